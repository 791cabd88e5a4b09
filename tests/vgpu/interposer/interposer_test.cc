// Unit tests of the interposer: the shared accounting protocol (threads and forked processes),
// configuration parsing, every allocation path and report through the real shim library loaded
// into this process over the fake driver, cuGetProcAddress/dlsym mapping, and the compute pacer on
// a virtual clock shared with the fake driver's GPU timeline.
#include <errno.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "abi/vgpu_accounting.h"
#include "testing/vcuda/support.h"
#include "vgpu/interposer/core.h"

namespace gpulet {
namespace {

using namespace testing_interposer;
using vgpu::AccountingRegion;

constexpr uint64_t kMiB = 1 << 20;

std::string TempFile(const char* tag) {
  std::string dir = ProcessTempDir();
  return dir + "/vcuda-" + tag + "-" + std::to_string(getpid()) + "-" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

AccountingRegion* MapFresh(const std::string& path, uint64_t limit) {
  unlink(path.c_str());
  const char* error = nullptr;
  AccountingRegion* r = vgpu::MapAccounting(path.c_str(), true, &error);
  EXPECT_NE(r, nullptr) << error;
  if (r) r->memory_limit.store(limit);
  return r;
}

uint64_t SelfOwner() { return vgpu::OwnerWord(getpid(), vgpu::ProcessStartTicks(getpid())); }

// --- accounting protocol ------------------------------------------------------------------------

// Concurrent reservations from many threads never commit more than the limit.
TEST(Accounting, ThreadsNeverExceedLimit) {
  std::string path = TempFile("threads");
  AccountingRegion* r = MapFresh(path, 64 * kMiB);
  ASSERT_NE(r, nullptr);
  std::atomic<int64_t> committed{0};
  std::atomic<int64_t> worst{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      int slot = vgpu::ClaimSlot(*r, SelfOwner());
      ASSERT_GE(slot, 0);
      std::mt19937 rng(t);
      std::vector<uint64_t> held;
      for (int i = 0; i < 4000; ++i) {
        uint64_t b = 1 + rng() % (4 * kMiB);
        if (vgpu::Reserve(*r, slot, SelfOwner(), b)) {
          int64_t now = committed.fetch_add(static_cast<int64_t>(b)) + static_cast<int64_t>(b);
          int64_t w = worst.load();
          while (w < now && !worst.compare_exchange_weak(w, now)) {
          }
          held.push_back(b);
        }
        if (!held.empty() && rng() % 2) {
          committed.fetch_sub(static_cast<int64_t>(held.back()));
          vgpu::Unreserve(*r, slot, held.back());
          held.pop_back();
        }
      }
      for (uint64_t b : held)
        committed.fetch_sub(static_cast<int64_t>(b)), vgpu::Unreserve(*r, slot, b);
      vgpu::ReleaseSlot(*r, slot, SelfOwner());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(worst.load(), 64 * static_cast<int64_t>(kMiB));
  EXPECT_GT(worst.load(), 48 * static_cast<int64_t>(kMiB));  // and the limit was really contended
  EXPECT_LE(r->peak_used.load(), 64 * kMiB);
  EXPECT_EQ(vgpu::UsedBytes(*r), 0u);
}

// 16 processes racing to fill one container's limit commit at most the limit, to the byte; when
// they die without freeing, a survivor gets the whole limit back.
TEST(Accounting, SixteenProcessesRaceToTheLimit) {
  std::string path = TempFile("race");
  // Children stay alive until all have finished: a dead child's memory is (rightly) reclaimed.
  const uint64_t limit = 100 * kMiB + 12345;
  AccountingRegion* r = MapFresh(path, limit);
  ASSERT_NE(r, nullptr);
  auto* shared = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  std::atomic<uint64_t>& go = shared[0];
  std::atomic<uint64_t>* got = shared + 1;  // per child: bytes it holds
  std::vector<pid_t> kids;
  for (int k = 0; k < 16; ++k) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const char* e = nullptr;
      AccountingRegion* mine = vgpu::MapAccounting(path.c_str(), true, &e);
      uint64_t owner = SelfOwner();
      int slot = mine ? vgpu::ClaimSlot(*mine, owner) : -1;
      if (slot < 0) _exit(2);
      while (go.load() == 0) sched_yield();
      std::mt19937 rng(k);
      for (int fails = 0; fails < 20;) {
        uint64_t b = 1 + rng() % (3 * kMiB);
        if (vgpu::Reserve(*mine, slot, owner, b))
          got[k].fetch_add(b);
        else
          ++fails;
      }
      go.fetch_add(1);
      while (go.load() < 17) sched_yield();  // stay alive (holding) until every child is done
      _exit(0);  // exits holding everything, like a process that never frees
    }
    kids.push_back(pid);
  }
  go.store(1);
  for (pid_t p : kids) {
    int status = 0;
    waitpid(p, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  uint64_t total = 0;
  for (int k = 0; k < 16; ++k) total += got[k].load();
  EXPECT_LE(total, limit);
  EXPECT_GT(total, limit - 3 * kMiB * 16);  // contention never starves the container
  EXPECT_LE(r->peak_used.load(), limit);
  // All 16 are dead: the next process reclaims their memory and may use the whole limit.
  int slot = vgpu::ClaimSlot(*r, SelfOwner());
  ASSERT_GE(slot, 0);
  EXPECT_TRUE(vgpu::Reserve(*r, slot, SelfOwner(), limit));
  EXPECT_EQ(vgpu::UsedBytes(*r), limit);
  munmap(shared, 4096);
}

// A process SIGKILLed in the middle of allocating leaves nothing held: the others keep going,
// and its memory returns to the container.
TEST(Accounting, SigkillMidAllocationReturnsMemory) {
  std::string path = TempFile("kill");
  const uint64_t limit = 32 * kMiB;
  AccountingRegion* r = MapFresh(path, limit);
  ASSERT_NE(r, nullptr);
  auto churn = [&](int seed, int rounds) {
    const char* e = nullptr;
    AccountingRegion* mine = vgpu::MapAccounting(path.c_str(), true, &e);
    uint64_t owner = SelfOwner();
    int slot = vgpu::ClaimSlot(*mine, owner);
    std::mt19937 rng(seed);
    std::vector<uint64_t> held;
    for (int i = 0; rounds < 0 || i < rounds; ++i) {
      uint64_t b = 1 + rng() % kMiB;
      if (vgpu::Reserve(*mine, slot, owner, b)) held.push_back(b);
      if (held.size() > 8) vgpu::Unreserve(*mine, slot, held.front()), held.erase(held.begin());
    }
    for (uint64_t b : held) vgpu::Unreserve(*mine, slot, b);
    vgpu::ReleaseSlot(*mine, slot, owner);
    _exit(0);
  };
  pid_t victim = fork();
  if (victim == 0) churn(1, -1);  // forever, until killed
  // The victim grabs most of the limit and keeps allocating.
  pid_t hog = fork();
  if (hog == 0) {
    const char* e = nullptr;
    AccountingRegion* mine = vgpu::MapAccounting(path.c_str(), true, &e);
    uint64_t owner = SelfOwner();
    int slot = vgpu::ClaimSlot(*mine, owner);
    while (!vgpu::Reserve(*mine, slot, owner, 20 * kMiB)) sched_yield();
    pause();  // holds 20 MiB, then is killed without freeing
    _exit(0);
  }
  std::vector<pid_t> survivors;
  for (int k = 0; k < 3; ++k) {
    pid_t p = fork();
    if (p == 0) churn(10 + k, 200000);
    survivors.push_back(p);
  }
  while (vgpu::UsedBytes(*r) < 20 * kMiB) sched_yield();
  usleep(20000);
  kill(victim, SIGKILL);
  kill(hog, SIGKILL);
  waitpid(victim, nullptr, 0);
  waitpid(hog, nullptr, 0);
  for (pid_t p : survivors) {
    int status = 0;
    waitpid(p, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a survivor got stuck or died";
  }
  int slot = vgpu::ClaimSlot(*r, SelfOwner());
  ASSERT_GE(slot, 0);
  EXPECT_TRUE(vgpu::Reserve(*r, slot, SelfOwner(), limit)) << "killed processes' memory lost";
  EXPECT_LE(r->peak_used.load(), limit);
}

// An owner word naming a pid that this pid namespace does not have: how a process of another
// pid namespace sharing the file (another pod of the same DRA claim, or a tenant's own user
// namespace) looks from here.
uint64_t InvisibleOwner(int k) {
  int pid = 4194000 + k;  // above any pid this machine hands out (checked)
  while (kill(pid, 0) == 0 || errno != ESRCH) ++pid;
  return vgpu::OwnerWord(pid, 1000 + static_cast<uint64_t>(k));
}

// A shared page for a test's processes: flags and pids.
std::atomic<uint64_t>* SharedPage() {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::atomic<uint64_t>*>(p);
}
void WaitFor(std::atomic<uint64_t>& flag, uint64_t value) {
  for (int i = 0; i < 20000 && flag.load() < value; ++i) usleep(500);
}

// A live process whose pid this process cannot see keeps its memory: the limit holds across pid
// namespaces. Liveness is the slot's lock on the file (the kernel's, across namespaces), not
// /proc/<pid>: before, the survivor over the limit judged the invisible owner dead, zeroed its
// 768 MiB and reserved 512 MiB more (1280 MiB committed under 1 GiB). Once that process is
// killed, its lock is gone and its memory comes back.
TEST(Accounting, LiveOwnerInAnotherPidNamespaceKeepsItsMemory) {
  std::string path = TempFile("pidns");
  const uint64_t limit = 1024 * kMiB;
  AccountingRegion* r = MapFresh(path, limit);
  ASSERT_NE(r, nullptr);
  std::atomic<uint64_t>* shared = SharedPage();
  ASSERT_NE(shared, nullptr);
  pid_t other = fork();
  ASSERT_GE(other, 0);
  if (other == 0) {
    const char* e = nullptr;
    AccountingRegion* mine = vgpu::MapAccounting(path.c_str(), true, &e);
    uint64_t owner = InvisibleOwner(0);
    int slot = mine ? vgpu::ClaimSlot(*mine, owner) : -1;
    if (slot < 0 || !vgpu::Reserve(*mine, slot, owner, 768 * kMiB, limit)) _exit(2);
    shared[0].store(1);
    pause();  // holds 768 MiB until killed
    _exit(0);
  }
  WaitFor(shared[0], 1);
  ASSERT_EQ(shared[0].load(), 1u) << "the other process did not reserve";
  int slot = vgpu::ClaimSlot(*r, SelfOwner());
  ASSERT_GE(slot, 0);
  EXPECT_FALSE(vgpu::Reserve(*r, slot, SelfOwner(), 512 * kMiB, limit))
      << "the live owner's reservation was reclaimed: " << vgpu::UsedBytes(*r) / kMiB << " MiB";
  EXPECT_EQ(vgpu::UsedBytes(*r), 768 * kMiB);
  EXPECT_LE(r->peak_used.load(), limit);
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
  EXPECT_TRUE(vgpu::Reserve(*r, slot, SelfOwner(), 512 * kMiB, limit))
      << "the killed process's reservation did not come back";
  EXPECT_EQ(vgpu::UsedBytes(*r), 512 * kMiB);
  vgpu::ReleaseSlot(*r, slot, SelfOwner());
  munmap(shared, 4096);
}

// A fork child that inherits its parent's descriptor of the file (and its mapping) still gets a
// slot and a lock of its own: when the parent dies its memory comes back even while the child
// lives, and the child's memory stays counted. Both pids are invisible here (another pid
// namespace), so /proc cannot tell: before, the survivor reclaimed the live child's 200 MiB too.
TEST(Accounting, ForkChildHoldsItsOwnSlot) {
  std::string path = TempFile("forkns");
  const uint64_t limit = 1024 * kMiB;
  AccountingRegion* r = MapFresh(path, limit);
  ASSERT_NE(r, nullptr);
  std::atomic<uint64_t>* shared = SharedPage();
  ASSERT_NE(shared, nullptr);
  // The child is orphaned when its parent is killed: it comes back to us, to be reaped.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    const char* e = nullptr;
    AccountingRegion* mine = vgpu::MapAccounting(path.c_str(), true, &e);
    uint64_t owner = InvisibleOwner(1);
    int slot = mine ? vgpu::ClaimSlot(*mine, owner) : -1;
    if (slot < 0 || !vgpu::Reserve(*mine, slot, owner, 300 * kMiB, limit)) _exit(2);
    pid_t child = fork();
    if (child == 0) {  // the same mapping and descriptor as its parent
      uint64_t own = InvisibleOwner(2);
      int s = vgpu::ClaimSlot(*mine, own);
      if (s < 0 || s == slot || !vgpu::Reserve(*mine, s, own, 200 * kMiB, limit)) _exit(2);
      shared[0].store(1);
      pause();
      _exit(0);
    }
    shared[1].store(static_cast<uint64_t>(child));
    WaitFor(shared[0], 1);
    shared[2].store(1);
    pause();
    _exit(0);
  }
  WaitFor(shared[2], 1);
  ASSERT_EQ(shared[2].load(), 1u) << "parent and child did not reserve";
  auto child = static_cast<pid_t>(shared[1].load());
  EXPECT_EQ(vgpu::UsedBytes(*r), 500 * kMiB);
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  int slot = vgpu::ClaimSlot(*r, SelfOwner());
  ASSERT_GE(slot, 0);
  EXPECT_TRUE(vgpu::Reserve(*r, slot, SelfOwner(), limit - 200 * kMiB, limit))
      << "the dead parent's 300 MiB did not come back (its child kept its lock?): "
      << vgpu::UsedBytes(*r) / kMiB << " MiB committed";
  EXPECT_FALSE(vgpu::Reserve(*r, slot, SelfOwner(), 1, limit))
      << "the live child's 200 MiB was reclaimed";
  EXPECT_LE(r->peak_used.load(), limit);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  EXPECT_TRUE(vgpu::Reserve(*r, slot, SelfOwner(), 200 * kMiB, limit)) << "the child's memory";
  vgpu::ReleaseSlot(*r, slot, SelfOwner());
  munmap(shared, 4096);
}

// Foreign or incompatible files are refused with a message, never used.
TEST(Accounting, RejectsForeignAndTruncatedFiles) {
  std::string path = TempFile("bad");
  const char* error = nullptr;
  {
    FILE* f = fopen(path.c_str(), "w");
    std::vector<char> junk(sizeof(AccountingRegion), 'x');
    fwrite(junk.data(), 1, junk.size(), f);
    fclose(f);
  }
  EXPECT_EQ(vgpu::MapAccounting(path.c_str(), true, &error), nullptr);
  EXPECT_STREQ(error, "accounting file has a foreign magic number");
  truncate(path.c_str(), 10);
  EXPECT_EQ(vgpu::MapAccounting(path.c_str(), false, &error), nullptr);
  EXPECT_STREQ(error, "accounting file is truncated");
  vgpu::AccountingSnapshot snap;
  EXPECT_FALSE(vgpu::ReadAccounting((path + ".missing").c_str(), &snap, &error));
  EXPECT_STREQ(error, "cannot open accounting file");
  unlink(path.c_str());
  AccountingRegion* r = vgpu::MapAccounting(path.c_str(), true, &error);
  ASSERT_NE(r, nullptr);
  r->version = 99;
  EXPECT_EQ(vgpu::MapAccounting(path.c_str(), true, &error), nullptr);
  EXPECT_STREQ(error, "accounting file has an unsupported layout version");
}

// The agent's reader sees what the writers committed.
TEST(Accounting, ReaderSnapshot) {
  std::string path = TempFile("reader");
  AccountingRegion* r = MapFresh(path, 10 * kMiB);
  ASSERT_NE(r, nullptr);
  r->core_limit.store(30);
  int slot = vgpu::ClaimSlot(*r, SelfOwner());
  ASSERT_TRUE(vgpu::Reserve(*r, slot, SelfOwner(), 3 * kMiB));
  vgpu::AccountingSnapshot s;
  const char* error = nullptr;
  ASSERT_TRUE(vgpu::ReadAccounting(path.c_str(), &s, &error)) << error;
  EXPECT_EQ(s.memory_limit, 10 * kMiB);
  EXPECT_EQ(s.memory_used, 3 * kMiB);
  EXPECT_EQ(s.core_limit, 30u);
  EXPECT_EQ(s.processes, 1u);
}

// --- configuration ------------------------------------------------------------------------------

struct EnvCase {
  const char* name;
  const char* value;
};
const char* Lookup(const std::vector<EnvCase>& env, const char* n) {
  for (auto& e : env)
    if (strcmp(e.name, n) == 0) return e.value;
  return nullptr;
}
thread_local const std::vector<EnvCase>* g_env;
vcuda::Config Parse(const std::vector<EnvCase>& env) {
  g_env = &env;
  return vcuda::ParseConfig(+[](const char* n) { return Lookup(*g_env, n); });
}

// Each malformed variable is reported by name and value, and the library fails closed.
TEST(Config, BadValuesAreNamed) {
  struct Bad {
    std::vector<EnvCase> env;
    const char* mention;
  } cases[] = {
      {{{"GPULET_VGPU_MEMORY_LIMIT", "1.5G"}}, "GPULET_VGPU_MEMORY_LIMIT=\"1.5G\""},
      {{{"GPULET_VGPU_MEMORY_LIMIT", "-1"}}, "GPULET_VGPU_MEMORY_LIMIT"},
      {{{"GPULET_VGPU_MEMORY_LIMIT", "99999999999999999999999"}}, "GPULET_VGPU_MEMORY_LIMIT"},
      {{{"GPULET_VGPU_MEMORY_LIMIT", ""}}, "GPULET_VGPU_MEMORY_LIMIT"},
      {{{"GPULET_VGPU_CORE_LIMIT", "0"}}, "GPULET_VGPU_CORE_LIMIT=\"0\""},
      {{{"GPULET_VGPU_CORE_LIMIT", "101"}}, "GPULET_VGPU_CORE_LIMIT"},
      {{{"GPULET_VGPU_CORE_LIMIT", "50"}, {"GPULET_VGPU_CORE_CEILING", "40"}},
       "GPULET_VGPU_CORE_CEILING=\"40\""},
      {{{"GPULET_VGPU_CONTEXT_BYTES", "lots"}}, "GPULET_VGPU_CONTEXT_BYTES"},
  };
  for (auto& c : cases) {
    vcuda::Config cfg = Parse(c.env);
    EXPECT_TRUE(cfg.invalid) << c.mention;
    EXPECT_NE(std::string(cfg.error).find(c.mention), std::string::npos) << cfg.error;
  }
}

// Good values, the opt-out, and the GPU named by UUID.
TEST(Config, GoodValues) {
  vcuda::Config c = Parse({{"GPULET_VGPU_MEMORY_LIMIT", "1073741824"},
                           {"GPULET_VGPU_CORE_LIMIT", "30"},
                           {"GPULET_VGPU_CORE_CEILING", "60"},
                           {"NVIDIA_VISIBLE_DEVICES", "GPU-face0000-0000-0000-0000-000000000001"}});
  EXPECT_FALSE(c.invalid) << c.error;
  EXPECT_EQ(c.memory_limit, 1073741824u);
  EXPECT_EQ(c.core_limit, 30u);
  EXPECT_EQ(c.core_ceiling, 60u);
  ASSERT_TRUE(c.has_uuid);
  EXPECT_EQ(static_cast<unsigned char>(c.uuid[0]), 0xfa);
  EXPECT_EQ(c.uuid[15], 1);
  EXPECT_TRUE(Parse({{"GPULET_VGPU_DISABLE", "1"}, {"GPULET_VGPU_MEMORY_LIMIT", "x"}}).disabled);
  EXPECT_FALSE(Parse({{"NVIDIA_VISIBLE_DEVICES", "0,1"}}).has_uuid);
  // Through CDI the container's NVIDIA_VISIBLE_DEVICES is the spec's "void": the agent's own
  // variable names the GPU, and wins over whatever NVIDIA_VISIBLE_DEVICES holds.
  vcuda::Config cdi = Parse({{"NVIDIA_VISIBLE_DEVICES", "void"},
                             {"GPULET_VGPU_UUID", "GPU-face0000-0000-0000-0000-000000000002"}});
  ASSERT_TRUE(cdi.has_uuid);
  EXPECT_EQ(cdi.uuid[15], 2);
  EXPECT_EQ(Parse({{"NVIDIA_VISIBLE_DEVICES", "GPU-face0000-0000-0000-0000-000000000001"},
                   {"GPULET_VGPU_UUID", "GPU-face0000-0000-0000-0000-000000000002"}})
                .uuid[15],
            2);
  EXPECT_FALSE(Parse({{"NVIDIA_VISIBLE_DEVICES", "void"}}).has_uuid) << "no GPU named: all limited";
  EXPECT_FALSE(Parse({{"NVIDIA_VISIBLE_DEVICES", "all"}}).has_uuid);
  char u[16];
  EXPECT_FALSE(vcuda::ParseUuid("GPU-1234", u));
  EXPECT_FALSE(vcuda::ParseUuid("GPU-zzzz0000-0000-0000-0000-000000000001", u));
}

// Array sizes: element size x channels x extent, summed over mip levels (computed by hand).
TEST(Core, ArrayBytes) {
  CUDA_ARRAY3D_DESCRIPTOR d{100, 50, 0, CU_AD_FORMAT_FLOAT, 4, 0};
  EXPECT_EQ(vcuda::Core::ArrayBytes(d, 1), 100u * 50 * 16);
  d = {64, 0, 0, CU_AD_FORMAT_HALF, 1, 0};
  EXPECT_EQ(vcuda::Core::ArrayBytes(d, 1), 128u);
  d = {8, 8, 8, CU_AD_FORMAT_UNSIGNED_INT8, 2, 0};  // levels 8^3 + 4^3 + 2^3 + 1, 2 bytes each
  EXPECT_EQ(vcuda::Core::ArrayBytes(d, 4), 2u * (512 + 64 + 8 + 1));
}

// The two-level handle table: far more live handles than its L1-sized first level (so windows
// fill and spill to the big table), from 4 threads at once, each found exactly once with its own
// size, then gone; unknown handles and double frees find nothing; freed entries are reusable.
TEST(Core, HandleTableFindsEveryHandleOnce) {
  vcuda::RealDriver real;
  ASSERT_TRUE(vcuda::ResolveRealDriver(FakeCuda(), FakeCuda(), &dlsym, &real));
  auto region = std::make_unique<AccountingRegion>();
  auto core = std::make_unique<vcuda::Core>();
  core->Init(real, vcuda::Config{}, region.get(), vcuda::RealClockFns());
  constexpr int kThreads = 4, kPer = 3000;  // 12000 live handles vs 1024 first-level entries
  auto handle = [](int t, int i) {
    // Two kinds of address streams: 1 MiB-strided (the fake's, and large real allocations) and
    // 512-byte-strided (sub-allocations): both must spread, neither may collide.
    return t % 2 ? 0x7f0000000000ull + (uint64_t(t) << 32) + uint64_t(i) * kMiB
                 : 0x7e0000000000ull + (uint64_t(t) << 32) + uint64_t(i) * 512;
  };
  auto bytes = [](int t, int i) { return uint64_t(t) * 100000 + uint64_t(i) + 1; };
  auto run = [&](auto&& body) {
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) ts.emplace_back(body, t);
    for (auto& th : ts) th.join();
  };
  for (int round = 0; round < 2; ++round) {  // the second round reuses tombstoned entries
    run([&](int t) {
      for (int i = 0; i < kPer; ++i)
        core->Commit(vcuda::Kind::kPointer, handle(t, i), bytes(t, i), true);
    });
    std::atomic<int> wrong{0};
    run([&](int t) {
      for (int i = kPer - 1; i >= 0; --i) {
        if (core->Take(vcuda::Kind::kPointer, handle(t, i)) != bytes(t, i)) ++wrong;
        if (core->Take(vcuda::Kind::kPointer, handle(t, i)) != 0) ++wrong;  // double free
      }
    });
    EXPECT_EQ(wrong.load(), 0) << "round " << round;
    EXPECT_EQ(core->Take(vcuda::Kind::kArray, handle(0, 0)), 0u) << "another kind, same value";
    EXPECT_EQ(core->Take(vcuda::Kind::kPointer, 0x1234), 0u);
  }
}

// --- the shim library in this process, over the fake driver -------------------------------------

// Loads libgpulet-vcuda.so (RTLD_LOCAL: it interposes nothing here; we call its hooks by
// pointer) configured for a 64 MiB container with 4 MiB per context.
class Shim : public ::testing::Test {
 public:
  static constexpr uint64_t kLimit = 64 * kMiB;
  static constexpr uint64_t kCtx = 4 * kMiB;
  void SetUp() override {
    // The library initialises once per process: every test of this fixture in one process shares
    // its accounting file (and frees what it allocates).
    static const std::string path = [] {
      std::string p = ProcessTempDir() + "/vcuda-shim-" + std::to_string(getpid());
      unlink(p.c_str());
      return p;
    }();
    path_ = path;
    setenv("GPULET_VGPU_REAL_LIBCUDA", FakeCudaPath().c_str(), 1);
    setenv("GPULET_VGPU_ACCOUNTING", path_.c_str(), 1);
    setenv("GPULET_VGPU_MEMORY_LIMIT", std::to_string(kLimit).c_str(), 1);
    setenv("GPULET_VGPU_CONTEXT_BYTES", std::to_string(kCtx).c_str(), 1);
    setenv("FAKE_CUDA_CONTEXT_BYTES", std::to_string(kCtx).c_str(), 1);  // read at first use
    ASSERT_NE(FakeCuda(), nullptr) << dlerror();
    shim_ = dlopen(ShimPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(shim_, nullptr) << dlerror();
    ASSERT_EQ(FakeSym<CUresult (*)(unsigned)>("cuInit")(0), CUDA_SUCCESS);
    ASSERT_EQ(Hook<cuda::cuDevicePrimaryCtxRetain_t>("cuDevicePrimaryCtxRetain")(&ctx_, 0),
              CUDA_SUCCESS);
    FakeSym<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx_);
    const char* e = nullptr;
    region_ = vgpu::MapAccounting(path_.c_str(), false, &e);
    ASSERT_NE(region_, nullptr) << e;
  }
  template <class T>
  T Hook(const char* name) {
    return reinterpret_cast<T>(dlsym(shim_, name));
  }
  uint64_t Used() { return vgpu::UsedBytes(*region_); }
  uint64_t FakeAllocated() { return FakeSym<uint64_t (*)()>("fakecuda_allocated_bytes")(); }

  std::string path_;
  void* shim_ = nullptr;
  CUcontext ctx_ = nullptr;
  AccountingRegion* region_ = nullptr;
};

// The primary context is charged once, on the first retain, at what NVML says the process holds
// (the fake's context: kCtx), which is learned as the container's per-context estimate.
TEST_F(Shim, PrimaryContextIsCounted) {
  EXPECT_EQ(Used(), kCtx);
  EXPECT_EQ(region_->context_bytes.load(), kCtx) << "the context was not measured";
  CUcontext again;
  ASSERT_EQ(Hook<cuda::cuDevicePrimaryCtxRetain_t>("cuDevicePrimaryCtxRetain")(&again, 0), 0);
  EXPECT_EQ(Used(), kCtx);
  ASSERT_EQ(Hook<cuda::cuDevicePrimaryCtxRelease_t>("cuDevicePrimaryCtxRelease_v2")(0), 0);
  EXPECT_EQ(Used(), kCtx);
}

// One allocation path: allocate, the charge, past-the-limit refusal, free.
struct Path {
  const char* name;
  // Allocates `bytes` (nominal) and returns the handle; *charged = what the container pays.
  std::function<CUresult(Shim*, uint64_t bytes, CUdeviceptr* handle, uint64_t* charged)> alloc;
  std::function<CUresult(Shim*, uint64_t handle)> free;
};

void PrintTo(const Path& p, std::ostream* os) { *os << p.name; }

class AllocPath : public Shim, public ::testing::WithParamInterface<Path> {};

// Every allocation path is counted exactly, refused past the limit without reaching the driver,
// and returned on free.
TEST_P(AllocPath, CountedRefusedAndReturned) {
  const Path& p = GetParam();
  uint64_t base = Used(), fake_base = FakeAllocated();
  CUdeviceptr h = 0;
  uint64_t charged = 0;
  ASSERT_EQ(p.alloc(this, 8 * kMiB, &h, &charged), CUDA_SUCCESS);
  EXPECT_GT(charged, 0u);
  EXPECT_EQ(Used(), base + charged);
  EXPECT_EQ(FakeAllocated(), fake_base + charged) << "charge differs from the driver's truth";
  CUdeviceptr h2 = 0;
  uint64_t c2 = 0;
  EXPECT_EQ(p.alloc(this, kLimit, &h2, &c2), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(Used(), base + charged);
  EXPECT_EQ(FakeAllocated(), fake_base + charged) << "the refused allocation reached the driver";
  ASSERT_EQ(p.free(this, h), CUDA_SUCCESS);
  EXPECT_EQ(Used(), base);
  EXPECT_EQ(FakeAllocated(), fake_base);
}

std::vector<Path> Paths() {
  using S = Shim;
  // Pointer allocations free with cuMemFree_v2 unless said otherwise.
  auto ptr_free = [](S* s, uint64_t h) { return s->Hook<cuda::cuMemFree_t>("cuMemFree_v2")(h); };
  auto async_free = [](S* s, uint64_t h) {
    return s->Hook<cuda::cuMemFreeAsync_t>("cuMemFreeAsync")(h, nullptr);
  };
  auto array_free = [](S* s, uint64_t h) {
    return s->Hook<cuda::cuArrayDestroy_t>("cuArrayDestroy")(reinterpret_cast<CUarray>(h));
  };
  // A 2D float4 array of `bytes`: width x 1024 rows x 16 bytes.
  auto array_desc = [](uint64_t bytes) {
    return CUDA_ARRAY_DESCRIPTOR{bytes / 16 / 1024, 1024, CU_AD_FORMAT_FLOAT, 4};
  };
  return {
      {"cuMemAlloc_v2",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         return s->Hook<cuda::cuMemAlloc_t>("cuMemAlloc_v2")(h, b);
       },
       ptr_free},
      {"cuMemAlloc",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         CUdeviceptr_v1 p = 0;
         CUresult r = s->Hook<cuda::cuMemAlloc_v1_t>("cuMemAlloc")(&p, static_cast<unsigned>(b));
         *h = p;
         return r;
       },
       [](S* s, uint64_t h) {
         return s->Hook<cuda::cuMemFree_v1_t>("cuMemFree")(static_cast<CUdeviceptr_v1>(h));
       }},
      {"cuMemAllocPitch_v2",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         size_t pitch = 0;
         size_t width = 1000, height = b / 1000;  // the driver rounds 1000 up to 1024
         CUresult r =
             s->Hook<cuda::cuMemAllocPitch_t>("cuMemAllocPitch_v2")(h, &pitch, width, height, 4);
         *c = r == CUDA_SUCCESS ? pitch * height : 0;
         return r;
       },
       ptr_free},
      {"cuMemAllocPitch",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         unsigned pitch = 0, width = 1024, height = static_cast<unsigned>(b / 1024);
         CUdeviceptr_v1 p = 0;
         CUresult r =
             s->Hook<cuda::cuMemAllocPitch_v1_t>("cuMemAllocPitch")(&p, &pitch, width, height, 4);
         *h = p;
         *c = uint64_t{width} * height;
         return r;
       },
       [](S* s, uint64_t h) {
         return s->Hook<cuda::cuMemFree_v1_t>("cuMemFree")(static_cast<CUdeviceptr_v1>(h));
       }},
      {"cuMemAllocManaged",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         return s->Hook<cuda::cuMemAllocManaged_t>("cuMemAllocManaged")(h, b, 1);
       },
       ptr_free},
      {"cuMemAllocAsync",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         return s->Hook<cuda::cuMemAllocAsync_t>("cuMemAllocAsync")(h, b, nullptr);
       },
       async_free},
      {"cuMemAllocAsync_ptsz",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         return s->Hook<cuda::cuMemAllocAsync_t>("cuMemAllocAsync_ptsz")(h, b, nullptr);
       },
       [](S* s, uint64_t h) {
         return s->Hook<cuda::cuMemFreeAsync_t>("cuMemFreeAsync_ptsz")(h, nullptr);
       }},
      {"cuMemAllocFromPoolAsync",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         return s->Hook<cuda::cuMemAllocFromPoolAsync_t>("cuMemAllocFromPoolAsync")(h, b, nullptr,
                                                                                    nullptr);
       },
       async_free},
      {"cuMemAllocFromPoolAsync_ptsz",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         return s->Hook<cuda::cuMemAllocFromPoolAsync_t>("cuMemAllocFromPoolAsync_ptsz")(
             h, b, nullptr, nullptr);
       },
       async_free},
      {"cuMemCreate",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = b;
         CUmemAllocationProp prop{};
         prop.type = 1;
         prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
         return s->Hook<cuda::cuMemCreate_t>("cuMemCreate")(h, b, &prop, 0);
       },
       [](S* s, uint64_t h) { return s->Hook<cuda::cuMemRelease_t>("cuMemRelease")(h); }},
      {"cuArrayCreate_v2",
       [array_desc](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         CUDA_ARRAY_DESCRIPTOR d = array_desc(b);
         *c = d.Width * d.Height * 16;
         CUarray a = nullptr;
         CUresult r = s->Hook<cuda::cuArrayCreate_t>("cuArrayCreate_v2")(&a, &d);
         *h = reinterpret_cast<uint64_t>(a);
         return r;
       },
       array_free},
      {"cuArrayCreate",
       [array_desc](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         CUDA_ARRAY_DESCRIPTOR d = array_desc(b);
         CUDA_ARRAY_DESCRIPTOR_v1 d1{static_cast<unsigned>(d.Width), 1024, CU_AD_FORMAT_FLOAT, 4};
         *c = d.Width * d.Height * 16;
         CUarray a = nullptr;
         CUresult r = s->Hook<cuda::cuArrayCreate_v1_t>("cuArrayCreate")(&a, &d1);
         *h = reinterpret_cast<uint64_t>(a);
         return r;
       },
       array_free},
      {"cuArray3DCreate_v2",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         CUDA_ARRAY3D_DESCRIPTOR d{b / 2 / 64 / 64, 64, 64, CU_AD_FORMAT_HALF, 1, 0};
         *c = d.Width * 64 * 64 * 2;
         CUarray a = nullptr;
         CUresult r = s->Hook<cuda::cuArray3DCreate_t>("cuArray3DCreate_v2")(&a, &d);
         *h = reinterpret_cast<uint64_t>(a);
         return r;
       },
       array_free},
      {"cuArray3DCreate",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         CUDA_ARRAY3D_DESCRIPTOR_v1 d{static_cast<unsigned>(b / 64 / 64), 64, 64,
                                      CU_AD_FORMAT_UNSIGNED_INT8,         1,  0};
         *c = uint64_t{d.Width} * 64 * 64;
         CUarray a = nullptr;
         CUresult r = s->Hook<cuda::cuArray3DCreate_v1_t>("cuArray3DCreate")(&a, &d);
         *h = reinterpret_cast<uint64_t>(a);
         return r;
       },
       array_free},
      {"cuMipmappedArrayCreate",
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         // Square 2D RGBA8 levels: w^2 + (w/2)^2 = 1.25 w^2 texels of 4 bytes.
         size_t w = static_cast<size_t>(std::sqrt(static_cast<double>(b) / 5.0));
         w &= ~size_t{1};
         CUDA_ARRAY3D_DESCRIPTOR d{w, w, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
         *c = 4 * (w * w + (w / 2) * (w / 2));
         CUmipmappedArray m = nullptr;
         CUresult r = s->Hook<cuda::cuMipmappedArrayCreate_t>("cuMipmappedArrayCreate")(&m, &d, 2);
         *h = reinterpret_cast<uint64_t>(m);
         return r;
       },
       [](S* s, uint64_t h) {
         return s->Hook<cuda::cuMipmappedArrayDestroy_t>("cuMipmappedArrayDestroy")(
             reinterpret_cast<CUmipmappedArray>(h));
       }},
      {"cuCtxCreate_v4",  // a context is charged GPULET_VGPU_CONTEXT_BYTES
       [](S* s, uint64_t b, CUdeviceptr* h, uint64_t* c) {
         *c = S::kCtx;
         if (b >= S::kLimit) {  // fill up first so that the context itself no longer fits
           CUdeviceptr p;
           s->Hook<cuda::cuMemAlloc_t>("cuMemAlloc_v2")(&p, S::kLimit - s->Used() - S::kCtx / 2);
           CUcontext ctx = nullptr;
           CUresult r = s->Hook<cuda::cuCtxCreate_v4_t>("cuCtxCreate_v4")(&ctx, nullptr, 0, 0);
           s->Hook<cuda::cuMemFree_t>("cuMemFree_v2")(p);
           return r;
         }
         CUcontext ctx = nullptr;
         CUresult r = s->Hook<cuda::cuCtxCreate_v4_t>("cuCtxCreate_v4")(&ctx, nullptr, 0, 0);
         *h = reinterpret_cast<uint64_t>(ctx);
         FakeSym<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(s->ctx_);
         return r;
       },
       [](S* s, uint64_t h) {
         return s->Hook<cuda::cuCtxDestroy_t>("cuCtxDestroy_v2")(reinterpret_cast<CUcontext>(h));
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(EveryPath, AllocPath, ::testing::ValuesIn(Paths()),
                         [](const auto& info) { return std::string(info.param.name); });

// Host-located VMM memory is not device memory: not charged.
TEST_F(Shim, HostVmmIsNotCharged) {
  CUmemAllocationProp prop{};
  prop.location = {2 /* host */, 0};
  CUmemGenericAllocationHandle h;
  uint64_t base = Used();
  ASSERT_EQ(Hook<cuda::cuMemCreate_t>("cuMemCreate")(&h, kLimit * 2, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(Used(), base);
  EXPECT_EQ(Hook<cuda::cuMemRelease_t>("cuMemRelease")(h), CUDA_SUCCESS);
}

// What a program that dlopens libcuda.so.1 gets for an entry point (the interposer's dlsym on
// the driver's handle): our hook where we wrap it, else the driver's own.
template <class T>
T Resolved(Shim* s, const char* name) {
  return reinterpret_cast<T>(s->Hook<void* (*)(void*, const char*)>("dlsym")(FakeCuda(), name));
}

// With the VMM API the memory stays allocated while it is mapped: NVIDIA's VMM samples and
// Paddle's allocator call cuMemRelease right after cuMemMap. The charge is held until the
// handle is both released and unmapped everywhere (here: mapped twice), as the driver holds the
// memory (before: refunded at cuMemRelease, while the device still held it).
TEST_F(Shim, VmmChargeHeldWhileMapped) {
  auto create = Resolved<cuda::cuMemCreate_t>(this, "cuMemCreate");
  auto release = Resolved<cuda::cuMemRelease_t>(this, "cuMemRelease");
  auto map = Resolved<cuda::cuMemMap_t>(this, "cuMemMap");
  auto unmap = Resolved<cuda::cuMemUnmap_t>(this, "cuMemUnmap");
  using AddressReserve =
      CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  auto va_reserve = FakeSym<AddressReserve>("cuMemAddressReserve");
  ASSERT_TRUE(create && release && map && unmap && va_reserve);
  const uint64_t base = Used(), fake_base = FakeAllocated(), size = 16 * kMiB;
  CUmemAllocationProp prop{};
  prop.type = 1;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  ASSERT_EQ(create(&h, size, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(va_reserve(&va, 2 * size, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(map(va, size, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(map(va + size, size, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(release(h), CUDA_SUCCESS);  // the samples' idiom: released at once, used while mapped
  EXPECT_EQ(FakeAllocated(), fake_base + size) << "the driver frees it only when unmapped";
  EXPECT_EQ(Used(), base + size) << "refunded while the device still holds it";
  CUdeviceptr p;  // and the charge counts against the limit
  CUresult r = Hook<cuda::cuMemAlloc_t>("cuMemAlloc_v2")(&p, kLimit - base - size / 2);
  if (r == CUDA_SUCCESS) Hook<cuda::cuMemFree_t>("cuMemFree_v2")(p);
  EXPECT_EQ(r, CUDA_ERROR_OUT_OF_MEMORY) << "the mapped memory did not count against the limit";
  ASSERT_EQ(unmap(va, size), CUDA_SUCCESS);
  EXPECT_EQ(Used(), base + size) << "still mapped once";
  ASSERT_EQ(unmap(va + size, size), CUDA_SUCCESS);
  EXPECT_EQ(Used(), base);
  EXPECT_EQ(FakeAllocated(), fake_base);
  // Unmapped first, released after: the charge goes at the release. One cuMemUnmap over two
  // adjacent mappings unmaps both.
  ASSERT_EQ(create(&h, size, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(map(va, size, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(map(va + size, size, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(unmap(va, 2 * size), CUDA_SUCCESS);
  EXPECT_EQ(Used(), base + size) << "unmapped but not released: still allocated";
  ASSERT_EQ(release(h), CUDA_SUCCESS);
  EXPECT_EQ(Used(), base);
  EXPECT_EQ(FakeAllocated(), fake_base);
}

// The legacy launches (cuLaunch, cuLaunchGrid, cuLaunchGridAsync) are wrapped like
// cuLaunchKernel, through dlsym and cuGetProcAddress alike, so that a core limit paces them too
// (their pacing on the clock: E2E.LegacyLaunchesArePaced). Before: the driver's own, unpaced.
TEST_F(Shim, LegacyLaunchesAreHooked) {
  auto gpa = Hook<cuda::cuGetProcAddress_v2_t>("cuGetProcAddress_v2");
  for (const char* name : {"cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync"}) {
    void* hook = dlsym(shim_, name);
    EXPECT_NE(hook, nullptr) << name << " is not hooked";
    EXPECT_EQ(Resolved<void*>(this, name), hook) << name;
    void* fn = nullptr;
    ASSERT_EQ(gpa(name, &fn, 2000, 0, nullptr), CUDA_SUCCESS) << name;
    EXPECT_EQ(fn, hook) << name;
  }
  CUfunction f;
  FakeSym<CUresult (*)(CUfunction*, CUmodule, const char*)>("cuModuleGetFunction")(&f, nullptr,
                                                                                   "k");
  int64_t before = FakeSym<int64_t (*)(int64_t, int64_t)>("fakecuda_busy_between")(0, INT64_MAX);
  EXPECT_EQ(Resolved<cuda::cuLaunch_t>(this, "cuLaunch")(f), CUDA_SUCCESS);
  EXPECT_EQ(Resolved<cuda::cuLaunchGrid_t>(this, "cuLaunchGrid")(f, 2, 1), CUDA_SUCCESS);
  EXPECT_EQ(Resolved<cuda::cuLaunchGridAsync_t>(this, "cuLaunchGridAsync")(f, 3, 1, nullptr),
            CUDA_SUCCESS);
  FakeSym<CUresult (*)()>("cuCtxSynchronize")();
  // 1 + 2 + 3 blocks of 1 us ran on the device (unpaced here: this fixture has no core limit).
  EXPECT_EQ(FakeSym<int64_t (*)(int64_t, int64_t)>("fakecuda_busy_between")(0, INT64_MAX) - before,
            6000);
}

// cuMemGetInfo, cuDeviceTotalMem and NVML show the container's limit, not the card.
TEST_F(Shim, ReportsShowTheLimit) {
  CUdeviceptr p;
  ASSERT_EQ(Hook<cuda::cuMemAlloc_t>("cuMemAlloc_v2")(&p, 10 * kMiB), CUDA_SUCCESS);
  size_t free_b = 0, total = 0;
  ASSERT_EQ(Hook<cuda::cuMemGetInfo_t>("cuMemGetInfo_v2")(&free_b, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, kLimit);
  EXPECT_EQ(free_b, kLimit - kCtx - 10 * kMiB);
  unsigned f32 = 0, t32 = 0;
  ASSERT_EQ(Hook<cuda::cuMemGetInfo_v1_t>("cuMemGetInfo")(&f32, &t32), CUDA_SUCCESS);
  EXPECT_EQ(t32, kLimit);
  ASSERT_EQ(Hook<cuda::cuDeviceTotalMem_t>("cuDeviceTotalMem_v2")(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, kLimit);
  nvmlDevice_t dev;
  ASSERT_EQ(
      FakeSym<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>("nvmlDeviceGetHandleByIndex_v2")(0, &dev),
      0);
  nvmlMemory_t m{};
  ASSERT_EQ(Hook<cuda::nvmlDeviceGetMemoryInfo_t>("nvmlDeviceGetMemoryInfo")(dev, &m), 0);
  EXPECT_EQ(m.total, kLimit);
  EXPECT_EQ(m.used, kCtx + 10 * kMiB);
  EXPECT_EQ(m.free, kLimit - kCtx - 10 * kMiB);
  nvmlMemory_v2_t m2{};
  m2.version = nvmlMemory_v2;
  ASSERT_EQ(Hook<cuda::nvmlDeviceGetMemoryInfo_v2_t>("nvmlDeviceGetMemoryInfo_v2")(dev, &m2), 0);
  EXPECT_EQ(m2.total, kLimit);
  EXPECT_EQ(m2.used, kCtx + 10 * kMiB);
  Hook<cuda::cuMemFree_t>("cuMemFree_v2")(p);
}

// The limit comes from the process's own environment: writing the container-writable file
// (memory_limit = 0, "unlimited") does not lift it; a lower value there does lower it.
TEST_F(Shim, AccountingFileCannotLiftTheLimit) {
  const char* e = nullptr;
  AccountingRegion* rw = vgpu::MapAccounting(path_.c_str(), true, &e);
  ASSERT_NE(rw, nullptr) << e;
  uint64_t saved = rw->memory_limit.load();
  rw->memory_limit.store(0);
  CUdeviceptr p;
  auto alloc = Hook<cuda::cuMemAlloc_t>("cuMemAlloc_v2");
  EXPECT_EQ(alloc(&p, kLimit), CUDA_ERROR_OUT_OF_MEMORY) << "file value 0 lifted the limit";
  rw->memory_limit.store(kLimit * 4);
  EXPECT_EQ(alloc(&p, kLimit), CUDA_ERROR_OUT_OF_MEMORY) << "file value raised the limit";
  rw->memory_limit.store(kCtx + 8 * kMiB);
  EXPECT_EQ(alloc(&p, 16 * kMiB), CUDA_ERROR_OUT_OF_MEMORY) << "a lower file value is honoured";
  rw->memory_limit.store(saved);
  ASSERT_EQ(alloc(&p, 16 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(Hook<cuda::cuMemFree_t>("cuMemFree_v2")(p), CUDA_SUCCESS);
  munmap(rw, sizeof(AccountingRegion));
}

// cuGetProcAddress(_v2) lets the driver pick the version and stream flavour, then hands back
// our hook for hooked entry points and the driver's own for the rest.
TEST_F(Shim, GetProcAddressMapsToHooks) {
  auto gpa = Hook<cuda::cuGetProcAddress_v2_t>("cuGetProcAddress_v2");
  struct Case {
    const char* symbol;
    int version;
    cuuint64_t flags;
    void* want;
  } cases[] = {
      {"cuMemAlloc", 3020, 0, dlsym(shim_, "cuMemAlloc_v2")},
      {"cuMemAlloc", 2000, 0, dlsym(shim_, "cuMemAlloc")},
      {"cuLaunchKernel", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       dlsym(shim_, "cuLaunchKernel_ptsz")},
      {"cuLaunchKernel", 4000, 0, dlsym(shim_, "cuLaunchKernel")},
      {"cuGetProcAddress", 12000, 0, dlsym(shim_, "cuGetProcAddress_v2")},
      {"cuCtxCreate", 12050, 0, dlsym(shim_, "cuCtxCreate_v4")},
      {"cuCtxSetCurrent", 4000, 0, dlsym(FakeCuda(), "cuCtxSetCurrent")},
      {"cuMemGetInfo", 3020, 0, dlsym(shim_, "cuMemGetInfo_v2")},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = -1;
    ASSERT_EQ(gpa(c.symbol, &fn, c.version, c.flags, &st), CUDA_SUCCESS) << c.symbol;
    EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_EQ(fn, c.want) << c.symbol << ":" << c.version;
  }
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult st = -1;
  EXPECT_EQ(gpa("cuNoSuchThing", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  auto gpa1 = Hook<cuda::cuGetProcAddress_t>("cuGetProcAddress");
  ASSERT_EQ(gpa1("cuMemFree", &fn, 3020, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, dlsym(shim_, "cuMemFree_v2"));
}

// dlsym on the driver's handle returns hooks for hooked names, the driver's symbol otherwise,
// and null for names the handle does not define.
TEST_F(Shim, DlsymReturnsHooks) {
  auto hooked_dlsym = Hook<void* (*)(void*, const char*)>("dlsym");
  ASSERT_NE(hooked_dlsym, nullptr);
  EXPECT_EQ(hooked_dlsym(FakeCuda(), "cuMemAlloc_v2"), dlsym(shim_, "cuMemAlloc_v2"));
  EXPECT_EQ(hooked_dlsym(FakeCuda(), "cuGetProcAddress_v2"), dlsym(shim_, "cuGetProcAddress_v2"));
  EXPECT_EQ(hooked_dlsym(FakeCuda(), "cuCtxSetCurrent"), dlsym(FakeCuda(), "cuCtxSetCurrent"));
  EXPECT_EQ(hooked_dlsym(FakeCuda(), "cuNoSuchThing"), nullptr);
  EXPECT_EQ(hooked_dlsym(RTLD_DEFAULT, "strlen"), dlsym(RTLD_DEFAULT, "strlen"));
}

// Without a core limit launches pass straight through (and still run on the device).
TEST_F(Shim, UnthrottledLaunchPassesThrough) {
  CUfunction f;
  FakeSym<CUresult (*)(CUfunction*, CUmodule, const char*)>("cuModuleGetFunction")(&f, nullptr,
                                                                                   "k");
  auto launch = Hook<cuda::cuLaunchKernel_t>("cuLaunchKernel");
  for (int i = 0; i < 10; ++i)
    ASSERT_EQ(launch(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(region_->launches.load(), 0u);  // not even counted: the pacer is off
  EXPECT_GT(FakeSym<int64_t (*)(int64_t, int64_t)>("fakecuda_busy_between")(0, INT64_MAX), 0);
}

// --- compute pacer on virtual time ---------------------------------------------------------------

class Pacing : public ::testing::TestWithParam<uint32_t> {};

// For shares 10/30/50/90 the GPU-time share of every 10 s window is within +-5 points, and of
// every 1 s window too (no oscillation), over 30 simulated seconds.
TEST_P(Pacing, TracksShareWithoutOscillation) {
  uint32_t share = GetParam();
  auto region = std::make_unique<AccountingRegion>();
  std::vector<double> tens = RunGreedy(share, share, 30'000'000'000, 10'000'000'000, region.get());
  ASSERT_EQ(tens.size(), 3u);
  for (double s : tens) EXPECT_NEAR(s, share, 5.0);
  // Same run length again, judged in 1 s windows.
  auto region2 = std::make_unique<AccountingRegion>();
  std::vector<double> ones = RunGreedy(share, share, 10'000'000'000, 1'000'000'000, region2.get());
  double lo = 100, hi = 0;
  for (double s : ones) lo = std::min(lo, s), hi = std::max(hi, s);
  EXPECT_NEAR(lo, share, 5.0);
  EXPECT_NEAR(hi, share, 5.0);
  EXPECT_LT(hi - lo, 2.0) << "share swings between windows";
  EXPECT_GT(region->throttled_ns.load(), 0u);
  EXPECT_GT(region->busy_ns.load(), 0u);
}
INSTANTIATE_TEST_SUITE_P(Shares, Pacing, ::testing::Values(10u, 30u, 50u, 90u));

// A share is a floor, not only a cap (issue 20.2): next to a neighbour that keeps half the GPU
// busy, a 30 % container still gets >= 25 % (the time its work waited behind the neighbour is
// not charged: NVML's per-process utilisation says what was its own), and with a ceiling of 60 it
// borrows what is left idle, up to 100 - 50 - 5 points of headroom, never more than its ceiling.
// Before: 19.3-19.5 % for both.
TEST(PacingFloor, ShareHoldsNextToABusyNeighbour) {
  auto hard = std::make_unique<AccountingRegion>();
  for (double v : RunGreedy(30, 30, 10'000'000'000, 5'000'000'000, hard.get(),
                            /*warmup_ns=*/3'000'000'000, /*neighbour_percent=*/50)) {
    EXPECT_GE(v, 25.0);
    EXPECT_LE(v, 35.0);
  }
  auto soft = std::make_unique<AccountingRegion>();
  for (double v : RunGreedy(30, 60, 10'000'000'000, 5'000'000'000, soft.get(),
                            /*warmup_ns=*/3'000'000'000, /*neighbour_percent=*/50)) {
    EXPECT_GE(v, 25.0);
    EXPECT_LE(v, 50.0);
  }
}

// The fake GPU time-slices between contexts as a real one does without MPS: a context whose
// neighbour queued a long batch first still gets half the device while both have work (the fake
// used to serve the device first-come-first-served, leaving it nothing until the batch ended).
TEST(FakeGpu, TimeSlicesBetweenContexts) {
  std::vector<double> s = RunTenants({{100, 100, 1000}, {100, 100, 1000}}, 2'000'000'000, 0);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NEAR(s[0], 50.0, 2.0);
  EXPECT_NEAR(s[1], 50.0, 2.0);
  // A neighbour's 500 ms batch queued ahead: this context's next 1 ms kernel does not wait for it.
  auto region = std::make_unique<AccountingRegion>();
  VirtualGpu gpu(100, 100, region.get());
  ASSERT_TRUE(gpu.ok);
  FakeSym<void (*)(int, int64_t)>("fakecuda_foreign_work")(0, 500'000'000);
  int64_t t0 = VirtualNow();
  gpu.Launch(1000);
  gpu.sync(gpu.stream);
  EXPECT_LE(VirtualNow() - t0, 4'000'000) << "waited behind the neighbour's batch";
  EXPECT_GE(VirtualNow() - t0, 1'000'000);
  FakeSym<void (*)(int)>("fakecuda_drop_foreign_work")(0);  // not the next test's neighbour
}

struct FloorCase {
  std::vector<uint32_t> shares;
};
void PrintTo(const FloorCase& c, std::ostream* os) {
  for (uint32_t s : c.shares) *os << s << "/";
}
class PacingFloors : public ::testing::TestWithParam<FloorCase> {};

// Issue 20.2: where the shares on a GPU add up to at most 100 %, each is a floor: greedy
// containers, every one paced by its own interposer, each get their share (10 s after 3 s of
// warm-up). Waiting in the device's time slices behind the others is not charged. The issue's
// target is +-5 points; held here to +-3 so that inexact charging shows: with the factor alone
// (no true-up, idle credit counted from completion) 30/30/40 got 26.2/26.4/36.6 and 30/70
// 27.7/68.7. On the first-come-first-served fake, 30 beside 70 got 25-26 % and 10 beside 90 0.02 %.
TEST_P(PacingFloors, EachShareHoldsBesideBusyNeighbours) {
  std::vector<TenantSpec> specs;
  for (uint32_t s : GetParam().shares) specs.push_back({s, s});
  std::vector<double> got = RunTenants(specs, 10'000'000'000, 3'000'000'000);
  ASSERT_EQ(got.size(), specs.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_GE(got[i], specs[i].limit - 3.0)
        << "tenant " << i << " of " << ::testing::PrintToString(GetParam());
    EXPECT_LE(got[i], specs[i].limit + 3.0) << "tenant " << i;
    RecordProperty(std::string("share_") + std::to_string(i), std::to_string(got[i]));
    printf("share %u: %.2f %%\n", specs[i].limit, got[i]);
  }
}
INSTANTIATE_TEST_SUITE_P(Mixes, PacingFloors,
                         ::testing::Values(FloorCase{{10, 90}}, FloorCase{{30, 50}},
                                           FloorCase{{30, 70}}, FloorCase{{30, 30, 40}}),
                         [](const auto& info) {
                           std::string n = "shares";
                           for (uint32_t s : info.param.shares) n += "_" + std::to_string(s);
                           return n;
                         });

// Work that barely uses the GPU is not slowed below its share: empty kernels (1 us of GPU each,
// 4 us of host time to launch) under a 50 % limit cost what they cost unpaced, within 25 %.
// Pacing charges the GPU time they used, not the launch: before, the start event of an idle
// stream counted the launch call as GPU time and two event records per launch added 2 us, so
// each launch took ~2.5x as long (the H200 measured 11.5-12 us instead of ~4 us).
TEST(PacingLaunches, EmptyKernelsAreNotSlowedBelowTheirShare) {
  auto r1 = std::make_unique<AccountingRegion>(), r2 = std::make_unique<AccountingRegion>();
  LoopResult free_run = RunLaunchLoop(100, 1, 0, 20000, 0, r1.get());
  LoopResult paced = RunLaunchLoop(50, 1, 0, 20000, 0, r2.get());
  ASSERT_GT(free_run.ns_per_launch, 0);
  EXPECT_LT(paced.ns_per_launch, 1.25 * free_run.ns_per_launch)
      << "unpaced " << free_run.ns_per_launch << " ns, paced " << paced.ns_per_launch << " ns";
  EXPECT_LT(paced.gpu_share, 50.0);
}

// On a real GPU an empty kernel sent to an idle stream still spends ~2-3 us on the GPU's
// timeline between its start and end events (the front end, no SM work). Charged as GPU time, a
// loop of empty kernels looked > 50 % busy and was paced (H200: 7.1 us per launch instead of
// 3.8 us at a 50 % limit). The fake models that front-end time (2.5 us before a 1 us kernel, 2.5 us
// of host work per launch so that each reaches an idle stream: 3.5 us start-to-end of 6.75 us per
// launch, a 15 % SM share); under a 30 % limit it was paced to 11.7 us per launch before the fix.
TEST(PacingLaunches, GpuFrontEndTimeIsNotCharged) {
  auto r1 = std::make_unique<AccountingRegion>(), r2 = std::make_unique<AccountingRegion>();
  LoopResult free_run = RunLaunchLoop(100, 1, 2500, 20000, 0, r1.get(), /*gpu_launch_ns=*/2500);
  LoopResult paced = RunLaunchLoop(30, 1, 2500, 20000, 0, r2.get(), /*gpu_launch_ns=*/2500);
  ASSERT_GT(free_run.ns_per_launch, 0);
  EXPECT_LT(paced.ns_per_launch, 1.5 * free_run.ns_per_launch)
      << "unpaced " << free_run.ns_per_launch << " ns, paced " << paced.ns_per_launch << " ns";
  EXPECT_LT(paced.gpu_share, 30.0);
  RecordProperty("ns_per_launch", std::to_string(paced.ns_per_launch));
  RecordProperty("unpaced_ns_per_launch", std::to_string(free_run.ns_per_launch));
}

// The front-end allowance is not a discount on real work: 20 us and 1 ms kernels (as in the
// GPU check's `vcuda_probe busy`) on a GPU with that front-end time keep 27-33 % at a 30 % limit,
// also when the process ran empty kernels first (which calibrate the allowance).
TEST(PacingLaunches, FrontEndAllowanceKeepsBusyKernelsAtTheirShare) {
  for (unsigned blocks : {20u, 1000u}) {
    auto region = std::make_unique<AccountingRegion>();
    VirtualGpu gpu(30, 30, region.get());
    ASSERT_TRUE(gpu.ok);
    FakeSym<void (*)(int64_t, int64_t)>("fakecuda_set_host_costs")(4000, 1000);
    FakeSym<void (*)(int64_t)>("fakecuda_set_gpu_launch_cost")(2500);
    for (int i = 0; i < 2000; ++i) gpu.Launch(1);  // empty kernels: the allowance is learnt
    gpu.sync(gpu.stream);
    int64_t start = VirtualNow() + 200'000'000, end = start + 2'000'000'000;
    while (VirtualNow() < end) {
      gpu.Launch(blocks);
      gpu.sync(gpu.stream);
    }
    double share = VirtualGpu::Shares(start, end, end - start)[0];
    EXPECT_GE(share, 27.0) << blocks << " us kernels";
    EXPECT_LE(share, 33.0) << blocks << " us kernels";
    RecordProperty("share_" + std::to_string(blocks) + "us", std::to_string(share));
  }
}

struct MixCase {
  uint32_t limit;
  unsigned blocks;  // kernel length, us
  int64_t host_ns;  // the program's own host work per launch
  int sync_every;
};
void PrintTo(const MixCase& c, std::ostream* os) {
  *os << c.limit << "% " << c.blocks << "us kernels " << c.host_ns << "ns host sync/"
      << c.sync_every;
}
class PacingMix : public ::testing::TestWithParam<MixCase> {};

// Kernels long and short, GPU-bound and host-bound, get their configured share of GPU time
// within +-3 points (issue 24.4: 27-33 % at a 30 % limit), or what they use when that is less.
TEST_P(PacingMix, ShareOfGpuTimeIsTheLimit) {
  const MixCase& c = GetParam();
  auto r1 = std::make_unique<AccountingRegion>(), r2 = std::make_unique<AccountingRegion>();
  int launches = static_cast<int>(20'000'000'000 / (c.blocks * 1000 + c.host_ns + 4000));
  LoopResult free_run = RunLaunchLoop(100, c.blocks, c.host_ns, launches, c.sync_every, r1.get());
  LoopResult paced = RunLaunchLoop(c.limit, c.blocks, c.host_ns, launches, c.sync_every, r2.get());
  double want = std::min<double>(c.limit, free_run.gpu_share);
  EXPECT_NEAR(paced.gpu_share, want, 3.0) << "unpaced share " << free_run.gpu_share;
  RecordProperty("achieved_share", std::to_string(paced.gpu_share));
}
INSTANTIATE_TEST_SUITE_P(
    Mixes, PacingMix,
    ::testing::Values(MixCase{30, 2000, 0, 2},    // 2 ms kernels, GPU-bound (8192^3-like)
                      MixCase{30, 16, 0, 0},      // 16 us kernels queued back to back
                      MixCase{30, 16, 10000, 0},  // 16 us kernels, 14 us host per launch
                      MixCase{30, 8, 10000, 0},   // host-bound: the GPU is busy ~40 %
                      MixCase{50, 3, 2000, 64},   // short kernels, periodic syncs
                      MixCase{10, 100, 0, 4}),
    [](const auto& info) {
      const MixCase& c = info.param;
      return "limit" + std::to_string(c.limit) + "_kernel" + std::to_string(c.blocks) + "us_host" +
             std::to_string(c.host_ns / 1000) + "us_sync" + std::to_string(c.sync_every);
    });

// Issue 24.4 as a rate: GPU-bound programs at a 30 % limit run at 27-33 % of their unlimited
// rate, with large kernels (2 ms, synced in pairs, as 8192^3 matmuls) and small ones (16 us,
// queued back to back). (A host-bound program keeps its share of GPU *time*, which is more of its
// rate: see docs/interposer.md. The clock a real GPU gains when it is less busy is not modelled.)
TEST(PacingRate, GpuBoundKernelsRunAtTheirShareOfTheUnlimitedRate) {
  struct Case {
    unsigned blocks;
    int sync_every;
  };
  for (Case c : {Case{2000, 2}, Case{16, 0}}) {
    auto r1 = std::make_unique<AccountingRegion>(), r2 = std::make_unique<AccountingRegion>();
    int launches = static_cast<int>(10'000'000'000 / (c.blocks * 1000 + 4000));
    LoopResult free_run = RunLaunchLoop(100, c.blocks, 0, launches, c.sync_every, r1.get());
    LoopResult paced = RunLaunchLoop(30, c.blocks, 0, launches / 3, c.sync_every, r2.get());
    ASSERT_GT(paced.ns_per_launch, 0);
    double rate = 100.0 * free_run.ns_per_launch / paced.ns_per_launch;
    EXPECT_GE(rate, 27.0) << c.blocks << " us kernels";
    EXPECT_LE(rate, 33.0) << c.blocks << " us kernels";
    RecordProperty("rate_" + std::to_string(c.blocks) + "us", std::to_string(rate));
    printf("%u us kernels: %.2f %% of the unlimited rate\n", c.blocks, rate);
  }
}

// A soft limit alone on the GPU borrows idle time up to its ceiling (and no further).
TEST(PacingSoft, BorrowsUpToCeilingWhenAlone) {
  auto region = std::make_unique<AccountingRegion>();
  std::vector<double> s = RunGreedy(30, 60, 10'000'000'000, 5'000'000'000, region.get(),
                                    /*warmup_ns=*/3'000'000'000);
  for (double v : s) EXPECT_NEAR(v, 60.0, 5.0);
  EXPECT_GE(region->effective_share_permille.load(), 580u);
  EXPECT_LE(region->effective_share_permille.load(), 600u);
}

// Next to a neighbour using half the GPU, a soft limit gives back what it borrowed: it never
// takes more than the neighbour leaves nor more than its ceiling (its floor: PacingFloor).
TEST(PacingSoft, GivesBackNextToANeighbour) {
  auto region = std::make_unique<AccountingRegion>();
  std::vector<double> s = RunGreedy(30, 60, 10'000'000'000, 5'000'000'000, region.get(),
                                    /*warmup_ns=*/3'000'000'000, /*neighbour_percent=*/50);
  ASSERT_EQ(s.size(), 2u);
  for (double v : s) {
    EXPECT_LE(v, 50.0);
    EXPECT_GT(v, 10.0);
  }
  EXPECT_LT(region->effective_share_permille.load(), 600u) << "did not give back";
}

}  // namespace
}  // namespace gpulet
