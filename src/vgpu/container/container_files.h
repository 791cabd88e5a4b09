// The host side of one fractional container's files (abi/vgpu_contract.h): the grant directory
// holding its accounting file (read-write in the container) and its limits file (read-only), and
// the node's preload file (read-only at /etc/ld.so.preload).
//
// A tenant can write to its accounting file, so it could grow it without end (write past the
// end, ftruncate) on the host's disk, where the kubelet counts nothing against the pod. With
// `tmpfs`, the grant directory is a tmpfs of its own, 16 KiB and 8 inodes: the file is bounded by
// construction, whatever the tenant does and whether or not anything trims it. The mount is made
// in the agent's mount namespace and must reach the container runtime's, so the directory's
// parent must be a shared mount (mountPropagation: Bidirectional on the agent's /var/lib/gpulet);
// PrepareGrantDir checks that before mounting rather than let the runtime bind an empty directory.
#pragma once

#include <stdint.h>

#include <string>

#include "abi/vgpu_contract_builder.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpulet::vgpu {

struct GrantDirOptions {
  int64_t uid = -1, gid = -1;  // the container's user and group when the pod says (runAsUser/Group)
  bool tmpfs = false;          // a size-bounded tmpfs per grant directory (see above)
  std::string library;         // host path of the interposer library
  std::string preload;         // host path of the preload file (one per node), written if stale
};

// The tmpfs of a grant directory: its accounting and limits files fit with room to spare, and
// nothing more does.
inline constexpr size_t kGrantDirBytes = 16 * 1024;

// Creates `dir` (0700, the agent's) with the accounting file (kept when it exists: the
// container's processes hold memory in it, its owner and mode set again), the limits file
// (rewritten from `limits`, 0444) and the preload file. Errors name the path and what failed;
// nothing is left mounted on failure.
absl::StatusOr<ContractFiles> PrepareGrantDir(const std::string& dir, const ContainerLimits& limits,
                                              const GrantDirOptions& options);

// The host files of grant directory `dir` (what PrepareGrantDir made there), with the node's
// interposer library and preload file: what the container's mounts come from.
ContractFiles GrantDirFiles(const std::string& dir, const std::string& library,
                            const std::string& preload);

// Unmounts `dir` when it is a mount point and removes it with what it holds.
absl::Status RemoveGrantDir(const std::string& dir);

// Whether `path` is a mount point (its device differs from its parent's).
bool IsMountPoint(const std::string& path);

// Whether mounts made under `path` propagate to the other mount namespaces sharing it: the mount
// holding `path` is a shared one (mountinfo's "shared:N"). `mountinfo` is /proc/self/mountinfo's
// text (a parameter for tests).
absl::Status CheckMountsPropagate(const std::string& path, const std::string& mountinfo);

}  // namespace gpulet::vgpu
