// The openb node and pod CSV files `gpulet-sched simulate` reads; the first byte picks which.
#include "placement/sim.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text = gpulet::fuzz::Input(data + 1, size - 1);
  if (data[0] & 1)
    (void)gpulet::placement::ParseOpenbNodes(text, "fuzz.csv");
  else
    (void)gpulet::placement::ParseOpenbPods(text, "fuzz.csv");
  return 0;
}
