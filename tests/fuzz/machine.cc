// Machine profiles (--simulate PATH): user-written YAML.
#include "testing/fake_nvml/machine.h"

#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gpulet::sim::ParseMachine(gpulet::fuzz::Input(data, size), "fuzz.yaml");
  return 0;
}
