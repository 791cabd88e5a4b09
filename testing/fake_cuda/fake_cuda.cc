// A fake CUDA driver (libcuda.so.1) and the few NVML memory/utilisation calls the interposer
// makes (libnvidia-ml.so.1 is a symlink to this library), at the real C ABI, so that the
// interposer's production code paths run without a GPU.
//
// Model: devices with memory accounting (allocations fail past the device total, like a real
// GPU), contexts (each charges FAKE_CUDA_CONTEXT_BYTES of device memory), streams, events and
// kernels that "run" for a simulated time: a kernel needs grid blocks x FAKE_CUDA_NS_PER_BLOCK ns
// of the device (a graph launch FAKE_CUDA_GRAPH_NS). The device time-slices between contexts as a
// real GPU does without MPS: each context's work runs in submission order, one context at a time;
// while other contexts have work waiting, the running one is switched out after a time slice
// (FAKE_CUDA_TIMESLICE_NS, 2 ms), round robin, and resumes where it stopped. So a context with
// work gets 1/k of the device beside k-1 busy ones, whatever they queued before it (the fake used
// to serve the device first-come-first-served, which no GPU does between contexts). Completion is
// computed lazily: events and synchronisations advance the device to "now" and a synchronisation
// sleeps until its work is done given what is queued (re-checking if others queued more). With
// FAKE_CUDA_STATE=<file> the device memory counters live in a shared file, so several processes
// share one GPU's memory and tests can read the device truth (peak usage) from outside the
// processes under test; the time-sliced timeline is per process (tests that share a GPU's time
// run their tenants as contexts of one process, see fakecuda_set_context_pid).
//
// Environment: FAKE_CUDA_DEVICE_COUNT (1), FAKE_CUDA_DEVICE_MEMORY (16 GiB),
// FAKE_CUDA_CONTEXT_BYTES (0; a real context holds ~518 MiB on an H200), FAKE_CUDA_ALLOC_GRANULE
// (1: allocations are rounded up to it on the device, 2 MiB on real GPUs), FAKE_CUDA_MODULE_BYTES
// (0: device memory a cuModuleLoadData holds), FAKE_CUDA_NVML_PID_OFFSET (0: NVML's pids are
// getpid() + this, as in a container's pid namespace), FAKE_CUDA_NO_PROCESS_INFO (NVML cannot list
// processes), FAKE_CUDA_NS_PER_BLOCK (1000), FAKE_CUDA_GRAPH_NS (1000000), FAKE_CUDA_TIMESLICE_NS
// (2000000), FAKE_CUDA_STATE, FAKE_CUDA_PROC_LOG (append one "symbol:version:flags" line per
// cuGetProcAddress call), FAKE_CUDA_UUIDS (the devices' UUIDs by physical index, comma-separated,
// and so their count; default GPU-face0000-0000-0000-0000-<index>: a test gives the fake the GPUs
// of a simulated machine, whose NVML reports the same UUIDs, as a real driver's CUDA and NVML do),
// FAKE_CUDA_DEVICE_NODES (a directory: physical device i exists only if <dir>/nvidia<i> does, as
// the real driver sees only the GPUs whose device nodes a container was given),
// CUDA_VISIBLE_DEVICES (indexes or GPU-UUID prefixes among those, applied at cuInit like the real
// driver). VMM memory (cuMemCreate) stays allocated while mapped (cuMemMap), released or not, and
// is freed when both released and unmapped, as the real driver does. Test-only entry points
// (fakecuda_*) set a virtual clock and read the timeline. Thread-safety: every entry point may be
// called from any thread (one mutex; it is a fake).
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "abi/cuda_abi.h"

