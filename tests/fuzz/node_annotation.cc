// The node annotation gpulet.io/vgpu-gpus: written by the node agent, but a Node object anyone
// with node patch rights can edit; read by the extender's watch callback.
#include "scheduler/extender.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpulet::fuzz::QuietLogs();
  static gpulet::scheduler::Extender* extender =
      new gpulet::scheduler::Extender(nullptr, gpulet::scheduler::ExtenderOptions{});
  std::string text = gpulet::fuzz::Input(data, size);
  (void)gpulet::vgpu::DecodeNodePool(text);
  extender->UpsertNode(
      {{"metadata", {{"name", "node-x"}, {"annotations", {{"gpulet.io/vgpu-gpus", text}}}}}});
  return 0;
}
