// Files gpulet reads (/sys, /proc, /dev, /etc) and writes (state, specs): one concrete type and
// helpers on host paths, no interface (issue 18). Tests are hermetic without a fake: every reader
// that looks at the host takes a root (a temporary tree in tests, the simulated node's --sim-root),
// and the outside worlds that do need scripting (NVML, CUDA, the kubelet, the API server) have
// their fakes. An abstract Filesystem was injected in one place and bypassed in forty, and no fake
// of it was ever written: two ways to touch a file and a seam that tested nothing.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpulet {

// `path` under `root`, lexically ("/" or "": `path` unchanged; "/sim" and "/dev/x": "/sim/dev/x"):
// the one way rooted paths are joined (a simulated node, the host under --host-root, a driver
// container's root). Symlinks are not followed; node::UnderRoot follows the host's.
std::string JoinRoot(const std::string& root, const std::string& path);

// The filesystem seen through `root`: with root "/sim" a read of "/sys/x" reads "/sim/sys/x".
// Used with "/" in production and a temporary tree for simulated nodes and tests. Thread-safe.
class RootedFilesystem {
 public:
  explicit RootedFilesystem(std::string root = "/");
  absl::StatusOr<std::string> ReadFile(const std::string& path) const;
  // Writes to a temporary file beside `path`, fsyncs, then renames: readers see the old or the new
  // content, never a half-written file.
  absl::Status WriteFileAtomic(const std::string& path, const std::string& content,
                               mode_t mode = 0644) const;
  bool Exists(const std::string& path) const;
  // Entry names (not paths), sorted; NotFound when `path` is not a directory.
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) const;
  absl::Status MakeDirs(const std::string& path, mode_t mode = 0755) const;
  absl::Status Remove(const std::string& path) const;

  // The host path that `path` maps to.
  std::string Resolve(const std::string& path) const;
  const std::string& root() const { return root_; }

 private:
  std::string root_;  // without trailing slash; empty for "/"
};

// The same on host paths (a RootedFilesystem at "/").
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status WriteFileAtomic(const std::string& path, const std::string& content,
                             mode_t mode = 0644);
bool PathExists(const std::string& path);
// Whether `path` could be written now (its directory exists and is writable, it is no
// directory): checked before a long computation whose result goes there. Errors name `path`.
absl::Status CheckWritable(const std::string& path);
absl::Status MakeDirs(const std::string& path, mode_t mode = 0755);

}  // namespace gpulet
