#include "dra/driver.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "k8s/dra/v1/api.grpc.pb.h"
#include "k8s/dra/v1beta1/api.grpc.pb.h"
#include "k8s/pluginregistration/v1/api.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "vgpu/container/container_files.h"
#include "vgpu/rules/rules.h"

namespace gpulet::dra {
namespace {

constexpr char kCdiKindClass[] = "claim";
constexpr int kCheckpointVersion = 1;

// DNS-1123 label (namespace) / subdomain (claim name) and a UUID-ish uid: what the kubelet passes
// ends up in API paths and file names, so anything else is refused before it is used.
bool IsDnsName(const std::string& s, bool subdomain) {
  if (s.empty() || s.size() > (subdomain ? 253u : 63u)) return false;
  for (char c : s) {
    bool ok =
        absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || (subdomain && c == '.');
    if (!ok) return false;
  }
  return absl::ascii_isalnum(s.front()) && absl::ascii_isalnum(s.back());
}
bool IsUid(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!absl::ascii_isalnum(c) && c != '-') return false;
  return true;
}

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

// Whether an allocation result for request `result_request` ("gpu" or "gpu/sub") is covered by a
// config entry naming `requests` (empty: every request).
bool Covers(const nlohmann::json& requests, const std::string& result_request) {
  if (!requests.is_array() || requests.empty()) return true;
  for (const auto& r : requests) {
    if (!r.is_string()) continue;
    std::string n = r.get<std::string>();
    if (result_request == n || absl::StartsWith(result_request, n + "/")) return true;
  }
  return false;
}

std::string InventoryKey(const gpu::Inventory& inv) {
  std::string k = inv.driver_version;
  for (const auto& d : inv.devices) {
    absl::StrAppend(&k, "|", d.uuid, ":", d.mig_enabled);
    for (const auto& m : d.mig_devices) absl::StrAppend(&k, ",", m.uuid);
  }
  return k;
}

}  // namespace

absl::StatusOr<int64_t> ParseQuantity(const std::string& in) {
  // The one quantity parser (vgpu/rules), with DRA's bound: nothing here can be negative.
  auto v = vgpu::ParseIntQuantity(in);
  if (!v.ok() || *v < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("\"", in, "\" is not a whole non-negative quantity (e.g. 4Gi, 512Mi, 30)"));
  return *v;
}

absl::StatusOr<VgpuLimits> ParseVgpuConfig(const nlohmann::json& p) {
  if (!p.is_object()) return absl::InvalidArgumentError("parameters: not an object");
  if (p.value("apiVersion", "") != kConfigApiVersion || p.value("kind", "") != "VgpuConfig")
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters: apiVersion/kind must be ", kConfigApiVersion, "/VgpuConfig, not \"",
        p.value("apiVersion", ""), "/", p.value("kind", ""), "\""));
  for (const auto& [k, v] : p.items())
    if (k != "apiVersion" && k != "kind" && k != "memory" && k != "cores")
      return absl::InvalidArgumentError(absl::StrCat("parameters.", k,
                                                     ": unknown field "
                                                     "(known: memory, cores)"));
  VgpuLimits l;
  if (p.contains("memory")) {
    const auto& m = p["memory"];
    auto bytes = m.is_string()           ? ParseQuantity(m.get<std::string>())
                 : m.is_number_integer() ? absl::StatusOr<int64_t>(m.get<int64_t>())
                                         : absl::InvalidArgumentError("not a quantity");
    if (!bytes.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("parameters.memory: ", bytes.status().message()));
    if (*bytes < static_cast<int64_t>(vgpu::kMemoryUnitBytes) ||
        *bytes % static_cast<int64_t>(vgpu::kMemoryUnitBytes) != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters.memory: ", m.dump(), " must be a multiple of 256Mi, at least 256Mi"));
    l.memory_bytes = *bytes;
  }
  if (p.contains("cores")) {
    const auto& c = p["cores"];
    int64_t v = 0;
    if (!c.is_number_integer() || (v = c.get<int64_t>()) < 1 || v > 100)
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters.cores: ", c.dump(), " must be an integer 1..100 (percent of the GPU)"));
    l.cores = v;
  }
  return l;
}

