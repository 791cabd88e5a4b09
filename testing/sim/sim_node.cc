// The simulated node behind `gpulet sim`. See sim_node.h.
#include "testing/sim/sim_node.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "common/signals.h"
#include "common/status.h"
#include "fake_nvml/control.h"
#include "fake_nvml/machine.h"
#include "testing/process/spawn.h"

extern char** environ;

namespace gpulet::sim {
namespace {

namespace stdfs = std::filesystem;
using std::chrono::milliseconds;

std::string SelfDir() {
  std::error_code ec;
  auto p = stdfs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

std::string Pad(const std::string& s, size_t n) {
  return s.size() >= n ? s + " " : s + std::string(n - s.size(), ' ');
}

}  // namespace

SimPaths::SimPaths(const std::string& r)
    : root(r),
      device_plugin_dir(r + "/kubelet/device-plugins"),
      pod_resources_socket(r + "/kubelet/pod-resources/kubelet.sock"),
      agent_log(r + "/agent.log"),
      pid_file(r + "/sim.lock") {}

std::string DefaultSimRoot() {
  const char* tmp = getenv("TMPDIR");
  return absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/gpulet-sim-", getuid());
}

SimNode::SimNode(SimOptions options, std::ostream& out)
    : opt_(std::move(options)),
      out_(out),
      paths_(opt_.sim_root.empty() ? DefaultSimRoot() : opt_.sim_root) {
  if (opt_.agent_binary.empty()) opt_.agent_binary = SelfDir() + "/gpulet";
}

SimNode::~SimNode() {
  Stop();
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::Status SimNode::Prepare() {
  if (opt_.profile.empty())
    return absl::InvalidArgumentError(absl::StrCat(
        "--simulate PROFILE is required (built-in: ", absl::StrJoin(BuiltinProfiles(), ", "),
        ", or a machine-file path)"));
  auto machine = LoadMachine(opt_.profile);
  if (!machine.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--simulate ", opt_.profile, ": ", machine.status().message()));
  gpus_ = static_cast<int>(machine->gpus.size());
  if (access(opt_.agent_binary.c_str(), X_OK) != 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "agent binary not found: ", opt_.agent_binary,
        " (build it: cmake --build build --target gpulet; or pass --agent-binary PATH)"));
  for (const auto& f : opt_.pod_files) {
    ASSIGN_OR_RETURN(auto pods, emu::LoadPodFile(f));
    for (auto& p : pods) {
      for (const auto& q : pods_)
        if (q.Key() == p.Key())
          return absl::InvalidArgumentError(
              absl::StrCat(p.source, ": pod ", p.Key(), " is already defined at ", q.source));
      for (const std::string& w : p.warnings) std::cerr << "gpulet sim: warning: " << w << "\n";
      pods_.push_back(std::move(p));
    }
  }
  return absl::OkStatus();
}

absl::Status SimNode::Start() {
  std::error_code ec;
  stdfs::create_directories(paths_.root, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create sim root ", paths_.root, ": ", ec.message()));
  lock_fd_ = open(paths_.pid_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0 || flock(lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("a simulated node is already running at ", paths_.root,
                     " (stop it, or pass --sim-root DIR for a second node)"));
  // A new node starts clean: no kubelet state, no fault state from an earlier node.
  stdfs::remove_all(paths_.root + "/kubelet", ec);
  stdfs::remove_all(paths_.root + "/vgpu", ec);
  stdfs::remove(ControlLogPath(paths_.root), ec);

  emu::EmulatorOptions eo;
  eo.device_plugin_dir = paths_.device_plugin_dir;
  eo.pod_resources_socket = paths_.pod_resources_socket;
  emu_ = std::make_unique<emu::KubeletEmulator>(eo);
  RETURN_IF_ERROR(emu_->Start());
  t0_ = std::chrono::steady_clock::now();

  std::vector<std::string> args = {opt_.agent_binary,
                                   "agent",
                                   "--simulate",
                                   opt_.profile,
                                   "--sim-root",
                                   paths_.root,
                                   "--device-plugin-dir",
                                   paths_.device_plugin_dir,
                                   "--pod-resources-socket",
                                   paths_.pod_resources_socket};
  // A simulated node stays inside its sim root and never takes a fixed port: the metrics endpoint
  // binds any free loopback port (the agent logs it) and the feature file goes under the root, so
  // several simulated nodes (and tests) run side by side. --agent-arg overrides either.
  auto given = [&](const std::string& flag) {
    for (const auto& a : opt_.agent_extra_args)
      if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
    return false;
  };
  if (!given("--metrics-address")) args.insert(args.end(), {"--metrics-address", "127.0.0.1:0"});
  if (!given("--labels-output"))
    args.insert(args.end(), {"--labels-output", paths_.root + "/features.d/gpulet"});
  // vGPU: the state (checkpoint, accounting files) stays under the root, the interposer is the one
  // built beside gpulet-sim, and a node whose pods ask for vcuda resources shares every GPU
  // (no API server here: the agent places by the kubelet's counts; docs/vgpu.md).
  if (!given("--vgpu-state-dir"))
    args.insert(args.end(), {"--vgpu-state-dir", paths_.root + "/vgpu"});
  if (!given("--metrics-vgpu-accounting-dir"))
    args.insert(args.end(), {"--metrics-vgpu-accounting-dir", paths_.root + "/vgpu"});
  if (!given("--vgpu-library"))
    args.insert(args.end(), {"--vgpu-library", SelfDir() + "/../lib/libgpulet-vcuda.so"});
  auto any_pod_asks = [this](const std::string& prefix) {
    return std::any_of(pods_.begin(), pods_.end(), [&](const emu::PodSpec& p) {
      return std::any_of(
          p.containers.begin(), p.containers.end(), [&](const emu::ContainerSpec& c) {
            return std::any_of(c.limits.begin(), c.limits.end(),
                               [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; });
          });
    });
  };
  // A shared GPU is not offered whole, so the GPUs are shared only when no pod wants whole ones
  // (the mixed demo would otherwise lose its nvidia.com/gpu); --agent-arg=--vgpu-gpus=... decides
  // otherwise.
  vgpu_note_ = any_pod_asks("tencent.com/vcuda-") && !given("--vgpu-gpus");
  if (vgpu_note_ && !any_pod_asks("nvidia.com/")) {
    args.insert(args.end(), {"--vgpu-gpus", "all"});
    vgpu_note_ = false;
  }
  args.insert(args.end(), opt_.agent_extra_args.begin(), opt_.agent_extra_args.end());
  // Our caller blocks SIGINT/SIGTERM; the agent gets a clean mask (testing/process/spawn.h).
  // The agent dies with us: a runner killed with SIGKILL left it serving the node.
  agent_pid_ =
      testing_process::Spawn(args, {.log = paths_.agent_log, .env = {}, .die_with_parent = true});
  int rc = agent_pid_ < 0 ? errno : 0;
  if (rc != 0) {
    agent_pid_ = -1;
    return absl::InternalError(
        absl::StrCat("cannot start ", opt_.agent_binary, ": ", strerror(rc)));
  }
  out_ << "Simulated node "
       << "sim-node"
       << ": " << opt_.profile << ", " << gpus_ << " GPUs on the fake NVML; sim root "
       << paths_.root << "\n"
       << "Agent: " << absl::StrJoin(args, " ") << "  (pid " << agent_pid_ << ", log "
       << paths_.agent_log << ")\n";

  // Registered means: every resource registered so far has sent its device list, and nothing new
  // has registered for a moment (the agent registers its resources one after another).
  auto deadline = std::chrono::steady_clock::now() + opt_.register_timeout;
  auto last_change = std::chrono::steady_clock::now();
  int64_t last_regs = 0;
  while (true) {
    if (!AgentAlive())
      return absl::FailedPreconditionError(
          absl::StrCat("the agent exited (", agent_status_ >= 256 ? "signal " : "status ",
                       agent_status_ % 256, ") before registering with the kubelet emulator; ",
                       "last lines of ", paths_.agent_log, ":\n", AgentLogTail()));
    auto now = std::chrono::steady_clock::now();
    int64_t regs = emu_->registrations();
    if (regs != last_regs) last_regs = regs, last_change = now;
    auto res = emu_->Resources();
    bool all_listed = !res.empty() && std::all_of(res.begin(), res.end(),
                                                  [](const auto& r) { return r.generation > 0; });
    if (all_listed && now - last_change > milliseconds(500)) break;
    if (now > deadline)
      return absl::DeadlineExceededError(
          absl::StrCat("the agent registered no resource with ", paths_.device_plugin_dir,
                       "/kubelet.sock within ", opt_.register_timeout.count() / 1000,
                       "s; last lines of ", paths_.agent_log, ":\n", AgentLogTail()));
    if (StopSignalWithin(milliseconds(20)))
      return absl::CancelledError(
          absl::StrCat("stopped by ", strsignal(stop_signal_), " while waiting for the agent"));
  }
  for (const auto& r : emu_->Resources())
    out_ << "Registered: " << r.name << " (endpoint " << r.endpoint << ", " << r.capacity
         << " devices, " << r.allocatable << " healthy)\n";
  if (vgpu_note_)
    out_ << "Note: pods ask for both whole GPUs and vGPU shares; no GPU is shared. Run the vGPU "
            "pods "
            "alone, or share some GPUs with --agent-arg=--vgpu-gpus=<indexes>.\n";
  out_ << "\nEvents:\n";
  PrintNewEvents();
  return absl::OkStatus();
}

void SimNode::RunPods() {
  int64_t longest = 0;
  for (const auto& p : pods_) {
    auto st = emu_->AddPod(p);
    if (!st.ok()) out_ << "  " << p.source << ": " << st.status().message() << "\n";
    longest = std::max(longest, p.run_time_ms);
    PrintNewEvents();
  }
  // Let simulated run times play out; pods they free devices for get admitted meanwhile.
  auto deadline =
      std::chrono::steady_clock::now() + milliseconds(longest) + std::chrono::seconds(30);
  while ((emu_->HasTimedPods() || !emu_->WaitIdle(milliseconds(0))) &&
         std::chrono::steady_clock::now() < deadline) {
    if (StopSignalWithin(milliseconds(20))) break;  // a pod's 1h30m is not waited out
    PrintNewEvents();
  }
  if (stop_signal_ != 0) {
    PrintNewEvents();
    out_ << "Received " << SignalName(stop_signal_) << ", stopping.\n";
    return;
  }
  emu_->WaitIdle(std::chrono::seconds(5));
  PrintNewEvents();
}

void SimNode::PrintNewEvents() {
  auto events = emu_->Events();
  for (; events_printed_ < events.size(); ++events_printed_) {
    const auto& e = events[events_printed_];
    double t = std::chrono::duration<double>(e.at - t0_).count();
    std::ostringstream ts;
    ts << "+" << std::fixed << std::setprecision(2) << std::max(0.0, t) << "s";
    out_ << "  " << Pad(ts.str(), 8) << Pad(e.type, 8) << Pad(e.reason, 25) << Pad(e.object, 32)
         << e.message << "\n";
  }
  out_.flush();
}

namespace {

// A vGPU unit's device ID, "<GPU UUID>::<letters><n>" (e.g. "GPU-...::vc12"), split into the GPU,
// the prefix up to the number and the number. False for any other ID (whole GPUs, MIG, replicas).
bool SplitUnitId(const std::string& id, std::string* gpu, std::string* prefix, int64_t* n) {
  size_t sep = id.rfind("::");
  if (sep == std::string::npos) return false;
  size_t digits = id.find_first_of("0123456789", sep + 2);
  if (digits == std::string::npos || digits == sep + 2 ||
      id.find_first_not_of("0123456789", digits) != std::string::npos)
    return false;
  *gpu = id.substr(0, sep);
  *prefix = id.substr(0, digits);
  return absl::SimpleAtoi(id.substr(digits), n);
}

}  // namespace

// vGPU units as ranges: 30 IDs "GPU-x::vc0" .. "GPU-x::vc29" print as "GPU-x::vc0-vc29" (a pod's
// list ran to 1.5 KB per line); other IDs print as they are.
std::string CompressDeviceIds(const std::vector<std::string>& ids) {
  std::map<std::string, std::vector<int64_t>> by_prefix;
  std::vector<std::string> out;
  for (const std::string& id : ids) {
    std::string gpu, prefix;
    int64_t n = 0;
    if (SplitUnitId(id, &gpu, &prefix, &n))
      by_prefix[prefix].push_back(n);
    else
      out.push_back(id);
  }
  for (auto& [prefix, nums] : by_prefix) {
    std::sort(nums.begin(), nums.end());
    const std::string letters = prefix.substr(prefix.rfind("::") + 2);
    std::string runs;
    for (size_t i = 0; i < nums.size();) {
      size_t j = i;
      while (j + 1 < nums.size() && nums[j + 1] == nums[j] + 1) ++j;
      absl::StrAppend(&runs, runs.empty() ? "" : ",", letters, nums[i]);
      if (j > i) absl::StrAppend(&runs, "-", letters, nums[j]);
      i = j + 1;
    }
    out.push_back(absl::StrCat(prefix.substr(0, prefix.rfind("::") + 2), runs));
  }
  return absl::StrJoin(out, ",");
}

void SimNode::PrintOccupancy() {
  // Per GPU, of each resource offered in vGPU units: units held by pods not finished / offered.
  std::map<std::string, std::map<std::string, std::pair<int64_t, int64_t>>> per_gpu;
  std::vector<std::string> columns;
  for (const auto& r : emu_->Resources()) {
    bool any = false;
    for (const auto& d : r.devices) {
      std::string gpu, prefix;
      int64_t n = 0;
      if (!SplitUnitId(d.id, &gpu, &prefix, &n)) continue;
      ++per_gpu[gpu][r.name].second;
      any = true;
    }
    if (any) columns.push_back(r.name);
  }
  if (per_gpu.empty()) return;
  for (const auto& p : emu_->Pods()) {
    if (p.phase == emu::PodPhase::kSucceeded || p.phase == emu::PodPhase::kFailed) continue;
    for (const auto& a : p.containers)
      for (const auto& [res, ids] : a.devices)
        for (const std::string& id : ids) {
          std::string gpu, prefix;
          int64_t n = 0;
          if (SplitUnitId(id, &gpu, &prefix, &n)) ++per_gpu[gpu][res].first;
        }
  }
  out_ << "vGPU occupancy per GPU (units used/total; 100 core units = one GPU, a memory unit = "
          "256 MiB):\n";
  for (const auto& [gpu, by_res] : per_gpu) {
    out_ << "  " << gpu;
    for (const std::string& c : columns) {
      auto it = by_res.find(c);
      if (it == by_res.end()) continue;
      out_ << "  " << c.substr(c.find('/') + 1) << " " << it->second.first << "/"
           << it->second.second;
    }
    out_ << "\n";
  }
}

void SimNode::PrintNode() {
  auto res = emu_->Resources();
  size_t w = 16;
  for (const auto& r : res) w = std::max(w, r.name.size() + 2);
  out_ << "\nName:               sim-node\n";
  out_ << "Capacity:\n";
  for (const auto& r : res) out_ << "  " << Pad(r.name + ":", w) << " " << r.capacity << "\n";
  out_ << "Allocatable:\n";
  for (const auto& r : res) out_ << "  " << Pad(r.name + ":", w) << " " << r.allocatable << "\n";
  out_ << "Allocated resources:\n  (Total limits may be over 100 percent, i.e., overcommitted.)\n";
  out_ << "  " << Pad("Resource", w) << " Requests  Limits\n";
  out_ << "  " << Pad("--------", w) << " --------  ------\n";
  for (const auto& r : res)
    out_ << "  " << Pad(r.name, w) << " " << Pad(std::to_string(r.allocated), 9) << " "
         << r.allocated << "\n";
  PrintOccupancy();
}

void SimNode::PrintPods() {
  out_ << "\nPods:\n";
  for (const auto& p : emu_->Pods()) {
    out_ << "  " << Pad(p.spec.Key(), 30) << Pad(emu::PodPhaseName(p.phase), 10)
         << (p.reason.empty() ? "" : p.reason + ": ") << p.message << "\n";
    for (const auto& c : p.spec.containers) {
      out_ << "    container " << c.name << " (" << c.image << ")\n";
      for (const auto& a : p.containers) {
        if (a.container != c.name) continue;
        for (const auto& [res, ids] : a.devices)
          out_ << "      " << res << ": " << CompressDeviceIds(ids) << "\n";
        std::map<std::string, std::string> envs(a.response.envs().begin(), a.response.envs().end());
        for (const auto& [k, v] : envs) out_ << "      env     " << k << "=" << v << "\n";
        for (const auto& d : a.response.devices())
          out_ << "      device  " << d.host_path() << " -> " << d.container_path() << " ("
               << d.permissions() << ")\n";
        for (const auto& m : a.response.mounts())
          out_ << "      mount   " << m.host_path() << " -> " << m.container_path()
               << (m.read_only() ? " (ro)" : "") << "\n";
        for (const auto& m : a.response.mounts()) {
          if (m.host_path().find("/vgpu/unknown-") == std::string::npos) continue;
          // The kubelet's Allocate does not say which pod it is for, and a bare simulated node
          // has no API server to ask: the directory is named by grant time until PodResources
          // names the pod (docs/vgpu.md).
          out_ << "      note    accounting directory unknown-<time>: without an API server "
                  "Allocate cannot name the pod\n";
        }
        for (const auto& cdi : a.response.cdi_devices())
          out_ << "      cdi     " << cdi.name() << "\n";
        std::map<std::string, std::string> ann(a.response.annotations().begin(),
                                               a.response.annotations().end());
        for (const auto& [k, v] : ann) out_ << "      annot.  " << k << "=" << v << "\n";
      }
    }
  }
  out_.flush();
}

void SimNode::Serve() {
  // The agent logs its metrics URL once at start (the port is ephemeral unless an --agent-arg
  // sets it).
  std::string metrics = "see the agent log";
  for (int i = 0; i < 20; ++i) {
    std::ifstream log(paths_.agent_log);
    std::string line;
    while (std::getline(log, line)) {
      size_t at = line.find("metrics: http://");
      if (at == std::string::npos) continue;
      metrics = line.substr(at + 9);
      metrics = metrics.substr(0, metrics.find(' '));
    }
    if (metrics != "see the agent log") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  out_ << "\nServing the simulated node until SIGINT/SIGTERM (Ctrl-C, or kill %1 when started "
          "with &):\n"
       << "  sim root:               " << paths_.root << "\n"
       << "  device-plugin dir:      " << paths_.device_plugin_dir << "\n"
       << "  kubelet registration:   " << emu_->kubelet_socket() << "\n"
       << "  PodResources v1:        " << emu_->pod_resources_socket() << "\n"
       << "  metrics:                " << metrics << "\n"
       << "  agent:                  pid " << agent_pid_ << ", log " << paths_.agent_log << "\n"
       << "  faults:                 gpulet sim fault xid --gpu 3 --code 79 --sim-root "
       << paths_.root << "\n\nEvents:\n";
  out_.flush();
  bool agent_reported = false;
  while (true) {
    bool stop = StopSignalWithin(milliseconds(200));
    PrintNewEvents();
    if (stop) {
      out_ << "Received " << SignalName(stop_signal_) << ", stopping.\n";
      break;
    }
    if (!agent_reported && !AgentAlive()) {
      out_ << "  the agent exited (status " << agent_status_ << "); last lines of "
           << paths_.agent_log << ":\n"
           << AgentLogTail();
      agent_reported = true;
    }
  }
}

std::string SimNode::SignalName(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : strsignal(sig);
}

bool SimNode::StopSignalWithin(milliseconds wait) {
  if (stop_signal_ == 0) stop_signal_ = WaitForStopSignal(StopSignals(), wait);
  return stop_signal_ != 0;
}

bool SimNode::AgentAlive() {
  if (agent_pid_ < 0) return false;
  int status = 0;
  pid_t r = waitpid(agent_pid_, &status, WNOHANG);
  if (r == 0) return true;
  agent_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 256 + WTERMSIG(status);
  agent_pid_ = -1;
  return false;
}

std::string SimNode::AgentLogTail() const {
  auto text = ReadFileToString(paths_.agent_log);
  if (!text.ok() || text->empty()) return "  (empty)\n";
  std::vector<std::string> lines;
  std::istringstream in(*text);
  for (std::string l; std::getline(in, l);) lines.push_back("  " + l);
  size_t from = lines.size() > 15 ? lines.size() - 15 : 0;
  return absl::StrJoin(lines.begin() + from, lines.end(), "\n") + "\n";
}

void SimNode::Stop() {
  if (agent_pid_ > 0 && AgentAlive()) {
    kill(agent_pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (AgentAlive() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(10));
    if (agent_pid_ > 0) {
      kill(agent_pid_, SIGKILL);
      waitpid(agent_pid_, nullptr, 0);
      agent_pid_ = -1;
      out_ << "\nAgent did not stop within 5s of SIGTERM; killed.\n";
    } else {
      out_ << "\nAgent stopped (" << (agent_status_ >= 256 ? "signal " : "exit status ")
           << agent_status_ % 256 << ").\n";
    }
  }
  if (emu_) emu_->Stop();
}

}  // namespace gpulet::sim
