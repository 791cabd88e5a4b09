// Container edits: what gpulet adds to a container (device nodes, mounts, env, hooks), in the shape
// of a CDI `containerEdits` block, and how they are applied to an OCI runtime spec (config.json).
// The OCI spec is an nlohmann::ordered_json document so that fields gpulet does not know survive a
// load/edit/save round trip unchanged. Plain values; no threads, no globals.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace gpulet::runtime {

using Json = nlohmann::ordered_json;

struct DeviceNode {
  std::string path;       // inside the container
  std::string host_path;  // empty: same as path (CDI >= 0.5.0 field)
  std::string type = "c";
  std::optional<int64_t> major, minor;  // filled from the host node when absent
  std::optional<uint32_t> file_mode, uid, gid;
  std::string permissions;  // cgroup access, default "rwm"
};

struct Mount {
  std::string host_path, container_path, type;
  std::vector<std::string> options;
};

struct Hook {
  std::string
      hook_name;  // createRuntime, createContainer, startContainer, prestart, poststart, poststop
  std::string path;
  std::vector<std::string> args, env;
  std::optional<int> timeout;
};

struct ContainerEdits {
  std::vector<std::string> env;  // "KEY=VALUE"
  std::vector<DeviceNode> device_nodes;
  std::vector<Mount> mounts;
  std::vector<Hook> hooks;

  // Appends `other`, skipping device nodes / mounts already present at the same container path.
  void Merge(const ContainerEdits& other);
  bool empty() const {
    return env.empty() && device_nodes.empty() && mounts.empty() && hooks.empty();
  }
};

// Fills missing major/minor/type/file_mode of each device node from the host node (stat of
// host_path, or path when host_path is empty). A missing or non-device host node is an error naming
// it.
absl::Status ResolveDeviceNodes(std::vector<DeviceNode>& nodes);

// Applies edits to an OCI runtime spec: process.env (replacing same keys), linux.devices and the
// matching linux.resources.devices allow rules, mounts (bind), hooks. Device nodes must be
// resolved. Only touches what it adds; fails (spec unchanged) when the spec's shape is wrong.
absl::Status ApplyEdits(const ContainerEdits& edits, Json& spec);

// Adds only the cgroup allow rules (linux.resources.devices, type/major/minor/access) for resolved
// `nodes`, skipping rules already present. Legacy mode: the prestart hook creates the nodes, but
// runc applies the device cgroup from config.json before any hook runs. All or nothing.
absl::Status AllowDevices(const std::vector<DeviceNode>& nodes, Json& spec);

// Reads and validates an OCI bundle's config.json (a JSON object with ociVersion, process, root).
absl::StatusOr<Json> LoadOciSpec(const std::string& path);
// Writes the spec atomically (temp file in the same directory, fsync, rename), keeping the mode.
absl::Status SaveOciSpec(const std::string& path, const Json& spec);

// A path with "." and empty components removed and ".." applied lexically (never above "/" for an
// absolute path), without a trailing slash: "/a/./b/../c/" -> "/a/c". No filesystem access.
std::string CleanPath(const std::string& path);

// Environment helpers on process.env of an OCI spec.
std::optional<std::string> GetEnv(const Json& spec, const std::string& key);
std::optional<std::string> GetEnv(const std::vector<std::string>& env, const std::string& key);

}  // namespace gpulet::runtime