// ---------------------------------------------------------------------------------------------
// gRPC: the registration service and the DRA service in both API versions (same messages).

template <typename Api>
class DraService final : public Api::DRAPlugin::Service {
 public:
  explicit DraService(Driver* d) : d_(d) {}
  grpc::Status NodePrepareResources(grpc::ServerContext*,
                                    const typename Api::NodePrepareResourcesRequest* req,
                                    typename Api::NodePrepareResourcesResponse* resp) override {
    for (const auto& c : req->claims()) {
      auto& out = (*resp->mutable_claims())[c.uid()];
      auto p = d_->Prepare(c.namespace_(), c.name(), c.uid());
      if (!p.ok()) {
        out.set_error(std::string(p.status().message()));
        spdlog::warn("DRA: prepare {}/{} ({}): {}", c.namespace_(), c.name(), c.uid(),
                     std::string(p.status().message()));
        continue;
      }
      for (const auto& dev : p->devices) {
        auto* o = out.add_devices();
        for (const auto& r : dev.requests) o->add_request_names(r);
        o->set_pool_name(dev.pool);
        o->set_device_name(dev.device);
        for (const auto& id : dev.cdi_ids) o->add_cdi_device_ids(id);
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                      const typename Api::NodeUnprepareResourcesRequest* req,
                                      typename Api::NodeUnprepareResourcesResponse* resp) override {
    for (const auto& c : req->claims()) {
      auto& out = (*resp->mutable_claims())[c.uid()];
      if (absl::Status s = d_->Unprepare(c.uid()); !s.ok()) out.set_error(std::string(s.message()));
    }
    return grpc::Status::OK;
  }

 private:
  Driver* d_;
};

struct V1 {
  using NodePrepareResourcesRequest =
      ::k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesRequest;
  using NodePrepareResourcesResponse =
      ::k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse;
  using NodeUnprepareResourcesRequest =
      ::k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesRequest;
  using NodeUnprepareResourcesResponse =
      ::k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse;
  using DRAPlugin = ::k8s::io::kubelet::pkg::apis::dra::v1::DRAPlugin;
};
struct V1beta1 {
  using NodePrepareResourcesRequest =
      ::k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesRequest;
  using NodePrepareResourcesResponse =
      ::k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesResponse;
  using NodeUnprepareResourcesRequest =
      ::k8s::io::kubelet::pkg::apis::dra::v1beta1::NodeUnprepareResourcesRequest;
  using NodeUnprepareResourcesResponse =
      ::k8s::io::kubelet::pkg::apis::dra::v1beta1::NodeUnprepareResourcesResponse;
  using DRAPlugin = ::k8s::io::kubelet::pkg::apis::dra::v1beta1::DRAPlugin;
};

class RegistrationService final : public pluginregistration::Registration::Service {
 public:
  RegistrationService(std::string driver, std::string endpoint)
      : driver_(std::move(driver)), endpoint_(std::move(endpoint)) {}
  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    info->set_type("DRAPlugin");
    info->set_name(driver_);
    info->set_endpoint(endpoint_);
    info->add_supported_versions("v1.DRAPlugin");
    info->add_supported_versions("v1beta1.DRAPlugin");
    return grpc::Status::OK;
  }
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* s,
                                        pluginregistration::RegistrationStatusResponse*) override {
    if (s->plugin_registered())
      spdlog::info("DRA: the kubelet registered driver {}", driver_);
    else
      spdlog::error("DRA: the kubelet refused driver {}: {}", driver_, s->error());
    return grpc::Status::OK;
  }

 private:
  std::string driver_, endpoint_;
};

