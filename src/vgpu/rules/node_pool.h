// The node-pool annotation gpulet.io/vgpu-gpus (kAnnotationNodeGpus): the agent publishes its
// fractional-pool GPUs on its Node, the extender places against them and the webhook checks the
// largest. One encoder and one decoder, so the three agree on the JSON:
//   [{"uuid":"GPU-...","index":0,"memoryUnits":318,"healthy":true}, ...]
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpulet::vgpu {

// Most GPUs one node may declare (annotation or capacity): bounds the state a node can create.
inline constexpr int64_t kMaxNodeGpus = 256;

struct PoolGpu {
  std::string uuid;    // empty: not given
  uint32_t index = 0;  // NVML index on the node (informative: nothing off the node uses it)
  int64_t memory_units = 0;
  bool healthy = true;
};

std::string EncodeNodePool(const std::vector<PoolGpu>& gpus);

// Every field is type- and bounds-checked (at most kMaxNodeGpus GPUs, memoryUnits in
// 0..kMaxMemoryUnitsPerGpu, uuid a short token); errors say which GPU and field. "index" is read
// when it is a 32-bit unsigned integer and otherwise ignored (older agents' values stay valid).
absl::StatusOr<std::vector<PoolGpu>> DecodeNodePool(std::string_view text);

// A GPU UUID as NVML prints it ("GPU-8c5b...", "MIG-...") or our "<node>-gpu<i>": short, and
// nothing that could break the comma-separated annotation or a log line.
bool IsUuidToken(std::string_view s);

}  // namespace gpulet::vgpu
