#include "testing/kubelet/probe.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "k8s/podresources/v1/api.grpc.pb.h"

namespace gpulet::emu::probe {
namespace {

template <typename C>
std::string Sorted(const C& ids) {
  std::vector<std::string> v(ids.begin(), ids.end());
  std::sort(v.begin(), v.end());
  return v.empty() ? "-" : absl::StrJoin(v, ",");
}

std::string Id(int n) { return absl::StrCat("dev-", n); }

}  // namespace

std::string StatusLine(const grpc::Status& s) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  int c = static_cast<int>(s.error_code());
  if (c == 0) return "OK";
  std::string name = c > 0 && c <= 16 ? kNames[c] : absl::StrCat("CODE_", c);
  return absl::StrCat(name, " \"", s.error_message(), "\"");
}

ProbePlugin::ProbePlugin(std::string dir) : dir_(std::move(dir)) {}
ProbePlugin::~ProbePlugin() { Stop(); }

bool ProbePlugin::Serve() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = false;
  }
  std::remove(socket().c_str());
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + socket(), grpc::InsecureServerCredentials());
  b.RegisterService(this);
  server_ = b.BuildAndStart();
  return server_ != nullptr;
}

std::string TryRegister(const std::string& dir, const std::string& version,
                        const std::string& resource) {
  auto ch =
      grpc::CreateChannel("unix:" + dir + "/kubelet.sock", grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(ch);
  v1beta1::RegisterRequest req;
  req.set_version(version);
  req.set_endpoint(kEndpoint);
  req.set_resource_name(resource);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  req.mutable_options()->set_pre_start_required(true);
  v1beta1::Empty e;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return StatusLine(stub->Register(&ctx, req, &e));
}

void ProbePlugin::Register() {
  int before;
  {
    std::lock_guard<std::mutex> l(mu_);
    before = list_and_watch_calls_;
  }
  std::string r = TryRegister(dir_, "v1beta1", kResource);
  std::unique_lock<std::mutex> l(mu_);
  // The kubelet starts ListAndWatch from a goroutine, before or after its answer to Register:
  // waiting for it keeps the transcript's order the same from run to run.
  if (r == "OK" &&
      !cv_.wait_for(l, std::chrono::seconds(10), [&] { return list_and_watch_calls_ > before; }))
    r = "OK, but no ListAndWatch within 10 s";
  Record("register: " + r);
}

void ProbePlugin::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    server_.reset();
  }
}

void ProbePlugin::SetHealthy(int n, bool healthy) {
  std::lock_guard<std::mutex> l(mu_);
  healthy_[n] = healthy;
  ++version_;
  cv_.notify_all();
}

void ProbePlugin::Note(const std::string& line) {
  std::lock_guard<std::mutex> l(mu_);
  Record(line);
}

void ProbePlugin::Record(const std::string& line) {
  lines_.push_back(line);
  if (sink_) {
    std::fprintf(sink_, "%s\n", line.c_str());
    std::fflush(sink_);
  }
  cv_.notify_all();
}

std::vector<std::string> ProbePlugin::Lines() const {
  std::lock_guard<std::mutex> l(mu_);
  return lines_;
}

bool ProbePlugin::WaitFor(const std::string& prefix, size_t skip,
                          std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, timeout, [&] {
    for (size_t i = skip; i < lines_.size(); ++i)
      if (lines_[i].rfind(prefix, 0) == 0) return true;
    return false;
  });
}

grpc::Status ProbePlugin::GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                                 v1beta1::DevicePluginOptions* o) {
  std::lock_guard<std::mutex> l(mu_);
  Record("call GetDevicePluginOptions");
  o->set_get_preferred_allocation_available(true);
  o->set_pre_start_required(true);
  return grpc::Status::OK;
}

grpc::Status ProbePlugin::ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                                       grpc::ServerWriter<v1beta1::ListAndWatchResponse>* w) {
  std::unique_lock<std::mutex> l(mu_);
  ++list_and_watch_calls_;
  Record("call ListAndWatch");
  int sent = -1;
  while (!stopping_ && !ctx->IsCancelled()) {
    if (sent != version_) {
      v1beta1::ListAndWatchResponse r;
      for (int i = 0; i < 4; ++i) {
        auto* d = r.add_devices();
        d->set_id(Id(i));
        d->set_health(healthy_[i] ? "Healthy" : "Unhealthy");
      }
      sent = version_;
      l.unlock();
      bool ok = w->Write(r);
      l.lock();
      if (!ok) break;
    }
    cv_.wait_for(l, std::chrono::milliseconds(50));
  }
  return grpc::Status::OK;
}

