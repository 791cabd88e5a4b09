// A simulated GPU node for `gpulet sim`: the kubelet emulator in this process, the real agent
// (`gpulet agent --simulate P ...`) as a child process on the fake NVML, and pods from YAML.
// Owns the child process and the emulator; used from one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "testing/kubelet/emulator.h"

namespace gpulet::sim {

// Device IDs for printing: vGPU units as ranges per GPU ("GPU-x::vc0-vc29,vc40"), others as they
// are.
std::string CompressDeviceIds(const std::vector<std::string>& ids);

struct SimOptions {
  std::string profile;       // --simulate
  std::string sim_root;      // state dir; empty: $TMPDIR/gpulet-sim-<uid>
  std::string agent_binary;  // empty: "gpulet" beside this executable
  std::vector<std::string> agent_extra_args;
  std::vector<std::string> pod_files;
  std::chrono::milliseconds register_timeout{20000};
};

// The layout of a sim root, shared with `gpulet sim fault` and the docs.
struct SimPaths {
  explicit SimPaths(const std::string& root);
  std::string root, device_plugin_dir, pod_resources_socket, agent_log, pid_file;
};

// The default sim root: $TMPDIR (or /tmp) + "/gpulet-sim-<uid>".
std::string DefaultSimRoot();

class SimNode {
 public:
  SimNode(SimOptions options, std::ostream& out);
  ~SimNode();  // stops the agent and the emulator

  // Validates the profile and every pod file (file:line errors) before touching anything.
  absl::Status Prepare();
  // Starts the emulator and the agent, waits for the agent's registrations.
  absl::Status Start();
  // Submits the pods in order and lets simulated run times play out; prints events as they
  // happen.
  void RunPods();
  // `kubectl describe node`-like summary and each pod's status and allocation.
  void PrintNode();
  void PrintOccupancy();
  void PrintPods();
  // Prints where the node's sockets are, then events until SIGINT/SIGTERM (which must be blocked
  // in every thread by the caller, so that this thread can wait for them).
  void Serve();
  // Stops the agent (SIGTERM, then SIGKILL after 5 s) and the emulator. Idempotent.
  void Stop();

  emu::KubeletEmulator* emulator() { return emu_.get(); }
  // The stop signal (SIGINT, SIGTERM, SIGQUIT) that ended Start, RunPods or Serve early; 0: none.
  int stop_signal() const { return stop_signal_; }

 private:
  // Waits up to `wait` for a stop signal (blocked by the caller, common/signals.h), remembering
  // it: every wait of the runner goes through here, so it stops within one step of a signal.
  bool StopSignalWithin(std::chrono::milliseconds wait);
  static std::string SignalName(int sig);
  void PrintNewEvents();
  bool AgentAlive();
  std::string AgentLogTail() const;

  SimOptions opt_;
  std::ostream& out_;
  SimPaths paths_;
  int gpus_ = 0;
  std::vector<emu::PodSpec> pods_;
  std::unique_ptr<emu::KubeletEmulator> emu_;
  pid_t agent_pid_ = -1;
  bool vgpu_note_ = false;  // vGPU pods were given but no GPU is shared (mixed with whole-GPU pods)
  int agent_status_ = 0;
  size_t events_printed_ = 0;
  std::chrono::steady_clock::time_point t0_;
  int lock_fd_ = -1;
  int stop_signal_ = 0;
};

}  // namespace gpulet::sim
