// Pod YAML given to `gpulet sim` and the kubelet emulator.
#include "testing/kubelet/pod.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gpulet::emu::ParsePods(gpulet::fuzz::Input(data, size), "fuzz.yaml");
  return 0;
}
