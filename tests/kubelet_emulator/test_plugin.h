// A tiny device plugin for the emulator's own tests: a real gRPC DevicePlugin server on a unix
// socket in the device-plugin directory, with devices and behaviour set by the test. Not product
// code (the product's plugin lives in src/plugin). Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"

namespace gpulet::emu::testplugin {

struct Dev {
  std::string id;
  bool healthy = true;
  int numa = -1;  // -1: no topology
};

class TestPlugin : public v1beta1::DevicePlugin::Service {
 public:
  TestPlugin(std::string dir, std::string endpoint, std::string resource, std::vector<Dev> devs)
      : dir_(std::move(dir)),
        endpoint_(std::move(endpoint)),
        resource_(std::move(resource)),
        devs_(std::move(devs)) {}
  ~TestPlugin() { Stop(); }

  // Options sent with Register.
  bool preferred = false;
  bool pre_start = false;
  std::vector<std::string>
      preference;  // returned by GetPreferredAllocation (filtered to available)
  grpc::Status allocate_error = grpc::Status::OK;
  // When set, Register sends this preferred-allocation option instead of `preferred` (which
  // GetDevicePluginOptions still answers): a plugin whose two answers disagree.
  std::optional<bool> register_preferred;

  std::string socket() const { return dir_ + "/" + endpoint_; }

  bool Serve() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = false;
    }
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + socket(), grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    return server_ != nullptr;
  }

  grpc::Status Register(const std::string& version = "v1beta1", std::string resource = "") {
    auto ch =
        grpc::CreateChannel("unix:" + dir_ + "/kubelet.sock", grpc::InsecureChannelCredentials());
    auto stub = v1beta1::Registration::NewStub(ch);
    v1beta1::RegisterRequest req;
    req.set_version(version);
    req.set_endpoint(endpoint_);
    req.set_resource_name(resource.empty() ? resource_ : resource);
    req.mutable_options()->set_get_preferred_allocation_available(
        register_preferred.value_or(preferred));
    req.mutable_options()->set_pre_start_required(pre_start);
    v1beta1::Empty e;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Register(&ctx, req, &e);
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
      server_.reset();
    }
  }

  void SetHealth(const std::string& id, bool healthy) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& d : devs_)
      if (d.id == id) d.healthy = healthy;
    ++version_;
    cv_.notify_all();
  }

  std::vector<std::vector<std::string>> allocate_calls() const {
    std::lock_guard<std::mutex> l(mu_);
    return allocate_calls_;
  }
  std::vector<std::vector<std::string>> prestart_calls() const {
    std::lock_guard<std::mutex> l(mu_);
    return prestart_calls_;
  }
  std::vector<std::string> last_preferred_available() const {
    std::lock_guard<std::mutex> l(mu_);
    return last_available_;
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* o) override {
    o->set_get_preferred_allocation_available(preferred);
    o->set_pre_start_required(pre_start);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* w) override {
    std::unique_lock<std::mutex> l(mu_);
    int sent = -1;
    while (!stopping_ && !ctx->IsCancelled()) {
      if (sent != version_) {
        v1beta1::ListAndWatchResponse r;
        for (const auto& d : devs_) {
          auto* x = r.add_devices();
          x->set_id(d.id);
          x->set_health(d.healthy ? "Healthy" : "Unhealthy");
          if (d.numa >= 0) x->mutable_topology()->add_nodes()->set_id(d.numa);
        }
        sent = version_;
        l.unlock();
        bool ok = w->Write(r);
        l.lock();
        if (!ok) break;
      }
      cv_.wait_for(l, std::chrono::milliseconds(20));
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& cr : req->container_requests()) {
      last_available_.assign(cr.available_deviceids().begin(), cr.available_deviceids().end());
      std::set<std::string> avail(last_available_.begin(), last_available_.end());
      auto* out = resp->add_container_responses();
      for (const auto& id : preference)
        if (avail.count(id) && out->deviceids_size() < cr.allocation_size()) out->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!allocate_error.ok()) return allocate_error;
    for (const auto& cr : req->container_requests()) {
      std::vector<std::string> ids(cr.devices_ids().begin(), cr.devices_ids().end());
      allocate_calls_.push_back(ids);
      auto* out = resp->add_container_responses();
      (*out->mutable_envs())["TEST_VISIBLE_DEVICES"] = absl::StrJoin(ids, ",");
      for (const auto& id : ids) {
        auto* d = out->add_devices();
        d->set_container_path("/dev/" + id);
        d->set_host_path("/dev/" + id);
        d->set_permissions("rw");
        out->add_cdi_devices()->set_name("example.com/dev=" + id);
      }
      auto* m = out->add_mounts();
      m->set_container_path("/opt/lib");
      m->set_host_path("/host/lib");
      m->set_read_only(true);
      (*out->mutable_annotations())["example.com/devices"] = absl::StrJoin(ids, ",");
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse*) override {
    std::lock_guard<std::mutex> l(mu_);
    prestart_calls_.emplace_back(req->devices_ids().begin(), req->devices_ids().end());
    return grpc::Status::OK;
  }

 private:
  std::string dir_, endpoint_, resource_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Dev> devs_;
  int version_ = 0;
  bool stopping_ = false;
  std::vector<std::vector<std::string>> allocate_calls_, prestart_calls_;
  std::vector<std::string> last_available_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace gpulet::emu::testplugin
