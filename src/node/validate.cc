#include "node/validate.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "k8s/podresources/v1/api.grpc.pb.h"
#include "node/install.h"
#include "runtime/cdi.h"
#include "runtime/engine_config.h"

namespace gpulet::node {
namespace {

StepResult Driver(const ValidateOptions& o, gpu::Inventory* inv) {
  StepResult s{"driver"};
  std::unique_ptr<gpu::GpuLayer> owned;
  gpu::GpuLayer* layer = o.layer;
  if (layer == nullptr) {
    auto opened = gpu::OpenGpuLayer(o.gpu);
    if (!opened.ok()) {
      s.detail = std::string(opened.status().message());
      return s;
    }
    owned = *std::move(opened);
    layer = owned.get();
  }
  auto got = layer->GetInventory();
  if (!got.ok()) {
    s.detail = std::string(got.status().message());
    return s;
  }
  *inv = *got;
  if (inv->devices.empty()) {
    s.detail = "NVML answers but reports no GPUs";
    return s;
  }
  s.ok = true;
  s.detail = absl::StrCat(inv->devices.size(), " GPUs (", inv->devices[0].name, "), driver ",
                          inv->driver_version, ", CUDA ", inv->cuda_driver_version / 1000, ".",
                          inv->cuda_driver_version % 1000 / 10);
  return s;
}

StepResult Runtime(const ValidateOptions& o, const gpu::Inventory& inv) {
  StepResult s{"runtime"};
  std::string engine = o.runtime;
  if (engine == "auto") {
    auto e = DetectEngine(o.host_root);
    if (!e.ok()) {
      s.detail = std::string(e.status().message());
      return s;
    }
    engine = *e;
  }
  auto parsed = runtime::ParseEngine(engine);
  if (!parsed.ok()) {
    s.detail = std::string(parsed.status().message());
    return s;
  }
  std::string shim = o.prefix + "/bin/gpulet-container-runtime";
  if (::access(UnderRoot(o.host_root, shim).c_str(), X_OK) != 0) {
    s.detail = absl::StrCat(shim, " is not installed (run `gpulet install`)");
    return s;
  }
  // Configured means: configuring again would change nothing.
  runtime::ConfigureOptions co;
  co.engine = *parsed;
  co.root = o.host_root == "/" ? "" : o.host_root;
  co.runtime_path = shim;
  co.enable_cdi = true;
  auto plan = runtime::PlanConfigure(co);
  if (!plan.ok()) {
    s.detail = absl::StrCat(engine, " configuration: ", plan.status().message());
    return s;
  }
  for (const auto& c : *plan)
    if (c.changed()) {
      s.detail = absl::StrCat(engine, " is not configured for gpulet (",
                              c.path.substr(co.root.size()), " lacks the runtime; run `gpulet install`)");
      return s;
    }
  // What a container asking for the first GPU gets, from the CDI spec on disk.
  runtime::CdiRegistry cdi;
  if (auto st = cdi.Load({UnderRoot(o.host_root, o.cdi_dir)}); !st.ok()) {
    s.detail = std::string(st.message());
    return s;
  }
  std::string first = absl::StrCat("nvidia.com/gpu=", inv.devices[0].index);
  auto edits = cdi.Resolve({first});
  if (!edits.ok()) {
    s.detail = absl::StrCat("CDI: ", edits.status().message());
    return s;
  }
  std::string want = absl::StrCat("/dev/nvidia", inv.devices[0].minor);
  bool has_node = false;
  for (const auto& d : edits->device_nodes) {
    if (d.path != want) continue;
    struct stat st;
    std::string host = d.host_path.empty() ? d.path : d.host_path;
    if (::stat(UnderRoot(o.host_root, host).c_str(), &st) != 0) {
      s.detail = absl::StrCat(first, " maps to ", host, ", which does not exist on the host");
      return s;
    }
    has_node = true;
  }
  if (!has_node) {
    s.detail = absl::StrCat(first, " does not give the container ", want);
    return s;
  }
  s.ok = true;
  s.detail = absl::StrCat(engine, " runs ", shim, "; ", first, " gives ", want, ", ",
                          edits->device_nodes.size() - 1, " other device nodes and ",
                          edits->mounts.size(), " driver mounts");
  return s;
}

bool Ours(const ValidateOptions& o, const std::string& resource) {
  for (const auto& p : o.resource_prefixes)
    if (absl::StartsWith(resource, p)) return true;
  return false;
}

StepResult Plugin(const ValidateOptions& o) {
  StepResult s{"device-plugin"};
  auto channel = grpc::CreateChannel("unix://" + o.pod_resources_socket,
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::AllocatableResourcesRequest req;
  v1::AllocatableResourcesResponse resp;
  grpc::Status st = stub->GetAllocatableResources(&ctx, req, &resp);
  if (!st.ok()) {
    s.detail = absl::StrCat("kubelet PodResources API at ", o.pod_resources_socket,
                            " did not answer: ", st.error_message());
    return s;
  }
  std::map<std::string, int> allocatable;
  for (const auto& d : resp.devices())
    if (Ours(o, d.resource_name())) allocatable[d.resource_name()] += d.device_ids_size();
  if (allocatable.empty()) {
    s.detail = "the kubelet has no allocatable GPU resources: the device plugin is not registered";
    return s;
  }
  std::vector<std::string> parts;
  for (const auto& [r, n] : allocatable) parts.push_back(absl::StrCat(r, "=", n));
  s.detail = absl::StrCat("kubelet allocatable ", absl::StrJoin(parts, ", "));
  if (o.client == nullptr || o.node_name.empty()) {
    s.ok = true;
    s.detail += "; node capacity not checked (no API access)";
    return s;
  }
  auto node = o.client->GetNode(o.node_name);
  if (!node.ok()) {
    s.detail = absl::StrCat("cannot read node ", o.node_name, ": ", node.status().message());
    return s;
  }
  const auto& cap = (*node)["status"].value("capacity", k8s::json::object());
  for (const auto& [r, n] : allocatable) {
    auto it = cap.find(r);
    if (it == cap.end() || !it->is_string() || it->get<std::string>() == "0") {
      s.detail = absl::StrCat("node ", o.node_name, " capacity does not show ", r, " yet");
      return s;
    }
  }
  s.ok = true;
  s.detail += absl::StrCat("; node ", o.node_name, " capacity shows them");
  return s;
}

}  // namespace

ValidationReport ValidateStack(const ValidateOptions& o) {
  ValidationReport r;
  gpu::Inventory inv;
  r.steps.push_back(Driver(o, &inv));
  if (!r.steps.back().ok) return r;
  r.steps.push_back(Runtime(o, inv));
  if (!r.steps.back().ok) return r;
  r.steps.push_back(Plugin(o));
  return r;
}

}  // namespace gpulet::node
