// CDI spec files (YAML or JSON) from /etc/cdi and /var/run/cdi: any writer of those directories.
#include "runtime/cdi.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gpulet::runtime::ParseCdiSpec(gpulet::fuzz::Input(data, size), "fuzz.yaml");
  return 0;
}
