// /etc/gpulet/container-runtime.json.
#include "runtime/request.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gpulet::runtime::LoadRuntimeConfig(
      gpulet::fuzz::ScratchFile("runtime.json", gpulet::fuzz::Input(data, size)));
  return 0;
}
