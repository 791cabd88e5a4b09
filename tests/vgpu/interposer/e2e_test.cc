// End-to-end tests of libgpulet-vcuda.so as a container gets it: LD_PRELOADed into separate CUDA
// programs (linked by name, or resolving everything through cuGetProcAddress_v2 like libcudart),
// sharing one accounting file and one fake GPU (FAKE_CUDA_STATE) whose own counters are the
// device truth the limits are checked against.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "abi/vgpu_accounting.h"
#include "testing/vcuda/support.h"
#include "vgpu/interposer/hooks.h"

namespace gpulet {
namespace {

using namespace testing_interposer;
constexpr uint64_t kMiB = 1 << 20;

std::string Bin(const char* name) { return std::string(GPULET_BINARY_DIR) + "/tests/" + name; }

// A child process with piped stdin/stdout; environment = ours + `env`.
struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;
  std::string buffered;

  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    int pin[2], pout[2];
    // CLOEXEC: a sibling must not inherit our pipe ends (its copy would hide EOF).
    if (pipe2(pin, O_CLOEXEC) != 0 || pipe2(pout, O_CLOEXEC) != 0) return;
    pid = fork();
    if (pid == 0) {
      dup2(pin[0], 0);
      dup2(pout[1], 1);
      close(pin[1]);
      close(pout[0]);
      for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    in = pin[1];
    out = pout[0];
  }
  std::string Line() {  // one line of output, "" at EOF
    for (;;) {
      size_t nl = buffered.find('\n');
      if (nl != std::string::npos) {
        std::string l = buffered.substr(0, nl);
        buffered.erase(0, nl + 1);
        return l;
      }
      char b[256];
      ssize_t n = read(out, b, sizeof b);
      if (n <= 0) return std::exchange(buffered, "");
      buffered.append(b, static_cast<size_t>(n));
    }
  }
  std::string All() {
    std::string s, l;
    while (!(l = Line()).empty()) s += l + "\n";
    return s;
  }
  void Send(char c) { (void)!write(in, &c, 1); }
  void CloseIn() {
    if (in >= 0) close(in), in = -1;
  }
  int Wait() {
    CloseIn();
    int status = 0;
    waitpid(pid, &status, 0);
    if (out >= 0) close(out), out = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

uint64_t Field(const std::string& text, const std::string& key, int index = 0) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + " ", 0) != 0) continue;
    std::istringstream f(line.substr(key.size() + 1));
    uint64_t v = 0;
    for (int i = 0; i <= index; ++i) f >> v;
    return v;
  }
  ADD_FAILURE() << "no \"" << key << "\" in: " << text;
  return 0;
}

class E2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(ShimPath().c_str(), R_OK) != 0) GTEST_SKIP() << "libgpulet-vcuda.so not built";
    std::string base = ProcessTempDir() + "/vcuda-e2e-" + std::to_string(getpid()) + "-" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
    accounting_ = base + ".acct";
    state_ = base + ".gpu";
    unlink(accounting_.c_str());
    unlink(state_.c_str());
    env_ = {{"LD_PRELOAD", ShimPath()},
            {"LD_LIBRARY_PATH", FakeCudaDir()},
            {"GPULET_VGPU_ACCOUNTING", accounting_},
            {"GPULET_VGPU_MEMORY_LIMIT", std::to_string(limit_)},
            {"GPULET_VGPU_CONTEXT_BYTES", std::to_string(kMiB)},
            {"FAKE_CUDA_CONTEXT_BYTES", std::to_string(kMiB)},
            {"FAKE_CUDA_DEVICE_MEMORY", std::to_string(1024 * kMiB)},
            {"FAKE_CUDA_STATE", state_},
            // A sanitizer build's children carry their runtime after the preload.
            {"ASAN_OPTIONS", "verify_asan_link_order=0:detect_leaks=0"}};
  }
  // The fake GPU's peak device memory across all processes (SharedDevice: used, peak, ...).
  uint64_t DevicePeak(int device = 0) {
    int fd = open(state_.c_str(), O_RDONLY);
    uint64_t v[4] = {};
    if (fd >= 0) (void)!pread(fd, v, sizeof v, device * 32), close(fd);
    return v[1];
  }
  std::string Run(std::vector<std::string> argv, std::map<std::string, std::string> extra = {},
                  int* code = nullptr) {
    auto env = env_;
    for (auto& [k, v] : extra) env[k] = v;
    Child c(argv, env);
    std::string out = c.All();
    int rc = c.Wait();
    if (code)
      *code = rc;
    else
      EXPECT_EQ(rc, 0) << argv[0] << " " << argv[1] << ": " << out;
    return out;
  }

  uint64_t limit_ = 256 * kMiB + 4321;
  std::string accounting_, state_;
  std::map<std::string, std::string> env_;
};

// The "share N" lines a pacing probe prints, one per window of a second (percent of GPU time).
std::vector<double> Shares(const std::string& out) {
  std::vector<double> shares;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.rfind("share ", 0) == 0) shares.push_back(std::stod(l.substr(6)));
  return shares;
}

