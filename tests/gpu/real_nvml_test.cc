// The conformance suite against this machine's real libnvidia-ml.so.1 (label gpu). Skipped with the
// reason when the library is absent, as on every development and CI machine of this project.
#include "conformance.h"

namespace gpulet::gpu::testing {
INSTANTIATE_TEST_SUITE_P(RealNvml, GpuLayerConformance, ::testing::Values(std::string()));
}  // namespace gpulet::gpu::testing
