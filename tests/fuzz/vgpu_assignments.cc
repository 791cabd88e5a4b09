// The node agent's vGPU checkpoint (<state_dir>/assignments.json), read at every start: a file
// on the host, but a corrupt one must be an error naming it, never a crash loop.
#include "tests/fuzz/fuzz.h"
#include "vgpu/node/node.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpulet::fuzz::QuietLogs();
  std::string path =
      gpulet::fuzz::ScratchFile("vgpu/assignments.json", gpulet::fuzz::Input(data, size));
  gpulet::vgpu::NodeOptions o;
  o.node_name = "node-x";
  o.state_dir = path.substr(0, path.rfind('/'));
  std::vector<gpulet::vgpu::PoolGpu> pool = {{"GPU-a", 0, 320, true}, {"GPU-b", 1, 64, true}};
  gpulet::vgpu::NodeAssigner assigner(o, pool, nullptr);
  (void)assigner.Load();
  return 0;
}
