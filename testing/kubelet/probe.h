// The kubelet probe: the same device-plugin scenarios against the kubelet emulator and the real
// kubelet, written as one transcript that can be compared line by line (docs/cluster.md, "Fakes
// against the real components"). tests/kubelet_emulator/kubelet_probe_test.cc drives the emulator,
// tests/cluster/test_kubelet_probe.py the real kubelet (through gpulet-kubelet-probe); both check
// the transcript against tests/kubelet_emulator/kubelet_probe.expected, which is what the real
// kubelet v1.34 did.
//
// ProbePlugin is a device plugin for resource probe.gpulet.io/dev with devices dev-0..dev-3 that
// asks for GetPreferredAllocation and PreStartContainer and records every call the kubelet makes,
// one line each, with nothing that changes from run to run (sets printed sorted). Its preference:
// the highest-numbered available devices; from the second call on, the unknown device dev-9 (to
// see what the kubelet does with a preference it cannot use). Test code only; thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"

namespace gpulet::emu::probe {

inline constexpr char kResource[] = "probe.gpulet.io/dev";
inline constexpr char kEndpoint[] = "gpulet-probe.sock";

class ProbePlugin : public v1beta1::DevicePlugin::Service {
 public:
  explicit ProbePlugin(std::string dir);
  ~ProbePlugin() override;

  // Serves on <dir>/gpulet-probe.sock (removing a stale file first). False when it cannot bind.
  bool Serve();
  // Register with kubelet.sock: "register: OK" (once the kubelet has called ListAndWatch) or
  // "register: CODE \"message\"" is recorded.
  void Register();
  // Ends the server and the ListAndWatch stream.
  void Stop();
  // Marks dev-N (un)healthy; the open ListAndWatch stream sends the new list.
  void SetHealthy(int n, bool healthy);
  // Records a line of the caller's (an observation between calls).
  void Note(const std::string& line);
  std::vector<std::string> Lines() const;
  // Waits until a recorded line starts with `prefix` after the first `skip` lines; false on
  // timeout.
  bool WaitFor(const std::string& prefix, size_t skip, std::chrono::milliseconds timeout) const;
  std::string socket() const { return dir_ + "/" + kEndpoint; }
  // Also appends each line to `f` as it is recorded (flushed), so that another process writing
  // the same file sees the calls in order. Not owned; set before Serve().
  void set_sink(std::FILE* f) { sink_ = f; }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* o) override;
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* w) override;
  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* resp) override;
  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override;
  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse*) override;

 private:
  void Record(const std::string& line);  // mu_ held

  std::string dir_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<std::string> lines_;
  bool healthy_[4] = {true, true, true, true};
  int version_ = 0;
  int preferred_calls_ = 0;
  int list_and_watch_calls_ = 0;
  bool stopping_ = false;
  std::unique_ptr<grpc::Server> server_;
  std::FILE* sink_ = nullptr;
};

// What kubelet.sock answers a registration with API version `version` and resource `resource`:
// "OK" or "CODE \"message\"".
std::string TryRegister(const std::string& dir, const std::string& version,
                        const std::string& resource);

// The kubelet's PodResources v1 view of probe.gpulet.io/dev on `socket`, one line each:
//   podresources_list: ns/pod/container=dev-a,dev-b; ...      (pods holding the resource, sorted)
//   podresources_pods: probe-kp-1,...                          (the probe's pods List shows at all)
//   podresources_allocatable: dev-0,...
//   podresources_get_missing: CODE "message"                  (Get of a pod that does not exist)
std::vector<std::string> PodResourcesView(const std::string& socket);

// A gRPC status as "CODE \"message\"" (CODE as grpc names it: UNKNOWN, INVALID_ARGUMENT, ...).
std::string StatusLine(const grpc::Status& s);

}  // namespace gpulet::emu::probe