namespace {

constexpr int kMaxDevices = 16;

struct SharedDevice {  // lives in FAKE_CUDA_STATE when set
  std::atomic<uint64_t> used;
  std::atomic<uint64_t> peak;
  std::atomic<int64_t> busy_until;
  std::atomic<uint64_t> busy_total;
};
// NVML's per-process view (nvmlDeviceGetComputeRunningProcesses_v3): what each process holds on
// each device, contexts, module code and rounding included. Appended after dev[] so that readers
// of the device counters keep their offsets.
constexpr int kMaxProcs = 64;
struct SharedProc {
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> used;
};
struct SharedState {
  SharedDevice dev[kMaxDevices];
  SharedProc procs[kMaxDevices][kMaxProcs];
};

struct Ctx {
  int device;  // physical index
  bool primary;
  int channel;  // its queue on the device (Driver::channels)
};
struct Stream {};
struct Event {
  std::atomic<int64_t> time{-1};  // -1: never recorded, kPending: its work has not finished
  uint64_t generation = 0;        // a re-record makes the stamps of older records stale
  int channel = -1;
  uint64_t seq = 0;  // completes with this launch of its channel
};
constexpr int64_t kPending = -2;

// A run of launches of one context, executed in order. Consecutive launches merge into one item
// (so a queue stays short however many launches are in flight) unless an event was recorded
// between them: the event completes when the item before it does.
struct Work {
  int64_t ready;      // not before: the front end of a launch onto an idle context
  int64_t remaining;  // ns of device time still to run
  uint64_t seq;       // the last launch this item stands for
  std::vector<std::pair<Event*, uint64_t>> stamps;  // (event, generation) completed with it
};
struct Queue {
  std::deque<Work> q;
  uint64_t done_seq = 0;  // every launch up to this one has finished
};
// One context's share of a device: its queue and its history (for busy time and NVML samples).
struct Channel {
  int device = 0;
  bool foreign = false;  // a neighbour tenant's work (fakecuda_foreign_work), not this process's
  int64_t nvml_pid = 0;  // 0: getpid() + FAKE_CUDA_NVML_PID_OFFSET
  uint64_t next_seq = 1;
  Queue queue;
  std::vector<std::pair<int64_t, int64_t>> exec;    // [start, end) it ran on the device
  std::vector<std::pair<int64_t, int64_t>> active;  // the same plus front ends (NVML's samples)
};
// Which channel holds a device now, and until when (round-robin time slices).
struct SliceState {
  int64_t t = 0;  // the device is simulated up to here
  int cur = -1;   // index into the device's channel list
  int64_t slice_end = 0;
};

void AppendMerged(std::vector<std::pair<int64_t, int64_t>>& v, int64_t a, int64_t b) {
  if (b <= a) return;
  if (!v.empty() && v.back().second >= a) {
    v.back().second = std::max(v.back().second, b);
  } else {
    v.emplace_back(a, b);
  }
}

// Runs the device whose queues are `qs` from s.t up to `until`, round robin between the queues
// with work ready, `slice` ns each while others wait. on_run(i, a, b): queue i ran [a, b);
// on_done(i, work, t): work finished at t. With stop >= 0, returns the time queue `stop` finished
// launch `stop_seq` (and stops there); otherwise -1.
template <class OnRun, class OnDone>
int64_t Simulate(SliceState& s, const std::vector<Queue*>& qs, int64_t slice, int64_t until,
                 int stop, uint64_t stop_seq, OnRun&& on_run, OnDone&& on_done) {
  const int n = static_cast<int>(qs.size());
  auto runnable = [&](int i) { return !qs[i]->q.empty() && qs[i]->q.front().ready <= s.t; };
  for (;;) {
    if (stop >= 0 && qs[stop]->done_seq >= stop_seq) return s.t;
    if (s.t >= until || n == 0) return -1;
    bool cur_ok = s.cur >= 0 && s.cur < n && runnable(s.cur);
    if (!cur_ok || s.t >= s.slice_end) {
      int pick = -1;
      for (int k = 1; k <= n && pick < 0; ++k) {
        int i = ((s.cur < 0 ? n - 1 : s.cur) + k) % n;
        if (runnable(i)) pick = i;
      }
      if (pick < 0) {  // nothing ready: idle until the next front end completes
        int64_t next = INT64_MAX;
        for (Queue* q : qs)
          if (!q->q.empty()) next = std::min(next, q->q.front().ready);
        if (next == INT64_MAX) {
          s.t = std::max(s.t, until == INT64_MAX ? s.t : until);
          return -1;
        }
        s.t = std::min(next, until);
        s.cur = -1;
        continue;
      }
      s.cur = pick;
      s.slice_end = s.t + slice;
    }
    Work& w = qs[s.cur]->q.front();
    int64_t end = std::min({s.t + w.remaining, s.slice_end, until});
    on_run(s.cur, s.t, end);
    w.remaining -= end - s.t;
    s.t = end;
    if (w.remaining == 0) {
      qs[s.cur]->done_seq = w.seq;
      on_done(s.cur, w, s.t);
      qs[s.cur]->q.pop_front();
    }
  }
}
struct Func {
  std::string name;
};
struct Alloc {
  int device;
  uint64_t bytes;
};

// Handles live until the process exits (destroy calls only drop their state): a destroyed handle
// stays a valid address, and leak checkers see every object as reachable.
std::mutex g_keep_mu;
template <class T>
T* Keep(T* p) {
  static auto* keep = new std::vector<std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(g_keep_mu);
  keep->emplace_back(p);
  return p;
}

int64_t (*g_test_now)() = nullptr;
void (*g_test_sleep_until)(int64_t) = nullptr;

int64_t Now() {
  if (g_test_now) return g_test_now();
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
void SleepUntil(int64_t t) {
  if (g_test_sleep_until) return g_test_sleep_until(t);
  for (int64_t now = Now(); now < t; now = Now()) {
    timespec d{static_cast<time_t>((t - now) / 1000000000),
               static_cast<long>((t - now) % 1000000000)};
    nanosleep(&d, nullptr);
  }
}

uint64_t EnvU64(const char* name, uint64_t dflt) {
  const char* v = getenv(name);
  return v && *v ? strtoull(v, nullptr, 10) : dflt;
}

struct Driver {
  std::mutex mu;
  bool initialized = false;
  int physical_count = 1;
  uint64_t memory = 16ull << 30, context_bytes = 0, ns_per_block = 1000, graph_ns = 1000000;
  uint64_t granule = 1, module_bytes = 0;
  // Host time a launch / an event record takes (a real driver: ~4 us / ~1 us); spent on the
  // test's virtual clock, before the work reaches the device timeline. 0 without a test clock.
  std::atomic<int64_t> launch_ns{0}, event_ns{0};
  // GPU time between a launch reaching an idle stream and its kernel starting on the SMs (a real
  // GPU's front end: ~2-3 us on an H200). Queued launches hide it behind the work ahead of them.
  // Not busy time: the device timeline (and fakecuda_busy_between) holds only the kernel itself.
  int64_t gpu_launch_ns = 0;
  int64_t timeslice_ns = 2'000'000;
  std::vector<std::unique_ptr<Channel>> channels;  // every context's queue, any device
  std::vector<int> dev_channels[kMaxDevices];      // ... per physical device, round-robin order
  std::vector<Queue*> dev_queues[kMaxDevices];     // their queues, in the same order
  SliceState slice[kMaxDevices];
  int foreign_channel[kMaxDevices];  // -1 until a neighbour's work arrives
  int proc_slot[kMaxDevices];        // this process's entry in shared->procs[dev], -1 none
  std::vector<int> visible;          // ordinal -> physical index
  std::vector<std::string> uuids;    // FAKE_CUDA_UUIDS by physical index (empty: GPU-face...)
  SharedState local{};
  SharedState* shared = &local;
  std::map<uint64_t, Alloc> allocs;  // device pointers, arrays, mipmaps, VMM handles
  // VMM: live mappings per physical handle, and the handles released while still mapped (their
  // memory stays on the device until the last mapping goes, as with the real driver).
  std::map<uint64_t, int> vmm_maps;
  std::map<uint64_t, bool> vmm_released;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> mappings;  // address -> (size, handle)
  uint64_t next_va = 0x600000000000ull;                        // cuMemAddressReserve
  uint64_t next_ptr = 0x7f0000000000ull;
  uint64_t next_ptr32 = 0x10000000ull;  // the 32-bit (v1) entry points get addresses below 4 GiB
  std::map<int, int> primary_refs;      // physical device -> retain count
  std::map<int, CUcontext> primary;
  thread_local static CUcontext current;
  std::vector<std::pair<int64_t, int64_t>> intervals;  // this process's kernels ran [start, end)
  uint64_t allocated = 0;                              // this process's live bytes
  uint64_t charged[kMaxDevices] = {};                  // ... per physical device

  Driver() {
    physical_count =
        std::clamp<int>(static_cast<int>(EnvU64("FAKE_CUDA_DEVICE_COUNT", 1)), 1, kMaxDevices);
    if (const char* list = getenv("FAKE_CUDA_UUIDS"); list && *list) {
      std::string rest = list;
      for (size_t pos = 0; pos <= rest.size() && uuids.size() < kMaxDevices;) {
        size_t comma = rest.find(',', pos);
        uuids.push_back(rest.substr(pos, comma == std::string::npos ? comma : comma - pos));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      physical_count = static_cast<int>(uuids.size());
    }
    memory = EnvU64("FAKE_CUDA_DEVICE_MEMORY", memory);
    context_bytes = EnvU64("FAKE_CUDA_CONTEXT_BYTES", 0);
    ns_per_block = EnvU64("FAKE_CUDA_NS_PER_BLOCK", ns_per_block);
    graph_ns = EnvU64("FAKE_CUDA_GRAPH_NS", graph_ns);
    granule = std::max<uint64_t>(1, EnvU64("FAKE_CUDA_ALLOC_GRANULE", 1));
    module_bytes = EnvU64("FAKE_CUDA_MODULE_BYTES", 0);
    timeslice_ns =
        std::max<int64_t>(1000, static_cast<int64_t>(EnvU64("FAKE_CUDA_TIMESLICE_NS", 2'000'000)));
    for (int& s : proc_slot) s = -1;
    for (int& c : foreign_channel) c = -1;
    if (const char* path = getenv("FAKE_CUDA_STATE")) {
      int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd >= 0 && ftruncate(fd, sizeof(SharedState)) == 0) {
        void* p = mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) shared = static_cast<SharedState*>(p);
      }
      if (fd >= 0) close(fd);
    }
    // A normal exit frees the process's device memory, as the real driver does. (A SIGKILLed
    // process's memory stays counted on the fake GPU: tests judge the device before a kill.)
    atexit(+[] {
      Driver& d = *instance;
      for (int i = 0; i < kMaxDevices; ++i) {
        d.shared->dev[i].used.fetch_sub(d.charged[i]);
        if (d.proc_slot[i] >= 0) {
          d.shared->procs[i][d.proc_slot[i]].used.store(0);
          d.shared->procs[i][d.proc_slot[i]].pid.store(0);
        }
      }
    });
  }
  static Driver* instance;

  static std::string UuidText(int physical) {
    if (instance && physical >= 0 && physical < static_cast<int>(instance->uuids.size()))
      return instance->uuids[physical];
    char b[64];
    snprintf(b, sizeof b, "GPU-face0000-0000-0000-0000-%012x", physical);
    return b;
  }
  static void Uuid(int physical, char out[16]) {
    memset(out, 0, 16);
    int n = 0;
    for (char c : UuidText(physical).substr(4)) {
      int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (v < 0 || n >= 32) continue;
      out[n / 2] = static_cast<char>(n % 2 ? out[n / 2] | v : v << 4);
      ++n;
    }
  }

  void ApplyVisible() {
    visible.clear();
    std::vector<int> present;  // what the container's device nodes give it
    const char* nodes = getenv("FAKE_CUDA_DEVICE_NODES");
    for (int i = 0; i < physical_count; ++i)
      if (nodes == nullptr ||
          access((std::string(nodes) + "/nvidia" + std::to_string(i)).c_str(), F_OK) == 0)
        present.push_back(i);
    const char* env = getenv("CUDA_VISIBLE_DEVICES");
    if (env == nullptr) {
      visible = present;
      return;
    }
    std::string s = env;
    size_t pos = 0;
    while (pos <= s.size()) {  // an invalid entry ends the list, as with the real driver
      size_t comma = s.find(',', pos);
      std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      int found = -1;
      if (tok.rfind("GPU-", 0) == 0) {
        for (int i : present)
          if (UuidText(i).rfind(tok, 0) == 0) found = i;
      } else if (!tok.empty() && tok.find_first_not_of("0123456789") == std::string::npos) {
        size_t i = strtoul(tok.c_str(), nullptr, 10);
        if (i < present.size()) found = present[i];
      }
      if (found < 0 || std::find(visible.begin(), visible.end(), found) != visible.end()) break;
      visible.push_back(found);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }

  CUresult Charge(int physical, uint64_t bytes) {
    SharedDevice& d = shared->dev[physical];
    uint64_t used = d.used.load();
    do {
      if (used + bytes > memory) return CUDA_ERROR_OUT_OF_MEMORY;
    } while (!d.used.compare_exchange_weak(used, used + bytes));
    uint64_t peak = d.peak.load();
    while (peak < used + bytes && !d.peak.compare_exchange_weak(peak, used + bytes)) {
    }
    allocated += bytes;
    charged[physical] += bytes;
    if (SharedProc* p = Proc(physical)) p->used.fetch_add(bytes);
    return CUDA_SUCCESS;
  }
  // This process's NVML entry on a device, claimed on first use (nullptr if the table is full).
  SharedProc* Proc(int physical) {
    if (proc_slot[physical] < 0) {
      int32_t self = static_cast<int32_t>(getpid());
      for (int i = 0; i < kMaxProcs && proc_slot[physical] < 0; ++i) {
        int32_t expect = 0;
        if (shared->procs[physical][i].pid.compare_exchange_strong(expect, self)) {
          shared->procs[physical][i].used.store(0);
          proc_slot[physical] = i;
        }
      }
      if (proc_slot[physical] < 0) return nullptr;
    }
    return &shared->procs[physical][proc_slot[physical]];
  }
  void Uncharge(int physical, uint64_t bytes) {
    if (SharedProc* p = Proc(physical)) p->used.fetch_sub(bytes);
    shared->dev[physical].used.fetch_sub(bytes);
    allocated -= bytes;
    charged[physical] -= bytes;
  }

  int CurrentDevice() {
    if (current == nullptr) return -1;
    return reinterpret_cast<Ctx*>(current)->device;
  }

  CUresult AllocOnCurrent(uint64_t key_hint, uint64_t bytes, unsigned long long* key_out) {
    int dev = CurrentDevice();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    // The driver hands out memory in granules (2 MiB pages on real GPUs): what the device and
    // NVML see is the rounded size (FAKE_CUDA_ALLOC_GRANULE; 1 = exact, the default).
    bytes = (bytes + granule - 1) / granule * granule;
    if (CUresult r = Charge(dev, bytes); r != CUDA_SUCCESS) return r;
    uint64_t key = key_hint;
    if (key == 0) {
      key = next_ptr;
      next_ptr += (bytes + 0xfffff) & ~0xfffffull;  // 1 MiB granularity keeps pointers distinct
    }
    allocs[key] = {dev, bytes};
    *key_out = key;
    return CUDA_SUCCESS;
  }
  CUresult Free(uint64_t key) {
    auto it = allocs.find(key);
    if (it == allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    Uncharge(it->second.device, it->second.bytes);
    allocs.erase(it);
    return CUDA_SUCCESS;
  }

  void HostCost(int64_t ns) {
    if (ns > 0 && g_test_sleep_until) g_test_sleep_until(Now() + ns);
  }
  int NewChannel(int physical, bool foreign) {
    auto c = std::make_unique<Channel>();
    c->device = physical;
    c->foreign = foreign;
    channels.push_back(std::move(c));
    int id = static_cast<int>(channels.size()) - 1;
    dev_channels[physical].push_back(id);
    dev_queues[physical].push_back(&channels[id]->queue);
    return id;
  }
  int CurrentChannel() {
    if (current == nullptr) return -1;
    auto* ctx = reinterpret_cast<Ctx*>(current);
    return ctx->device < 0 ? -1 : ctx->channel;
  }
  // Runs a device up to `until` (the caller holds mu): records what ran and completes events.
  void Advance(int physical, int64_t until) {
    SliceState& st = slice[physical];
    if (until <= st.t) return;
    const std::vector<int>& ids = dev_channels[physical];
    Simulate(
        st, dev_queues[physical], timeslice_ns, until, -1, 0,
        [&](int i, int64_t a, int64_t b) {
          Channel& c = *channels[ids[i]];
          AppendMerged(c.exec, a, b);
          AppendMerged(c.active, a, b);
          if (!c.foreign) AppendMerged(intervals, a, b);
          shared->dev[physical].busy_total.fetch_add(static_cast<uint64_t>(b - a));
        },
        [&](int, Work& w, int64_t t) {
          for (auto& [e, gen] : w.stamps)
            if (e->generation == gen) e->time.store(t);
        });
  }
  // When channel `id` would finish launch `seq` if nothing more were queued: a dry run on copies.
  int64_t Predict(int id, uint64_t seq) {
    int physical = channels[id]->device;
    SliceState st = slice[physical];
    std::vector<Queue> copies;
    std::vector<Queue*> qs;
    int stop = -1;
    for (int other : dev_channels[physical]) {
      if (other == id) stop = static_cast<int>(copies.size());
      copies.push_back(channels[other]->queue);
    }
    for (Queue& q : copies) qs.push_back(&q);
    auto nothing = [](auto&&...) {};
    return Simulate(st, qs, timeslice_ns, INT64_MAX, stop, seq, nothing, nothing);
  }
  bool Done(int id, uint64_t seq) { return channels[id]->queue.done_seq >= seq; }
  // Queues `duration` ns of work on channel `id` at `now` (the caller holds mu).
  void Enqueue(int id, int64_t duration, int64_t front_end) {
    Channel& c = *channels[id];
    int64_t now = Now();
    Advance(c.device, now);
    uint64_t seq = c.next_seq++;
    std::deque<Work>& q = c.queue.q;
    if (q.empty()) {
      // An idle context: the GPU's front end spends time before the kernel reaches the SMs. NVML
      // counts it as the kernel's activity (as a real GPU's per-process samples do: they did not
      // keep empty kernels from being charged on an H200); it is not busy time.
      q.push_back(Work{now + front_end, duration, seq, {}});
      AppendMerged(c.active, now, now + front_end);
    } else if (q.back().stamps.empty()) {
      q.back().remaining += duration;
      q.back().seq = seq;
    } else {
      q.push_back(Work{now, duration, seq, {}});
    }
  }
  CUresult Launch(int64_t duration) {
    int id = CurrentChannel();
    if (id < 0) return CUDA_ERROR_INVALID_CONTEXT;
    Enqueue(id, duration, gpu_launch_ns);
    return CUDA_SUCCESS;
  }
  // Blocks until channel `id` has finished launch `seq` (call without mu held).
  void WaitFor(int id, uint64_t seq) {
    for (;;) {
      int64_t until;
      {
        std::lock_guard<std::mutex> lock(mu);
        Advance(channels[id]->device, Now());
        if (Done(id, seq)) return;
        until = Predict(id, seq);
      }
      if (until < 0) return;  // cannot finish (a bug in the model): never hang a test
      SleepUntil(std::max(until, Now() + 1));
    }
  }
  // Records `e` on the current context's queue (the caller holds mu).
  void Record(Event* e) {
    ++e->generation;
    int id = CurrentChannel();
    int64_t now = Now();
    if (id < 0) {
      e->time.store(now);
      return;
    }
    Channel& c = *channels[id];
    Advance(c.device, now);
    e->channel = id;
    if (c.queue.q.empty()) {
      e->seq = c.queue.done_seq;
      e->time.store(now);
      return;
    }
    e->seq = c.queue.q.back().seq;
    e->time.store(kPending);
    c.queue.q.back().stamps.emplace_back(e, e->generation);
  }
  // The event's time once its work has finished by now, else kPending (caller holds mu).
  int64_t EventTime(Event* e) {
    int64_t t = e->time.load();
    if (t == kPending) {
      Advance(channels[e->channel]->device, Now());
      t = e->time.load();
    }
    return t;
  }
};
thread_local CUcontext Driver::current = nullptr;
Driver* Driver::instance = nullptr;

Driver& D() {
  static Driver* d = Driver::instance = new Driver();  // leaked: callers may run during exit
  return *d;
}

#define LOCK std::lock_guard<std::mutex> lock(D().mu)
#define NEED_INIT \
  if (!D().initialized) return CUDA_ERROR_NOT_INITIALIZED

CUresult CtxNew(CUcontext* out, CUdevice ordinal, bool primary) {
  NEED_INIT;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= static_cast<int>(D().visible.size()))
    return CUDA_ERROR_INVALID_DEVICE;
  int dev = D().visible[ordinal];
  if (D().context_bytes) {
    if (CUresult r = D().Charge(dev, D().context_bytes); r != CUDA_SUCCESS) return r;
  }
  *out = reinterpret_cast<CUcontext>(Keep(new Ctx{dev, primary, D().NewChannel(dev, false)}));
  return CUDA_SUCCESS;
}
void CtxFree(CUcontext c) {
  auto* ctx = reinterpret_cast<Ctx*>(c);
  if (D().context_bytes) D().Uncharge(ctx->device, D().context_bytes);
  // Work still queued in a destroyed context is dropped; its events complete now.
  Channel& ch = *D().channels[ctx->channel];
  D().Advance(ctx->device, Now());
  for (Work& w : ch.queue.q) {
    ch.queue.done_seq = w.seq;
    for (auto& [e, gen] : w.stamps)
      if (e->generation == gen) e->time.store(Now());
  }
  ch.queue.q.clear();
  if (Driver::current == c) Driver::current = nullptr;
  ctx->device = -1;
}

uint64_t ArrayBytes(size_t w, size_t h, size_t d, int format, unsigned channels) {
  unsigned elem = format == CU_AD_FORMAT_UNSIGNED_INT8 || format == CU_AD_FORMAT_SIGNED_INT8 ? 1
                  : format == CU_AD_FORMAT_UNSIGNED_INT16 || format == CU_AD_FORMAT_SIGNED_INT16 ||
                          format == CU_AD_FORMAT_HALF
                      ? 2
                      : 4;
  return uint64_t{w} * std::max<size_t>(h, 1) * std::max<size_t>(d, 1) * elem * channels;
}

}  // namespace

extern "C" {

// --- test-only controls ------------------------------------------------------------------------
__attribute__((visibility("default"))) void fakecuda_set_clock(int64_t (*now)(),
                                                               void (*sleep_until)(int64_t)) {
  g_test_now = now;
  g_test_sleep_until = sleep_until;
}
// Host time of each launch and event record, on the virtual clock (fakecuda_set_clock).
__attribute__((visibility("default"))) void fakecuda_set_host_costs(int64_t launch_ns,
                                                                    int64_t event_ns) {
  D().launch_ns.store(launch_ns);
  D().event_ns.store(event_ns);
}
// GPU-side front-end time of each launch onto an idle stream (see Driver::gpu_launch_ns).
__attribute__((visibility("default"))) void fakecuda_set_gpu_launch_cost(int64_t ns) {
  LOCK;
  D().gpu_launch_ns = ns;
}
namespace {
// Time covered by `v` (ordered, non-overlapping intervals: kernels of one process run in order on
// the device timeline, so starts and ends never decrease) within [t0, t1), by bisection.
int64_t CoveredBetween(const std::vector<std::pair<int64_t, int64_t>>& v, int64_t t0, int64_t t1) {
  auto it = std::lower_bound(
      v.begin(), v.end(), t0,
      [](const std::pair<int64_t, int64_t>& i, int64_t t) { return i.second <= t; });
  int64_t sum = 0;
  for (; it != v.end() && it->first < t1; ++it)
    sum += std::max<int64_t>(0, std::min(it->second, t1) - std::max(it->first, t0));
  return sum;
}
}  // namespace
// This process's kernel busy time overlapping [t0, t1).
__attribute__((visibility("default"))) int64_t fakecuda_busy_between(int64_t t0, int64_t t1) {
  LOCK;
  for (int i = 0; i < D().physical_count; ++i) D().Advance(i, Now());
  return CoveredBetween(D().intervals, t0, t1);
}
// One context's device time within [t0, t1) (several tenants in one test process).
__attribute__((visibility("default"))) int64_t fakecuda_context_busy_between(CUcontext c,
                                                                             int64_t t0,
                                                                             int64_t t1) {
  LOCK;
  if (c == nullptr) return 0;
  Channel& ch = *D().channels[reinterpret_cast<Ctx*>(c)->channel];
  D().Advance(ch.device, Now());
  return CoveredBetween(ch.exec, t0, t1);
}
// The pid NVML reports for a context's work (nvmlDeviceGetProcessUtilization), so that tenants
// run as contexts of one test process look like the separate processes they stand for.
__attribute__((visibility("default"))) void fakecuda_set_context_pid(CUcontext c, unsigned pid) {
  LOCK;
  if (c != nullptr) D().channels[reinterpret_cast<Ctx*>(c)->channel]->nvml_pid = pid;
}
__attribute__((visibility("default"))) uint64_t fakecuda_allocated_bytes() {
  LOCK;
  return D().allocated;
}
__attribute__((visibility("default"))) uint64_t fakecuda_device_peak(int physical) {
  return D().shared->dev[physical].peak.load();
}
__attribute__((visibility("default"))) uint64_t fakecuda_device_used(int physical) {
  return D().shared->dev[physical].used.load();
}
// Device memory this process holds without any allocation call (module code, driver buffers):
// shows in the device counters and in NVML's entry for the process, nowhere else.
__attribute__((visibility("default"))) void fakecuda_hold_hidden(int physical, uint64_t bytes) {
  LOCK;
  D().Charge(physical, bytes);
}
// Runs `duration` ns of a foreign tenant's work on a physical device (a neighbour container).
// It is a context of its own, time-sliced with this process's contexts.
__attribute__((visibility("default"))) void fakecuda_foreign_work(int physical, int64_t duration) {
  LOCK;
  if (physical < 0 || physical >= kMaxDevices) return;
  if (D().foreign_channel[physical] < 0)
    D().foreign_channel[physical] = D().NewChannel(physical, true);
  D().Enqueue(D().foreign_channel[physical], duration, 0);
}

// Drops the neighbour's work still queued on a device (a test's neighbour must not outlive it).
__attribute__((visibility("default"))) void fakecuda_drop_foreign_work(int physical) {
  LOCK;
  if (physical < 0 || physical >= kMaxDevices || D().foreign_channel[physical] < 0) return;
  Channel& c = *D().channels[D().foreign_channel[physical]];
  D().Advance(physical, Now());
  if (!c.queue.q.empty()) c.queue.done_seq = c.queue.q.back().seq;
  c.queue.q.clear();
}

// --- driver: init and devices ------------------------------------------------------------------
CUresult cuInit(unsigned int flags) {
  LOCK;
  if (!D().initialized) {
    D().ApplyVisible();
    D().initialized = true;
  }
  return D().visible.empty() ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}
CUresult cuDriverGetVersion(int* v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* n) {
  LOCK;
  NEED_INIT;
  *n = static_cast<int>(D().visible.size());
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  LOCK;
  NEED_INIT;
  if (ordinal < 0 || ordinal >= static_cast<int>(D().visible.size()))
    return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(CUuuid* u, CUdevice d) {
  LOCK;
  NEED_INIT;
  if (d < 0 || d >= static_cast<int>(D().visible.size())) return CUDA_ERROR_INVALID_DEVICE;
  Driver::Uuid(D().visible[d], u->bytes);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid_v2(CUuuid* u, CUdevice d) { return cuDeviceGetUuid(u, d); }
CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  snprintf(name, len, "Fake GPU");
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
  *v = 0;
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  LOCK;
  NEED_INIT;
  if (d < 0 || d >= static_cast<int>(D().visible.size())) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = D().memory;
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice d) {
  size_t b;
  CUresult r = cuDeviceTotalMem_v2(&b, d);
  if (r == CUDA_SUCCESS) *bytes = static_cast<unsigned int>(std::min<size_t>(b, 0xffffffffu));
  return r;
}

// --- contexts ----------------------------------------------------------------------------------
CUresult cuCtxCreate_v2(CUcontext* c, unsigned int flags, CUdevice d) {
  LOCK;
  CUresult r = CtxNew(c, d, false);
  if (r == CUDA_SUCCESS) Driver::current = *c;
  return r;
}
CUresult cuCtxCreate(CUcontext* c, unsigned int flags, CUdevice d) {
  return cuCtxCreate_v2(c, flags, d);
}
CUresult cuCtxCreate_v3(CUcontext* c, void*, int, unsigned int flags, CUdevice d) {
  return cuCtxCreate_v2(c, flags, d);
}
CUresult cuCtxCreate_v4(CUcontext* c, void*, unsigned int flags, CUdevice d) {
  return cuCtxCreate_v2(c, flags, d);
}
CUresult cuCtxDestroy_v2(CUcontext c) {
  LOCK;
  if (c == nullptr || reinterpret_cast<Ctx*>(c)->primary) return CUDA_ERROR_INVALID_CONTEXT;
  CtxFree(c);
  return CUDA_SUCCESS;
}
CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  LOCK;
  NEED_INIT;
  if (d < 0 || d >= static_cast<int>(D().visible.size())) return CUDA_ERROR_INVALID_DEVICE;
  int dev = D().visible[d];
  if (D().primary_refs[dev]++ == 0) {
    CUresult r = CtxNew(&D().primary[dev], d, true);
    if (r != CUDA_SUCCESS) {
      D().primary_refs[dev] = 0;
      return r;
    }
  }
  *c = D().primary[dev];
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  LOCK;
  NEED_INIT;
  if (d < 0 || d >= static_cast<int>(D().visible.size())) return CUDA_ERROR_INVALID_DEVICE;
  int dev = D().visible[d];
  if (D().primary_refs[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--D().primary_refs[dev] == 0) CtxFree(D().primary[dev]);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
CUresult cuCtxSetCurrent(CUcontext c) {
  Driver::current = c;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = Driver::current;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* d) {
  LOCK;
  int dev = D().CurrentDevice();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  auto it = std::find(D().visible.begin(), D().visible.end(), dev);
  *d = static_cast<CUdevice>(it - D().visible.begin());
  return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize() {
  int id;
  uint64_t seq;
  {
    LOCK;
    id = D().CurrentChannel();
    if (id < 0) return CUDA_ERROR_INVALID_CONTEXT;
    seq = D().channels[id]->next_seq - 1;
  }
  D().WaitFor(id, seq);
  return CUDA_SUCCESS;
}

// --- memory ------------------------------------------------------------------------------------
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  LOCK;
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  return D().AllocOnCurrent(0, bytes, p);
}
CUresult cuMemAlloc(CUdeviceptr_v1* p, unsigned int bytes) {
  LOCK;
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr q;
  CUresult r = D().AllocOnCurrent(D().next_ptr32, bytes, &q);
  if (r == CUDA_SUCCESS)
    *p = static_cast<CUdeviceptr_v1>(q), D().next_ptr32 += (bytes + 0xfffff) & ~0xfffffull;
  return r;
}
CUresult cuMemAllocPitch_v2(CUdeviceptr* p, size_t* pitch, size_t w, size_t h, unsigned int elem) {
  LOCK;
  if (!p || !pitch || elem == 0 || elem > 16) return CUDA_ERROR_INVALID_VALUE;
  *pitch = (w + 511) & ~size_t{511};
  return D().AllocOnCurrent(0, *pitch * h, p);
}
CUresult cuMemAllocPitch(CUdeviceptr_v1* p, unsigned int* pitch, unsigned int w, unsigned int h,
                         unsigned int elem) {
  LOCK;
  if (!p || !pitch || elem == 0 || elem > 16) return CUDA_ERROR_INVALID_VALUE;
  unsigned pt = (w + 511) & ~511u;
  CUdeviceptr q;
  CUresult r = D().AllocOnCurrent(D().next_ptr32, uint64_t{pt} * h, &q);
  if (r == CUDA_SUCCESS) {
    *p = static_cast<CUdeviceptr_v1>(q), *pitch = pt;
    D().next_ptr32 += (uint64_t{pt} * h + 0xfffff) & ~0xfffffull;
  }
  return r;
}
CUresult cuMemAllocManaged(CUdeviceptr* p, size_t bytes, unsigned int flags) {
  return cuMemAlloc_v2(p, bytes);
}
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream) { return cuMemAlloc_v2(p, bytes); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t bytes, CUstream s) {
  return cuMemAllocAsync(p, bytes, s);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t bytes, CUmemoryPool, CUstream) {
  return cuMemAlloc_v2(p, bytes);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* p, size_t b, CUmemoryPool pool, CUstream s) {
  return cuMemAllocFromPoolAsync(p, b, pool, s);
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  LOCK;
  return D().Free(p);
}
CUresult cuMemFree(CUdeviceptr_v1 p) { return cuMemFree_v2(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream) { return cuMemFree_v2(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t bytes, const CUmemAllocationProp* prop,
                     unsigned long long) {
  LOCK;
  NEED_INIT;
  if (!h || !prop) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {  // host memory: not device memory
    *h = D().next_ptr++;
    return CUDA_SUCCESS;
  }
  int ordinal = prop->location.id;
  if (ordinal < 0 || ordinal >= static_cast<int>(D().visible.size()))
    return CUDA_ERROR_INVALID_DEVICE;
  int dev = D().visible[ordinal];
  if (CUresult r = D().Charge(dev, bytes); r != CUDA_SUCCESS) return r;
  *h = D().next_ptr;
  D().next_ptr += (bytes + 0xfffff) & ~0xfffffull;
  D().allocs[*h] = {dev, bytes};
  return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  LOCK;
  // Still mapped: the memory stays allocated until the last cuMemUnmap (the driver's rule).
  if (auto it = D().vmm_maps.find(h); it != D().vmm_maps.end() && it->second > 0) {
    D().vmm_released[h] = true;
    return CUDA_SUCCESS;
  }
  D().Free(h);  // host handles are unknown here and release fine
  return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr, unsigned long long) {
  LOCK;
  if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
  *p = D().next_va;
  D().next_va += (size + 0xfffff) & ~0xfffffull;
  return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr, size_t) { return CUDA_SUCCESS; }
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long) {
  LOCK;
  if (p == 0 || size == 0 || offset != 0 || D().mappings.count(p)) return CUDA_ERROR_INVALID_VALUE;
  D().mappings[p] = {size, h};
  ++D().vmm_maps[h];
  return CUDA_SUCCESS;
}
// Unmaps every mapping that starts in [p, p + size); a handle both released and no longer mapped
// anywhere is freed.
CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  LOCK;
  auto it = D().mappings.lower_bound(p);
  if (it == D().mappings.end() || it->first != p) return CUDA_ERROR_INVALID_VALUE;
  while (it != D().mappings.end() && it->first < p + size) {
    uint64_t h = it->second.second;
    it = D().mappings.erase(it);
    if (--D().vmm_maps[h] > 0) continue;
    D().vmm_maps.erase(h);
    if (D().vmm_released.erase(h)) D().Free(h);
  }
  return CUDA_SUCCESS;
}
CUresult cuArray3DCreate_v2(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  LOCK;
  if (!a || !d || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long key;
  CUresult r = D().AllocOnCurrent(
      0, ArrayBytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), &key);
  if (r == CUDA_SUCCESS) *a = reinterpret_cast<CUarray>(key);
  return r;
}
CUresult cuArray3DCreate(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR_v1* d) {
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d3{d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
  return cuArray3DCreate_v2(a, &d3);
}
CUresult cuArrayCreate_v2(CUarray* a, const CUDA_ARRAY_DESCRIPTOR* d) {
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d3{d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
  return cuArray3DCreate_v2(a, &d3);
}
CUresult cuArrayCreate(CUarray* a, const CUDA_ARRAY_DESCRIPTOR_v1* d) {
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY_DESCRIPTOR d2{d->Width, d->Height, d->Format, d->NumChannels};
  return cuArrayCreate_v2(a, &d2);
}
CUresult cuArrayDestroy(CUarray a) {
  LOCK;
  return D().Free(reinterpret_cast<uint64_t>(a));
}
CUresult cuMipmappedArrayCreate(CUmipmappedArray* m, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                unsigned int levels) {
  LOCK;
  if (!m || !d || levels == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t bytes = 0;
  for (unsigned l = 0; l < levels; ++l)
    bytes += ArrayBytes(
        std::max<size_t>(d->Width >> l, 1), d->Height ? std::max<size_t>(d->Height >> l, 1) : 0,
        d->Depth ? std::max<size_t>(d->Depth >> l, 1) : 0, d->Format, d->NumChannels);
  unsigned long long key;
  CUresult r = D().AllocOnCurrent(0, bytes, &key);
  if (r == CUDA_SUCCESS) *m = reinterpret_cast<CUmipmappedArray>(key);
  return r;
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
  LOCK;
  return D().Free(reinterpret_cast<uint64_t>(m));
}
CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  LOCK;
  int dev = D().CurrentDevice();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *total = D().memory;
  *free_bytes = D().memory - D().shared->dev[dev].used.load();
  return CUDA_SUCCESS;
}
CUresult cuMemGetInfo(unsigned int* f, unsigned int* t) {
  size_t a, b;
  CUresult r = cuMemGetInfo_v2(&a, &b);
  if (r == CUDA_SUCCESS) {
    *f = static_cast<unsigned>(std::min<size_t>(a, 0xffffffffu));
    *t = static_cast<unsigned>(std::min<size_t>(b, 0xffffffffu));
  }
  return r;
}

// --- streams, events, modules, launches --------------------------------------------------------
CUresult cuStreamCreate(CUstream* s, unsigned int) {
  *s = reinterpret_cast<CUstream>(Keep(new Stream()));
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream s) { return CUDA_SUCCESS; }
// A context's work runs in order, so a stream is done when its context's queue is.
CUresult cuStreamSynchronize(CUstream s) {
  int id;
  uint64_t seq;
  {
    LOCK;
    id = D().CurrentChannel();
    if (id < 0) return CUDA_SUCCESS;
    seq = D().channels[id]->next_seq - 1;
  }
  D().WaitFor(id, seq);
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent* e, unsigned int) {
  *e = reinterpret_cast<CUevent>(Keep(new Event()));
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) { return CUDA_SUCCESS; }
CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }
CUresult cuEventRecord(CUevent e, CUstream) {
  D().HostCost(D().event_ns.load());  // the device sees the event when the call has submitted it
  LOCK;
  D().Record(reinterpret_cast<Event*>(e));
  return CUDA_SUCCESS;
}
CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s); }
CUresult cuEventQuery(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  int64_t t = ev->time.load();
  if (t == kPending) {
    LOCK;
    t = D().EventTime(ev);
  }
  return t >= 0 && Now() >= t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuEventSynchronize(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  int channel = -1;
  uint64_t seq = 0;
  {
    LOCK;
    if (ev->time.load() == kPending) channel = ev->channel, seq = ev->seq;
  }
  if (channel >= 0) D().WaitFor(channel, seq);
  int64_t t = ev->time.load();
  if (t >= 0) SleepUntil(t);
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  int64_t ta, tb;
  {
    LOCK;
    ta = D().EventTime(reinterpret_cast<Event*>(a));
    tb = D().EventTime(reinterpret_cast<Event*>(b));
  }
  if (ta == -1 || tb == -1) return CUDA_ERROR_INVALID_HANDLE;
  if (ta < 0 || tb < 0 || Now() < ta || Now() < tb) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>(tb - ta) / 1e6f;
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  return cuEventElapsedTime(ms, a, b);
}
// A module's code lives in device memory no allocation call shows (FAKE_CUDA_MODULE_BYTES on the
// current context's device, for the rest of the process).
CUresult cuModuleLoadData(CUmodule* m, const void*) {
  LOCK;
  if (D().module_bytes && D().CurrentDevice() >= 0) {
    if (CUresult r = D().Charge(D().CurrentDevice(), D().module_bytes); r != CUDA_SUCCESS) return r;
  }
  *m = reinterpret_cast<CUmodule>(Keep(new int(0)));
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  *f = reinterpret_cast<CUfunction>(Keep(new Func{name}));
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned, unsigned,
                        unsigned, unsigned, CUstream, void**, void**) {
  if (!f || gx == 0 || gy == 0 || gz == 0) return CUDA_ERROR_INVALID_VALUE;
  // Host time first, outside the lock: a test's other threads run meanwhile (virtual clock).
  D().HostCost(D().launch_ns.load());
  LOCK;
  return D().Launch(static_cast<int64_t>(uint64_t{gx} * gy * gz * D().ns_per_block));
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned sh, CUstream s, void** p,
                             void** e) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, p, e);
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned sh, CUstream s, void** p) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, p, nullptr);
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                        CUstream s, void** p) {
  return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, sh, s, p);
}
// The legacy launches (block shape set beforehand with cuFuncSetBlockShape; grid blocks as given).
CUresult cuFuncSetBlockShape(CUfunction f, int, int, int) {
  return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuLaunch(CUfunction f) {
  return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
}
CUresult cuLaunchGrid(CUfunction f, int w, int h) {
  if (w <= 0 || h <= 0) return CUDA_ERROR_INVALID_VALUE;
  return cuLaunchKernel(f, static_cast<unsigned>(w), static_cast<unsigned>(h), 1, 1, 1, 1, 0,
                        nullptr, nullptr, nullptr);
}
CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
  if (w <= 0 || h <= 0) return CUDA_ERROR_INVALID_VALUE;
  return cuLaunchKernel(f, static_cast<unsigned>(w), static_cast<unsigned>(h), 1, 1, 1, 1, 0, s,
                        nullptr, nullptr);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** p, void** e) {
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  return cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                        c->blockDimZ, c->sharedMemBytes, c->hStream, p, e);
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f, void** p, void** e) {
  return cuLaunchKernelEx(c, f, p, e);
}
CUresult cuGraphCreate(void** g, unsigned int) {
  *g = Keep(new int(0));
  return CUDA_SUCCESS;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, void*, unsigned long long) {
  *e = reinterpret_cast<CUgraphExec>(Keep(new int(0)));
  return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec e, CUstream) {
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  D().HostCost(D().launch_ns.load());
  LOCK;
  return D().Launch(static_cast<int64_t>(D().graph_ns));
}
CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return cuGraphLaunch(e, s); }
CUresult cuGetExportTable(const void**, const void*) { return CUDA_ERROR_NOT_SUPPORTED; }

