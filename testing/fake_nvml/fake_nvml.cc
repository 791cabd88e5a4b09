// The fake libnvidia-ml.so.1: NVML's C ABI (the subset in abi/nvml_api.h) served from a
// machine file, with live fault injection through the node's control log (control.h). Loaded by
// production code through the same dlopen path as the real library.
//
// Configuration: gpuletSimConfigure(machine, sim_root) before nvmlInit, or the environment
// variables GPULET_SIM_MACHINE / GPULET_SIM_ROOT (for programs that just dlopen the library).
// One simulated machine per process at a time: nvmlInit for a different machine while the first
// is initialised fails with NVML_ERROR_IN_USE. State is global and guarded by one mutex; every
// entry point is thread-safe. Calls this fake does not implement are not exported, so callers see
// them missing exactly as with an old driver; calls a device does not support return
// NVML_ERROR_NOT_SUPPORTED. Built twice: the full library, and with GPULET_FAKE_NVML_LEGACY a
// library that lacks the newer versioned symbols, to test fallbacks and degradation.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "abi/nvml_api.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/status.h"
#include "fake_nvml/control.h"
#include "fake_nvml/machine.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpulet::sim {
namespace {

// What an nvmlDevice_t points to: a physical GPU (mig < 0) or one of its MIG devices.
struct DevHandle {
  int gpu = 0;
  int mig = -1;
};

struct EventSet {
  std::map<int, unsigned long long> masks;  // gpu -> registered event types
  std::deque<nvmlEventData_t> queue;
};

struct GpuState {
  bool lost = false;
  std::map<std::string, uint64_t> tel;
};

struct State {
  std::string machine_arg, root;  // the configuration this state was built from
  Machine m;
  std::vector<std::unique_ptr<DevHandle>> gpus;
  std::vector<std::vector<std::unique_ptr<DevHandle>>> migs;
  std::set<const void*> handles;
  std::vector<GpuState> rt;
  std::set<EventSet*> sets;
  bool nvml_failed = false;
  off_t log_offset = 0;
  std::chrono::steady_clock::time_point loaded = std::chrono::steady_clock::now();
};

std::mutex g_mu;
std::unique_ptr<State> g_state;  // the loaded machine; survives nvmlShutdown for re-init
int g_refcount = 0;
std::string g_cfg_machine, g_cfg_root;
bool g_configured = false;
std::string g_last_error;
std::string g_private_root;  // a temporary sim root when none was given

constexpr unsigned long long kSupportedEvents =
    nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// ---- driver-visible files under the sim root ----------------------------------------------

std::string SysfsBusId(const std::string& nvml_bus_id) {  // "00000000:18:00.0" -> "0000:18:00.0"
  return absl::AsciiStrToLower(nvml_bus_id.substr(4));
}

// The fake's files are scratch state that is rebuilt at every load: written whole and renamed
// into place (readers never see half a file) but not fsynced, which would cost a disk flush per
// file for nothing.
class ScratchFs {
 public:
  explicit ScratchFs(std::string root) : root_(std::move(root)) {}
  absl::Status MakeDirs(const std::string& p) {
    std::error_code ec;
    std::filesystem::create_directories(root_ + p, ec);
    return ec ? absl::InternalError(absl::StrCat("cannot create ", root_, p, ": ", ec.message()))
              : absl::OkStatus();
  }
  bool Exists(const std::string& p) const { return std::filesystem::exists(root_ + p); }
  absl::Status WriteFileAtomic(const std::string& p, const std::string& content) {
    std::string tmp = absl::StrCat(root_, p, ".tmp", ::getpid());
    FILE* f = std::fopen(tmp.c_str(), "w");
    bool ok = f != nullptr && std::fwrite(content.data(), 1, content.size(), f) == content.size();
    if (f != nullptr) ok = std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), (root_ + p).c_str()) != 0) {
      std::remove(tmp.c_str());
      return absl::InternalError(
          absl::StrCat("cannot write ", root_, p, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  std::string root_;
};

absl::Status Materialise(const State& s) {
  ScratchFs fs(s.root);
  const Machine& m = s.m;
  RETURN_IF_ERROR(fs.MakeDirs("/control"));
  for (const GpuSpec& g : m.gpus) {
    std::string dir = "/sys/bus/pci/devices/" + SysfsBusId(g.pci_bus_id);
    RETURN_IF_ERROR(fs.MakeDirs(dir));
    RETURN_IF_ERROR(fs.WriteFileAtomic(dir + "/numa_node", absl::StrCat(g.numa_node, "\n")));
    RETURN_IF_ERROR(fs.WriteFileAtomic(dir + "/local_cpulist", g.cpus + "\n"));
    RETURN_IF_ERROR(fs.WriteFileAtomic(dir + "/class", "0x030200\n"));  // 3D controller
    RETURN_IF_ERROR(fs.WriteFileAtomic(
        dir + "/vendor",
        absl::StrCat("0x", absl::Hex(g.pci_device_id & 0xffff, absl::kZeroPad4), "\n")));
    RETURN_IF_ERROR(fs.WriteFileAtomic(
        dir + "/device",
        absl::StrCat("0x", absl::Hex(g.pci_device_id >> 16, absl::kZeroPad4), "\n")));
  }
  RETURN_IF_ERROR(fs.MakeDirs("/proc/driver/nvidia"));
  RETURN_IF_ERROR(fs.WriteFileAtomic(
      "/proc/driver/nvidia/version",
      absl::StrCat(
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  ", m.driver_version,
          "  (gpulet simulated node)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")));
  // The kernel module lists every possible MIG capability: gpuG/giI/access and gpuG/giI/ciC/access.
  std::string mig_minors = "config 1\nmonitor 2\n";
  for (size_t g = 0; g < m.gpus.size(); ++g) {
    for (int gi = 0; gi < 15; ++gi) {
      int base = 3 + static_cast<int>(g) * 135 + gi * 9;
      absl::StrAppend(&mig_minors, "gpu", g, "/gi", gi, "/access ", base, "\n");
      for (int ci = 0; ci < 8; ++ci)
        absl::StrAppend(&mig_minors, "gpu", g, "/gi", gi, "/ci", ci, "/access ", base + 1 + ci,
                        "\n");
    }
  }
  // The capability files the kernel module publishes per existing GPU/compute instance (what
  // NVIDIA's go-nvlib reads to find a MIG device's /dev/nvidia-caps nodes), same minors as above.
  for (size_t g = 0; g < m.gpus.size(); ++g) {
    if (!m.gpus[g].mig_enabled) continue;
    for (const MigSpec& mig : m.gpus[g].mig) {
      int base = 3 + static_cast<int>(g) * 135 + static_cast<int>(mig.gi) * 9;
      std::string gi_dir =
          absl::StrCat("/proc/driver/nvidia/capabilities/gpu", g, "/mig/gi", mig.gi);
      std::string ci_dir = absl::StrCat(gi_dir, "/ci", mig.ci);
      RETURN_IF_ERROR(fs.MakeDirs(ci_dir));
      RETURN_IF_ERROR(fs.WriteFileAtomic(
          gi_dir + "/access", absl::StrCat("DeviceFileMinor: ", base, "\nDeviceFileMode: 292\n")));
      RETURN_IF_ERROR(fs.WriteFileAtomic(
          ci_dir + "/access", absl::StrCat("DeviceFileMinor: ", base + 1 + static_cast<int>(mig.ci),
                                           "\nDeviceFileMode: 292\n")));
    }
  }
  RETURN_IF_ERROR(fs.MakeDirs("/proc/driver/nvidia-caps"));
  RETURN_IF_ERROR(fs.WriteFileAtomic("/proc/driver/nvidia-caps/mig-minors", mig_minors));
  RETURN_IF_ERROR(fs.WriteFileAtomic(
      "/proc/devices", absl::StrCat("Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n",
                                    "195 nvidia-frontend\n", m.uvm_major, " nvidia-uvm\n",
                                    m.caps_major, " nvidia-caps\n\nBlock devices:\n  8 sd\n")));
  // Placeholders only (regular files): creating character devices needs root. Runtime tests that
  // need real device nodes mknod them themselves.
  RETURN_IF_ERROR(fs.MakeDirs("/dev/nvidia-caps"));
  std::vector<std::string> devs = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"};
  for (const GpuSpec& g : m.gpus) devs.push_back(absl::StrCat("nvidia", g.minor));
  for (const std::string& d : devs) {
    if (!fs.Exists("/dev/" + d)) RETURN_IF_ERROR(fs.WriteFileAtomic("/dev/" + d, ""));
  }
  // "mig <gpu> <gi>:<ci> ..." for each MIG-enabled GPU: fault writers check --gi/--ci against it.
  std::string node = absl::StrCat("gpus ", m.gpus.size(), "\nmachine ", m.name, "\n");
  for (size_t i = 0; i < m.gpus.size(); ++i) {
    if (!m.gpus[i].mig_enabled) continue;
    absl::StrAppend(&node, "mig ", i);
    for (const MigSpec& mig : m.gpus[i].mig) absl::StrAppend(&node, " ", mig.gi, ":", mig.ci);
    node += "\n";
  }
  return fs.WriteFileAtomic("/control/node", node);
}

// ---- the control log -------------------------------------------------------------------------

void Apply(State& s, const Fault& f, bool deliver_events) {
  if (f.kind == Fault::Kind::kNvmlFail) s.nvml_failed = true;
  if (f.kind == Fault::Kind::kNvmlOk) s.nvml_failed = false;
  if (f.gpu < 0 || f.gpu >= static_cast<int>(s.rt.size())) return;
  GpuState& g = s.rt[f.gpu];
  unsigned long long type = 0;
  switch (f.kind) {
    case Fault::Kind::kLost:
      g.lost = true;
      break;
    case Fault::Kind::kReset:
      g.lost = false;
      g.tel["ecc_sbe_volatile"] = g.tel["ecc_dbe_volatile"] = 0;
      break;
    case Fault::Kind::kSet:
      for (const auto& [k, v] : f.values) g.tel[k] = v;
      break;
    case Fault::Kind::kEcc: {
      const char* kind = f.double_bit ? "dbe" : "sbe";
      ++g.tel[absl::StrCat("ecc_", kind, "_volatile")];
      ++g.tel[absl::StrCat("ecc_", kind, "_aggregate")];
      type = f.double_bit ? nvmlEventTypeDoubleBitEccError : nvmlEventTypeSingleBitEccError;
      break;
    }
    case Fault::Kind::kXid:
      type = nvmlEventTypeXidCriticalError;
      break;
    default:
      break;
  }
  if (type == 0 || !deliver_events) return;
  for (EventSet* set : s.sets) {
    auto it = set->masks.find(f.gpu);
    if (it == set->masks.end() || !(it->second & type)) continue;
    nvmlEventData_t e{};
    e.device = reinterpret_cast<nvmlDevice_t>(s.gpus[f.gpu].get());
    e.eventType = type;
    e.eventData = f.kind == Fault::Kind::kXid ? f.code : 0;
    e.gpuInstanceId = f.gi >= 0 ? static_cast<unsigned>(f.gi) : 0xFFFFFFFFu;
    e.computeInstanceId = f.ci >= 0 ? static_cast<unsigned>(f.ci) : 0xFFFFFFFFu;
    set->queue.push_back(e);
  }
}

// Applies control-log lines appended since the last poll: one stat() when nothing changed.
void Poll(State& s, bool deliver_events = true) {
  std::string path = ControlLogPath(s.root);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || st.st_size == s.log_offset) return;
  if (st.st_size < s.log_offset) s.log_offset = 0;  // log recreated: read it again
  // Only the new tail is read, so a long-lived node with a long log stays cheap.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::string text(static_cast<size_t>(st.st_size - s.log_offset), '\0');
  ssize_t n = ::pread(fd, text.data(), text.size(), s.log_offset);
  ::close(fd);
  if (n <= 0) return;
  text.resize(static_cast<size_t>(n));
  size_t pos = 0;
  for (;;) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // a partial last line is read on the next poll
    auto f = ParseFault(absl::string_view(text).substr(pos, nl - pos));
    if (f.ok()) Apply(s, *f, deliver_events);
    pos = nl + 1;
  }
  s.log_offset += static_cast<off_t>(pos);
}

