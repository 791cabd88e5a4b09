// The OCI container state the hook reads on stdin.
#include "runtime/hook.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gpulet::runtime::ParseContainerState(gpulet::fuzz::Input(data, size));
  return 0;
}
