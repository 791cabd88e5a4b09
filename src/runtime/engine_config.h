// `gpulet runtime configure`: registers gpulet-container-runtime with a container engine by editing
// its configuration: containerd (config version 2 or 3: a drop-in file plus `imports` in the main
// file, as nvidia-ctk does), Docker (daemon.json, other keys kept), CRI-O (a drop-in file).
// Planning is separate from writing so --dry-run shows the exact diff. Plain functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpulet::runtime {

enum class Engine { kContainerd, kDocker, kCrio };
absl::StatusOr<Engine> ParseEngine(const std::string& s);

struct ConfigureOptions {
  Engine engine = Engine::kContainerd;
  std::string config_path;   // empty: the engine's default
  std::string drop_in_path;  // empty: <config dir>/conf.d/99-gpulet.toml (crio: crio.conf.d/)
  std::string runtime_name = "nvidia";
  std::string runtime_path;  // absolute path of gpulet-container-runtime
  bool set_as_default = false;
  bool enable_cdi = false;
  // Where the engine's files are read and written: "" for the running system; "/host" for a host
  // mounted into the installer container. Paths written inside the files (imports, runtime paths)
  // stay host-absolute.
  std::string root;
};

struct FileChange {
  std::string path;
  bool existed = false;
  std::string before, after;
  bool changed() const { return !existed || before != after; }
};

// Reads the current files and computes their new content. An existing file that does not parse is
// an error naming it (and the line); nothing is written.
absl::StatusOr<std::vector<FileChange>> PlanConfigure(const ConfigureOptions& options,
                                                      std::vector<std::string>* notes = nullptr);

// Writes the changed files atomically, first copying each existing one to <path>.bak.
absl::Status ApplyChanges(const std::vector<FileChange>& changes);

// A unified diff of one change ("--- path" / "+++ path" / "@@" hunks, 3 lines of context).
std::string UnifiedDiff(const FileChange& change);

}  // namespace gpulet::runtime
