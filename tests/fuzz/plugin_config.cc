// Device-plugin config files (NVIDIA's config v1 plus gpulet's sections), from a ConfigMap.
#include "plugin/config.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpulet::fuzz::QuietLogs();
  (void)gpulet::plugin::ParseConfig(gpulet::fuzz::Input(data, size), "fuzz.yaml");
  return 0;
}