struct Driver::Served {
  std::unique_ptr<DraService<V1>> v1;
  std::unique_ptr<DraService<V1beta1>> v1beta1;
  std::unique_ptr<RegistrationService> reg;
  std::unique_ptr<grpc::Server> service, registration;
};

// ---------------------------------------------------------------------------------------------

Driver::Driver(gpu::GpuLayer* gpu, k8s::Client* api, HealthFn healthy,
               const kubelet::ChangeNotifier* health_changes, DriverOptions options)
    : gpu_(gpu),
      api_(api),
      healthy_(std::move(healthy)),
      changes_(health_changes),
      options_(std::move(options)),
      publisher_(api, options_.node_name, options_.driver) {}

Driver::~Driver() { Stop(); }

std::string Driver::registration_socket() const {
  return absl::StrCat(options_.kubelet_dir, "/plugins_registry/", options_.driver, "-reg.sock");
}
std::string Driver::service_socket() const {
  return absl::StrCat(options_.kubelet_dir, "/plugins/", options_.driver, "/dra.sock");
}

int64_t Driver::slice_generation() const {
  absl::MutexLock l(const_cast<absl::Mutex*>(&sync_mu_));
  return publisher_.generation();
}

std::vector<PreparedClaim> Driver::prepared() const {
  absl::MutexLock l(&mu_);
  std::vector<PreparedClaim> out;
  for (const auto& [uid, c] : claims_) out.push_back(c);
  return out;
}

absl::Status Driver::RefreshInventory() {
  ASSIGN_OR_RETURN(gpu::Inventory inv, gpu_->GetInventory());
  bool changed = devices_.empty() || InventoryKey(inv) != InventoryKey(inventory_);
  if (!changed) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto devices, BuildDevices(inv, options_.devices));
  runtime::CdiGenerateOptions co = options_.cdi;
  co.names = runtime::NameStrategy::kUuid;
  std::vector<std::string> warnings;
  auto spec = runtime::GenerateCdiSpec(inv, co, &warnings);
  if (!spec.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("DRA: cannot build the devices' CDI edits: ", spec.status().message()));
  for (const auto& w : warnings) spdlog::warn("DRA: CDI: {}", w);
  inventory_ = std::move(inv);
  devices_ = std::move(devices);
  by_name_.clear();
  for (size_t i = 0; i < devices_.size(); ++i) by_name_[devices_[i].name] = i;
  base_spec_ = *std::move(spec);
  return absl::OkStatus();
}

absl::Status Driver::Start() {
  if (options_.node_name.empty()) return absl::InvalidArgumentError("DRA: no node name");
  if (!api_) return absl::InvalidArgumentError("DRA: no API server client");
  RootedFilesystem fs;
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(RefreshInventory());
    RETURN_IF_ERROR(fs.MakeDirs(options_.state_dir, 0700));
    RETURN_IF_ERROR(fs.MakeDirs(options_.cdi_dir, 0755));
    RETURN_IF_ERROR(LoadCheckpoint());
  }
  // Read before the first sync: a change after it must wake the sync thread, which may start late.
  uint64_t seen = changes_ ? changes_->generation() : 0;
  // A slice the API refuses must not keep the kubelet plugin from serving claims already
  // prepared: logged, retried by the sync thread.
  absl::Status first = Sync();
  if (!first.ok()) spdlog::warn("DRA: {}", std::string(first.message()));
  if (!options_.kubelet_dir.empty()) {
    auto served = std::make_unique<Served>();
    std::string svc = service_socket(), reg = registration_socket();
    for (const std::string& p : {svc, reg}) {
      RETURN_IF_ERROR(fs.MakeDirs(std::filesystem::path(p).parent_path().string(), 0750));
      ::unlink(p.c_str());  // a socket left by a previous run
    }
    served->v1 = std::make_unique<DraService<V1>>(this);
    served->v1beta1 = std::make_unique<DraService<V1beta1>>(this);
    grpc::ServerBuilder b1;
    b1.AddListeningPort("unix:" + svc, grpc::InsecureServerCredentials());
    b1.RegisterService(served->v1.get());
    b1.RegisterService(served->v1beta1.get());
    served->service = b1.BuildAndStart();
    if (!served->service) return absl::UnavailableError("DRA: cannot serve on " + svc);
    // Registration last: the kubelet may call the endpoint as soon as it sees this socket.
    served->reg = std::make_unique<RegistrationService>(options_.driver, svc);
    grpc::ServerBuilder b2;
    b2.AddListeningPort("unix:" + reg, grpc::InsecureServerCredentials());
    b2.RegisterService(served->reg.get());
    served->registration = b2.BuildAndStart();
    if (!served->registration) return absl::UnavailableError("DRA: cannot serve on " + reg);
    served_ = std::move(served);
    spdlog::info("DRA: driver {} on {} (registration {})", options_.driver, svc, reg);
  }
  {
    absl::MutexLock l(&mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this, seen, failed = !first.ok()] { Loop(seen, failed); });
  return absl::OkStatus();
}

