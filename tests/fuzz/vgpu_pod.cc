// A pod's vGPU requests as the webhook, the extender and the node agent judge them (the pod author
// writes every field). Parsed as the servers parse bodies: no exceptions, bounded depth.
#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz.h"
#include "vgpu/rules/rules.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int depth_limit = 64;
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t,
                                             nlohmann::json&) { return depth <= depth_limit; };
  nlohmann::json pod = nlohmann::json::parse(gpulet::fuzz::Input(data, size), cb, false);
  if (pod.is_discarded()) return 0;
  gpulet::vgpu::ResourceNames names;
  (void)gpulet::vgpu::ParsePod(pod, names, 8);
  return 0;
}
