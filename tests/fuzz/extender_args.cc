// ExtenderArgs bodies kube-scheduler posts to /filter and /prioritize (the pod inside is the pod
// author's), parsed as the server parses them, against two nodes with vGPU pools.
#include "http/guarded_server.h"
#include "scheduler/extender.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpulet::fuzz::QuietLogs();
  static gpulet::scheduler::Extender* extender = [] {
    auto* e = new gpulet::scheduler::Extender(nullptr, gpulet::scheduler::ExtenderOptions{});
    for (const char* n : {"node-a", "node-b"})
      e->UpsertNode({{"metadata",
                      {{"name", n},
                       {"annotations",
                        {{"gpulet.io/vgpu-gpus",
                          R"([{"uuid":"GPU-a","index":0,"memoryUnits":320,"healthy":true},)"
                          R"({"uuid":"GPU-b","index":1,"memoryUnits":64,"healthy":true}])"}}}}}});
    return e;
  }();
  auto body = gpulet::http::ParseUntrustedJson(gpulet::fuzz::Input(data, size));
  if (!body.ok()) return 0;
  (void)extender->FilterWire(body->value);
  (void)extender->PrioritizeWire(body->value);
  return 0;
}