void Driver::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (served_) {
    // The registration socket first: the kubelet stops calling, then the service goes.
    served_->registration->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    ::unlink(registration_socket().c_str());
    served_->service->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    ::unlink(service_socket().c_str());
    served_.reset();
  }
}

void Driver::Loop(uint64_t seen, bool failed) {
  const auto resync = absl::ToChronoNanoseconds(options_.resync);
  Clock::TimePoint last = options_.clock->Now();
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    WritePendingStatus();
    uint64_t now_gen = seen;
    if (changes_) {
      now_gen = changes_->WaitChange(seen, failed ? absl::Seconds(1) : absl::Milliseconds(200));
    } else {
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (now_gen == seen && !failed && options_.clock->Now() - last < resync) continue;
    seen = now_gen;
    last = options_.clock->Now();
    absl::Status s = Sync();
    if (!s.ok() && !failed) spdlog::warn("DRA: {}", std::string(s.message()));
    failed = !s.ok();
  }
}

void Driver::WritePendingStatus() {
  std::vector<PreparedClaim> todo;
  {
    absl::MutexLock l(&mu_);
    for (const auto& uid : status_pending_)
      if (auto it = claims_.find(uid); it != claims_.end()) todo.push_back(it->second);
    status_pending_.clear();
  }
  for (const auto& c : todo)
    if (absl::Status s = WriteDeviceStatus(c); !s.ok())
      spdlog::warn("DRA: status of claim {}/{}: {}", c.ns, c.name, std::string(s.message()));
}

absl::Status Driver::Sync() {
  absl::MutexLock sl(&sync_mu_);
  nlohmann::json entries = nlohmann::json::array();
  std::vector<PreparedClaim> affected;
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(RefreshInventory());
    std::set<std::string> unhealthy;
    for (const DraDevice& d : devices_) {
      if (healthy_ && !healthy_(d.gpu, d.mig)) {
        unhealthy.insert(d.name);
        continue;  // an unhealthy device leaves the slice: nothing new is allocated on it
      }
      entries.push_back(d.entry);
    }
    if (unhealthy != unhealthy_) {
      for (const auto& [uid, c] : claims_)
        for (const auto& dev : c.devices)
          if (unhealthy.count(dev.device) != unhealthy_.count(dev.device)) {
            affected.push_back(c);
            break;
          }
      unhealthy_ = std::move(unhealthy);
    }
  }
  RETURN_IF_ERROR(publisher_.Publish(entries));
  if (options_.write_device_status)
    for (const auto& c : affected)
      if (absl::Status s = WriteDeviceStatus(c); !s.ok())
        spdlog::warn("DRA: status of claim {}/{}: {}", c.ns, c.name, std::string(s.message()));
  return absl::OkStatus();
}