absl::Status Load(const std::string& machine_arg, const std::string& root) {
  ASSIGN_OR_RETURN(Machine m, LoadMachine(machine_arg));
  auto s = std::make_unique<State>();
  s->machine_arg = machine_arg;
  s->root = root;
  s->m = std::move(m);
  for (size_t i = 0; i < s->m.gpus.size(); ++i) {
    s->gpus.push_back(std::make_unique<DevHandle>(DevHandle{static_cast<int>(i), -1}));
    s->handles.insert(s->gpus.back().get());
    s->migs.emplace_back();
    for (size_t j = 0; j < s->m.gpus[i].mig.size(); ++j) {
      s->migs[i].push_back(
          std::make_unique<DevHandle>(DevHandle{static_cast<int>(i), static_cast<int>(j)}));
      s->handles.insert(s->migs[i].back().get());
    }
    s->rt.push_back(GpuState{false, s->m.gpus[i].telemetry});
  }
  RETURN_IF_ERROR(Materialise(*s));
  Poll(*s, /*deliver_events=*/false);  // replay the state faults of this node's history
  g_state = std::move(s);
  return absl::OkStatus();
}

nvmlReturn_t Init() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string machine = g_configured ? g_cfg_machine : Env("GPULET_SIM_MACHINE");
  std::string root = g_configured ? g_cfg_root : Env("GPULET_SIM_ROOT");
  if (machine.empty()) machine = "dgx-h100";
  if (root.empty()) {
    if (g_private_root.empty()) {
      std::string tmpl = std::filesystem::temp_directory_path().string() + "/gpulet-sim-XXXXXX";
      if (::mkdtemp(tmpl.data()) == nullptr) {
        g_last_error = absl::StrCat("cannot create a temporary sim root: ", std::strerror(errno));
        return NVML_ERROR_UNKNOWN;
      }
      g_private_root = tmpl;
    }
    root = g_private_root;
  }
  if (g_refcount > 0 && (g_state->machine_arg != machine || g_state->root != root)) {
    g_last_error = absl::StrCat("this process already simulates '", g_state->machine_arg, "' at ",
                                g_state->root, "; one simulated machine per process");
    return NVML_ERROR_IN_USE;
  }
  // A root wiped since the last init (a test's temp dir reused by the next test) is a new node:
  // its faults and control-log offset belong to the old one.
  struct stat node_file;
  const bool wiped = g_state && ::stat(sim::NodeFilePath(root).c_str(), &node_file) != 0;
  if (!g_state || wiped || g_state->machine_arg != machine || g_state->root != root) {
    g_state.reset();
    absl::Status st = Load(machine, root);
    if (!st.ok()) {
      g_last_error = std::string(st.message());
      return NVML_ERROR_UNKNOWN;
    }
  } else {
    Poll(*g_state);
  }
  if (g_state->nvml_failed) {
    g_last_error = "simulated driver failure (gpulet sim fault nvml-fail)";
    return NVML_ERROR_DRIVER_NOT_LOADED;
  }
  ++g_refcount;
  g_last_error.clear();
  return NVML_SUCCESS;
}

// Common prologue of every call after init: lock, poll, check the library is usable.
#define ENTER()                                                     \
  std::lock_guard<std::mutex> lock(g_mu);                           \
  if (g_refcount == 0 || !g_state) return NVML_ERROR_UNINITIALIZED; \
  State& s = *g_state;                                              \
  Poll(s);                                                          \
  if (s.nvml_failed) return NVML_ERROR_UNINITIALIZED

// Resolves a handle; returns from the caller on a bad or lost device.
#define DEVICE(dev, h)                                                                     \
  if (!s.handles.count(static_cast<const void*>(dev))) return NVML_ERROR_INVALID_ARGUMENT; \
  const DevHandle& h = *reinterpret_cast<const DevHandle*>(dev);                           \
  if (s.rt[h.gpu].lost) return NVML_ERROR_GPU_IS_LOST

nvmlReturn_t CopyString(const std::string& v, char* out, unsigned int len) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (v.size() + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, v.c_str(), v.size() + 1);
  return NVML_SUCCESS;
}

// A telemetry value of a physical GPU; NOT_SUPPORTED when the machine file does not give it.
template <typename T>
nvmlReturn_t Tel(const State& s, const DevHandle& h, const char* key, T* out) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  const auto& t = s.rt[h.gpu].tel;
  auto it = t.find(key);
  if (it == t.end()) return NVML_ERROR_NOT_SUPPORTED;
  *out = static_cast<T>(it->second);
  return NVML_SUCCESS;
}

void FillPci(const std::string& bus_id, uint32_t device_id, uint32_t subsys, nvmlPciInfo_t* p) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->busId, sizeof p->busId, "%s", bus_id.c_str());
  std::snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", bus_id.substr(4).c_str());
  std::sscanf(bus_id.c_str(), "%x:%x:%x", &p->domain, &p->bus, &p->device);
  p->pciDeviceId = device_id;
  p->pciSubSystemId = subsys;
}

