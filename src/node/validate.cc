#include "node/validate.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/status.h"
#include "dra/slices.h"
#include "k8s/podresources/v1/api.grpc.pb.h"
#include "node/install.h"
#include "runtime/cdi.h"
#include "runtime/engine_config.h"
#include "runtime/ldconfig.h"

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
  for (const gpu::Device& d : inv->devices) {
    if (d.Readable()) continue;
    s.detail = absl::StrCat("GPU ", d.index, " cannot be read: ", d.error);
    return s;
  }
  s.ok = true;
  s.detail = absl::StrCat(inv->devices.size(), " GPUs (", inv->devices[0].name, "), driver ",
                          inv->driver_version, ", CUDA ", inv->cuda_driver_version / 1000, ".",
                          inv->cuda_driver_version % 1000 / 10);
  return s;
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd` through /bin/sh; its exit status, stdout+stderr in *out.
int Shell(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " </dev/null 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// runc on PATH first (the gpulet image carries one that loads with the image's libraries), then
// the host's.
absl::StatusOr<std::string> FindRunc(const ValidateOptions& o) {
  if (!o.probe_runc.empty()) return o.probe_runc;
  std::string out;
  if (Shell("command -v runc", &out) == 0 && !out.empty())
    return std::string(absl::StripTrailingAsciiWhitespace(out));
  for (const char* d :
       {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    std::string p = UnderRoot(o.host_root, std::string(d) + "/runc");
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return absl::NotFoundError(
      absl::StrCat("no runc under ", o.host_root, " or on PATH (--probe-runc)"));
}

// The host's CDI specs with their host paths made reachable from this process (host root prefixed);
// container paths stay as they are. Our hook gets `--config hook_config` (which names the host's
// ldconfig as this process reaches it).
absl::Status RelocateCdiSpecs(const std::string& host_root, const std::string& from,
                              const std::string& to, const std::string& hook_config) {
  RETURN_IF_ERROR(MakeDirs(to));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(from, ec)) {
    std::string ext = e.path().extension().string();
    if (ext != ".yaml" && ext != ".yml" && ext != ".json") continue;
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(e.path().string()));
    ASSIGN_OR_RETURN(runtime::CdiSpec spec, runtime::ParseCdiSpec(text, e.path().string()));
    auto move = [&](runtime::ContainerEdits& edits) {
      for (auto& d : edits.device_nodes)
        d.host_path = UnderRoot(host_root, d.host_path.empty() ? d.path : d.host_path);
      for (auto& m : edits.mounts) m.host_path = UnderRoot(host_root, m.host_path);
      for (auto& h : edits.hooks) {
        if (absl::EndsWith(h.path, "/gpulet-container-hook")) {
          h.args.push_back("--config");
          h.args.push_back(hook_config);
        }
        h.path = UnderRoot(host_root, h.path);
      }
    };
    move(spec.edits);
    for (auto& d : spec.devices) move(d.edits);
    RETURN_IF_ERROR(WriteFileAtomic(to + "/" + e.path().stem().string() + ".yaml",
                                    runtime::CdiSpecToYaml(spec), 0644));
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", from, ": ", ec.message()));
  return absl::OkStatus();
}

constexpr char kProbeDone[] = "gpulet-probe-done";

// Starts a busybox container through the installed shim (with runc, as the engine starts it) that
// asks for `device` by CDI annotation and lists /dev/nvidia*; returns the listed paths.
// Everything lives in a temporary directory that is removed afterwards.
absl::StatusOr<std::vector<std::string>> ProbeContainer(const ValidateOptions& o,
                                                        const std::string& shim,
                                                        const std::string& device) {
  if (::access(o.probe_busybox.c_str(), X_OK) != 0)
    return absl::NotFoundError(absl::StrCat("no static busybox at ", o.probe_busybox,
                                            " for the probe container (--probe-busybox)"));
  ASSIGN_OR_RETURN(std::string runc, FindRunc(o));
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-validate-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    return absl::InternalError(absl::StrCat("cannot create ", tmpl, ": ", std::strerror(errno)));
  const std::string dir = tmpl, bundle = dir + "/bundle", rootfs = bundle + "/rootfs";
  const std::string id = absl::StrCat("gpulet-validate-", ::getpid());
  struct Cleanup {
    std::string dir, runc, id;
    ~Cleanup() {
      std::string ignored;
      Shell(absl::StrCat(Quote(runc), " --root ", Quote(dir + "/state"), " delete -f ", id),
            &ignored);
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir, runc, id};

  std::error_code ec;
  for (const char* d : {"/bin", "/proc", "/dev", "/sys", "/tmp", "/etc"})
    std::filesystem::create_directories(rootfs + d, ec);
  std::filesystem::copy_file(o.probe_busybox, rootfs + "/bin/busybox", ec);
  for (const char* a : {"sh", "ls"})
    std::filesystem::create_symlink("busybox", rootfs + "/bin/" + a, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot build the probe rootfs in ", rootfs, ": ", ec.message()));
  std::string out;
  if (Shell(absl::StrCat(Quote(runc), " spec --bundle ", Quote(bundle)), &out) != 0)
    return absl::InternalError(absl::StrCat("`", runc, " spec` failed: ", out));
  ASSIGN_OR_RETURN(runtime::Json spec, runtime::LoadOciSpec(bundle + "/config.json"));
  spec["process"]["terminal"] = false;
  // The marker tells "ran and saw no GPU node" from "did not run".
  spec["process"]["args"] = {"sh", "-c",
                             std::string("ls -1 /dev/nvidia* 2>/dev/null; echo ") + kProbeDone};
  spec["annotations"]["cdi.k8s.io/gpulet-validate"] = device;
  RETURN_IF_ERROR(runtime::SaveOciSpec(bundle + "/config.json", spec));

  std::string spec_dir = UnderRoot(o.host_root, o.cdi_dir);
  if (o.host_root != "/" && !o.host_root.empty()) {
    spec_dir = dir + "/cdi";
    RETURN_IF_ERROR(RelocateCdiSpecs(o.host_root, UnderRoot(o.host_root, o.cdi_dir), spec_dir,
                                     dir + "/runtime.json"));
  }
  runtime::Json config = {
      {"runtimes", {runc}},
      {"spec-dirs", {spec_dir}},
      {"hook-path", UnderRoot(o.host_root, o.prefix + "/bin/gpulet-container-hook")}};
  // The host's ldconfig for the hook, chosen as the hook chooses it (ldconfig.real before a
  // wrapper script, static ELF only); the gpulet image has none of its own.
  // None under the host root (a test's fake host): the hook's own default on this machine.
  absl::StatusOr<runtime::Ldconfig> ld = runtime::OpenLdconfig("", o.host_root);
  if (ld.ok())
    config["ldconfig"] = ld->path;
  else if (ld.status().code() != absl::StatusCode::kNotFound)
    return ld.status();
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/runtime.json", config.dump(), 0644));

  // Output goes to a file, not our pipe: a container left running past the timeout (its PID 1
  // ignores SIGTERM) must not keep us reading; the cleanup's `runc delete -f` ends it.
  out.clear();
  int rc =
      Shell(absl::StrCat("GPULET_RUNTIME_CONFIG=", Quote(dir + "/runtime.json"), " timeout -k 5 ",
                         o.probe_timeout_seconds, " ", Quote(UnderRoot(o.host_root, shim)),
                         " --root ", Quote(dir + "/state"), " run --bundle ", Quote(bundle), " ",
                         id, " >", Quote(dir + "/out"), " 2>&1"),
            &out);
  std::string shown(absl::StripAsciiWhitespace(ReadFileToString(dir + "/out").value_or(out)));
  if (rc == 124 || rc == 137)
    return absl::DeadlineExceededError(
        absl::StrCat("the probe container did not finish in ", o.probe_timeout_seconds, " s"));
  std::vector<std::string> nodes;
  for (absl::string_view line : absl::StrSplit(shown, '\n'))
    if (absl::StartsWith(line, "/dev/nvidia")) nodes.emplace_back(line);
  if (rc != 0 || !absl::StrContains(shown, kProbeDone))
    return absl::FailedPreconditionError(
        absl::StrCat("the probe container failed (exit ", rc, "): ", shown.substr(0, 400)));
  return nodes;
}

// The engine `o` names (or the one found under the host root), and how `runtime configure` would
// edit it for the installed shim.
struct EngineToCheck {
  std::string name;
  runtime::ConfigureOptions configure;
};
absl::StatusOr<EngineToCheck> EngineOptions(const ValidateOptions& o) {
  std::string engine = o.runtime;
  if (engine == "auto") {
    ASSIGN_OR_RETURN(engine, DetectEngine(o.host_root));
  }
  runtime::ConfigureOptions co;
  ASSIGN_OR_RETURN(co.engine, runtime::ParseEngine(engine));
  co.root = o.host_root == "/" ? "" : o.host_root;
  co.runtime_path = o.prefix + "/bin/gpulet-container-runtime";
  co.enable_cdi = true;
  return EngineToCheck{engine, co};
}

// Whether what the device plugin hands out (o.delivery) reaches containers on the engine `co`; on
// success `how` (when given) says what it was judged on, for the step's detail.
absl::Status DeliveryReaches(const ValidateOptions& o, const runtime::ConfigureOptions& co,
                             std::string* how = nullptr) {
  if (!o.delivery) return absl::OkStatus();
  // The shim is the default runtime when making it so would change nothing.
  runtime::ConfigureOptions as_default = co;
  as_default.set_as_default = true;
  auto p = runtime::PlanConfigure(as_default);
  bool shim_default =
      p.ok() && std::none_of(p->begin(), p->end(), [](const auto& c) { return c.changed(); });
  std::string version;
  if (o.client && !o.node_name.empty()) {
    // A failed read is not "unknown, so allowed": the check waits for the next pass instead.
    auto n = o.client->GetNode(o.node_name);
    if (!n.ok())
      return absl::UnavailableError(
          absl::StrCat("cannot read node ", o.node_name,
                       "'s container engine version from the API: ", n.status().message()));
    version =
        n->value(nlohmann::json::json_pointer("/status/nodeInfo/containerRuntimeVersion"), "");
  }
  RETURN_IF_ERROR(CheckGpuDelivery(*o.delivery, version, shim_default));
  if (how)
    *how = absl::StrCat("delivery checked against ",
                        version.empty() ? "an unknown engine version" : version,
                        shim_default ? ", gpulet's shim the default runtime" : "",
                        o.delivery->device_specs ? ", device specs" : "");
  return absl::OkStatus();
}

StepResult Runtime(const ValidateOptions& o, const gpu::Inventory& inv) {
  StepResult s{"runtime"};
  auto e = EngineOptions(o);
  if (!e.ok()) {
    s.detail = std::string(e.status().message());
    return s;
  }
  const std::string& engine = e->name;
  const runtime::ConfigureOptions& co = e->configure;
  const std::string& shim = co.runtime_path;
  if (::access(UnderRoot(o.host_root, shim).c_str(), X_OK) != 0) {
    s.detail = absl::StrCat(shim, " is not installed (run `gpulet install`)");
    return s;
  }
  // Configured means: configuring again would change nothing.
  auto plan = runtime::PlanConfigure(co);
  if (!plan.ok()) {
    s.detail = absl::StrCat(engine, " configuration: ", plan.status().message());
    return s;
  }
  for (const auto& c : *plan)
    if (c.changed()) {
      s.detail =
          absl::StrCat(engine, " is not configured for gpulet (", c.path.substr(co.root.size()),
                       " lacks the runtime; run `gpulet install`)");
      return s;
    }
  std::string delivery;
  if (absl::Status d = DeliveryReaches(o, co, &delivery); !d.ok()) {
    s.detail = std::string(d.message());
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
  s.detail = absl::StrCat(engine, " runs ", shim, "; ", first, " gives ", want, ", ",
                          edits->device_nodes.size() - 1, " other device nodes and ",
                          edits->mounts.size(), " driver mounts");
  if (!delivery.empty()) absl::StrAppend(&s.detail, "; ", delivery);
  if (!o.container_probe) {
    s.ok = true;
    s.detail += "; no probe container (--no-probe)";
    return s;
  }
  auto seen = ProbeContainer(o, shim, first);
  if (!seen.ok()) {
    s.detail = absl::StrCat("probe container: ", seen.status().message());
    return s;
  }
  if (std::find(seen->begin(), seen->end(), want) == seen->end()) {
    s.detail = absl::StrCat(
        "a container started through ", shim, " with ", first, " does not see ", want,
        " (it sees: ", seen->empty() ? "no /dev/nvidia* nodes" : absl::StrJoin(*seen, " "), ")");
    return s;
  }
  s.ok = true;
  s.detail += absl::StrCat("; a probe container started through it sees ", want);
  return s;
}

bool Ours(const ValidateOptions& o, const std::string& resource) {
  for (const auto& p : o.resource_prefixes)
    if (absl::StartsWith(resource, p)) return true;
  return false;
}

// The devices in `o.dra_driver`'s ResourceSlices of this node.
absl::StatusOr<size_t> DraDevices(const ValidateOptions& o) {
  auto slices = dra::ListNodeSlices(o.client, o.node_name, o.dra_driver);
  if (!slices.ok())
    return absl::UnavailableError(absl::StrCat("cannot list the ResourceSlices of ", o.dra_driver,
                                               ": ", slices.status().message()));
  size_t n = 0;
  for (const auto& slice : *slices) {
    if (!slice.is_object() || !slice.contains("spec") || !slice["spec"].is_object()) continue;
    auto devices = slice["spec"].find("devices");
    if (devices != slice["spec"].end() && devices->is_array()) n += devices->size();
  }
  return n;
}

}  // namespace

absl::Status CheckGpuDelivery(const GpuDelivery& d, const std::string& runtime_version,
                              bool shim_is_default) {
  if (d.device_specs) return absl::OkStatus();
  if (d.through_shim && shim_is_default) return absl::OkStatus();
  // CDI device names in the CRI request: containerd since 1.7, CRI-O since 1.28; cri-dockerd never.
  std::string engine = runtime_version.substr(0, runtime_version.find("://"));
  absl::string_view number(runtime_version);
  number.remove_prefix(std::min(number.size(), engine.size() + 3));
  absl::ConsumePrefix(&number, "v");  // some builds report "containerd://v1.6.8"
  std::vector<std::string> v = absl::StrSplit(number, '.');
  int major = 0, minor = 0;
  const bool parsed =
      v.size() >= 2 && absl::SimpleAtoi(v[0], &major) &&
      absl::SimpleAtoi(absl::string_view(v[1]).substr(0, v[1].find_first_not_of("0123456789")),
                       &minor);
  auto at_least = [&](int m, int n) { return major > m || (major == m && minor >= n); };
  bool cri_cdi = true;  // unknown engines and versions: not refused
  if (engine == "docker") cri_cdi = false;
  if (engine == "containerd" && parsed) cri_cdi = at_least(1, 7);
  if (engine == "cri-o" && parsed) cri_cdi = at_least(1, 28);
  if (d.cdi_cri && cri_cdi) return absl::OkStatus();
  std::vector<std::string> why;
  if (d.cdi_cri) why.push_back(absl::StrCat(runtime_version, " has no CDI in CRI (cdi-cri)"));
  if (d.through_shim)
    why.push_back(
        "gpulet's shim, which alone acts on envvar / volume-mounts / cdi-annotations, "
        "is not the engine's default runtime");
  if (why.empty()) why.push_back("the device plugin hands GPUs over in no way at all");
  return absl::FailedPreconditionError(absl::StrCat(
      "GPU containers would start without their GPUs: ", absl::StrJoin(why, "; "),
      ". Make gpulet's shim the default runtime (gpulet install --set-as-default; the chart's "
      "install.args) or pass device specs (compatWithCPUManager / flags.plugin.passDeviceSpecs: "
      "device nodes without driver libraries)"));
}

StepResult ValidateDevicePlugin(const ValidateOptions& o) {
  StepResult s{"device-plugin"};
  auto channel =
      grpc::CreateChannel("unix://" + o.pod_resources_socket, grpc::InsecureChannelCredentials());
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
  std::string dra;  // what the DRA driver published, when it serves GPUs
  if (!o.dra_driver.empty()) {
    if (o.client == nullptr || o.node_name.empty()) {
      dra = absl::StrCat(o.dra_driver, " ResourceSlices not checked (no API access)");
    } else {
      auto n = DraDevices(o);
      if (!n.ok()) {
        s.detail = std::string(n.status().message());
        return s;
      }
      if (*n == 0) {
        s.detail = absl::StrCat("no ResourceSlice of ", o.dra_driver, " for node ", o.node_name,
                                " holds a device yet: the DRA driver has not published");
        return s;
      }
      dra = absl::StrCat(*n, " devices in ", o.dra_driver, " ResourceSlices");
    }
  }
  if (allocatable.empty()) {
    if (!dra.empty()) {  // every GPU is DRA's: no device-plugin resources is right
      s.ok = true;
      s.detail = absl::StrCat(dra, "; no device-plugin GPU resources (every GPU through DRA)");
      return s;
    }
    s.detail = "the kubelet has no allocatable GPU resources: the device plugin is not registered";
    return s;
  }
  if (!dra.empty()) dra = "; " + dra;
  std::vector<std::string> parts;
  for (const auto& [r, n] : allocatable) parts.push_back(absl::StrCat(r, "=", n));
  s.detail = absl::StrCat("kubelet allocatable ", absl::StrJoin(parts, ", "));
  if (o.client == nullptr || o.node_name.empty()) {
    s.ok = true;
    s.detail += absl::StrCat("; node capacity not checked (no API access)", dra);
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
  s.detail += absl::StrCat("; node ", o.node_name, " capacity shows them", dra);
  return s;
}

absl::Status ValidateGpuDelivery(const ValidateOptions& o) {
  if (!o.delivery) return absl::OkStatus();
  ASSIGN_OR_RETURN(EngineToCheck e, EngineOptions(o));
  return DeliveryReaches(o, e.configure);
}

ValidationReport ValidateStack(const ValidateOptions& o) {
  ValidationReport r;
  gpu::Inventory inv;
  r.steps.push_back(Driver(o, &inv));
  if (!r.steps.back().ok) return r;
  r.steps.push_back(Runtime(o, inv));
  if (!r.steps.back().ok) return r;
  r.steps.push_back(ValidateDevicePlugin(o));
  return r;
}

}  // namespace gpulet::node
