// The host side of a fractional container's files: the grant directory, the limits and preload
// files, and the size-bounded tmpfs that keeps a tenant from growing its accounting file
// (issue 31.3). The tmpfs cases run in a child with a mount namespace of its own.
#include "vgpu/container/container_files.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "abi/vgpu_accounting.h"
#include "common/fs.h"

namespace gpulet::vgpu {
namespace {

using ::testing::HasSubstr;

class GrantDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-grantdir-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    limits_.uuid = "GPU-11111111-2222-3333-4444-555555555555";
    limits_.memory_bytes = 1 << 30;
    limits_.cores = 30;
    limits_.ceiling = 60;
    options_.library = "/opt/gpulet/libgpulet-vcuda.so";
    options_.preload = root_ + "/ld.so.preload";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  // Runs `body` in a child with a mount namespace of its own (root only); the child's exit code
  // is the number of failed checks. Returns false (and the caller skips) where that is not
  // possible.
  static bool InMountNamespace(const std::function<int()>& body, int* failures) {
    if (geteuid() != 0) return false;
    pid_t pid = fork();
    if (pid == 0) {
      if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr))
        _exit(100);
      _exit(body());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 100) return false;
    *failures = WEXITSTATUS(status);
    return true;
  }

  std::string root_;
  ContainerLimits limits_;
  GrantDirOptions options_;
};

TEST_F(GrantDirTest, WritesTheContractFiles) {
  std::string dir = root_ + "/pod/c";
  auto f = PrepareGrantDir(dir, limits_, options_);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->accounting, dir + "/accounting");
  EXPECT_EQ(std::filesystem::file_size(f->accounting), sizeof(AccountingRegion));
  struct stat st {};
  ASSERT_EQ(stat(f->limits.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444u) << "the limits file is read-only";
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  auto text = ReadFileToString(f->limits);
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("\nGPULET_VGPU_MEMORY_LIMIT=1073741824\n"));
  EXPECT_THAT(*text, HasSubstr("\nGPULET_VGPU_CORE_CEILING=60\n"));
  // What the agent writes, the interposer's parser reads back.
  LimitsFile parsed;
  ASSERT_TRUE(parsed.Parse(text->data(), text->size())) << parsed.error;
  EXPECT_STREQ(parsed.Get(kVarUuid), limits_.uuid.c_str());
  EXPECT_STREQ(parsed.Get(kVarCoreLimit), "30");
  EXPECT_STREQ(parsed.Get(kVarDisable), "0");
  EXPECT_EQ(ReadFileToString(options_.preload).value_or(""), std::string(kContainerLibrary) + "\n");

  // Prepared again (a second container of the claim, a restarted agent): the accounting file
  // and the memory it records are kept.
  int fd = open(f->accounting.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "x", 1, 100), 1);
  close(fd);
  ASSERT_TRUE(PrepareGrantDir(dir, limits_, options_).ok());
  EXPECT_EQ(ReadFileToString(f->accounting).value_or("").at(100), 'x');

  ASSERT_TRUE(RemoveGrantDir(dir).ok());
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_TRUE(RemoveGrantDir(dir).ok()) << "removing twice is not an error";
}

TEST_F(GrantDirTest, LimitsFileParserRefusesWhatIsNotTheContract) {
  LimitsFile f;
  auto parse = [&f](const std::string& text) { return f.Parse(text.data(), text.size()); };
  EXPECT_TRUE(parse("# c\n\nGPULET_VGPU_CORE_LIMIT=20\nGPULET_VGPU_CORE_LIMIT=30"));
  EXPECT_STREQ(f.Get(kVarCoreLimit), "30") << "the last value counts";
  EXPECT_EQ(f.Get(kVarMemoryLimit), nullptr);
  EXPECT_FALSE(parse("GPULET_VGPU_CORE_LIMIT=20\nLD_PRELOAD=/x.so\n"));
  EXPECT_THAT(f.error, HasSubstr("/var/run/gpulet/vgpu/limits:2 is not GPULET_VGPU_NAME=VALUE"));
  EXPECT_FALSE(parse("GPULET_VGPU_CORE_LIMIT\n"));
  EXPECT_FALSE(parse(std::string("GPULET_VGPU_X=1\0", 16)));
  EXPECT_THAT(f.error, HasSubstr("NUL"));
  std::string many;
  for (int i = 0; i <= kLimitsFileEntries; ++i) many += "GPULET_VGPU_X=" + std::to_string(i) + "\n";
  EXPECT_FALSE(parse(many));
  EXPECT_THAT(f.error, HasSubstr("one entry too many"));
  std::string big(kLimitsFileMax + 1, '#');
  EXPECT_FALSE(parse(big));
  EXPECT_EQ(f.Get(kVarCoreLimit), nullptr) << "a refused file has no entries";
}