absl::StatusOr<PreparedClaim> Driver::Prepare(const std::string& ns, const std::string& name,
                                              const std::string& uid) {
  if (!IsDnsName(ns, false) || !IsDnsName(name, true) || !IsUid(uid))
    return absl::InvalidArgumentError(absl::StrCat("claim \"", ns, "/", name, "\" uid \"", uid,
                                                   "\": not a valid namespace, name and uid"));
  {
    absl::MutexLock l(&mu_);
    if (auto it = claims_.find(uid); it != claims_.end()) return it->second;  // idempotent
  }
  auto claim =
      api_->Call("GET", absl::StrCat(kResourceApi, "/namespaces/", ns, "/resourceclaims/", name));
  if (!claim.ok())
    return absl::Status(claim.status().code(), absl::StrCat("reading ResourceClaim ", ns, "/", name,
                                                            ": ", claim.status().message()));
  const nlohmann::json& c = *claim;
  if (c["metadata"].value("uid", "") != uid)
    return absl::FailedPreconditionError(absl::StrCat("ResourceClaim ", ns, "/", name, " has uid ",
                                                      c["metadata"].value("uid", ""), ", not ", uid,
                                                      " (deleted and created again?)"));
  const nlohmann::json* alloc = nullptr;
  if (c.contains("status") && c["status"].contains("allocation") &&
      c["status"]["allocation"].contains("devices"))
    alloc = &c["status"]["allocation"]["devices"];
  if (!alloc)
    return absl::FailedPreconditionError(
        absl::StrCat("ResourceClaim ", ns, "/", name, " is not allocated"));

  // Opaque configs of this driver, class ones first (the API lists them in that order): a later
  // entry overrides an earlier one for the requests it covers.
  struct Cfg {
    nlohmann::json requests;
    VgpuLimits limits;
  };
  std::vector<Cfg> configs;
  for (const auto& cfg : alloc->value("config", nlohmann::json::array())) {
    if (!cfg.contains("opaque") || cfg["opaque"].value("driver", "") != options_.driver) continue;
    auto lim = ParseVgpuConfig(cfg["opaque"].value("parameters", nlohmann::json()));
    if (!lim.ok())
      return absl::InvalidArgumentError(absl::StrCat("ResourceClaim ", ns, "/", name,
                                                     ": config of ", options_.driver, ": ",
                                                     lim.status().message()));
    configs.push_back({cfg.value("requests", nlohmann::json::array()), *lim});
  }

  PreparedClaim out;
  out.ns = ns;
  out.name = name;
  out.uid = uid;
  runtime::CdiSpec spec;
  spec.kind = absl::StrCat(options_.driver, "/", kCdiKindClass);
  absl::MutexLock l(&mu_);
  if (auto it = claims_.find(uid); it != claims_.end()) return it->second;  // raced with itself
  spec.edits = base_spec_.edits;
  std::map<std::string, int> used;
  int limited = 0;
  for (const auto& r : alloc->value("results", nlohmann::json::array())) {
    if (r.value("driver", "") != options_.driver) continue;  // another driver's device
    std::string pool = r.value("pool", ""), device = r.value("device", "");
    std::string request = r.value("request", "");
    if (pool != options_.node_name)
      return absl::FailedPreconditionError(
          absl::StrCat("ResourceClaim ", ns, "/", name, ": device ", device, " is from pool ", pool,
                       ", not this node's (", options_.node_name, ")"));
    auto at = by_name_.find(device);
    if (at == by_name_.end())
      return absl::NotFoundError(absl::StrCat("ResourceClaim ", ns, "/", name, ": device ", device,
                                              " is not on node ", options_.node_name,
                                              " (any more)"));
    const DraDevice& d = devices_[at->second];
    if (healthy_ && !healthy_(d.gpu, d.mig))
      return absl::UnavailableError(absl::StrCat("ResourceClaim ", ns, "/", name, ": device ",
                                                 device, " (", d.uuid, ") is unhealthy"));
    VgpuLimits lim;
    for (const auto& cfg : configs) {
      if (!Covers(cfg.requests, request)) continue;
      if (cfg.limits.memory_bytes) lim.memory_bytes = cfg.limits.memory_bytes;
      if (cfg.limits.cores) lim.cores = cfg.limits.cores;
    }
    // Consumable capacity: what the scheduler set aside for this claim is the limit.
    if (r.contains("consumedCapacity") && r["consumedCapacity"].is_object()) {
      const auto& cc = r["consumedCapacity"];
      if (cc.contains("memory") && cc["memory"].is_string()) {
        ASSIGN_OR_RETURN(int64_t m, ParseQuantity(cc["memory"].get<std::string>()));
        // The whole GPU's share (the default, on the 256Mi grid) is no limit.
        if (m < static_cast<int64_t>(WholeShareBytes(d.memory_bytes))) lim.memory_bytes = m;
      }
      if (cc.contains("cores") && cc["cores"].is_string()) {
        ASSIGN_OR_RETURN(int64_t k, ParseQuantity(cc["cores"].get<std::string>()));
        if (k < 100) lim.cores = k;
      }
    }
    if (lim.memory_bytes > static_cast<int64_t>(d.memory_bytes))
      return absl::InvalidArgumentError(
          absl::StrCat("ResourceClaim ", ns, "/", name, ": memory limit ", lim.memory_bytes >> 20,
                       "Mi is more than device ", device, " has (", d.memory_bytes >> 20, "Mi)"));
    const runtime::CdiDevice* base = nullptr;
    for (const auto& bd : base_spec_.devices)
      if (bd.name == d.uuid) base = &bd;
    if (!base) return absl::InternalError(absl::StrCat("no CDI edits for ", d.uuid));
    runtime::CdiDevice cd;
    int n = used[device]++;
    cd.name = absl::StrCat(uid, "-", device, n ? absl::StrCat("-", n) : "");
    cd.edits = base->edits;
    if (lim.any()) {
      if (++limited > 1)
        return absl::InvalidArgumentError(absl::StrCat(
            "ResourceClaim ", ns, "/", name,
            ": more than one device with vGPU limits (a fractional claim takes one device)"));
      out.accounting_dir = absl::StrCat(options_.state_dir, "/claims/", uid);
      RETURN_IF_ERROR(MakeDirs(absl::StrCat(options_.state_dir, "/claims"), 0700));
      vgpu::ContainerLimits limits;
      // The interposer's GPU by UUID, as the device plugin's vGPU grant names it
      // (NVIDIA_VISIBLE_DEVICES is "void" in a CDI container).
      limits.uuid = d.uuid;
      limits.memory_bytes =
          static_cast<uint64_t>(lim.memory_bytes ? lim.memory_bytes : d.memory_bytes);
      limits.cores = lim.cores ? lim.cores : 100;
      limits.ceiling = limits.cores;
      // Containers of any user open the accounting file (the claim's pods are not known here).
      ASSIGN_OR_RETURN(
          vgpu::ContractFiles files,
          vgpu::PrepareGrantDir(out.accounting_dir, limits,
                                {-1, -1, options_.accounting_tmpfs, options_.library_host_path,
                                 options_.state_dir + "/ld.so.preload"}));
      vgpu::ContainerContract contract = vgpu::BuildContract(limits, files);
      for (const auto& [k, v] : contract.env) cd.edits.env.push_back(absl::StrCat(k, "=", v));
      for (const auto& m : contract.mounts)
        cd.edits.mounts.push_back(
            {m.host_path, m.container_path, "bind", {"rbind", m.read_only ? "ro" : "rw"}});
    }
    PreparedDevice pd;
    if (!request.empty()) pd.requests.push_back(request);
    pd.pool = pool;
    pd.device = device;
    pd.share_id = r.value("shareID", "");
    pd.cdi_ids.push_back(absl::StrCat(spec.kind, "=", cd.name));
    spec.devices.push_back(std::move(cd));
    out.devices.push_back(std::move(pd));
  }
  if (out.devices.empty())
    return absl::FailedPreconditionError(absl::StrCat(
        "ResourceClaim ", ns, "/", name, " has no device of driver ", options_.driver));
  spec.cdi_version = runtime::MinimumCdiVersion(spec);
  out.spec_file = absl::StrCat(options_.cdi_dir, "/", options_.driver, "-claim_", uid, ".json");
  // The spec before the checkpoint: a crash in between leaves a file that the next prepare
  // rewrites, never a checkpointed claim without its spec.
  out.spec_text = runtime::CdiSpecToJson(spec);
  RETURN_IF_ERROR(WriteFileAtomic(out.spec_file, out.spec_text, 0644));
  if (absl::Status s = SaveClaim(out); !s.ok()) {
    ::unlink(out.spec_file.c_str());
    return s;
  }
  claims_[uid] = out;
  // Written by the sync thread: the kubelet's call does not wait for two more API round trips.
  if (options_.write_device_status) status_pending_.insert(uid);
  return out;
}

