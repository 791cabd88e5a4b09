// The filesystem as an outside world: everything gpulet reads from /sys, /proc, /dev, /etc or writes
// as state goes through this interface so tests can use a temporary tree or an in-memory fake.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpulet {

class Filesystem {
 public:
  virtual ~Filesystem() = default;
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) const = 0;
  // Writes to a temporary file beside `path`, fsyncs, then renames: readers see the old or the new
  // content, never a half-written file.
  virtual absl::Status WriteFileAtomic(const std::string& path, const std::string& content,
                                       mode_t mode = 0644) = 0;
  virtual bool Exists(const std::string& path) const = 0;
  // Entry names (not paths), sorted; NotFound when `path` is not a directory.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) const = 0;
  virtual absl::Status MakeDirs(const std::string& path, mode_t mode = 0755) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
};

// The real filesystem, seen through `root`: with root "/sim" a read of "/sys/x" reads "/sim/sys/x".
// Used with "/" in production and a temporary tree for simulated nodes and tests. Thread-safe.
class RealFilesystem : public Filesystem {
 public:
  explicit RealFilesystem(std::string root = "/");
  absl::StatusOr<std::string> ReadFile(const std::string& path) const override;
  absl::Status WriteFileAtomic(const std::string& path, const std::string& content,
                               mode_t mode = 0644) override;
  bool Exists(const std::string& path) const override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) const override;
  absl::Status MakeDirs(const std::string& path, mode_t mode = 0755) override;
  absl::Status Remove(const std::string& path) override;

  // The host path that `path` maps to.
  std::string Resolve(const std::string& path) const;
  const std::string& root() const { return root_; }

 private:
  std::string root_;  // without trailing slash; empty for "/"
};

// Free-standing helpers on host paths (no root), for code that has no Filesystem to hand.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status WriteFileAtomic(const std::string& path, const std::string& content,
                             mode_t mode = 0644);

}  // namespace gpulet
