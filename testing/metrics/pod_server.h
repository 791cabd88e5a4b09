// A minimal kubelet PodResources v1 server on a real unix socket, for tests that need pods without
// the whole kubelet emulator (which allocates only through a running device plugin).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "k8s/podresources/v1/api.grpc.pb.h"

namespace gpulet::testing_metrics {

struct FakeContainer {
  std::string ns, pod, container, resource;
  std::vector<std::string> ids;
};

class PodResourcesServer final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResourcesServer(std::string socket) : socket_(std::move(socket)) {}
  ~PodResourcesServer() override { Stop(); }

  bool Start() {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix://" + socket_, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    return server_ != nullptr;
  }
  void Stop() {
    if (server_) server_->Shutdown();
    server_.reset();
  }
  void Set(std::vector<FakeContainer> c) {
    std::lock_guard<std::mutex> l(mu_);
    containers_ = std::move(c);
  }
  int calls() {
    std::lock_guard<std::mutex> l(mu_);
    return calls_;
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_;
    for (const FakeContainer& c : containers_) {
      v1::PodResources* p = resp->add_pod_resources();
      p->set_name(c.pod);
      p->set_namespace_(c.ns);
      v1::ContainerResources* cr = p->add_containers();
      cr->set_name(c.container);
      v1::ContainerDevices* d = cr->add_devices();
      d->set_resource_name(c.resource);
      for (const std::string& id : c.ids) d->add_device_ids(id);
    }
    return grpc::Status::OK;
  }

 private:
  std::string socket_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<FakeContainer> containers_;
  int calls_ = 0;
};

}  // namespace gpulet::testing_metrics