// Where the CUDA toolkit is installed: a CUDA runtime program built with nvcc (cudart resolves the
// driver through cuGetProcAddress) sees the limit in cudaMemGetInfo, allocates under it, and gets
// cudaErrorMemoryAllocation past it. NVCC names the compiler, else nvcc on PATH or under
// /usr/local/cuda.
TEST_F(E2E, NvccCudaRuntimeProgramSeesTheLimit) {
  std::string nvcc = getenv("NVCC") ? getenv("NVCC") : "";
  if (nvcc.empty() && system("command -v nvcc >/dev/null 2>&1") == 0) nvcc = "nvcc";
  if (nvcc.empty() && access("/usr/local/cuda/bin/nvcc", X_OK) == 0)
    nvcc = "/usr/local/cuda/bin/nvcc";
  if (nvcc.empty()) GTEST_SKIP() << "CUDA toolkit not installed (no nvcc; set NVCC to its path)";
  std::string exe = state_ + ".cudart_probe";
  std::string cmd = nvcc + " -cudart static -o " + exe + " " + GPULET_SOURCE_DIR +
                    "/tests/vgpu/interposer/cudart_probe.cu 2>&1";
  ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
  // The CUDA runtime also needs cuGetExportTable's private, undocumented tables, which a fake
  // driver cannot provide (ours answers CUDA_ERROR_NOT_SUPPORTED): then cudart fails before any
  // allocation, without the interposer too. vcuda_procaddr replays cudart 13.0's driver lookups
  // instead (RuntimeStyleProgramThroughGetProcAddress).
  std::string bare = Run({exe}, {{"LD_PRELOAD", ""}});
  if (Field(bare, "meminfo", 0) != 0) {
    unlink(exe.c_str());
    GTEST_SKIP() << "the CUDA runtime does not start on the fake driver (cudaMemGetInfo -> "
                 << Field(bare, "meminfo", 0) << "; it needs cuGetExportTable): " << bare;
  }
  std::string out = Run({exe});
  EXPECT_EQ(Field(out, "meminfo", 0), 0u) << out;  // cudaSuccess
  EXPECT_EQ(Field(out, "meminfo", 2), limit_) << out;
  EXPECT_EQ(Field(out, "half"), 0u) << out;
  EXPECT_EQ(Field(out, "past"), 2u) << out;  // cudaErrorMemoryAllocation
  EXPECT_EQ(Field(out, "free"), 0u) << out;
  unlink(exe.c_str());
}

// 16 programs racing to allocate in one container never exceed the limit by a single byte:
// neither by their own count nor on the (fake) device, contexts included.
TEST_F(E2E, SixteenProcessesNeverExceedTheLimit) {
  std::vector<std::unique_ptr<Child>> kids;
  for (int k = 0; k < 16; ++k) {
    size_t chunk = kMiB + static_cast<size_t>(k) * 77777;  // uneven sizes: no lucky fit
    kids.push_back(std::make_unique<Child>(
        std::vector<std::string>{Bin("vcuda_probe"), "fill", std::to_string(chunk)}, env_));
  }
  for (auto& c : kids) ASSERT_EQ(c->Line(), "ready");
  for (auto& c : kids) c->Send('g');  // all start together
  uint64_t held = 0;
  for (auto& c : kids) held += Field(c->Line(), "held");
  EXPECT_LE(held + 16 * kMiB, limit_);
  EXPECT_GT(held + 16 * kMiB, limit_ - 16 * 3 * kMiB) << "the race starved the container";
  EXPECT_LE(DevicePeak(), limit_) << "the device saw more than the limit";
  vgpu::AccountingSnapshot snap;
  const char* error = nullptr;
  ASSERT_TRUE(vgpu::ReadAccounting(accounting_.c_str(), &snap, &error)) << error;
  EXPECT_EQ(snap.memory_used, held + 16 * kMiB);
  EXPECT_EQ(snap.processes, 16u);
  for (auto& c : kids) EXPECT_EQ(c->Wait(), 0);
}

// --- memory the driver really holds (contexts, rounding): NVML's per-process view ---------------

// A container of `procs` programs under a 1 GiB limit on a fake GPU whose contexts really hold
// 300 MiB each and whose allocations are rounded up to 2 MiB (both invisible to allocation
// hooks, visible in NVML's per-process used memory, as on a real GPU). They start together,
// create their contexts, allocate 1 MiB + 4 KiB until refused, and report. Nothing configures a
// context charge: the defaults must hold. Returns the probes' outputs; *peak = the device's peak.
class DriverHeld : public E2E {
 protected:
  // The container's environment: the 1 GiB limit, no configured context charge, a fake GPU
  // whose contexts hold 300 MiB and whose allocations round up to 2 MiB; `extra` on top.
  std::map<std::string, std::string> DriverEnv(const std::map<std::string, std::string>& extra) {
    auto env = env_;
    env.erase("GPULET_VGPU_CONTEXT_BYTES");
    env["GPULET_VGPU_MEMORY_LIMIT"] = std::to_string(kLimit);
    env["FAKE_CUDA_CONTEXT_BYTES"] = std::to_string(300 * kMiB);
    env["FAKE_CUDA_ALLOC_GRANULE"] = std::to_string(2 * kMiB);
    env["FAKE_CUDA_DEVICE_MEMORY"] = std::to_string(8192 * kMiB);
    for (auto& [k, v] : extra) env[k] = v;
    return env;
  }
  std::vector<std::string> Race(int procs, std::map<std::string, std::string> extra, uint64_t* peak,
                                uint64_t* nvml_sum) {
    auto env = DriverEnv(extra);
    std::vector<std::unique_ptr<Child>> kids;
    for (int k = 0; k < procs; ++k)
      kids.push_back(std::make_unique<Child>(
          std::vector<std::string>{Bin("vcuda_probe"), "ctxfill", std::to_string(kMiB + 4096)},
          env));
    for (auto& c : kids) EXPECT_EQ(c->Line(), "ready");
    for (auto& c : kids) c->Send('g');
    std::vector<std::string> outs;
    for (auto& c : kids) {
      std::string out;
      for (std::string l; (l = c->Line()).rfind("nvml_procs", 0) != 0 && !l.empty();)
        out += l + "\n";
      outs.push_back(out);
    }
    // Every program still holds its memory here. Each byte of the fake GPU belongs to one
    // process's NVML entry, so the device counter is NVML's sum over the container's processes.
    *nvml_sum = DeviceUsed();
    *peak = DevicePeak();
    for (auto& c : kids) EXPECT_EQ(c->Wait(), 0);
    return outs;
  }
  uint64_t DeviceUsed(int device = 0) {
    int fd = open(state_.c_str(), O_RDONLY);
    uint64_t v[4] = {};
    if (fd >= 0) (void)!pread(fd, v, sizeof v, device * 32), close(fd);
    return v[0];
  }
  static constexpr uint64_t kLimit = 1024 * kMiB;
};