absl::Status Driver::Unprepare(const std::string& uid) {
  if (!IsUid(uid))
    return absl::InvalidArgumentError(absl::StrCat("claim uid \"", uid, "\": not valid"));
  absl::MutexLock l(&mu_);
  auto it = claims_.find(uid);
  if (it == claims_.end()) return absl::OkStatus();  // never prepared, or already unprepared
  PreparedClaim c = it->second;
  if (::unlink(c.spec_file.c_str()) != 0 && errno != ENOENT)
    return absl::InternalError(absl::StrCat("removing ", c.spec_file, ": ", strerror(errno)));
  if (absl::Status s = vgpu::RemoveGrantDir(c.accounting_dir); !s.ok())
    spdlog::warn("DRA: {}", std::string(s.message()));
  if (::unlink(ClaimFile(uid).c_str()) != 0 && errno != ENOENT)
    return absl::InternalError(absl::StrCat("removing ", ClaimFile(uid), ": ", strerror(errno)));
  claims_.erase(it);
  return absl::OkStatus();
}

// One file per prepared claim (<state_dir>/prepared/<uid>.json): a prepare or unprepare writes
// or removes only its own claim's file, so its cost does not grow with the claims the node holds.
std::string Driver::ClaimFile(const std::string& uid) const {
  return absl::StrCat(options_.state_dir, "/prepared/", uid, ".json");
}