// NVLink endpoints of a GPU, link by link: a peer GPU's or an NVSwitch's bus id.
std::vector<std::pair<std::string, int>> Links(const State& s, int gpu) {
  std::vector<std::pair<std::string, int>> out;
  const Machine& m = s.m;
  if (m.nvswitch_links > 0) {
    for (int l = 0; l < m.nvswitch_links; ++l) {
      out.emplace_back(m.nvswitches[l % m.nvswitches.size()], NVML_NVLINK_DEVICE_TYPE_SWITCH);
    }
  } else if (!m.nvlink.empty()) {
    for (size_t j = 0; j < m.gpus.size(); ++j) {
      for (int c = 0; c < m.nvlink[gpu][j]; ++c)
        out.emplace_back(m.gpus[j].pci_bus_id, NVML_NVLINK_DEVICE_TYPE_GPU);
    }
  }
  return out;
}

nvmlReturn_t EventWait(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    {
      ENTER();
      auto* es = reinterpret_cast<EventSet*>(set);
      if (!s.sets.count(es) || data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
      if (!es->queue.empty()) {
        *data = es->queue.front();
        es->queue.pop_front();
        return NVML_SUCCESS;
      }
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return NVML_ERROR_TIMEOUT;
    // A few ms between polls keeps fault-to-delivery latency far below the 100 ms health budget.
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(2), deadline - now));
  }
}

}  // namespace
}  // namespace gpulet::sim

using namespace gpulet::sim;  // NOLINT: the C ABI below is the whole point of this file

// ---- gpulet extensions (looked up with dlsym by gpu/open.cc in simulate mode) ------------------

FAKE_EXPORT void gpuletSimConfigure(const char* machine, const char* sim_root) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cfg_machine = machine ? machine : "";
  g_cfg_root = sim_root ? sim_root : "";
  g_configured = true;
}
// The reason for the last failed nvmlInit (machine-file errors with file:line), or "".
FAKE_EXPORT const char* gpuletSimLastError() {
  std::lock_guard<std::mutex> lock(g_mu);
  thread_local std::string copy;
  copy = g_last_error;
  return copy.c_str();
}

// ---- init ---------------------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlInit() { return Init(); }
FAKE_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int) { return Init(); }
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlInit_v2() { return Init(); }
#endif
FAKE_EXPORT nvmlReturn_t nvmlShutdown() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
  --g_refcount;
  if (g_refcount == 0 && g_state) {
    for (EventSet* set : g_state->sets) delete set;
    g_state->sets.clear();
  }
  return NVML_SUCCESS;
}

FAKE_EXPORT const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED:
      return "Already Initialized";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_IN_USE:
      return "In use by another client";
    case NVML_ERROR_NO_DATA:
      return "No data";
    default:
      return "Unknown Error";
  }
}

// ---- system -------------------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* v, unsigned int len) {
  ENTER();
  return CopyString(s.m.driver_version, v, len);
}
FAKE_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* v, unsigned int len) {
  ENTER();
  return CopyString(s.m.nvml_version, v, len);
}
FAKE_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* v) {
  ENTER();
  if (!v) return NVML_ERROR_INVALID_ARGUMENT;
  *v = s.m.cuda_driver_version;
  return NVML_SUCCESS;
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) {
  return nvmlSystemGetCudaDriverVersion(v);
}
#endif

// ---- device enumeration ----------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* n) {
  ENTER();
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  *n = static_cast<unsigned>(s.gpus.size());
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t* d) {
  ENTER();
  if (!d || i >= s.gpus.size()) return NVML_ERROR_INVALID_ARGUMENT;
  if (s.rt[i].lost) return NVML_ERROR_GPU_IS_LOST;
  *d = reinterpret_cast<nvmlDevice_t>(s.gpus[i].get());
  return NVML_SUCCESS;
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* n) { return nvmlDeviceGetCount(n); }
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  return nvmlDeviceGetHandleByIndex(i, d);
}
#endif
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* d) {
  ENTER();
  if (!uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
  for (size_t i = 0; i < s.gpus.size(); ++i) {
    if (s.m.gpus[i].uuid == uuid) {
      if (s.rt[i].lost) return NVML_ERROR_GPU_IS_LOST;
      *d = reinterpret_cast<nvmlDevice_t>(s.gpus[i].get());
      return NVML_SUCCESS;
    }
    // MIG devices by their own UUID (drivers since R470), while MIG mode is on.
    for (size_t j = 0; s.m.gpus[i].mig_enabled && j < s.m.gpus[i].mig.size(); ++j) {
      if (s.m.gpus[i].mig[j].uuid != uuid) continue;
      if (s.rt[i].lost) return NVML_ERROR_GPU_IS_LOST;
      *d = reinterpret_cast<nvmlDevice_t>(s.migs[i][j].get());
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int* i) {
  ENTER();
  DEVICE(dev, h);
  if (!i || h.mig >= 0) return h.mig >= 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
  *i = static_cast<unsigned>(h.gpu);
  return NVML_SUCCESS;
}

// ---- identity ---------------------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char* v, unsigned int len) {
  ENTER();
  DEVICE(dev, h);
  return CopyString(h.mig >= 0 ? s.m.gpus[h.gpu].mig[h.mig].uuid : s.m.gpus[h.gpu].uuid, v, len);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char* v, unsigned int len) {
  ENTER();
  DEVICE(dev, h);
  const GpuSpec& g = s.m.gpus[h.gpu];
  // A MIG device is named after its parent and profile, as nvidia-smi -L shows it.
  return CopyString(h.mig >= 0 ? absl::StrCat(g.name, " MIG ", g.mig[h.mig].profile) : g.name, v,
                    len);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t dev, int* b) {
  ENTER();
  DEVICE(dev, h);
  if (!b) return NVML_ERROR_INVALID_ARGUMENT;
  *b = s.m.gpus[h.gpu].brand;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned int* a) {
  ENTER();
  DEVICE(dev, h);
  if (!a) return NVML_ERROR_INVALID_ARGUMENT;
  if (s.m.gpus[h.gpu].architecture == 0) return NVML_ERROR_NOT_SUPPORTED;
  *a = s.m.gpus[h.gpu].architecture;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int* minor) {
  ENTER();
  DEVICE(dev, h);
  if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  *minor = static_cast<unsigned>(s.m.gpus[h.gpu].minor);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t* p) {
  ENTER();
  DEVICE(dev, h);
  if (!p) return NVML_ERROR_INVALID_ARGUMENT;
  const GpuSpec& g = s.m.gpus[h.gpu];
  FillPci(g.pci_bus_id, g.pci_device_id, g.pci_subsystem_id, p);
  return NVML_SUCCESS;
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t* p) {
  return nvmlDeviceGetPciInfo_v2(dev, p);
}
#endif
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int* major,
                                                            int* minor) {
  ENTER();
  DEVICE(dev, h);
  if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
  if (s.m.gpus[h.gpu].cc_major == 0) return NVML_ERROR_NOT_SUPPORTED;
  *major = s.m.gpus[h.gpu].cc_major;
  *minor = s.m.gpus[h.gpu].cc_minor;
  return NVML_SUCCESS;
}

// ---- memory -----------------------------------------------------------------------------------

namespace {
nvmlReturn_t Memory(const State& s, const DevHandle& h, uint64_t* total, uint64_t* reserved,
                    uint64_t* used) {
  constexpr uint64_t kMiB = 1 << 20;
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (h.mig >= 0) {
    *total = g.mig[h.mig].memory_mib * kMiB;
    *reserved = *used = 0;  // the machine file keeps usage per physical GPU
    return NVML_SUCCESS;
  }
  const auto& t = s.rt[h.gpu].tel;
  auto get = [&](const char* k) {
    auto it = t.find(k);
    return it == t.end() ? 0 : it->second;
  };
  *total = g.memory_mib * kMiB;
  *reserved = std::min<uint64_t>(get("fb_reserved_mib") * kMiB, *total);
  *used = std::min<uint64_t>(get("fb_used_mib") * kMiB, *total - *reserved);
  return NVML_SUCCESS;
}
}  // namespace

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* m) {
  ENTER();
  DEVICE(dev, h);
  if (!m) return NVML_ERROR_INVALID_ARGUMENT;
  uint64_t total, reserved, used;
  Memory(s, h, &total, &reserved, &used);
  // v1 counts reserved memory as used, as the real library does.
  m->total = total;
  m->used = used + reserved;
  m->free = total - m->used;
  return NVML_SUCCESS;
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t* m) {
  ENTER();
  DEVICE(dev, h);
  if (!m) return NVML_ERROR_INVALID_ARGUMENT;
  if (m->version != nvmlMemory_v2) return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  uint64_t total, reserved, used;
  Memory(s, h, &total, &reserved, &used);
  m->total = total;
  m->reserved = reserved;
  m->used = used;
  m->free = total - reserved - used;
  return NVML_SUCCESS;
}
#endif