// One program: its context (300 MiB) and the rounding of its allocations are charged as NVML
// sees them, so the device never holds more than the limit, and the program still gets close to
// it (before: 300 MiB + 2 x its 1 GiB of allocations, about 2.3 GiB).
TEST_F(DriverHeld, OneProcessStaysUnderTheLimitAsNvmlSeesIt) {
  uint64_t peak = 0, used = 0;
  auto outs = Race(1, {}, &peak, &used);
  EXPECT_EQ(Field(outs[0], "context"), 0u) << outs[0];
  EXPECT_LE(peak, kLimit) << outs[0];
  EXPECT_LE(used, kLimit);
  EXPECT_GT(peak, kLimit - 8 * kMiB) << "refused long before the limit: " << outs[0];
  EXPECT_EQ(Field(outs[0], "nvml_self", 1), used) << outs[0];
}

// Eight programs racing in one container whose pid namespace hides their NVML pids (NVML
// reports pid + 1000000): each finds its own entry as the one that appears with its context.
// The device never holds more than the limit; the programs that got no room for a context were
// refused it with CUDA_ERROR_OUT_OF_MEMORY.
TEST_F(DriverHeld, EightRacingProcessesInAPidNamespace) {
  uint64_t peak = 0, used = 0;
  auto outs = Race(8, {{"FAKE_CUDA_NVML_PID_OFFSET", "1000000"}}, &peak, &used);
  int contexts = 0;
  for (auto& o : outs) {
    uint64_t r = Field(o, "context");
    EXPECT_TRUE(r == 0 || r == 2) << o;
    contexts += r == 0;
  }
  std::string all;
  for (auto& o : outs) all += o + "--\n";
  EXPECT_GE(contexts, 1) << all;
  EXPECT_LE(peak, kLimit) << all;
  EXPECT_LE(used, kLimit) << all;
  EXPECT_GT(peak, kLimit - 16 * kMiB) << "the race starved the container\n" << all;
}

// Each process reconciles only itself, and not on every allocation far from the limit: a
// neighbour's rounding it has not measured yet (here 40 allocations of 1 MiB + 4 KiB, each
// taking 2 MiB) is invisible in the charges. Near the limit the filling process looks at what
// NVML lists for the whole container, so the device still never holds more than the limit.
TEST_F(DriverHeld, ANeighboursUnmeasuredRoundingCountsNearTheLimit) {
  auto env = DriverEnv({{"FAKE_CUDA_CONTEXT_BYTES", std::to_string(64 * kMiB)},
                        {"FAKE_CUDA_NVML_PID_OFFSET", "1000000"}});
  Child neighbour({Bin("vcuda_probe"), "hold", "40", std::to_string(kMiB + 4096)}, env);
  ASSERT_EQ(neighbour.Line(), "ready");
  neighbour.Send('g');
  EXPECT_EQ(Field(neighbour.Line(), "held"), 40 * (kMiB + 4096));
  Child filler({Bin("vcuda_probe"), "fill", std::to_string(kMiB + 4096)}, env);
  ASSERT_EQ(filler.Line(), "ready");
  filler.Send('g');
  uint64_t filled = Field(filler.Line(), "held");
  EXPECT_LE(DevicePeak(), kLimit) << "filler held " << filled;
  EXPECT_GT(DevicePeak(), kLimit - 8 * kMiB) << "refused long before the limit";
  EXPECT_EQ(neighbour.Wait(), 0);
  EXPECT_EQ(filler.Wait(), 0);
}

// Memory that appears after the context without an allocation call (module code: 100 MiB here)
// is found by the allocation path's reconciliation and charged before the limit is reached.
TEST_F(DriverHeld, LaterHiddenMemoryIsCharged) {
  uint64_t peak = 0, used = 0;
  auto outs = Race(
      1, {{"FAKE_CUDA_MODULE_BYTES", std::to_string(100 * kMiB)}, {"FAKE_CUDA_ALLOC_GRANULE", "1"}},
      &peak, &used);
  EXPECT_EQ(Field(outs[0], "module"), 0u) << outs[0];
  EXPECT_LE(peak, kLimit) << outs[0];
  EXPECT_LE(Field(outs[0], "held"), kLimit - 400 * kMiB) << outs[0];
  EXPECT_GT(peak, kLimit - 8 * kMiB) << outs[0];
}

