// /etc/ld.so.cache of a driver root (a driver container's root is not ours).
#include "runtime/driver.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gpulet::runtime::ParseLdCache(gpulet::fuzz::Input(data, size), "fuzz");
  return 0;
}
