#include "gpu/open.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/status.h"
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

// A new private sim root (gpulet-sim-XXXXXX in the temporary directory); the caller removes it.
absl::StatusOr<std::string> MakeTempSimRoot() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-sim-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr)
    return absl::InternalError(
        absl::StrCat("cannot create a temporary sim root: ", strerror(errno)));
  return tmpl;
}

// The one place a simulated node and the host are told apart. `owned_root` (may be null): the
// private sim root is the caller's to remove; null: the layer removes it.
absl::StatusOr<std::unique_ptr<GpuLayer>> Open(const GpuOptions& options, std::string* node_root,
                                               std::string* owned_root) {
  NvmlBackendOptions o;
  if (options.simulate.empty()) {
    o.library = options.nvml_library;
    o.host_root = options.host_root.empty() ? "/" : options.host_root;
    *node_root = o.host_root;
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
    ASSIGN_OR_RETURN(o.sim_root, MakeTempSimRoot());
    (owned_root != nullptr ? *owned_root : o.owned_dir) = o.sim_root;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(o.sim_root, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create sim root ", o.sim_root, ": ", ec.message()));
    }
    o.sim_root = std::filesystem::absolute(o.sim_root).lexically_normal().string();
  }
  o.host_root = *node_root = o.sim_root;
  auto layer = OpenNvmlGpuLayer(o);
  if (!layer.ok() && owned_root != nullptr && !owned_root->empty()) {
    std::error_code ec;
    std::filesystem::remove_all(*owned_root, ec);
    owned_root->clear();
  }
  return layer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuLayer>> OpenGpuLayer(const GpuOptions& options) {
  std::string node_root;
  return Open(options, &node_root, nullptr);
}

absl::StatusOr<std::unique_ptr<Machine>> Machine::Open(const GpuOptions& options, Clock* clock) {
  std::string node_root, owned_root;
  ASSIGN_OR_RETURN(auto gpus, gpu::Open(options, &node_root, &owned_root));
  return std::unique_ptr<Machine>(new Machine(std::move(gpus), std::move(node_root),
                                              !options.simulate.empty(), std::move(owned_root),
                                              clock));
}

Machine::Machine(std::unique_ptr<GpuLayer> gpus, std::string node_root, bool simulated,
                 std::string owned_root, Clock* clock)
    : gpus_(std::move(gpus)),
      node_root_(std::move(node_root)),
      simulated_(simulated),
      owned_root_(std::move(owned_root)),
      clock_(clock) {}

Machine::~Machine() {
  gpus_.reset();  // the fake NVML writes under the sim root until it is shut down
  std::error_code ec;
  if (!owned_root_.empty()) std::filesystem::remove_all(owned_root_, ec);
}

std::string Machine::Path(std::string_view path) const {
  return JoinRoot(node_root_, std::string(path));
}

}  // namespace gpulet::gpu
