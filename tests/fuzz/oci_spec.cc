// An OCI bundle's config.json as the shim and the hook read it (the image and pod author shape it).
#include "runtime/edits.h"
#include "runtime/request.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto spec = gpulet::runtime::LoadOciSpec(
      gpulet::fuzz::ScratchFile("config.json", gpulet::fuzz::Input(data, size)));
  if (spec.ok()) {
    gpulet::runtime::RuntimeConfig config;
    (void)gpulet::runtime::IsPrivileged(*spec);
    (void)gpulet::runtime::ResolveRequest(*spec, config);
  }
  return 0;
}
