// The manual GPU isolation file the agent watches.
#include "plugin/health.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpulet::fuzz::QuietLogs();
  (void)gpulet::plugin::ParseIsolation(gpulet::fuzz::Input(data, size), "fuzz.json");
  return 0;
}