// ---- MIG --------------------------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int* current,
                                              unsigned int* pending) {
  ENTER();
  DEVICE(dev, h);
  if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (!g.mig_capable || h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  *current = *pending = g.mig_enabled ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int* n) {
  ENTER();
  DEVICE(dev, h);
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  if (!s.m.gpus[h.gpu].mig_capable || h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  *n = 7;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int i,
                                                             nvmlDevice_t* out) {
  ENTER();
  DEVICE(dev, h);
  if (!out || h.mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (!g.mig_capable) return NVML_ERROR_NOT_SUPPORTED;
  if (!g.mig_enabled) return NVML_ERROR_INVALID_ARGUMENT;  // as NVML: MIG mode is off
  if (i >= g.mig.size()) return NVML_ERROR_NOT_FOUND;
  *out = reinterpret_cast<nvmlDevice_t>(s.migs[h.gpu][i].get());
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int* is_mig) {
  ENTER();
  DEVICE(dev, h);
  if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
  *is_mig = h.mig >= 0;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t dev,
                                                                      nvmlDevice_t* out) {
  ENTER();
  DEVICE(dev, h);
  if (!out || h.mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
  *out = reinterpret_cast<nvmlDevice_t>(s.gpus[h.gpu].get());
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int* id) {
  ENTER();
  DEVICE(dev, h);
  if (!id) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig < 0) return NVML_ERROR_NOT_SUPPORTED;
  *id = s.m.gpus[h.gpu].mig[h.mig].gi;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int* id) {
  ENTER();
  DEVICE(dev, h);
  if (!id) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig < 0) return NVML_ERROR_NOT_SUPPORTED;
  *id = s.m.gpus[h.gpu].mig[h.mig].ci;
  return NVML_SUCCESS;
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t dev, nvmlDeviceAttributes_t* a) {
  ENTER();
  DEVICE(dev, h);
  if (!a) return NVML_ERROR_INVALID_ARGUMENT;
  std::memset(a, 0, sizeof *a);
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (h.mig >= 0) {
    const MigSpec& m = g.mig[h.mig];
    a->multiprocessorCount = m.sm_count;
    a->gpuInstanceSliceCount = m.gi_slices;
    a->computeInstanceSliceCount = m.ci_slices;
    a->memorySizeMB = m.memory_mib;
    a->sharedCopyEngineCount = m.gi_slices;
  } else {
    a->multiprocessorCount = g.sm_count;
    a->gpuInstanceSliceCount = a->computeInstanceSliceCount = g.mig_capable ? 7 : 0;
    a->memorySizeMB = g.memory_mib;
  }
  return NVML_SUCCESS;
}
#endif

// ---- topology ---------------------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2,
                                                             nvmlGpuTopologyLevel_t* level) {
  ENTER();
  DEVICE(d1, a);
  DEVICE(d2, b);
  if (!level) return NVML_ERROR_INVALID_ARGUMENT;
  if (a.mig >= 0 || b.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  const GpuSpec& x = s.m.gpus[a.gpu];
  const GpuSpec& y = s.m.gpus[b.gpu];
  if (a.gpu == b.gpu)
    *level = NVML_TOPOLOGY_INTERNAL;
  else if (x.pcie_switch >= 0 && x.pcie_switch == y.pcie_switch)
    *level = NVML_TOPOLOGY_SINGLE;
  else if (x.host_bridge >= 0 && x.host_bridge == y.host_bridge)
    *level = NVML_TOPOLOGY_HOSTBRIDGE;
  else if (x.numa_node == y.numa_node)
    *level = NVML_TOPOLOGY_NODE;
  else
    *level = NVML_TOPOLOGY_SYSTEM;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link,
                                                  nvmlEnableState_t* active) {
  ENTER();
  DEVICE(dev, h);
  if (!active) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  auto links = Links(s, h.gpu);
  if (links.empty()) return NVML_ERROR_NOT_SUPPORTED;
  if (link >= links.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *active = NVML_FEATURE_ENABLED;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned int link,
                                                             nvmlPciInfo_t* p) {
  ENTER();
  DEVICE(dev, h);
  if (!p) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  auto links = Links(s, h.gpu);
  if (links.empty()) return NVML_ERROR_NOT_SUPPORTED;
  if (link >= links.size()) return NVML_ERROR_INVALID_ARGUMENT;
  uint32_t id = 0x10de;
  for (const GpuSpec& g : s.m.gpus)
    if (g.pci_bus_id == links[link].first) id = g.pci_device_id;
  FillPci(links[link].first, id, 0, p);
  return NVML_SUCCESS;
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned int link,
                                                             nvmlIntNvLinkDeviceType_t* type) {
  ENTER();
  DEVICE(dev, h);
  if (!type) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  auto links = Links(s, h.gpu);
  if (links.empty()) return NVML_ERROR_NOT_SUPPORTED;
  if (link >= links.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *type = links[link].second;
  return NVML_SUCCESS;
}
#endif

// ---- telemetry --------------------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int* t) {
  ENTER();
  DEVICE(dev, h);
  if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
  return Tel(s, h, "gpu_temp_c", t);
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count,
                                                  nvmlFieldValue_t* values) {
  ENTER();
  DEVICE(dev, h);
  if (!values || count < 0) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < count; ++i) {
    nvmlFieldValue_t& v = values[i];
    v.timestamp = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    v.latencyUsec = 0;
    if (v.fieldId == NVML_FI_DEV_MEMORY_TEMP) {
      v.valueType = 1;
      v.nvmlReturn = Tel(s, h, "memory_temp_c", &v.value.uiVal);
    } else if (v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ||
               v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) {
      // The machine file gives the sum over all links; per-link scopes are not modelled.
      v.valueType = 3;
      bool tx = v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
      v.nvmlReturn = v.scopeId != kNvmlScopeAllLinks
                         ? NVML_ERROR_NOT_SUPPORTED
                         : Tel(s, h, tx ? "nvlink_tx_kib" : "nvlink_rx_kib", &v.value.ullVal);
    } else if (v.fieldId == NVML_FI_DEV_POWER_AVERAGE || v.fieldId == NVML_FI_DEV_POWER_INSTANT) {
      v.valueType = 1;  // the simulated draw is steady: average == instant == power_usage_mw
      v.nvmlReturn = Tel(s, h, "power_usage_mw", &v.value.uiVal);
    } else if (v.fieldId == NVML_FI_DEV_PERF_POLICY_POWER ||
               v.fieldId == NVML_FI_DEV_PERF_POLICY_SYNC_BOOST) {
      v.valueType = 3;
      bool power = v.fieldId == NVML_FI_DEV_PERF_POLICY_POWER;
      v.nvmlReturn = Tel(s, h, power ? "clocks_event_power_cap_ns" : "clocks_event_sync_boost_ns",
                         &v.value.ullVal);
    } else {
      v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
  }
  return NVML_SUCCESS;
}
#endif
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int* mhz) {
  ENTER();
  DEVICE(dev, h);
  static const char* kKeys[] = {"graphics_clock_mhz", "sm_clock_mhz", "memory_clock_mhz",
                                "video_clock_mhz"};
  if (type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
  return Tel(s, h, kKeys[type], mhz);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int* mw) {
  ENTER();
  DEVICE(dev, h);
  return Tel(s, h, "power_usage_mw", mw);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int* mw) {
  ENTER();
  DEVICE(dev, h);
  if (!mw) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0 || s.m.gpus[h.gpu].power_limit_w == 0) return NVML_ERROR_NOT_SUPPORTED;
  *mw = s.m.gpus[h.gpu].power_limit_w * 1000;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t dev, unsigned int* mw) {
  return nvmlDeviceGetEnforcedPowerLimit(dev, mw);
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev,
                                                             unsigned long long* mj) {
  ENTER();
  DEVICE(dev, h);
  unsigned long long base = 0;
  if (nvmlReturn_t r = Tel(s, h, "total_energy_mj", &base); r != NVML_SUCCESS) return r;
  // The counter grows with the current power draw, as a real one does: mW x s = mJ.
  unsigned int mw = 0;
  Tel(s, h, "power_usage_mw", &mw);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.loaded).count();
  *mj = base + static_cast<unsigned long long>(mw * secs);
  return NVML_SUCCESS;
}
#endif
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t* u) {
  ENTER();
  DEVICE(dev, h);
  if (!u) return NVML_ERROR_INVALID_ARGUMENT;
  if (nvmlReturn_t r = Tel(s, h, "gpu_util_pct", &u->gpu); r != NVML_SUCCESS) return r;
  return Tel(s, h, "memory_util_pct", &u->memory);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned int* u,
                                                         unsigned int* period_us) {
  ENTER();
  DEVICE(dev, h);
  if (!period_us) return NVML_ERROR_INVALID_ARGUMENT;
  *period_us = 167000;
  return Tel(s, h, "encoder_util_pct", u);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned int* u,
                                                         unsigned int* period_us) {
  ENTER();
  DEVICE(dev, h);
  if (!period_us) return NVML_ERROR_INVALID_ARGUMENT;
  *period_us = 167000;
  return Tel(s, h, "decoder_util_pct", u);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int error_type, int counter,
                                                     unsigned long long* n) {
  ENTER();
  DEVICE(dev, h);
  if (!s.m.gpus[h.gpu].ecc) return NVML_ERROR_NOT_SUPPORTED;
  if ((error_type != 0 && error_type != 1) || (counter != 0 && counter != 1))
    return NVML_ERROR_INVALID_ARGUMENT;
  std::string key =
      absl::StrCat("ecc_", error_type ? "dbe" : "sbe", counter ? "_aggregate" : "_volatile");
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  auto it = s.rt[h.gpu].tel.find(key);
  *n = it == s.rt[h.gpu].tel.end() ? 0 : it->second;  // an ECC GPU counts from zero
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev,
                                                                   unsigned long long* r) {
  ENTER();
  DEVICE(dev, h);
  return Tel(s, h, "throttle_reasons", r);
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev,
                                                                unsigned long long* r) {
  return nvmlDeviceGetCurrentClocksThrottleReasons(dev, r);
}
#endif
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int* n) {
  ENTER();
  DEVICE(dev, h);
  return Tel(s, h, "pcie_replay_count", n);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter,
                                                     unsigned int* kbps) {
  ENTER();
  DEVICE(dev, h);
  if (counter != 0 && counter != 1) return NVML_ERROR_INVALID_ARGUMENT;
  return Tel(s, h, counter == 0 ? "pcie_tx_kbps" : "pcie_rx_kbps", kbps);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t dev, unsigned int* pct) {
  ENTER();
  DEVICE(dev, h);
  return Tel(s, h, "fan_speed_pct", pct);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t dev, int* p) {
  ENTER();
  DEVICE(dev, h);
  return Tel(s, h, "pstate", p);
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev,
                                                                 unsigned int* count,
                                                                 nvmlProcessInfo_t* infos) {
  ENTER();
  DEVICE(dev, h);
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) {
    *count = 0;
    return NVML_SUCCESS;
  }
  const auto& procs = s.m.gpus[h.gpu].processes;
  if (*count < procs.size()) {
    *count = static_cast<unsigned>(procs.size());
    return procs.empty() ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (size_t i = 0; i < procs.size(); ++i) {
    infos[i] = nvmlProcessInfo_t{procs[i].first, procs[i].second << 20, 0xFFFFFFFFu, 0xFFFFFFFFu};
  }
  *count = static_cast<unsigned>(procs.size());
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev,
                                                                 unsigned int* count,
                                                                 nvmlProcessInfo_t* infos) {
  return nvmlDeviceGetComputeRunningProcesses_v3(dev, count, infos);
}
#endif