// --- cuGetProcAddress: name + version + stream flavour -> entry point ---------------------------
struct Entry {
  const char* name;
  void* fn;
};
#define E(f) \
  { #f, reinterpret_cast < void*>(&f) }
static const Entry kEntries[] = {
    E(cuInit),
    E(cuDriverGetVersion),
    E(cuDeviceGetCount),
    E(cuDeviceGet),
    E(cuDeviceGetUuid),
    E(cuDeviceGetUuid_v2),
    E(cuDeviceGetName),
    E(cuDeviceGetAttribute),
    E(cuDeviceTotalMem),
    E(cuDeviceTotalMem_v2),
    E(cuCtxCreate),
    E(cuCtxCreate_v2),
    E(cuCtxCreate_v3),
    E(cuCtxCreate_v4),
    E(cuCtxDestroy),
    E(cuCtxDestroy_v2),
    E(cuDevicePrimaryCtxRetain),
    E(cuDevicePrimaryCtxRelease),
    E(cuDevicePrimaryCtxRelease_v2),
    E(cuCtxSetCurrent),
    E(cuCtxGetCurrent),
    E(cuCtxGetDevice),
    E(cuCtxSynchronize),
    E(cuMemAlloc),
    E(cuMemAlloc_v2),
    E(cuMemAllocPitch),
    E(cuMemAllocPitch_v2),
    E(cuMemAllocManaged),
    E(cuMemAllocAsync),
    E(cuMemAllocAsync_ptsz),
    E(cuMemAllocFromPoolAsync),
    E(cuMemAllocFromPoolAsync_ptsz),
    E(cuMemFree),
    E(cuMemFree_v2),
    E(cuMemFreeAsync),
    E(cuMemFreeAsync_ptsz),
    E(cuMemCreate),
    E(cuMemRelease),
    E(cuMemAddressReserve),
    E(cuMemAddressFree),
    E(cuMemMap),
    E(cuMemUnmap),
    E(cuArrayCreate),
    E(cuArrayCreate_v2),
    E(cuArray3DCreate),
    E(cuArray3DCreate_v2),
    E(cuArrayDestroy),
    E(cuMipmappedArrayCreate),
    E(cuMipmappedArrayDestroy),
    E(cuMemGetInfo),
    E(cuMemGetInfo_v2),
    E(cuStreamCreate),
    E(cuStreamDestroy_v2),
    E(cuStreamSynchronize),
    E(cuEventCreate),
    E(cuEventDestroy),
    E(cuEventDestroy_v2),
    E(cuEventRecord),
    E(cuEventRecord_ptsz),
    E(cuEventQuery),
    E(cuEventSynchronize),
    E(cuEventElapsedTime),
    E(cuEventElapsedTime_v2),
    E(cuModuleLoadData),
    E(cuModuleGetFunction),
    E(cuLaunchKernel),
    E(cuLaunchKernel_ptsz),
    E(cuLaunchCooperativeKernel),
    E(cuLaunchCooperativeKernel_ptsz),
    E(cuFuncSetBlockShape),
    E(cuLaunch),
    E(cuLaunchGrid),
    E(cuLaunchGridAsync),
    E(cuLaunchKernelEx),
    E(cuLaunchKernelEx_ptsz),
    E(cuGraphCreate),
    E(cuGraphInstantiateWithFlags),
    E(cuGraphLaunch),
    E(cuGraphLaunch_ptsz),
    E(cuGetExportTable),
};
CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);
CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