// Where NVML cannot list processes the per-context estimate (default 640 MiB) is charged
// instead: still never above the limit for contexts (allocations exact here: no rounding).
TEST_F(DriverHeld, WithoutNvmlTheEstimateIsCharged) {
  uint64_t peak = 0, used = 0;
  auto outs =
      Race(8, {{"FAKE_CUDA_NO_PROCESS_INFO", "1"}, {"FAKE_CUDA_ALLOC_GRANULE", "1"}}, &peak, &used);
  int contexts = 0;
  for (auto& o : outs) contexts += Field(o, "context") == 0;
  EXPECT_EQ(contexts, 1) << "640 MiB estimate: one context fits in 1 GiB";
  EXPECT_LE(peak, kLimit);
  EXPECT_GT(peak, 600 * kMiB);
}

// SIGKILL in the middle of allocations: the others finish, and the killed programs' memory
// returns (a new program can use the whole limit again).
TEST_F(E2E, SigkillMidAllocation) {
  std::vector<std::unique_ptr<Child>> survivors;
  for (int k = 0; k < 3; ++k)
    survivors.push_back(std::make_unique<Child>(
        std::vector<std::string>{Bin("vcuda_probe"), "churn", std::to_string(2 * kMiB), "30000"},
        env_));
  Child victim({Bin("vcuda_probe"), "churn", std::to_string(3 * kMiB), "-1"}, env_);
  Child hog({Bin("vcuda_probe"), "fill", std::to_string(16 * kMiB)}, env_);
  ASSERT_EQ(hog.Line(), "ready");
  // Let every churner create its context (charged 1 MiB) before the hog fills the container:
  // a churner starting late would find no room for its context, which is not what is tested.
  for (int i = 0; i < 1000; ++i) {
    vgpu::AccountingSnapshot snap;
    const char* error = nullptr;
    if (vgpu::ReadAccounting(accounting_.c_str(), &snap, &error) && snap.processes >= 5 &&
        snap.memory_used >= 5 * kMiB)
      break;
    usleep(10000);
  }
  usleep(20000);
  hog.Send('g');
  EXPECT_GT(Field(hog.Line(), "held"), 100 * kMiB);
  usleep(50000);
  // The device never held more than the limit while they raced. (The fake GPU does not return
  // a killed process's memory the way the real driver does, so it is judged up to the kill.)
  EXPECT_LE(DevicePeak(), limit_);
  kill(victim.pid, SIGKILL);
  kill(hog.pid, SIGKILL);
  EXPECT_EQ(victim.Wait(), 128 + SIGKILL);
  EXPECT_EQ(hog.Wait(), 128 + SIGKILL);
  for (auto& s : survivors) {
    EXPECT_GT(Field(s->Line(), "done"), 0u);
    EXPECT_EQ(s->Wait(), 0);
  }
  Child after({Bin("vcuda_probe"), "fill", std::to_string(kMiB)}, env_);
  ASSERT_EQ(after.Line(), "ready");
  after.Send('g');
  uint64_t got = Field(after.Line(), "held");
  // (Near the limit an allocation must also fit at the driver's 2 MiB granule.)
  EXPECT_GE(got + kMiB + kMiB + vcuda::Core::kDriverGranule, limit_)
      << "memory of killed processes did not come back";
  EXPECT_LE(got + kMiB, limit_);
  EXPECT_EQ(after.Wait(), 0);
}

// util-linux's unshare on PATH, or "".
std::string FindUnshare() {
  std::string unshare;
  if (FILE* p = popen("command -v unshare", "r")) {
    char b[256] = {};
    if (fgets(b, sizeof b, p)) unshare = b;
    pclose(p);
    while (!unshare.empty() && unshare.back() == '\n') unshare.pop_back();
  }
  return unshare;
}