// ---- the nvidia-smi set: static facts and modes from the machine file -------------------------

namespace gpulet::sim {
namespace {
// A fact of a physical GPU: NOT_SUPPORTED on a MIG device or when the machine file leaves it 0.
nvmlReturn_t Fact(const DevHandle& h, uint32_t v, unsigned int* out) {
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0 || v == 0) return NVML_ERROR_NOT_SUPPORTED;
  *out = v;
  return NVML_SUCCESS;
}
nvmlReturn_t FactString(const DevHandle& h, const std::string& v, char* out, unsigned int len) {
  if (h.mig >= 0 || v.empty()) return NVML_ERROR_NOT_SUPPORTED;
  return CopyString(v, out, len);
}
nvmlReturn_t Switch(const DevHandle& h, bool on, nvmlEnableState_t* out) {
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  *out = on ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}
}  // namespace
}  // namespace gpulet::sim

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t dev, char* v, unsigned int len) {
  ENTER();
  DEVICE(dev, h);
  return FactString(h, s.m.gpus[h.gpu].serial, v, len);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t dev, char* v, unsigned int len) {
  ENTER();
  DEVICE(dev, h);
  return FactString(h, s.m.gpus[h.gpu].vbios_version, v, len);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t dev, int object, char* v,
                                                     unsigned int len) {
  ENTER();
  DEVICE(dev, h);
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (object != NVML_INFOROM_OEM && object != NVML_INFOROM_ECC) return NVML_ERROR_NOT_SUPPORTED;
  return FactString(h, object == NVML_INFOROM_OEM ? g.inforom_oem : g.inforom_ecc, v, len);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned int* mhz) {
  ENTER();
  DEVICE(dev, h);
  const GpuSpec& g = s.m.gpus[h.gpu];
  switch (type) {
    case NVML_CLOCK_GRAPHICS:
      return Fact(h, g.max_graphics_clock_mhz, mhz);
    case NVML_CLOCK_SM:
      return Fact(h, g.max_sm_clock_mhz, mhz);
    case NVML_CLOCK_MEM:
      return Fact(h, g.max_memory_clock_mhz, mhz);
    default:
      return NVML_ERROR_NOT_SUPPORTED;
  }
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t dev,
                                                                  unsigned long long* r) {
  ENTER();
  DEVICE(dev, h);
  if (!r) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  *r = 0x1FF;  // nvmlClocksEventReasonGpuIdle .. DisplayClockSetting
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned int* v) {
  ENTER();
  DEVICE(dev, h);
  return Fact(h, s.m.gpus[h.gpu].pcie_gen, v);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int* v) {
  ENTER();
  DEVICE(dev, h);
  return Fact(h, s.m.gpus[h.gpu].pcie_gen_max, v);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int* v) {
  ENTER();
  DEVICE(dev, h);
  return Fact(h, s.m.gpus[h.gpu].pcie_gpu_gen_max, v);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned int* v) {
  ENTER();
  DEVICE(dev, h);
  return Fact(h, s.m.gpus[h.gpu].pcie_width, v);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned int* v) {
  ENTER();
  DEVICE(dev, h);
  return Fact(h, s.m.gpus[h.gpu].pcie_width_max, v);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t dev,
                                                                  unsigned int* mw) {
  ENTER();
  DEVICE(dev, h);
  return Fact(h, s.m.gpus[h.gpu].power_default_w * 1000, mw);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t dev,
                                                                      unsigned int* min_mw,
                                                                      unsigned int* max_mw) {
  ENTER();
  DEVICE(dev, h);
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (nvmlReturn_t r = Fact(h, g.power_min_w * 1000, min_mw); r != NVML_SUCCESS) return r;
  return Fact(h, g.power_max_w * 1000, max_mw);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGspFirmwareMode(nvmlDevice_t dev, unsigned int* enabled,
                                                      unsigned int* default_mode) {
  ENTER();
  DEVICE(dev, h);
  if (!enabled || !default_mode) return NVML_ERROR_INVALID_ARGUMENT;
  int mode = s.m.gpus[h.gpu].gsp_firmware;
  if (h.mig >= 0 || mode < 0) return NVML_ERROR_NOT_SUPPORTED;
  *enabled = *default_mode = static_cast<unsigned>(mode);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t dev, unsigned int* n) {
  ENTER();
  DEVICE(dev, h);
  return Fact(h, 4000, n);  // NVML's default buffer of per-process records
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t dev, nvmlEnableState_t* m) {
  ENTER();
  DEVICE(dev, h);
  return Switch(h, false, m);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, nvmlEnableState_t* m) {
  ENTER();
  DEVICE(dev, h);
  return Switch(h, s.m.gpus[h.gpu].persistence_mode, m);
}
// A simulated node is headless: no display attached or active.
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t dev, nvmlEnableState_t* m) {
  ENTER();
  DEVICE(dev, h);
  return Switch(h, false, m);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t dev, nvmlEnableState_t* m) {
  ENTER();
  DEVICE(dev, h);
  return Switch(h, false, m);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, int* mode) {
  ENTER();
  DEVICE(dev, h);
  if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
  *mode = s.m.gpus[h.gpu].compute_mode;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, nvmlEnableState_t* current,
                                              nvmlEnableState_t* pending) {
  ENTER();
  DEVICE(dev, h);
  if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
  if (!s.m.gpus[h.gpu].ecc || h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  *current = *pending = NVML_FEATURE_ENABLED;
  return NVML_SUCCESS;
}
// DRAM errors are the machine's ECC counters; the simulated SRAM never fails.
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t dev, int error_type,
                                                         int counter, int location,
                                                         unsigned long long* n) {
  ENTER();
  DEVICE(dev, h);
  if (!n || (error_type != 0 && error_type != 1) || (counter != 0 && counter != 1))
    return NVML_ERROR_INVALID_ARGUMENT;
  if (!s.m.gpus[h.gpu].ecc || h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  if (location == NVML_MEMORY_LOCATION_SRAM) {
    *n = 0;
    return NVML_SUCCESS;
  }
  if (location != NVML_MEMORY_LOCATION_DRAM) return NVML_ERROR_NOT_SUPPORTED;
  std::string key =
      absl::StrCat("ecc_", error_type ? "dbe" : "sbe", counter ? "_aggregate" : "_volatile");
  auto it = s.rt[h.gpu].tel.find(key);
  *n = it == s.rt[h.gpu].tel.end() ? 0 : it->second;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int* corr,
                                                   unsigned int* unc, unsigned int* pending,
                                                   unsigned int* failed) {
  ENTER();
  DEVICE(dev, h);
  if (!corr || !unc || !pending || !failed) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned int* outs[] = {corr, unc, pending, failed};
  const char* keys[] = {"remapped_rows_correctable", "remapped_rows_uncorrectable",
                        "remapped_rows_pending", "remapped_rows_failure"};
  for (int i = 0; i < 4; ++i) {
    if (nvmlReturn_t r = Tel(s, h, keys[i], outs[i]); r != NVML_SUCCESS) return r;
  }
  return NVML_SUCCESS;
}
// Every bank starts with all its spare rows; each remapped row uses one of a bank's.
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t dev,
                                                           nvmlRowRemapperHistogramValues_t* v) {
  ENTER();
  DEVICE(dev, h);
  if (!v) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned corr = 0, unc = 0;
  if (nvmlReturn_t r = Tel(s, h, "remapped_rows_correctable", &corr); r != NVML_SUCCESS) return r;
  Tel(s, h, "remapped_rows_uncorrectable", &unc);
  constexpr unsigned kBanks = 2560;
  unsigned used = std::min(kBanks, corr + unc);
  *v = nvmlRowRemapperHistogramValues_t{kBanks - used, used, 0, 0, 0};
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetJpgUtilization(nvmlDevice_t dev, unsigned int* u,
                                                     unsigned int* period_us) {
  ENTER();
  DEVICE(dev, h);
  if (!period_us) return NVML_ERROR_INVALID_ARGUMENT;
  *period_us = 167000;
  return Tel(s, h, "jpeg_util_pct", u);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetOfaUtilization(nvmlDevice_t dev, unsigned int* u,
                                                     unsigned int* period_us) {
  ENTER();
  DEVICE(dev, h);
  if (!period_us) return NVML_ERROR_INVALID_ARGUMENT;
  *period_us = 167000;
  return Tel(s, h, "ofa_util_pct", u);
}
// No encoder sessions run on a simulated node; answered where the encoder is modelled.
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetEncoderStats(nvmlDevice_t dev, unsigned int* sessions,
                                                   unsigned int* fps, unsigned int* latency_us) {
  ENTER();
  DEVICE(dev, h);
  if (!sessions || !fps || !latency_us) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned util = 0;
  if (nvmlReturn_t r = Tel(s, h, "encoder_util_pct", &util); r != NVML_SUCCESS) return r;
  *sessions = *fps = *latency_us = 0;
  return NVML_SUCCESS;
}

// ---- GPM: samples hold the GPU's GPM telemetry when taken; metrics are the later sample's ------

namespace gpulet::sim {
namespace {
struct GpmSampleRec {
  int gpu = -1;               // -1: allocated, never filled
  uint32_t gi = 0xFFFFFFFFu;  // GPU instance, or the whole GPU
  std::chrono::steady_clock::time_point at;
  std::map<unsigned, double> values;  // GPM metric id -> percent
};
std::set<GpmSampleRec*> g_gpm_samples;  // guarded by g_mu

bool GpmSupported(const GpuSpec& g) {
  return g.gpm >= 0 ? g.gpm == 1 : g.architecture >= NVML_DEVICE_ARCH_HOPPER;
}

void FillGpm(const State& s, int gpu, GpmSampleRec& rec) {
  const auto& t = s.rt[gpu].tel;
  auto get = [&](const char* key, const char* fallback) -> double {
    auto it = t.find(key);
    if (it == t.end() && fallback) it = t.find(fallback);
    return it == t.end() ? 0.0 : static_cast<double>(it->second);
  };
  rec.values = {{NVML_GPM_METRIC_GRAPHICS_UTIL, get("gpm_graphics_util_pct", "gpu_util_pct")},
                {NVML_GPM_METRIC_SM_UTIL, get("gpm_sm_util_pct", nullptr)},
                {NVML_GPM_METRIC_SM_OCCUPANCY, get("gpm_sm_occupancy_pct", nullptr)},
                {NVML_GPM_METRIC_ANY_TENSOR_UTIL, get("gpm_tensor_util_pct", nullptr)},
                {NVML_GPM_METRIC_DRAM_BW_UTIL, get("gpm_dram_bw_util_pct", "memory_util_pct")},
                {NVML_GPM_METRIC_FP64_UTIL, get("gpm_fp64_util_pct", nullptr)},
                {NVML_GPM_METRIC_FP32_UTIL, get("gpm_fp32_util_pct", nullptr)},
                {NVML_GPM_METRIC_FP16_UTIL, get("gpm_fp16_util_pct", nullptr)}};
  for (auto& [id, v] : rec.values) v = std::min(v, 100.0);
}
}  // namespace
}  // namespace gpulet::sim

FAKE_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t* support) {
  ENTER();
  DEVICE(dev, h);
  if (!support) return NVML_ERROR_INVALID_ARGUMENT;
  if (support->version != NVML_GPM_SUPPORT_VERSION)
    return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  support->isSupportedDevice = h.mig < 0 && GpmSupported(s.m.gpus[h.gpu]);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t* sample) {
  ENTER();
  if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
  auto* rec = new GpmSampleRec();
  g_gpm_samples.insert(rec);
  *sample = reinterpret_cast<nvmlGpmSample_t>(rec);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* rec = reinterpret_cast<GpmSampleRec*>(sample);
  if (!g_gpm_samples.erase(rec)) return NVML_ERROR_INVALID_ARGUMENT;
  delete rec;
  return NVML_SUCCESS;
}
namespace gpulet::sim {
namespace {
nvmlReturn_t GpmSample(State& s, const DevHandle& h, uint32_t gi, nvmlGpmSample_t sample) {
  auto* rec = reinterpret_cast<GpmSampleRec*>(sample);
  if (!g_gpm_samples.count(rec) || h.mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (!GpmSupported(g)) return NVML_ERROR_NOT_SUPPORTED;
  if (gi != 0xFFFFFFFFu) {
    bool found =
        std::any_of(g.mig.begin(), g.mig.end(), [&](const MigSpec& m) { return m.gi == gi; });
    if (!found) return NVML_ERROR_NOT_FOUND;
  }
  rec->gpu = h.gpu;
  rec->gi = gi;
  rec->at = std::chrono::steady_clock::now();
  FillGpm(s, h.gpu, *rec);
  return NVML_SUCCESS;
}
}  // namespace
}  // namespace gpulet::sim
FAKE_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
  ENTER();
  DEVICE(dev, h);
  return GpmSample(s, h, 0xFFFFFFFFu, sample);
}
FAKE_EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t dev, unsigned int gpu_instance_id,
                                             nvmlGpmSample_t sample) {
  ENTER();
  DEVICE(dev, h);
  if (gpu_instance_id == 0xFFFFFFFFu) return NVML_ERROR_INVALID_ARGUMENT;
  return GpmSample(s, h, gpu_instance_id, sample);
}
// As NVML: both samples filled, of the same device or instance, the first one older.
FAKE_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t* mg) {
  ENTER();
  if (!mg) return NVML_ERROR_INVALID_ARGUMENT;
  if (mg->version != NVML_GPM_METRICS_GET_VERSION)
    return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  if (mg->numMetrics > NVML_GPM_METRIC_MAX) return NVML_ERROR_INVALID_ARGUMENT;
  auto* a = reinterpret_cast<GpmSampleRec*>(mg->sample1);
  auto* b = reinterpret_cast<GpmSampleRec*>(mg->sample2);
  if (!g_gpm_samples.count(a) || !g_gpm_samples.count(b) || a->gpu < 0 || b->gpu < 0 ||
      a->gpu != b->gpu || a->gi != b->gi || !(a->at < b->at)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  for (unsigned i = 0; i < mg->numMetrics; ++i) {
    nvmlGpmMetric_t& m = mg->metrics[i];
    auto it = b->values.find(m.metricId);
    m.nvmlReturn = it == b->values.end() ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    m.value = it == b->values.end() ? 0 : it->second;
    m.metricInfo = {nullptr, nullptr, nullptr};
  }
  return NVML_SUCCESS;
}

// ---- events -----------------------------------------------------------------------------------

FAKE_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  ENTER();
  if (!set) return NVML_ERROR_INVALID_ARGUMENT;
  auto* es = new EventSet();
  s.sets.insert(es);
  *set = reinterpret_cast<nvmlEventSet_t>(es);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_state) return NVML_ERROR_UNINITIALIZED;
  auto* es = reinterpret_cast<EventSet*>(set);
  if (!g_state->sets.erase(es)) return NVML_ERROR_INVALID_ARGUMENT;
  delete es;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev,
                                                          unsigned long long* types) {
  ENTER();
  DEVICE(dev, h);
  if (!types) return NVML_ERROR_INVALID_ARGUMENT;
  *types = s.m.gpus[h.gpu].ecc ? kSupportedEvents : nvmlEventTypeXidCriticalError;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types,
                                                  nvmlEventSet_t set) {
  ENTER();
  DEVICE(dev, h);
  auto* es = reinterpret_cast<EventSet*>(set);
  if (!s.sets.count(es)) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned long long supported =
      s.m.gpus[h.gpu].ecc ? kSupportedEvents : nvmlEventTypeXidCriticalError;
  if (h.mig >= 0 || (types & ~supported)) return NVML_ERROR_NOT_SUPPORTED;
  es->masks[h.gpu] |= types;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t* data,
                                          unsigned int timeout_ms) {
  return EventWait(set, data, timeout_ms);
}
#ifndef GPULET_FAKE_NVML_LEGACY
FAKE_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data,
                                             unsigned int timeout_ms) {
  return EventWait(set, data, timeout_ms);
}
#endif

