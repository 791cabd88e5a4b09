// Pods as the kubelet emulator sees them: the subset of core/v1 Pod that matters to the device
// manager, read from YAML with the API server's validation of extended-resource requests.
// Plain values; no threads, no ownership subtleties.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace gpulet::emu {

struct ContainerSpec {
  std::string name;
  std::string image;
  std::vector<std::pair<std::string, std::string>> env;  // spec order
  // Quantities exactly as written ("1", "500m", "2Gi"); extended resources are integers.
  std::map<std::string, std::string> limits;
  std::map<std::string, std::string> requests;
};

struct OwnerReference {
  std::string api_version, kind, name, uid;
  bool controller = false;
};

struct PodSpec {
  std::string name;
  std::string namespace_ = "default";
  std::string uid;  // generated from namespace/name when the YAML has none
  std::map<std::string, std::string> annotations;
  std::vector<OwnerReference> owner_references;
  // spec.nodeName: a pod bound directly to the node skips the scheduler, so the kubelet's own
  // admission decides (UnexpectedAdmissionError), as in a real cluster.
  std::string node_name;
  std::vector<ContainerSpec> containers;
  // Simulated run time (annotation sim.gpulet.io/run-time, e.g. "3s", "500ms"): a Running pod
  // becomes Succeeded after this long and frees its devices. 0 = runs until deleted.
  int64_t run_time_ms = 0;
  std::string source;  // "file:line" of the document, for messages
  // "file:line: ..." for a form still accepted but deprecated (a bare run-time number), to print.
  std::vector<std::string> warnings;

  std::string Key() const { return namespace_ + "/" + name; }
};

// The annotation carrying a pod's simulated run time.
inline constexpr char kRunTimeAnnotation[] = "sim.gpulet.io/run-time";

// Whether `name` is an extended resource name as the kubelet's Register and the API server define
// it: a qualified name with a domain prefix outside kubernetes.io, not starting with "requests.".
bool IsExtendedResourceName(const std::string& name);

// Parses one or more YAML documents ("---" separated) of kind Pod. `filename` is used in messages.
// Errors name file:line and the problem; the API server's rules for extended resources apply
// (integer quantity; must be in limits; requests, if given, equal limits).
absl::StatusOr<std::vector<PodSpec>> ParsePods(const std::string& yaml_text,
                                               const std::string& filename);
absl::StatusOr<std::vector<PodSpec>> LoadPodFile(const std::string& path);

// Integer value of an extended-resource quantity of `spec` in container `c` (0 when absent).
int64_t ExtendedRequest(const ContainerSpec& c, const std::string& resource);

}  // namespace gpulet::emu