grpc::Status ProbePlugin::GetPreferredAllocation(grpc::ServerContext*,
                                                 const v1beta1::PreferredAllocationRequest* req,
                                                 v1beta1::PreferredAllocationResponse* resp) {
  std::lock_guard<std::mutex> l(mu_);
  ++preferred_calls_;
  for (const auto& cr : req->container_requests()) {
    std::vector<std::string> answer;
    if (preferred_calls_ == 1) {
      std::vector<std::string> avail(cr.available_deviceids().begin(),
                                     cr.available_deviceids().end());
      std::sort(avail.rbegin(), avail.rend());
      for (const auto& id : avail)
        if (static_cast<int>(answer.size()) < cr.allocation_size()) answer.push_back(id);
    } else {
      answer.push_back("dev-9");
    }
    auto* out = resp->add_container_responses();
    for (const auto& id : answer) out->add_deviceids(id);
    Record(absl::StrCat("call GetPreferredAllocation available=", Sorted(cr.available_deviceids()),
                        " must_include=", Sorted(cr.must_include_deviceids()),
                        " size=", cr.allocation_size(), " -> ", Sorted(answer)));
  }
  return grpc::Status::OK;
}

grpc::Status ProbePlugin::Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                                   v1beta1::AllocateResponse* resp) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> per;
  for (const auto& cr : req->container_requests()) {
    per.push_back(Sorted(cr.devices_ids()));
    auto* out = resp->add_container_responses();
    (*out->mutable_envs())["PROBE_DEVICES"] = Sorted(cr.devices_ids());
  }
  Record("call Allocate containers=" + absl::StrJoin(per, " "));
  return grpc::Status::OK;
}

grpc::Status ProbePlugin::PreStartContainer(grpc::ServerContext*,
                                            const v1beta1::PreStartContainerRequest* req,
                                            v1beta1::PreStartContainerResponse*) {
  std::lock_guard<std::mutex> l(mu_);
  Record("call PreStartContainer ids=" + Sorted(req->devices_ids()));
  return grpc::Status::OK;
}

std::vector<std::string> PodResourcesView(const std::string& socket) {
  auto ch = grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(ch);
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(10); };
  std::vector<std::string> out;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::ListPodResourcesRequest req;
    v1::ListPodResourcesResponse resp;
    grpc::Status st = stub->List(&ctx, req, &resp);
    std::map<std::string, std::string> held;  // ns/pod/container -> ids
    std::vector<std::string> listed;          // the probe's pods, with or without devices
    for (const auto& p : resp.pod_resources())
      if (p.name().rfind("probe-kp-", 0) == 0) listed.push_back(p.name());
    for (const auto& p : resp.pod_resources())
      for (const auto& c : p.containers()) {
        std::vector<std::string> ids;
        for (const auto& d : c.devices())
          if (d.resource_name() == kResource)
            ids.insert(ids.end(), d.device_ids().begin(), d.device_ids().end());
        if (!ids.empty())
          held[absl::StrCat(p.namespace_(), "/", p.name(), "/", c.name())] = Sorted(ids);
      }
    std::vector<std::string> parts;
    for (const auto& [k, v] : held) parts.push_back(k + "=" + v);
    out.push_back("podresources_list: " +
                  (st.ok() ? (parts.empty() ? "-" : absl::StrJoin(parts, "; ")) : StatusLine(st)));
    out.push_back("podresources_pods: " + (st.ok() ? Sorted(listed) : StatusLine(st)));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::AllocatableResourcesRequest req;
    v1::AllocatableResourcesResponse resp;
    grpc::Status st = stub->GetAllocatableResources(&ctx, req, &resp);
    std::vector<std::string> ids;
    for (const auto& d : resp.devices())
      if (d.resource_name() == kResource)
        ids.insert(ids.end(), d.device_ids().begin(), d.device_ids().end());
    out.push_back("podresources_allocatable: " + (st.ok() ? Sorted(ids) : StatusLine(st)));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::GetPodResourcesRequest req;
    req.set_pod_name("probe-missing");
    req.set_pod_namespace("default");
    v1::GetPodResourcesResponse resp;
    out.push_back("podresources_get_missing: " + StatusLine(stub->Get(&ctx, req, &resp)));
  }
  return out;
}

}  // namespace gpulet::emu::probe