// Two pods that share one DRA claim share its accounting file, but not a pid namespace: neither
// sees the other in its /proc. Each asks for 3 x 256 MiB under a 1 GiB limit: the second gets
// none while the first holds its 768 MiB (before: it found no /proc/<pid> for the first, judged
// it dead, zeroed its reservation and got 3/3, 1538 MiB on the device under 1024). Once the first
// is killed, its memory comes back to a third. Each program is pid 1 of a user and pid namespace
// of its own with its own /proc (unshare -Urpf --mount-proc), as in a container.
TEST_F(E2E, SeparatePidNamespacesShareOneLimit) {
  std::string unshare = FindUnshare();
  if (unshare.empty()) GTEST_SKIP() << "unshare (util-linux) is not installed";
  if (system((unshare + " -Urpf --mount-proc true >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "cannot create user and pid namespaces here ('unshare -Urpf --mount-proc "
                    "true' failed): the cross-namespace limit is not tested";
  const uint64_t limit = 1024 * kMiB, chunk = 256 * kMiB;
  auto env = env_;
  env["GPULET_VGPU_MEMORY_LIMIT"] = std::to_string(limit);
  env["FAKE_CUDA_DEVICE_MEMORY"] = std::to_string(8 * limit);
  // Every program is pid 1 in its namespace, which NVML's per-process list (keyed by the fake's
  // getpid()) cannot tell apart: the 1 MiB context estimate is charged instead.
  env["FAKE_CUDA_NO_PROCESS_INFO"] = "1";
  auto in_namespaces = [&] {
    // --kill-child: SIGKILL to the program when unshare dies (the test kills unshare).
    return std::vector<std::string>{
        unshare, "-Urpf", "--mount-proc",       "--kill-child=SIGKILL", Bin("vcuda_probe"),
        "hold",  "3",     std::to_string(chunk)};
  };
  Child first(in_namespaces(), env);
  ASSERT_EQ(first.Line(), "ready");
  first.Send('g');
  EXPECT_EQ(Field(first.Line(), "held"), 3 * chunk);
  usleep(30000);  // a later start time (both are pid 1): not mistaken for the same process
  Child second(in_namespaces(), env);
  ASSERT_EQ(second.Line(), "ready");
  second.Send('g');
  EXPECT_EQ(Field(second.Line(), "held"), 0u) << "the first program's reservation was reclaimed";
  EXPECT_LE(DevicePeak(), limit) << "the device held more than the limit";
  kill(first.pid, SIGKILL);
  first.All();  // EOF: the program (pid 1 of its namespace) is gone too
  first.Wait();
  Child third(in_namespaces(), env);
  ASSERT_EQ(third.Line(), "ready");
  third.Send('g');
  EXPECT_EQ(Field(third.Line(), "held"), 3 * chunk) << "the killed program's memory is lost";
  EXPECT_EQ(second.Wait(), 0);
  EXPECT_EQ(third.Wait(), 0);
}

// The unshare binary when user and mount namespaces can be made here, else "" (the caller skips).
std::string UserMountNamespaces() {
  std::string unshare = FindUnshare();
  if (unshare.empty() ||
      system((unshare + " -Urm sh -c 'mount -t tmpfs tmpfs /run' >/dev/null 2>&1").c_str()) != 0)
    return "";
  return unshare;
}

// A container as the agent makes it (issue 31.6): the limits in a read-only file at
// /var/run/gpulet/vgpu/limits and the interposer in /etc/ld.so.preload, each mounted over the
// real path in a mount namespace of the program's own. `limits` is the file's text; `preload`
// mounts an /etc whose ld.so.preload names the interposer.
std::vector<std::string> InContainer(const std::string& unshare, const std::string& dir,
                                     const std::string& limits, bool preload,
                                     std::vector<std::string> argv) {
  {
    std::ofstream(dir + "/limits") << limits;
    std::ofstream(dir + "/ld.so.preload") << ShimPath() << "\n";
  }
  std::string script =
      "set -e; d=\"$1\"; shift; mount -t tmpfs tmpfs /run; mkdir -p /run/gpulet/vgpu; "
      "cp \"$d/limits\" /run/gpulet/vgpu/limits; chmod 0444 /run/gpulet/vgpu/limits; "
      "mount --bind /run/gpulet/vgpu/limits /run/gpulet/vgpu/limits; "
      "mount -o remount,bind,ro /run/gpulet/vgpu/limits; ";
  if (preload)  // /etc as links to the real entries, and our ld.so.preload
    script +=
        "mkdir -p \"$d/etc\"; mount --rbind /etc \"$d/etc\"; mount -t tmpfs tmpfs /etc; "
        "for f in \"$d\"/etc/*; do ln -s \"$f\" /etc/; done; rm -f /etc/ld.so.preload; "
        "cp \"$d/ld.so.preload\" /etc/ld.so.preload; ";
  script += "exec \"$@\"";
  std::vector<std::string> full = {unshare, "-Urm", "--kill-child=SIGKILL", "sh", "-c", script,
                                   "sh",    dir};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

// Limits from the read-only file outrank the environment: the tenant's own
// GPULET_VGPU_MEMORY_LIMIT of 8 GiB and GPULET_VGPU_DISABLE=1 (envFrom a ConfigMap, an
// entrypoint's `env`) change nothing, and a process still holds at most the file's limit. Before,
// the environment was the only source: the program held all 3 chunks.
TEST_F(E2E, LimitsFileOutranksTheEnvironment) {
  std::string unshare = UserMountNamespaces();
  if (unshare.empty())
    GTEST_SKIP() << "cannot make user and mount namespaces here ('unshare -Urm' with a tmpfs "
                    "mount failed): the limits file is not tested";
  const uint64_t chunk = 100 * kMiB;
  std::string limits =
      "# written by the agent\nGPULET_VGPU_MEMORY_LIMIT=" + std::to_string(limit_) +
      "\nGPULET_VGPU_ACCOUNTING=" + accounting_ +
      "\nGPULET_VGPU_CONTEXT_BYTES=" + std::to_string(kMiB) + "\nGPULET_VGPU_DISABLE=0\n";
  auto env = env_;
  env["GPULET_VGPU_MEMORY_LIMIT"] = std::to_string(8192 * kMiB);
  env["GPULET_VGPU_DISABLE"] = "1";
  env["GPULET_VGPU_ACCOUNTING"] = accounting_ + ".tenant";
  Child c(InContainer(unshare, ProcessTempDir(), limits, false,
                      {Bin("vcuda_probe"), "hold", "3", std::to_string(chunk)}),
          env);
  ASSERT_EQ(c.Line(), "ready");
  c.Send('g');
  EXPECT_EQ(Field(c.Line(), "held"), 2 * chunk) << "the environment lifted the file's limit";
  EXPECT_LE(DevicePeak(), limit_);
  EXPECT_EQ(c.Wait(), 0);
  EXPECT_FALSE(std::filesystem::exists(accounting_ + ".tenant"))
      << "the environment's accounting path was used";
}

// A malformed limits file fails closed, whatever the environment says: nothing is allocated
// (the context itself may be refused, which is failing closed too).
TEST_F(E2E, MalformedLimitsFileFailsClosed) {
  std::string unshare = UserMountNamespaces();
  if (unshare.empty())
    GTEST_SKIP() << "cannot make user and mount namespaces here: the limits file is not tested";
  auto env = env_;
  env["GPULET_VGPU_DISABLE"] = "1";
  Child c(InContainer(unshare, ProcessTempDir(),
                      "GPULET_VGPU_MEMORY_LIMIT=" + std::to_string(limit_) + "\nLD_AUDIT=x\n",
                      false, {Bin("vcuda_probe"), "fill", std::to_string(kMiB)}),
          env);
  if (c.Line() == "ready") {
    c.Send('g');
    EXPECT_EQ(Field(c.Line(), "held"), 0u);
  }
  c.Wait();
  EXPECT_LE(DevicePeak(), kMiB) << "a malformed limits file let memory through";
}

// The interposer comes through /etc/ld.so.preload: a process whose LD_PRELOAD the tenant's
// entrypoint cleared is still limited.
TEST_F(E2E, PreloadFileLoadsTheInterposerWithoutLdPreload) {
  std::string unshare = UserMountNamespaces();
  if (unshare.empty())
    GTEST_SKIP() << "cannot make user and mount namespaces here: the preload file is not tested";
  const uint64_t chunk = 100 * kMiB;
  std::string limits = "GPULET_VGPU_MEMORY_LIMIT=" + std::to_string(limit_) +
                       "\nGPULET_VGPU_CONTEXT_BYTES=" + std::to_string(kMiB) +
                       "\nGPULET_VGPU_ACCOUNTING=" + accounting_ + "\n";
  auto env = env_;
  env["LD_PRELOAD"] = "";
  Child c(InContainer(unshare, ProcessTempDir(), limits, true,
                      {Bin("vcuda_probe"), "hold", "3", std::to_string(chunk)}),
          env);
  ASSERT_EQ(c.Line(), "ready");
  c.Send('g');
  EXPECT_EQ(Field(c.Line(), "held"), 2 * chunk) << "the interposer was not loaded";
  EXPECT_EQ(c.Wait(), 0);
}

// A program that touched CUDA and then exec()s (a launcher: checks the GPU, then execs the job)
// gets its memory back in the new image: the old image's slot lock went with its descriptor,
// closed at exec, so its 600 MiB and context charge are reclaimed. Before, the old slot had the
// same owner word (pid and start time) as the new image, which never reclaims its own, and the
// new image's 600 MiB under 1 GiB were refused. (The fake GPU keeps the old image's memory; the
// real driver's descriptors are closed at exec too, and its memory freed.)
TEST_F(E2E, ExecGetsThePreviousImagesMemoryBack) {
  const uint64_t limit = 1024 * kMiB, chunk = 600 * kMiB;
  auto env = env_;
  env["GPULET_VGPU_MEMORY_LIMIT"] = std::to_string(limit);
  env["FAKE_CUDA_DEVICE_MEMORY"] = std::to_string(8 * limit);
  Child c({Bin("vcuda_probe"), "exec", std::to_string(chunk)}, env);
  EXPECT_EQ(Field(c.Line(), "pre"), 0u);
  ASSERT_EQ(c.Line(), "ready");
  c.Send('g');
  EXPECT_EQ(Field(c.Line(), "held"), chunk) << "the image before exec still holds its charge";
  EXPECT_EQ(c.Wait(), 0);
}

// The legacy launches are paced like cuLaunchKernel: greedy 1 ms launches of each held to 30 %
// (the cap strict per second, as PacingOnTheRealClock). Before: unpaced, ~100 %.
TEST_F(E2E, LegacyLaunchesArePaced) {
  for (const char* kind : {"launch", "grid", "async"}) {
    std::string out =
        Run({Bin("vcuda_probe"), "legacy", "2", kind},
            {{"GPULET_VGPU_CORE_LIMIT", "30"}, {"FAKE_CUDA_NS_PER_BLOCK", "1000000"}});
    std::vector<double> shares = Shares(out);
    for (double share : shares) EXPECT_LE(share, 35.0) << kind << ":\n" << out;
    EXPECT_EQ(shares.size(), 2u) << kind << ":\n" << out;
    EXPECT_GE(std::accumulate(shares.begin(), shares.end(), 0.0) / 2, 10.0)
        << kind << ":\n"
        << out;  // greedy, but on a loaded 2-core VM
  }
}

// The libcudart-style program: every entry point of the CUDA 13.0 list through
// cuGetProcAddress_v2, forwarded to the driver in the same order with the same versions; the
// allocation entry point it got is ours and fails with CUDA_ERROR_OUT_OF_MEMORY at the limit.
TEST_F(E2E, RuntimeStyleProgramThroughGetProcAddress) {
  std::string list =
      std::string(GPULET_SOURCE_DIR) + "/tests/vgpu/interposer/data/cudart-13.0-getprocaddress.txt";
  if (const char* l = getenv("GPULET_CUDART_PROC_LIST")) list = l;
  ASSERT_EQ(access(list.c_str(), R_OK), 0)
      << "the cudart entry-point list is part of the tree: " << list;
  std::string log = accounting_ + ".proclog";
  unlink(log.c_str());
  std::string out =
      Run({Bin("vcuda_procaddr"), list, std::to_string(8 * kMiB)}, {{"FAKE_CUDA_PROC_LOG", log}});
  std::vector<std::string> want, seen;
  std::ifstream in(list);
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] != '#') want.push_back(l);
  std::ifstream got(log);
  for (std::string l; std::getline(got, l);) seen.push_back(l.substr(0, l.rfind(':')));
  // The program's own requests come first; the interposer adds none in between.
  ASSERT_GE(seen.size(), want.size());
  seen.resize(want.size());
  EXPECT_EQ(seen, want);
  EXPECT_EQ(Field(out, "requests"), want.size());
  EXPECT_NE(out.find("hooked cuMemAlloc yes"), std::string::npos) << out;
  EXPECT_EQ(Field(out, "total"), limit_);
  uint64_t held = Field(out, "held");
  EXPECT_LE(held + kMiB, limit_);
  EXPECT_GT(held + kMiB + 8 * kMiB, limit_);
  EXPECT_NE(out.find("last-error 2"), std::string::npos) << out;  // CUDA_ERROR_OUT_OF_MEMORY
}

// A program linked against libcuda by name sees the limit in cuMemGetInfo, cuDeviceTotalMem and
// NVML's memory info.
TEST_F(E2E, LinkedProgramSeesTheLimit) {
  std::string out = Run({Bin("vcuda_probe"), "info"});
  EXPECT_EQ(Field(out, "meminfo", 1), limit_);
  EXPECT_EQ(Field(out, "meminfo", 0), limit_ - kMiB);  // the context is already in use
  EXPECT_EQ(Field(out, "totalmem"), limit_);
  EXPECT_EQ(Field(out, "nvml", 0), limit_);
  EXPECT_EQ(Field(out, "nvml", 1), kMiB);
}

// CUDA_VISIBLE_DEVICES reordering or hiding GPUs: the limit follows the container's GPU (by
// UUID), not an ordinal.
TEST_F(E2E, VisibleDevicesReorderAndHide) {
  std::map<std::string, std::string> two = {
      {"FAKE_CUDA_DEVICE_COUNT", "2"},
      {"NVIDIA_VISIBLE_DEVICES", "GPU-face0000-0000-0000-0000-000000000001"},
      {"CUDA_VISIBLE_DEVICES", "1,0"}};
  uint64_t chunk = 16 * kMiB;
  // Each run on a fresh fake GPU (the fake keeps an exited process's memory).
  auto held = [&](const char* ordinal, const char* run) {
    two["FAKE_CUDA_STATE"] = state_ + run;
    return Field(Run({Bin("vcuda_probe"), "device", ordinal, std::to_string(chunk)}, two), "held");
  };
  // Ordinal 0 is physical GPU 1, the limited one; ordinal 1 is physical 0, not limited.
  uint64_t limited = held("0", ".a");
  EXPECT_LE(limited, limit_);
  EXPECT_GT(limited + kMiB + chunk, limit_);  // filled up to the last chunk (1 MiB is the context)
  EXPECT_GT(held("1", ".b"), limit_);
  two["CUDA_VISIBLE_DEVICES"] = "0";  // the limited GPU hidden: ordinal 0 is the other one
  EXPECT_GT(held("0", ".c"), limit_);
  // Reports follow the GPU too: CUDA ordinal 0 (physical 1) shows the limit, NVML's device 0
  // (physical 0, another tenant's GPU) shows the whole card.
  two["CUDA_VISIBLE_DEVICES"] = "1,0";
  two["FAKE_CUDA_STATE"] = state_ + ".d";
  std::string info = Run({Bin("vcuda_probe"), "info"}, two);
  EXPECT_EQ(Field(info, "meminfo", 1), limit_);
  EXPECT_EQ(Field(info, "nvml", 0), 1024 * kMiB);
}

// A container that got its GPU through CDI: the CDI spec set NVIDIA_VISIBLE_DEVICES=void, the
// driver sees only the GPU whose device node the container has (here the third of a machine's
// four, with the machine's own UUIDs), and the agent named it in GPULET_VGPU_UUID. The limit holds
// on that GPU, CUDA's ordinal 0; naming a GPU the container does not have limits nothing.
TEST_F(E2E, CdiContainerTheGrantedGpuByItsOwnUuid) {
  const std::string nodes = accounting_ + ".dev";
  std::filesystem::create_directories(nodes);
  std::ofstream(nodes + "/nvidia2").put('\0');
  const std::string a = "GPU-6bf20cbf-aee1-fd80-cc0e-b2560aa1134f",
                    b = "GPU-0d1ba1a1-5c3e-4f6a-8b1e-2f0c9e6d7a10",
                    c = "GPU-c9662dca-f95e-4782-58b5-b1966bfa79c6",
                    d = "GPU-9a0b1c2d-3e4f-5a6b-7c8d-9e0f1a2b3c4d";
  std::map<std::string, std::string> cdi = {{"FAKE_CUDA_UUIDS", a + "," + b + "," + c + "," + d},
                                            {"FAKE_CUDA_DEVICE_NODES", nodes},
                                            {"NVIDIA_VISIBLE_DEVICES", "void"},
                                            {"GPULET_VGPU_UUID", c}};
  uint64_t chunk = 16 * kMiB;
  cdi["FAKE_CUDA_STATE"] = state_ + ".cdi";
  std::string info = Run({Bin("vcuda_probe"), "info"}, cdi);
  EXPECT_EQ(Field(info, "meminfo", 1), limit_) << info;
  uint64_t held =
      Field(Run({Bin("vcuda_probe"), "device", "0", std::to_string(chunk)}, cdi), "held");
  EXPECT_LE(held, limit_);
  EXPECT_GT(held + kMiB + chunk, limit_);
  cdi["GPULET_VGPU_UUID"] = a;  // a GPU of the machine this container was not given
  cdi["FAKE_CUDA_STATE"] = state_ + ".other";
  EXPECT_GT(Field(Run({Bin("vcuda_probe"), "device", "0", std::to_string(chunk)}, cdi), "held"),
            limit_);
}

// GPULET_VGPU_DISABLE=1 turns the library into a pass-through.
TEST_F(E2E, OptOut) {
  Child c({Bin("vcuda_probe"), "fill", std::to_string(16 * kMiB)}, [&] {
    auto e = env_;
    e["GPULET_VGPU_DISABLE"] = "1";
    return e;
  }());
  ASSERT_EQ(c.Line(), "ready");
  c.Send('g');
  EXPECT_GT(Field(c.Line(), "held"), limit_);
  EXPECT_EQ(c.Wait(), 0);
}

// A malformed limit is reported once by name and fails closed (no memory), never crashes.
TEST_F(E2E, MalformedLimitFailsClosed) {
  std::string err = accounting_ + ".err";
  auto env = env_;
  env["GPULET_VGPU_MEMORY_LIMIT"] = "12G";
  int saved = dup(2);
  int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 2);
  Child c({Bin("vcuda_probe"), "fill", std::to_string(kMiB)}, env);
  dup2(saved, 2);
  close(fd);
  close(saved);
  std::string first = c.Line();
  if (first == "ready") {
    c.Send('g');
    EXPECT_EQ(Field(c.Line(), "held"), 0u);
  }  // else: the context itself was refused, which is failing closed too
  c.Wait();
  std::ifstream in(err);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("GPULET_VGPU_MEMORY_LIMIT=\"12G\" is not a decimal byte count"),
            std::string::npos)
      << text;
}

// Pacing through the preloaded library on the real clock: a greedy program held to 30 %. The
// cap is strict per second; the floor is loose because on a loaded machine the program itself
// may not get the CPU to be greedy (the virtual-time unit tests judge accuracy).
TEST_F(E2E, PacingOnTheRealClock) {
  std::string out = Run({Bin("vcuda_probe"), "greedy", "3"}, {{"GPULET_VGPU_CORE_LIMIT", "30"}});
  std::vector<double> shares = Shares(out);
  for (double share : shares) EXPECT_LE(share, 35.0) << out;
  EXPECT_EQ(shares.size(), 3u);
  EXPECT_GE(std::accumulate(shares.begin(), shares.end(), 0.0) / 3, 10.0)
      << out;  // measured 18-30 on a 2-core VM at load ~29
}

// The library exports exactly its hooks, needs only glibc, and carries no C++ exception
// machinery (built with -fno-exceptions, libstdc++ not linked at run time).
TEST(Library, ExportsOnlyHooksAndLinksOnlyGlibc) {
  if (access(ShimPath().c_str(), R_OK) != 0) GTEST_SKIP() << "libgpulet-vcuda.so not built";
  if (system("command -v nm >/dev/null && command -v readelf >/dev/null") != 0)
    GTEST_SKIP() << "binutils (nm, readelf) not installed";
  auto lines = [](const std::string& cmd) {
    std::set<std::string> out;
    FILE* p = popen(cmd.c_str(), "r");
    char b[512];
    while (p && fgets(b, sizeof b, p)) {
      std::string s(b);
      while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
      out.insert(s);
    }
    if (p) pclose(p);
    return out;
  };
  std::set<std::string> exported =
      lines("nm -D --defined-only " + ShimPath() + " | awk '{print $3}'");
  // The list the library is built from (hooks.h), and dlsym.
#define GPULET_HOOK_NAME(n) #n,
  const std::set<std::string> hooks = {GPULET_VCUDA_HOOKS(GPULET_HOOK_NAME) "dlsym"};
#undef GPULET_HOOK_NAME
  EXPECT_EQ(hooks.size(), 53u);  // 52 driver hooks + dlsym: a hook dropped by accident shows here
  EXPECT_EQ(exported, hooks);
  std::set<std::string> needed =
      lines("readelf -d " + ShimPath() + " | sed -n 's/.*(NEEDED).*\\[\\(.*\\)\\]/\\1/p'");
  // glibc only: libdl.so.2 and libpthread.so.0 are named so that glibc before 2.34 finds dlopen
  // & co there (glibc_floor.h); the sanitizers' runtimes in those builds.
  for (const std::string& n : needed)
    EXPECT_TRUE(n == "libc.so.6" || n == "libdl.so.2" || n == "libpthread.so.0" ||
                n.rfind("ld-linux", 0) == 0 || n.find("san.so") != std::string::npos)
        << "unexpected dependency " << n;
  std::set<std::string> symbols = lines("nm -D " + ShimPath() + " | awk '{print $NF}'");
  for (const char* bad :
       {"__cxa_throw", "__gxx_personality_v0", "_Unwind_Resume", "__cxa_begin_catch"})
    EXPECT_EQ(symbols.count(bad), 0u) << bad;
}

}  // namespace
}  // namespace gpulet
