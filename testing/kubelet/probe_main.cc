// gpulet-kubelet-probe: testing/kubelet/probe.h against a kubelet (the real one on the test
// cluster: tests/cluster/test_kubelet_probe.py).
//   gpulet-kubelet-probe serve DIR LOG
//     Tries two bad registrations, then serves and registers the probe plugin in the
//     device-plugin directory DIR, appending every line of the transcript to LOG as it happens.
//     When kubelet.sock is replaced (a kubelet restart) it notes whether its own socket survived,
//     serves again and re-registers, as a device plugin must. SIGUSR1 marks dev-0 unhealthy,
//     SIGUSR2 healthy again; SIGTERM ends it.
//   gpulet-kubelet-probe podresources SOCKET
//     Prints the PodResources v1 view of the probe resource (PodResourcesView).
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "testing/kubelet/probe.h"

namespace {
volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int s) { g_signal = s; }

// Which file `path` is: inode and change time. A restarted kubelet's new socket may get the freed
// inode number of the old one, so the inode alone can miss a restart; the change time (ns) cannot.
std::string Identity(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_ino) + "@" + std::to_string(st.st_ctim.tv_sec) + "." +
         std::to_string(st.st_ctim.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  using namespace gpulet::emu::probe;
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "podresources" && argc == 3) {
    for (const auto& l : PodResourcesView(argv[2])) std::printf("%s\n", l.c_str());
    return 0;
  }
  if (cmd != "serve" || argc != 4) {
    std::fprintf(stderr, "usage: gpulet-kubelet-probe serve DIR LOG | podresources SOCKET\n");
    return 2;
  }
  std::string dir = argv[2];
  std::FILE* log = std::fopen(argv[3], "a");
  if (!log) {
    std::fprintf(stderr, "gpulet-kubelet-probe: cannot open %s\n", argv[3]);
    return 1;
  }
  for (int s : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) std::signal(s, OnSignal);
  ProbePlugin plugin(dir);
  plugin.set_sink(log);
  plugin.Note("register_bad_version: " + TryRegister(dir, "v1beta2", kResource));
  plugin.Note("register_bad_name: " + TryRegister(dir, "v1beta1", "probe-dev"));
  if (!plugin.Serve()) {
    std::fprintf(stderr, "gpulet-kubelet-probe: cannot serve %s\n", plugin.socket().c_str());
    return 1;
  }
  plugin.Register();
  std::string kubelet = Identity(dir + "/kubelet.sock");
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int s = g_signal;
    g_signal = 0;
    if (s == SIGTERM || s == SIGINT) break;
    if (s == SIGUSR1 || s == SIGUSR2) plugin.SetHealthy(0, s == SIGUSR2);
    std::string now = Identity(dir + "/kubelet.sock");
    if (!now.empty() && now != kubelet) {
      kubelet = now;
      struct stat st {};
      bool kept = stat(plugin.socket().c_str(), &st) == 0;
      plugin.Note(std::string("kubelet.sock replaced; plugin socket ") +
                  (kept ? "kept" : "removed"));
      plugin.Stop();
      if (!plugin.Serve()) return 1;
      plugin.Register();
    }
  }
  plugin.Stop();
  return 0;
}