// ---- what other NVML consumers call (HAMi-core, NVIDIA's go-nvml programs) ---------------------

namespace gpulet::sim {
namespace {
// nvmlDeviceGetComputeRunningProcesses (no suffix): the first process record, without the MIG ids.
struct ProcessInfoV1 {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
// nvmlDeviceGetProcessUtilization's sample.
struct ProcessUtilizationSample {
  unsigned int pid;
  unsigned long long timeStamp;  // microseconds since the epoch
  unsigned int smUtil, memUtil, encUtil, decUtil;
};

[[maybe_unused]] uint64_t NowMicros() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// The first physical GPU `match` accepts, as a handle lookup answers it.
template <typename Match>
nvmlReturn_t GpuWhere(const State& s, Match match, nvmlDevice_t* d) {
  for (size_t i = 0; i < s.gpus.size(); ++i) {
    if (!match(s.m.gpus[i])) continue;
    if (s.rt[i].lost) return NVML_ERROR_GPU_IS_LOST;
    *d = reinterpret_cast<nvmlDevice_t>(s.gpus[i].get());
    return NVML_SUCCESS;
  }
  return NVML_ERROR_NOT_FOUND;
}

// The trace of unsupported calls (see unsupported.inc): one name per line, appended.
[[maybe_unused]] void TraceUnsupported(const char* name) {
  const char* path = std::getenv("GPULET_FAKE_NVML_TRACE");
  if (path == nullptr || *path == '\0') return;
  int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string line = std::string(name) + "\n";
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}
}  // namespace
}  // namespace gpulet::sim

FAKE_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char* name, unsigned int len) {
  ENTER();
  if (name == nullptr || len == 0) return NVML_ERROR_INVALID_ARGUMENT;
  for (const GpuSpec& g : s.m.gpus)
    for (const auto& [p, mib] : g.processes)
      if (p == pid) {
        // The machine file names no programs; a simulated process is a CUDA program by its pid.
        std::string comm = absl::StrCat("sim-process-", pid);
        std::snprintf(name, len, "%s", comm.c_str());
        return NVML_SUCCESS;
      }
  return NVML_ERROR_NOT_FOUND;
}

