// Container Device Interface (CDI) specs: the model, reading (YAML or JSON, with file:line errors),
// writing, generation from the GPU inventory and the driver root, and resolving fully-qualified
// device names ("nvidia.com/gpu=0") from the spec directories into container edits.
// Plain values and functions; CdiRegistry is not thread-safe (one per container start).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"
#include "runtime/edits.h"

namespace gpulet::runtime {

struct CdiDevice {
  std::string name;
  ContainerEdits edits;
};

struct CdiSpec {
  std::string cdi_version;  // as read; set by MinimumCdiVersion when generating
  std::string kind;         // "vendor/class", e.g. "nvidia.com/gpu"
  std::vector<CdiDevice> devices;
  ContainerEdits edits;  // applied once when any device of the spec is used
  std::string source;    // file it was read from (for messages)
};

// Parses a CDI spec (JSON is YAML). Validates cdiVersion, kind, device names, absolute paths and
// hook names; an error names the file and line.
absl::StatusOr<CdiSpec> ParseCdiSpec(const std::string& text, const std::string& source);

// The lowest cdiVersion able to hold the spec's content (as the CDI spec's version history says).
std::string MinimumCdiVersion(const CdiSpec& spec);
std::string CdiSpecToYaml(const CdiSpec& spec);
std::string CdiSpecToJson(const CdiSpec& spec);

enum class NameStrategy { kIndex, kUuid, kBoth };
absl::StatusOr<NameStrategy> ParseNameStrategy(const std::string& s);

struct CdiGenerateOptions {
  // "/": the host, unless it has no libcuda and `driver_container_root` has (a driver container,
  // as the GPU operator runs it): that root is then used as if it had been given here.
  std::string driver_root = "/";
  std::string driver_container_root = "/run/nvidia/driver";
  // Where this process sees the host's root filesystem: "/host" in a pod that mounts it there (the
  // installer, the agent's DRA driver); "/" or empty: its own root. driver_root and
  // driver_container_root are host paths, read under it, and the spec names host paths.
  std::string host_root = "/";
  std::string kind = "nvidia.com/gpu";
  NameStrategy names = NameStrategy::kBoth;
  // Where /proc/driver/nvidia-caps/mig-minors is read first (a simulated node's root); empty: the
  // driver root, then this host.
  std::string proc_root;
  // The hook that refreshes the container's ld cache (createRuntime); empty: no hook.
  std::string hook_path = "/usr/bin/gpulet-container-hook";
};

// One device per GPU and per MIG device (named per strategy, see docs/runtime.md), plus "all";
// the control nodes, libraries and binaries as shared edits. `warnings` gets what was left out.
absl::StatusOr<CdiSpec> GenerateCdiSpec(const gpu::Inventory& inventory,
                                        const CdiGenerateOptions& options,
                                        std::vector<std::string>* warnings = nullptr);

// The specs of some directories (*.yaml, *.yml, *.json), later directories overriding earlier
// ones for the same file name, as the CDI spec says.
class CdiRegistry {
 public:
  // A missing directory is fine. An unreadable or invalid spec is skipped, as containerd and CRI-O
  // skip it: one bad file (another vendor's, an older gpulet's) must not take every device with
  // it. Its error names it in skipped() and in Resolve's answer for a device it would have held.
  absl::Status Load(const std::vector<std::string>& dirs);
  const std::vector<std::string>& skipped() const { return skipped_; }
  void Add(CdiSpec spec) { specs_.push_back(std::move(spec)); }

  // Edits for fully-qualified names ("nvidia.com/gpu=0"): every device's edits plus, once per
  // spec, the spec's shared edits. An unknown kind or device is NotFound naming it.
  absl::StatusOr<ContainerEdits> Resolve(const std::vector<std::string>& qualified_names) const;
  // The shared edits of the specs of `kind` (a container that asks for the driver, no GPU: "none").
  ContainerEdits SharedEdits(const std::string& kind) const;
  bool HasKind(const std::string& kind) const;

 private:
  std::vector<CdiSpec> specs_;
  std::vector<std::string> skipped_;  // "path: what is wrong", one per skipped spec
};

// Splits "vendor/class=name"; false when `s` is not a fully-qualified CDI name.
bool SplitQualifiedName(const std::string& s, std::string* kind, std::string* name);

}  // namespace gpulet::runtime
