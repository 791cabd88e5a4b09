// gpulet-kubelet-check: the kubelet's side of `make gpu-check`. Serves the kubelet emulator's
// Registration and PodResources sockets under DIR, waits for a device plugin (the real agent,
// started by the check script against the real NVML) to register RESOURCE, then admits one pod
// asking for one device and prints what the kubelet would see, one `key value` line each:
//   registered <resource>   devices <n>   healthy <n>   ids <id,id,...>
//   allocated <device id>   env NVIDIA_VISIBLE_DEVICES=<value>   (every env of the response)
//   cdi <name> ...          mount <container path>   device <container path>
// usage: gpulet-kubelet-check DIR [RESOURCE] [TIMEOUT_S]     exit 0 when the pod ran, else 1.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "testing/kubelet/emulator.h"

namespace {
int Fail(const std::string& what) {
  std::fprintf(stderr, "gpulet-kubelet-check: %s\n", what.c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) return Fail("usage: gpulet-kubelet-check DIR [RESOURCE] [TIMEOUT_S]");
  using namespace gpulet::emu;
  std::string resource = argc > 2 ? argv[2] : "nvidia.com/gpu";
  int timeout_s = argc > 3 ? std::atoi(argv[3]) : 30;
  if (timeout_s <= 0 || timeout_s > 600) return Fail("TIMEOUT_S must be 1..600");
  EmulatorOptions opt;
  opt.device_plugin_dir = argv[1];
  opt.node_name = "gpu-check";
  KubeletEmulator kubelet(opt);
  if (auto s = kubelet.Start(); !s.ok()) return Fail(std::string(s.message()));
  std::printf("listening %s\n", kubelet.kubelet_socket().c_str());
  std::fflush(stdout);
  auto state = kubelet.WaitForUpdate(resource, 0, std::chrono::seconds(timeout_s));
  if (!state.ok())
    return Fail("no ListAndWatch for " + resource + ": " + std::string(state.status().message()));
  std::string ids;
  int healthy = 0;
  for (const auto& d : state->devices) {
    ids += (ids.empty() ? "" : ",") + d.id;
    healthy += d.healthy;
  }
  std::printf("registered %s\ndevices %zu\nhealthy %d\nids %s\n", resource.c_str(),
              state->devices.size(), healthy, ids.c_str());
  PodSpec pod;
  pod.name = "gpu-check";
  pod.containers.push_back(
      {.name = "main", .image = "none", .env = {}, .limits = {{resource, "1"}}, .requests = {}});
  auto st = kubelet.AddPod(pod);
  if (!st.ok()) return Fail("pod: " + std::string(st.status().message()));
  if (st->phase != PodPhase::kRunning)
    return Fail("pod " + std::string(PodPhaseName(st->phase)) + ": " + st->reason + " " +
                st->message);
  for (const auto& c : st->containers) {
    for (const auto& [res, devs] : c.devices)
      for (const auto& d : devs) std::printf("allocated %s\n", d.c_str());
    for (const auto& [k, v] : c.response.envs()) std::printf("env %s=%s\n", k.c_str(), v.c_str());
    for (const auto& d : c.response.cdi_devices()) std::printf("cdi %s\n", d.name().c_str());
    for (const auto& m : c.response.mounts()) std::printf("mount %s\n", m.container_path().c_str());
    for (const auto& d : c.response.devices())
      std::printf("device %s\n", d.container_path().c_str());
  }
  kubelet.Stop();
  return 0;
}
