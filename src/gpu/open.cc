#include "gpu/open.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gpu/nvml/nvml_layer.h"

namespace gpulet::gpu {

const char* PcieRelationName(PcieRelation r) {
  switch (r) {
    case PcieRelation::kSameBoard:
    case PcieRelation::kSingleSwitch:
      return "PIX";
    case PcieRelation::kMultiSwitch:
      return "PXB";
    case PcieRelation::kHostBridge:
      return "PHB";
    case PcieRelation::kSameNuma:
      return "NODE";
    case PcieRelation::kCrossNuma:
      return "SYS";
    default:
      return "N/A";
  }
}

namespace {

// The fake NVML sits beside the binaries of the same build: build/bin/gpulet and the tests in
// build/tests/ both find build/lib/fake/libnvidia-ml.so.1 as <exe dir>/../lib/fake/.
std::string FakeLibraryPath() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "lib" / "fake" / "libnvidia-ml.so.1").string();
}

}  // namespace

absl::StatusOr<std::string> MakeTempSimRoot() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-sim-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr)
    return absl::InternalError(
        absl::StrCat("cannot create a temporary sim root: ", strerror(errno)));
  return tmpl;
}

absl::StatusOr<std::unique_ptr<GpuLayer>> OpenGpuLayer(const GpuOptions& options) {
  NvmlBackendOptions o;
  if (options.simulate.empty()) {
    o.library = options.nvml_library;
    o.host_root = options.host_root.empty() ? "/" : options.host_root;
    return OpenNvmlGpuLayer(o);
  }
  o.simulate = true;
  o.library = FakeLibraryPath();
  if (!std::filesystem::exists(o.library)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load NVML library '", o.library,
        "': the simulated NVML is not built (cmake --build build --target gpulet_fake_nvml)"));
  }
  o.machine = options.simulate;
  o.sim_root = options.sim_root;
  if (o.sim_root.empty()) {
    auto dir = MakeTempSimRoot();
    if (!dir.ok()) return dir.status();
    o.sim_root = o.owned_dir = *dir;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(o.sim_root, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create sim root ", o.sim_root, ": ", ec.message()));
    }
    o.sim_root = std::filesystem::absolute(o.sim_root).lexically_normal().string();
  }
  o.host_root = o.sim_root;
  return OpenNvmlGpuLayer(o);
}

}  // namespace gpulet::gpu