TEST_F(GrantDirTest, PropagationIsReadFromMountinfo) {
  const std::string info =
      "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
      "30 22 8:2 / /var/lib rw,relatime - ext4 /dev/sda2 rw\n"
      "31 30 0:40 / /var/lib/gpulet rw,relatime shared:7 master:3 - ext4 /dev/sda2 rw\n"
      "32 22 0:41 / /srv/with\\040space rw - tmpfs tmpfs rw\n";
  EXPECT_TRUE(CheckMountsPropagate("/var/lib/gpulet/vgpu", info).ok());
  EXPECT_TRUE(CheckMountsPropagate("/opt/x", info).ok()) << "under the shared root";
  absl::Status s = CheckMountsPropagate("/var/lib/other", info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("the mount at /var/lib (holding /var/lib/other) is not shared"));
  EXPECT_THAT(s.message(), HasSubstr("mountPropagation: Bidirectional"));
  EXPECT_THAT(s.message(), HasSubstr("--vgpu-accounting-tmpfs=false"));
  EXPECT_FALSE(CheckMountsPropagate("/srv/with space/d", info).ok()) << "escaped mount points";
  EXPECT_FALSE(CheckMountsPropagate("/var/lib/gpulet-other", info).ok()) << "a prefix is no parent";
}

// The tenant-writable file cannot grow past the grant directory's tmpfs (before: a container
// appended 200 MiB to its DRA accounting file on the host's disk).
TEST_F(GrantDirTest, TmpfsBoundsWhatATenantCanWrite) {
  int failures = 0;
  bool ran = InMountNamespace(
      [&]() -> int {
        int bad = 0;
        // The state directory as the DaemonSet mounts it: shared (Bidirectional).
        if (mount(root_.c_str(), root_.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
            mount(nullptr, root_.c_str(), nullptr, MS_SHARED, nullptr) != 0)
          return 100;
        GrantDirOptions o = options_;
        o.tmpfs = true;
        std::string dir = root_ + "/claims/uid1";
        auto f = PrepareGrantDir(dir, limits_, o);
        if (!f.ok()) return fprintf(stderr, "prepare: %s\n", f.status().ToString().c_str()), 50;
        bad += !IsMountPoint(dir);
        int fd = open(f->accounting.c_str(), O_WRONLY | O_APPEND);
        std::string mib(1 << 20, 'z');
        ssize_t wrote = 0;
        for (int i = 0; i < 4; ++i) {
          ssize_t n = write(fd, mib.data(), mib.size());
          if (n > 0) wrote += n;
        }
        close(fd);
        off_t size = static_cast<off_t>(std::filesystem::file_size(f->accounting));
        fprintf(stderr, "appended %zd bytes; the file is %lld bytes\n", wrote,
                static_cast<long long>(size));
        bad += size > static_cast<off_t>(kGrantDirBytes);
        bad += wrote >= (1 << 20);
        // Prepared again with the same limits on the full tmpfs: the grant still stands.
        bad += !PrepareGrantDir(dir, limits_, o).ok();
        bad += !RemoveGrantDir(dir).ok();
        bad += IsMountPoint(dir) || std::filesystem::exists(dir);
        return bad;
      },
      &failures);
  if (!ran) GTEST_SKIP() << "needs root and a mount namespace of its own (unshare CLONE_NEWNS)";
  EXPECT_EQ(failures, 0) << "see the child's stderr above";
}

// Without propagation the tmpfs would be mounted where the container runtime never sees it (it
// would bind the empty directory beneath): refused, nothing left mounted.
TEST_F(GrantDirTest, TmpfsIsRefusedWhereMountsDoNotPropagate) {
  int failures = 0;
  bool ran = InMountNamespace(
      [&]() -> int {
        GrantDirOptions o = options_;
        o.tmpfs = true;
        std::string dir = root_ + "/claims/uid2";
        auto f = PrepareGrantDir(dir, limits_, o);
        int bad = f.ok();
        if (!f.ok()) {
          fprintf(stderr, "refused: %s\n", f.status().ToString().c_str());
          bad += f.status().message().find("is not shared") == std::string::npos;
        }
        bad += IsMountPoint(dir);
        return bad;
      },
      &failures);
  if (!ran) GTEST_SKIP() << "needs root and a mount namespace of its own (unshare CLONE_NEWNS)";
  EXPECT_EQ(failures, 0) << "see the child's stderr above";
}

}  // namespace
}  // namespace gpulet::vgpu