#ifndef GPULET_FAKE_NVML_LEGACY
// The first ABI: records without the MIG ids, otherwise as _v3 (same processes, same sizes).
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned int* count,
                                                              void* out) {
  ENTER();
  DEVICE(dev, h);
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) {
    *count = 0;
    return NVML_SUCCESS;
  }
  const auto& procs = s.m.gpus[h.gpu].processes;
  if (*count < procs.size() || (out == nullptr && !procs.empty())) {
    *count = static_cast<unsigned>(procs.size());
    return procs.empty() ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
  }
  auto* infos = static_cast<ProcessInfoV1*>(out);
  for (size_t i = 0; i < procs.size(); ++i)
    infos[i] = ProcessInfoV1{procs[i].first, procs[i].second << 20};
  *count = static_cast<unsigned>(procs.size());
  return NVML_SUCCESS;
}

// One sample per running process, newer than `last_seen` (microseconds). The GPU's utilisation
// (gpu_util_pct, memory_util_pct) is shared among its processes in proportion to their memory,
// so the per-process figures add up to what nvmlDeviceGetUtilizationRates says. NOT_FOUND when
// there is no sample, as NVML.
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, void* out,
                                                         unsigned int* count,
                                                         unsigned long long last_seen) {
  ENTER();
  DEVICE(dev, h);
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  if (h.mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
  const auto& procs = s.m.gpus[h.gpu].processes;
  const uint64_t now = NowMicros();
  if (procs.empty() || last_seen >= now) return NVML_ERROR_NOT_FOUND;
  if (out == nullptr || *count < procs.size()) {
    *count = static_cast<unsigned>(procs.size());
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  const auto& tel = s.rt[h.gpu].tel;
  auto value = [&](const char* key) -> uint64_t {
    auto it = tel.find(key);
    return it == tel.end() ? 0 : it->second;
  };
  uint64_t total = 0;
  for (const auto& p : procs) total += p.second;
  auto* samples = static_cast<ProcessUtilizationSample*>(out);
  for (size_t i = 0; i < procs.size(); ++i) {
    auto share = [&](uint64_t pct) {
      return static_cast<unsigned>(total == 0 ? pct / procs.size() : pct * procs[i].second / total);
    };
    samples[i] = ProcessUtilizationSample{procs[i].first,
                                          now,
                                          share(value("gpu_util_pct")),
                                          share(value("memory_util_pct")),
                                          share(value("encoder_util_pct")),
                                          share(value("decoder_util_pct"))};
  }
  *count = static_cast<unsigned>(procs.size());
  return NVML_SUCCESS;
}

// The old name of nvmlDeviceGetSupportedClocksEventReasons (renamed in CUDA 12.2's NVML).
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t dev,
                                                                     unsigned long long* r) {
  return nvmlDeviceGetSupportedClocksEventReasons(dev, r);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvmlDevice_t* d) {
  ENTER();
  if (!bus_id || !d) return NVML_ERROR_INVALID_ARGUMENT;
  // NVML accepts the 8- and 4-digit domain forms, any case.
  std::string want = absl::AsciiStrToLower(bus_id);
  if (want.size() == 12) want = "0000" + want;
  return GpuWhere(
      s, [&](const GpuSpec& g) { return absl::AsciiStrToLower(g.pci_bus_id) == want; }, d);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* bus_id, nvmlDevice_t* d) {
  return nvmlDeviceGetHandleByPciBusId_v2(bus_id, d);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char* serial, nvmlDevice_t* d) {
  ENTER();
  if (!serial || !d) return NVML_ERROR_INVALID_ARGUMENT;
  return GpuWhere(
      s, [&](const GpuSpec& g) { return !g.serial.empty() && g.serial == serial; }, d);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, unsigned int* node) {
  ENTER();
  DEVICE(dev, h);
  if (!node) return NVML_ERROR_INVALID_ARGUMENT;
  int n = s.m.gpus[h.gpu].numa_node;
  if (n < 0) return NVML_ERROR_NOT_SUPPORTED;
  *node = static_cast<unsigned>(n);
  return NVML_SUCCESS;
}

// ---- MIG instances: GPU instances and compute instances behind the MIG devices ---------------
// NVIDIA's go-nvlib names a MIG device's profile from its GPU instance's and compute instance's
// profile IDs (nvmlDeviceGetGpuInstanceById -> nvmlGpuInstanceGetInfo, matched against
// nvmlDeviceGetGpuInstanceProfileInfo), so the fake serves those objects for the machine file's
// MIG devices. Layouts are facts of NVML's API reference (nvmlGpuInstanceProfileInfo_t, ...).

namespace gpulet::sim {
namespace {
struct GpuInstanceProfileInfo {
  unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
      decoderCount, encoderCount, jpegCount, ofaCount;
  unsigned long long memorySizeMB;
};
struct InstancePlacement {
  unsigned int start, size;
};
struct GpuInstanceInfo {
  nvmlDevice_t device;
  unsigned int id, profileId;
  InstancePlacement placement;
};
struct ComputeInstanceInfo {
  nvmlDevice_t device;
  void* gpuInstance;
  unsigned int id, profileId;
  InstancePlacement placement;
};
struct ComputeInstanceProfileInfo {
  unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
      sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
};
// What an nvmlGpuInstance_t / nvmlComputeInstance_t points to. Kept for the life of the process
// (a handful per MIG device), so a handle stays valid across nvmlShutdown/nvmlInit as NVML's do.
struct InstanceHandle {
  int gpu = 0;
  uint32_t gi = 0;
  int ci = -1;  // -1: the GPU instance itself
};
std::map<std::tuple<int, uint32_t, int>, std::unique_ptr<InstanceHandle>> g_instances;

InstanceHandle* Instance(int gpu, uint32_t gi, int ci) {
  auto& h = g_instances[{gpu, gi, ci}];
  if (!h) h = std::make_unique<InstanceHandle>(InstanceHandle{gpu, gi, ci});
  return h.get();
}
const InstanceHandle* FindInstance(const void* p, bool compute) {
  for (const auto& [k, h] : g_instances)
    if (h.get() == p) return (h->ci >= 0) == compute ? h.get() : nullptr;
  return nullptr;
}
// NVML's GPU instance profile IDs by slice count (1_SLICE = 0, 2 = 1, 3 = 2, 4 = 3, 7 = 4,
// 8 = 5, 6 = 6); "+me" 1-slice is 1_SLICE_REV1 = 7. -1: none.
int GiProfileId(uint32_t slices, bool media) {
  if (media && slices == 1) return 7;
  switch (slices) {
    case 1:
      return 0;
    case 2:
      return 1;
    case 3:
      return 2;
    case 4:
      return 3;
    case 7:
      return 4;
    case 8:
      return 5;
    case 6:
      return 6;
    default:
      return -1;
  }
}
int SlicesOfGiProfile(unsigned profile) {
  switch (profile) {
    case 0:
    case 7:
      return 1;
    case 1:
      return 2;
    case 2:
      return 3;
    case 3:
      return 4;
    case 4:
      return 7;
    case 5:
      return 8;
    case 6:
      return 6;
    default:
      return 0;
  }
}
// Compute instance profile IDs use the same numbering by slice count.
int CiProfileId(uint32_t slices) { return GiProfileId(slices, false); }

const MigSpec* MigOf(const State& s, int gpu, uint32_t gi, int ci) {
  for (const MigSpec& m : s.m.gpus[gpu].mig)
    if (m.gi == gi && (ci < 0 || m.ci == static_cast<uint32_t>(ci))) return &m;
  return nullptr;
}
}  // namespace
}  // namespace gpulet::sim

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t dev, unsigned int profile,
                                                             void* out) {
  ENTER();
  DEVICE(dev, h);
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (!out || h.mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (!g.mig_capable) return NVML_ERROR_NOT_SUPPORTED;
  if (profile >= 10) return NVML_ERROR_INVALID_ARGUMENT;
  const int slices = SlicesOfGiProfile(profile);
  // The standard profiles of a 7-slice GPU, plus whatever the machine's layouts use.
  const MigSpec* seen = nullptr;
  for (const GpuSpec& other : s.m.gpus)
    for (const MigSpec& m : other.mig)
      if (other.name == g.name && GiProfileId(m.gi_slices, absl::StrContains(m.profile, "+me")) ==
                                      static_cast<int>(profile))
        seen = &m;
  if (seen == nullptr && (profile > 4 || slices == 0)) return NVML_ERROR_NOT_SUPPORTED;
  GpuInstanceProfileInfo info{};
  info.id = profile;
  info.sliceCount = static_cast<unsigned>(slices);
  info.instanceCount = slices == 3 ? 2 : 7 / static_cast<unsigned>(slices);
  info.multiprocessorCount = seen ? seen->sm_count : g.sm_count * static_cast<unsigned>(slices) / 8;
  info.memorySizeMB = seen ? seen->memory_mib : g.memory_mib * static_cast<unsigned>(slices) / 8;
  info.copyEngineCount = static_cast<unsigned>(slices);
  std::memcpy(out, &info, sizeof info);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t dev, unsigned int id,
                                                      void** gi) {
  ENTER();
  DEVICE(dev, h);
  if (!gi || h.mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
  const GpuSpec& g = s.m.gpus[h.gpu];
  if (!g.mig_capable) return NVML_ERROR_NOT_SUPPORTED;
  if (!g.mig_enabled || MigOf(s, h.gpu, id, -1) == nullptr) return NVML_ERROR_NOT_FOUND;
  *gi = Instance(h.gpu, id, -1);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(void* gi, void* out) {
  ENTER();
  const InstanceHandle* in = FindInstance(gi, false);
  if (!in || !out) return NVML_ERROR_INVALID_ARGUMENT;
  const MigSpec* m = MigOf(s, in->gpu, in->gi, -1);
  if (m == nullptr) return NVML_ERROR_NOT_FOUND;  // the layout changed under the handle
  GpuInstanceInfo info{};
  info.device = reinterpret_cast<nvmlDevice_t>(s.gpus[in->gpu].get());
  info.id = in->gi;
  info.profileId =
      static_cast<unsigned>(GiProfileId(m->gi_slices, absl::StrContains(m->profile, "+me")));
  info.placement = {in->gi, m->gi_slices};
  std::memcpy(out, &info, sizeof info);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void* gi, unsigned int id,
                                                               void** ci) {
  ENTER();
  const InstanceHandle* in = FindInstance(gi, false);
  if (!in || !ci) return NVML_ERROR_INVALID_ARGUMENT;
  if (MigOf(s, in->gpu, in->gi, static_cast<int>(id)) == nullptr) return NVML_ERROR_NOT_FOUND;
  *ci = Instance(in->gpu, in->gi, static_cast<int>(id));
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void* ci, void* out) {
  ENTER();
  const InstanceHandle* in = FindInstance(ci, true);
  if (!in || !out) return NVML_ERROR_INVALID_ARGUMENT;
  const MigSpec* m = MigOf(s, in->gpu, in->gi, in->ci);
  if (m == nullptr) return NVML_ERROR_NOT_FOUND;
  ComputeInstanceInfo info{};
  info.device = reinterpret_cast<nvmlDevice_t>(s.gpus[in->gpu].get());
  info.gpuInstance = Instance(in->gpu, in->gi, -1);
  info.id = static_cast<unsigned>(in->ci);
  info.profileId = static_cast<unsigned>(CiProfileId(m->ci_slices));
  info.placement = {0, m->ci_slices};
  std::memcpy(out, &info, sizeof info);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(void* ci, void* out) {
  return nvmlComputeInstanceGetInfo_v2(ci, out);
}

FAKE_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(void* gi,
                                                                      unsigned int profile,
                                                                      unsigned int eng_profile,
                                                                      void* out) {
  ENTER();
  const InstanceHandle* in = FindInstance(gi, false);
  if (!in || !out) return NVML_ERROR_INVALID_ARGUMENT;
  const MigSpec* m = MigOf(s, in->gpu, in->gi, -1);
  if (m == nullptr) return NVML_ERROR_NOT_FOUND;
  if (profile >= 8 || eng_profile >= 1) return NVML_ERROR_INVALID_ARGUMENT;
  const int slices = SlicesOfGiProfile(profile);
  if (profile == 7 || slices == 0 || static_cast<uint32_t>(slices) > m->gi_slices)
    return NVML_ERROR_NOT_SUPPORTED;
  ComputeInstanceProfileInfo info{};
  info.id = profile;
  info.sliceCount = static_cast<unsigned>(slices);
  info.instanceCount = m->gi_slices / static_cast<unsigned>(slices);
  info.multiprocessorCount = m->sm_count * static_cast<unsigned>(slices) / m->gi_slices;
  std::memcpy(out, &info, sizeof info);
  return NVML_SUCCESS;
}

#define FAKE_UNSUPPORTED(name)                                         \
  FAKE_EXPORT nvmlReturn_t name() {                                    \
    gpulet::sim::TraceUnsupported(#name);                              \
    std::lock_guard<std::mutex> lock(gpulet::sim::g_mu);               \
    if (gpulet::sim::g_refcount == 0) return NVML_ERROR_UNINITIALIZED; \
    return NVML_ERROR_NOT_SUPPORTED;                                   \
  }
#include "fake_nvml/unsupported.inc"
#undef FAKE_UNSUPPORTED
#endif