static void* FindEntry(const std::string& name) {
  if (name == "cuGetProcAddress") return reinterpret_cast<void*>(&cuGetProcAddress);
  if (name == "cuGetProcAddress_v2") return reinterpret_cast<void*>(&cuGetProcAddress_v2);
  for (const Entry& e : kEntries)
    if (name == e.name) return e.fn;
  return nullptr;
}

// The versions at which an entry point's ABI changed (the _v2/_v3/_v4 names); per-thread-stream
// variants are the _ptsz names. These are the driver's published versioning facts.
static std::string Versioned(const std::string& s, int v, cuuint64_t flags) {
  struct Bump {
    const char* name;
    int version;
    const char* suffix;
  };
  static const Bump kBumps[] = {
      {"cuGetProcAddress", 12000, "_v2"},
      {"cuMemAlloc", 3020, "_v2"},
      {"cuMemAllocPitch", 3020, "_v2"},
      {"cuMemFree", 3020, "_v2"},
      {"cuMemGetInfo", 3020, "_v2"},
      {"cuDeviceTotalMem", 3020, "_v2"},
      {"cuCtxCreate", 12050, "_v4"},
      {"cuCtxCreate", 11040, "_v3"},
      {"cuCtxCreate", 3020, "_v2"},
      {"cuCtxDestroy", 4000, "_v2"},
      {"cuArrayCreate", 3020, "_v2"},
      {"cuArray3DCreate", 3020, "_v2"},
      {"cuDevicePrimaryCtxRelease", 11000, "_v2"},
      {"cuStreamDestroy", 4000, "_v2"},
      {"cuEventDestroy", 4000, "_v2"},
      {"cuEventElapsedTime", 12080, "_v2"},
      {"cuDeviceGetUuid", 11040, "_v2"},
  };
  for (const Bump& b : kBumps)
    if (s == b.name && v >= b.version) return s + b.suffix;
  if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
    if (FindEntry(s + "_ptsz")) return s + "_ptsz";
  }
  return s;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  if (const char* log = getenv("FAKE_CUDA_PROC_LOG")) {
    if (FILE* f = fopen(log, "a")) {
      fprintf(f, "%s:%d:%llu\n", symbol ? symbol : "", version, flags);
      fclose(f);
    }
  }
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  void* fn = FindEntry(Versioned(symbol, version, flags));
  if (status) *status = fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  *pfn = fn;
  return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