absl::Status Driver::SaveClaim(const PreparedClaim& c) {
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& d : c.devices) {
    devs.push_back({{"requests", d.requests},
                    {"pool", d.pool},
                    {"device", d.device},
                    {"cdiDeviceIDs", d.cdi_ids}});
    if (!d.share_id.empty()) devs.back()["shareID"] = d.share_id;
  }
  // The spec itself, so a CDI directory on tmpfs (lost at reboot) is rewritten at start.
  nlohmann::json entry = {{"version", kCheckpointVersion},
                          {"uid", c.uid},
                          {"namespace", c.ns},
                          {"name", c.name},
                          {"devices", devs},
                          {"specFile", c.spec_file},
                          {"accountingDir", c.accounting_dir},
                          {"spec", c.spec_text}};
  return WriteFileAtomic(ClaimFile(c.uid), entry.dump(), 0600);
}

absl::Status Driver::LoadCheckpoint() {
  std::string dir = options_.state_dir + "/prepared";
  RETURN_IF_ERROR(RootedFilesystem().MakeDirs(dir, 0700));
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    std::string path = f.path().string();
    if (f.path().extension() != ".json") continue;  // a temporary file of an interrupted write
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    nlohmann::json e = nlohmann::json::parse(text, nullptr, false);
    if (!e.is_object() || e.value("version", 0) != kCheckpointVersion)
      return absl::DataLossError(
          absl::StrCat(path, ": not a gpulet DRA claim checkpoint of version ", kCheckpointVersion,
                       "; move it away to forget the claim"));
    PreparedClaim c;
    try {
      c.uid = e.at("uid").get<std::string>();
      c.ns = e.at("namespace").get<std::string>();
      c.name = e.at("name").get<std::string>();
      c.spec_file = e.at("specFile").get<std::string>();
      c.accounting_dir = e.value("accountingDir", "");
      c.spec_text = e.value("spec", "");
      for (const auto& d : e.at("devices")) {
        PreparedDevice pd;
        pd.requests = d.value("requests", std::vector<std::string>{});
        pd.pool = d.at("pool").get<std::string>();
        pd.device = d.at("device").get<std::string>();
        pd.share_id = d.value("shareID", "");
        pd.cdi_ids = d.value("cdiDeviceIDs", std::vector<std::string>{});
        c.devices.push_back(std::move(pd));
      }
    } catch (const nlohmann::json::exception& ex) {
      return absl::DataLossError(JsonErrorText(path, ex.what()));
    }
    if (!RootedFilesystem().Exists(c.spec_file) && !c.spec_text.empty()) {
      RETURN_IF_ERROR(WriteFileAtomic(c.spec_file, c.spec_text, 0644));
      spdlog::info("DRA: rewrote the CDI spec of claim {}/{} from the checkpoint", c.ns, c.name);
    }
    claims_[c.uid] = std::move(c);
  }
  if (ec) return absl::InternalError(absl::StrCat("reading ", dir, ": ", ec.message()));
  spdlog::info("DRA: {} prepared claims from {}", claims_.size(), dir);
  return absl::OkStatus();
}

