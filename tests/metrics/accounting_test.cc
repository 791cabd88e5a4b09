// The agent reading vGPU accounting files that a container controls (bind-mounted read-write):
// truncated under the reader, grown without limit, replaced by a symlink or a FIFO. The agent must
// neither crash (SIGBUS), nor hang, nor follow the link, and must cut the file back to its region.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "abi/vgpu_accounting.h"
#include "abi/vgpu_accounting_read.h"
#include "gtest/gtest.h"
#include "metrics/sampler.h"

namespace gpulet::metrics {
namespace {

class HostileAccountingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (std::filesystem::temp_directory_path() / "gpulet-acct-XXXXXX").string();
    root_ = mkdtemp(t.data());
    std::filesystem::create_directories(root_ + "/uid-1/main");
    std::ofstream(root_ + "/uid-1/pod") << "ml/frac\n";
    file_ = root_ + "/uid-1/main/accounting";
    const char* err = "";
    vgpu::AccountingRegion* r = vgpu::MapAccounting(file_.c_str(), true, &err);
    ASSERT_NE(r, nullptr) << err;
    r->memory_limit = 4ull << 30;
    r->core_limit = 30;
    munmap(r, sizeof *r);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  // The agent's grant for the container (the exporter reads only granted containers' files).
  static VgpuGrantReader Grants() {
    return [] {
      return std::vector<VgpuGrantRecord>{
          {"uid-1/main", "ml", "frac", "main", "GPU-1", 4ull << 30, 0.3}};
    };
  }
  std::string root_, file_;
};

// A container truncating its file in a loop while the agent samples: no SIGBUS (the agent used to
// mmap the file, and a page past the new end faults), reads either succeed or are refused.
TEST_F(HostileAccountingTest, TruncationLoopDoesNotCrashTheAgent) {
  std::atomic<bool> stop{false};
  std::thread tenant([&] {
    int fd = open(file_.c_str(), O_RDWR);
    while (!stop) {
      (void)!ftruncate(fd, 0);
      (void)!ftruncate(fd, sizeof(vgpu::AccountingRegion));
    }
    close(fd);
  });
  AccountingDirUsageSource source(root_, Grants());
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  int reads = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto r = source.Read();
    ASSERT_TRUE(r.ok()) << r.status();
    ++reads;
  }
  stop = true;
  tenant.join();
  EXPECT_GT(reads, 0);
}

// A file grown far past its region is cut back to the region on the next sampling, and still read.
TEST_F(HostileAccountingTest, GrownFileIsCutBack) {
  {
    std::ofstream f(file_, std::ios::app | std::ios::binary);
    std::string mib(1 << 20, 'z');
    for (int i = 0; i < 16; ++i) f << mib;
  }
  ASSERT_GT(std::filesystem::file_size(file_), 16u << 20);
  AccountingDirUsageSource source(root_, Grants());
  auto r = source.Read();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].memory_limit_bytes, 4ull << 30);
  EXPECT_EQ(std::filesystem::file_size(file_), sizeof(vgpu::AccountingRegion));
}

// A symlink in place of the file is not followed (it could name any host file); a FIFO does not
// block the agent; a short file is refused with a message naming it.
TEST_F(HostileAccountingTest, SymlinksFifosAndShortFilesAreRefused) {
  std::string other = root_ + "/elsewhere";
  std::filesystem::rename(file_, other);
  std::filesystem::create_symlink(other, file_);
  AccountingDirUsageSource source(root_, Grants());
  auto r = source.Read();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty()) << "followed a symlink";
  auto direct = vgpu::ReadAccountingFile(file_);
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kFailedPrecondition);

  std::filesystem::remove(file_);
  ASSERT_EQ(mkfifo(file_.c_str(), 0600), 0);
  auto pending = std::async(std::launch::async, [&] { return source.Read(); });
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "reading a FIFO blocked the agent";
  EXPECT_TRUE(pending.get()->empty());

  std::filesystem::remove(file_);
  std::ofstream(file_) << "short";
  auto s = vgpu::ReadAccountingFile(file_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find(file_), std::string::npos);
}

}  // namespace
}  // namespace gpulet::metrics