// --- NVML subset (libnvidia-ml.so.1 -> this file) ----------------------------------------------
nvmlReturn_t nvmlInit_v2() { return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown() { return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* n) {
  *n = static_cast<unsigned>(D().physical_count);
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  if (i >= static_cast<unsigned>(D().physical_count)) return NVML_ERROR_INVALID_ARGUMENT;
  *d = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(i + 1));
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* d) {
  for (int i = 0; i < D().physical_count; ++i)
    if (Driver::UuidText(i) == uuid) return nvmlDeviceGetHandleByIndex_v2(i, d);
  return NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* out, unsigned int len) {
  snprintf(out, len, "%s",
           Driver::UuidText(static_cast<int>(reinterpret_cast<uintptr_t>(d)) - 1).c_str());
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  int dev = static_cast<int>(reinterpret_cast<uintptr_t>(d)) - 1;
  if (dev < 0 || dev >= D().physical_count || !m) return NVML_ERROR_INVALID_ARGUMENT;
  m->total = D().memory;
  m->used = D().shared->dev[dev].used.load();
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t* m) {
  if (!m || m->version != nvmlMemory_v2) return NVML_ERROR_INVALID_ARGUMENT;
  nvmlMemory_t v1;
  nvmlReturn_t r = nvmlDeviceGetMemoryInfo(d, &v1);
  if (r == NVML_SUCCESS) m->total = v1.total, m->reserved = 0, m->free = v1.free, m->used = v1.used;
  return r;
}
// Every process with memory on the device, as NVML lists them: pid + FAKE_CUDA_NVML_PID_OFFSET
// (a container's pid namespace: NVML reports host pids, which are not the process's getpid()).
// FAKE_CUDA_NO_PROCESS_INFO=1: NOT_SUPPORTED, as where NVML cannot see processes.
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int* count,
                                                     nvmlProcessInfo_t* infos) {
  int dev = static_cast<int>(reinterpret_cast<uintptr_t>(d)) - 1;
  if (dev < 0 || dev >= D().physical_count || !count) return NVML_ERROR_INVALID_ARGUMENT;
  if (EnvU64("FAKE_CUDA_NO_PROCESS_INFO", 0)) return NVML_ERROR_NOT_SUPPORTED;
  uint64_t offset = EnvU64("FAKE_CUDA_NVML_PID_OFFSET", 0);
  unsigned n = 0;
  for (int i = 0; i < kMaxProcs; ++i) {
    int32_t pid = D().shared->procs[dev][i].pid.load();
    if (pid == 0) continue;
    if (n < *count && infos)
      infos[n] = nvmlProcessInfo_t{static_cast<unsigned>(pid + static_cast<int64_t>(offset)),
                                   D().shared->procs[dev][i].used.load(), 0xFFFFFFFFu, 0xFFFFFFFFu};
    ++n;
  }
  bool fits = n <= *count;
  *count = n;
  return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int* count,
                                                     nvmlProcessInfo_t* infos) {
  return nvmlDeviceGetComputeRunningProcesses_v3(d, count, infos);
}
// Per-process kernel time as NVML samples it: one sample per process (pid) with work on the
// device, stamped now (us), whose smUtil is the percent of [lastSeen, now) its kernels ran (the
// last second if lastSeen is 0 or older), front ends included. A context's pid is getpid() +
// FAKE_CUDA_NVML_PID_OFFSET unless a test set another (fakecuda_set_context_pid); a foreign
// tenant's work (fakecuda_foreign_work) is listed under pid 0x7fff0000 + device.
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t* out,
                                             unsigned int* count, unsigned long long last_seen_us) {
  int dev = static_cast<int>(reinterpret_cast<uintptr_t>(d)) - 1;
  if (dev < 0 || dev >= D().physical_count || !count) return NVML_ERROR_INVALID_ARGUMENT;
  int64_t now = Now(), from = static_cast<int64_t>(last_seen_us) * 1000;
  if (from <= 0 || from >= now || now - from > 10'000'000'000) from = now - 1'000'000'000;
  int64_t self = getpid() + static_cast<int64_t>(EnvU64("FAKE_CUDA_NVML_PID_OFFSET", 0));
  std::map<int64_t, int64_t> busy;  // pid -> active ns
  {
    LOCK;
    D().Advance(dev, now);
    for (int id : D().dev_channels[dev]) {
      const Channel& c = *D().channels[id];
      int64_t pid = c.foreign ? 0x7fff0000 + dev : c.nvml_pid != 0 ? c.nvml_pid : self;
      busy[pid] += CoveredBetween(c.active, from, now);
    }
  }
  if (busy.empty()) busy[self] = 0;  // a process with a context but no work: 0 %
  if (*count < busy.size() || out == nullptr) {
    *count = static_cast<unsigned>(busy.size());
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  unsigned n = 0;
  for (auto& [pid, ns] : busy) {
    out[n++] = nvmlProcessUtilizationSample_t{
        static_cast<unsigned>(pid),
        static_cast<unsigned long long>(now / 1000),
        static_cast<unsigned>(std::min<int64_t>(100, ns * 100 / (now - from))),
        0,
        0,
        0};
  }
  *count = n;
  return NVML_SUCCESS;
}

// Test-only: the sum of NVML's per-process memory on a physical device (every byte of the fake
// device belongs to a process, so the device counter's peak is this sum's peak).
__attribute__((visibility("default"))) uint64_t fakecuda_processes_used(int physical) {
  uint64_t sum = 0;
  for (int i = 0; i < kMaxProcs; ++i)
    if (D().shared->procs[physical][i].pid.load() != 0)
      sum += D().shared->procs[physical][i].used.load();
  return sum;
}

// Utilisation since this process's previous call (NVML reports the last sample period).
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  int dev = static_cast<int>(reinterpret_cast<uintptr_t>(d)) - 1;
  if (dev < 0 || dev >= D().physical_count || !u) return NVML_ERROR_INVALID_ARGUMENT;
  static int64_t last_t[kMaxDevices];
  static uint64_t last_busy[kMaxDevices];
  LOCK;
  int64_t now = Now();
  D().Advance(dev, now);
  uint64_t busy = D().shared->dev[dev].busy_total.load();
  int64_t dt = now - last_t[dev];
  u->gpu = dt > 0 && last_t[dev]
               ? static_cast<unsigned>(std::min<uint64_t>(100, (busy - last_busy[dev]) * 100 / dt))
               : 0;
  u->memory = 0;
  last_t[dev] = now;
  last_busy[dev] = busy;
  return NVML_SUCCESS;
}

}  // extern "C"