absl::Status Driver::WriteDeviceStatus(const PreparedClaim& c) {
  std::string path = absl::StrCat(kResourceApi, "/namespaces/", c.ns, "/resourceclaims/", c.name);
  ASSIGN_OR_RETURN(nlohmann::json claim, api_->Call("GET", path));
  if (claim["metadata"].value("uid", "") != c.uid) return absl::OkStatus();  // gone
  nlohmann::json devices = nlohmann::json::array();
  nlohmann::json old = claim["status"].value("devices", nlohmann::json::array());
  for (const auto& d : old)
    if (d.value("driver", "") != options_.driver) devices.push_back(d);  // other drivers' entries
  std::set<std::string> unhealthy;
  std::map<std::string, std::string> uuid;
  {
    absl::MutexLock l(&mu_);
    unhealthy = unhealthy_;
    for (const auto& d : devices_) uuid[d.name] = d.uuid;
  }
  for (const auto& d : c.devices) {
    bool bad = unhealthy.count(d.device) > 0;
    std::string since = Now();
    for (const auto& o : old)  // keep the transition time while the status does not change
      if (o.value("driver", "") == options_.driver && o.value("device", "") == d.device &&
          o.value("shareID", "") == d.share_id)
        for (const auto& cond : o.value("conditions", nlohmann::json::array()))
          if (cond.value("type", "") == "Ready" &&
              cond.value("status", "") == (bad ? "False" : "True"))
            since = cond.value("lastTransitionTime", since);
    devices.push_back(
        {{"driver", options_.driver},
         {"pool", d.pool},
         {"device", d.device},
         {"conditions",
          {{{"type", "Ready"},
            {"status", bad ? "False" : "True"},
            {"reason", bad ? "DeviceUnhealthy" : "Prepared"},
            {"message", bad ? absl::StrCat("GPU ", uuid[d.device],
                                           " is unhealthy (XID or lost); the pod should be moved")
                            : absl::StrCat("prepared on ", options_.node_name)},
            {"lastTransitionTime", since}}}},
         {"data", {{"uuid", uuid[d.device]}, {"cdiDeviceIDs", d.cdi_ids}}}});
    if (!d.share_id.empty()) devices.back()["shareID"] = d.share_id;
  }
  claim["status"]["devices"] = devices;
  return api_->Call("PUT", path + "/status", &claim).status();
}

}  // namespace gpulet::dra
