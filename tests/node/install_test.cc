// gpulet install / uninstall / validate against a temporary host root: a stand-in driver root, a
// containerd configuration, and the simulated dgx-h100 node for the inventory.
#include "node/install.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "absl/strings/str_join.h"
#include "node/validate.h"
#include "testing/runtime/fixtures.h"

namespace gpulet::node {
namespace {

namespace rt = gpulet::runtime::testing;
namespace fs = std::filesystem;

constexpr char kContainerd[] =
    "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n"
    "    sandbox_image = \"registry.k8s.io/pause:3.9\"\n";

class InstallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = rt::MakeTempDir("host");
    std::string why;
    if (!rt::MakeDriverRoot(host_, 8, &why)) GTEST_SKIP() << why;
    rt::WriteFile(host_ + "/etc/containerd/config.toml", kContainerd);
    art_ = rt::MakeTempDir("art");
    rt::WriteFile(art_ + "/bin/gpulet-container-runtime", "#!/bin/sh\nexec runc \"$@\"\n", 0755);
    rt::WriteFile(art_ + "/bin/gpulet-container-hook", "#!/bin/sh\n", 0755);
    rt::WriteFile(art_ + "/lib/libgpulet-vcuda.so", "not really a library");
    opts_.host_root = host_;
    opts_.artifacts_dir = art_;
    opts_.restart_command = "echo x >> '" + host_ + "/restarts'";
    opts_.gpu.simulate = "dgx-h100";
  }
  void TearDown() override {
    fs::remove_all(host_);
    fs::remove_all(art_);
  }
  int Restarts() {
    std::string s = rt::ReadFile(host_ + "/restarts");
    return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
  }
  std::string host_, art_;
  InstallOptions opts_;
};

// Install places the pieces, writes a CDI spec in host paths, configures containerd through a
// drop-in and restarts it once; a second run changes nothing and does not restart.
TEST_F(InstallTest, InstallsIdempotently) {
  auto r = Install(opts_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->engine, "containerd");
  EXPECT_TRUE(r->engine_config_changed);
  for (const char* f :
       {"/usr/local/gpulet/bin/gpulet-container-runtime",
        "/usr/local/gpulet/bin/gpulet-container-hook", "/usr/local/gpulet/lib/libgpulet-vcuda.so",
        "/var/run/cdi/gpulet-nvidia.yaml"})
    EXPECT_TRUE(fs::exists(host_ + f)) << f;
  std::string cdi = rt::ReadFile(host_ + "/var/run/cdi/gpulet-nvidia.yaml");
  EXPECT_NE(cdi.find("nvidia.com/gpu"), std::string::npos);
  EXPECT_EQ(cdi.find(host_), std::string::npos) << "CDI spec must name host paths, not " << host_;
  std::string main = rt::ReadFile(host_ + "/etc/containerd/config.toml");
  EXPECT_NE(main.find("/etc/containerd/conf.d/99-gpulet.toml"), std::string::npos) << main;
  EXPECT_EQ(main.find(host_), std::string::npos) << main;
  std::string drop = rt::ReadFile(host_ + "/etc/containerd/conf.d/99-gpulet.toml");
  EXPECT_NE(drop.find("/usr/local/gpulet/bin/gpulet-container-runtime"), std::string::npos) << drop;
  EXPECT_EQ(Restarts(), 1);

  auto again = Install(opts_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->engine_config_changed);
  EXPECT_EQ(Restarts(), 1) << "an unchanged configuration must not restart the engine";
}

// Uninstall restores the engine configuration byte for byte and removes everything placed.
TEST_F(InstallTest, UninstallRestoresAndRemoves) {
  ASSERT_TRUE(Install(opts_).ok());
  auto u = Uninstall(host_, opts_.restart_command);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(rt::ReadFile(host_ + "/etc/containerd/config.toml"), kContainerd);
  for (const char* f : {"/etc/containerd/conf.d/99-gpulet.toml", "/etc/containerd/config.toml.bak",
                        "/usr/local/gpulet/bin/gpulet-container-runtime",
                        "/var/run/cdi/gpulet-nvidia.yaml", "/var/lib/gpulet/install.json"})
    EXPECT_FALSE(fs::exists(host_ + f)) << f;
  EXPECT_EQ(Restarts(), 2);
  // Issue 22.3: the directories install created are gone too; the ones that were there stay.
  for (const char* d : {"/usr/local/gpulet", "/etc/containerd/conf.d", "/var/lib/gpulet"})
    EXPECT_FALSE(fs::exists(host_ + d)) << d;
  EXPECT_TRUE(fs::exists(host_ + "/etc/containerd"));
  // Nothing installed: a clear no-op.
  auto again = Uninstall(host_, "none");
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->actions.at(0).find("nothing to uninstall"), std::string::npos);
  // A host root that does not exist is an error naming it, not "nothing to uninstall".
  auto wrong = Uninstall(host_ + "/nonexistent", "none");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().message(), "--host-root " + host_ + "/nonexistent: no such directory");
}

// Each action is shown as it happens, before the engine restart: restarting the engine can end the
// output of the container uninstall runs in (CI once read an empty log from such a pod). The
// restart command here copies what was shown so far.
TEST_F(InstallTest, ActionsAreShownBeforeTheEngineRestarts) {
  const std::string shown = host_ + "/shown", at_restart = host_ + "/at-restart";
  auto show = [&](const std::string& a) { rt::WriteFile(shown, rt::ReadFile(shown) + a + "\n"); };
  const std::string restart = "cp '" + shown + "' '" + at_restart + "'";
  opts_.restart_command = restart;
  auto r = Install(opts_, show);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(rt::ReadFile(at_restart).find("configured /etc/containerd/config.toml"),
            std::string::npos)
      << rt::ReadFile(at_restart);
  EXPECT_EQ(rt::ReadFile(shown), absl::StrJoin(r->actions, "\n") + "\n")
      << "every action is shown once, in order";

  fs::remove(shown);
  auto u = Uninstall(host_, restart, show);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_NE(rt::ReadFile(at_restart).find("restored /etc/containerd/config.toml"),
            std::string::npos)
      << rt::ReadFile(at_restart);
  EXPECT_EQ(rt::ReadFile(shown), absl::StrJoin(u->actions, "\n") + "\n");
}

// Most hosts have /var/run -> /run, an absolute link: seen under --host-root it must lead to the
// host's /run, not the installer container's. Before, install failed ("cannot create
// /host/var/run/cdi: File exists", found on the real cluster) and uninstall left the spec behind.
TEST_F(InstallTest, FollowsAbsoluteHostSymlinksInsideTheHostRoot) {
  fs::remove_all(host_ + "/var/run");
  fs::create_directories(host_ + "/run");
  fs::create_directories(host_ + "/var");
  fs::create_symlink("/run", host_ + "/var/run");
  EXPECT_EQ(UnderRoot(host_, "/var/run/cdi/x.yaml"), host_ + "/run/cdi/x.yaml");
  EXPECT_EQ(UnderRoot(host_, "/var/run/../lib/gpulet"), host_ + "/lib/gpulet");
  EXPECT_EQ(UnderRoot("/", "/var/run/cdi"), "/var/run/cdi");
  auto r = Install(opts_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(fs::exists(host_ + "/run/cdi/gpulet-nvidia.yaml"));
  EXPECT_TRUE(fs::is_symlink(host_ + "/var/run")) << "the host's link must stay a link";
  auto u = Uninstall(host_, opts_.restart_command);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_FALSE(fs::exists(host_ + "/run/cdi/gpulet-nvidia.yaml"));
  EXPECT_FALSE(fs::exists(host_ + "/run/cdi")) << "install made it, uninstall removes it";
  EXPECT_TRUE(fs::exists(host_ + "/run"));
}

// A loop of links ends (taken as a plain path) instead of hanging.
TEST_F(InstallTest, SymlinkLoopUnderHostRootEnds) {
  fs::create_symlink("/loop-b", host_ + "/loop-a");
  fs::create_symlink("/loop-a", host_ + "/loop-b");
  EXPECT_FALSE(UnderRoot(host_, "/loop-a/x").empty());
}

// A 0600 engine configuration (it may hold registry credentials) stays 0600 through install and
// uninstall (issue 22.3).
TEST_F(InstallTest, EngineConfigKeepsItsMode) {
  fs::permissions(host_ + "/etc/containerd/config.toml",
                  fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(Install(opts_).ok());
  auto mode = [&] { return fs::status(host_ + "/etc/containerd/config.toml").permissions(); };
  EXPECT_EQ(mode(), fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(Uninstall(host_, "none").ok());
  EXPECT_EQ(rt::ReadFile(host_ + "/etc/containerd/config.toml"), kContainerd);
  EXPECT_EQ(mode(), fs::perms::owner_read | fs::perms::owner_write);
}

// An invalid engine configuration is reported with file:line and nothing is placed.
TEST_F(InstallTest, InvalidEngineConfigPlacesNothing) {
  rt::WriteFile(host_ + "/etc/containerd/config.toml", "version = 2\n[plugins\n");
  auto r = Install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("config.toml:2"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(host_ + "/usr/local/gpulet"));
  EXPECT_FALSE(fs::exists(host_ + "/var/lib/gpulet/install.json"));
  EXPECT_EQ(rt::ReadFile(host_ + "/etc/containerd/config.toml"), "version = 2\n[plugins\n");
}

// A missing shim or no engine at all is one clear error.
TEST_F(InstallTest, MissingPiecesAreClearErrors) {
  fs::remove(art_ + "/bin/gpulet-container-hook");
  auto r = Install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpulet-container-hook"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(host_ + "/usr/local/gpulet/bin/gpulet-container-runtime"));
  fs::remove(host_ + "/etc/containerd/config.toml");
  auto e = DetectEngine(host_);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--runtime"), std::string::npos);
}

// Validation passes driver and runtime (a real busybox container started through the installed
// shim and runc sees /dev/nvidia0) after install and stops at the device plugin when the kubelet
// does not answer; before install the runtime step names the fix.
TEST_F(InstallTest, ValidateStepsInOrder) {
  if (!rt::IsRoot()) GTEST_SKIP() << "needs root to mknod the device nodes and to run runc";
  if (!rt::Have("runc")) GTEST_SKIP() << "runc is not installed";
  if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "busybox-static is not installed";
  for (const char* b : {"gpulet-container-runtime", "gpulet-container-hook"})
    fs::copy_file(std::string(GPULET_BINARY_DIR) + "/bin/" + b, art_ + "/bin/" + b,
                  fs::copy_options::overwrite_existing);
  ValidateOptions v;
  v.host_root = host_;
  v.gpu.simulate = "dgx-h100";
  v.pod_resources_socket = host_ + "/no-kubelet.sock";
  ValidationReport before = ValidateStack(v);
  ASSERT_EQ(before.steps.size(), 2u);
  EXPECT_TRUE(before.steps[0].ok) << before.steps[0].detail;
  EXPECT_FALSE(before.steps[1].ok);
  EXPECT_NE(before.steps[1].detail.find("gpulet install"), std::string::npos)
      << before.steps[1].detail;

  ASSERT_TRUE(Install(opts_).ok());
  // A TMPDIR of this test's own: the probe makes its bundle there, and tests running side by side
  // (ctest -j) make theirs elsewhere, so what is left over is ours.
  const std::string tmp = art_ + "/tmp";
  fs::create_directories(tmp);
  const char* old_tmp = getenv("TMPDIR");
  const std::string saved = old_tmp ? old_tmp : "";
  setenv("TMPDIR", tmp.c_str(), 1);
  auto probe_dirs = [] {
    std::set<std::string> d;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
      if (e.path().filename().string().rfind("gpulet-validate-", 0) == 0) d.insert(e.path());
    return d;
  };
  std::set<std::string> dirs_before = probe_dirs();
  ValidationReport after = ValidateStack(v);
  ASSERT_EQ(after.steps.size(), 3u) << after.FirstFailure();
  EXPECT_TRUE(after.steps[1].ok) << after.steps[1].detail;
  EXPECT_NE(after.steps[1].detail.find("probe container started through it sees /dev/nvidia0"),
            std::string::npos)
      << after.steps[1].detail;
  EXPECT_FALSE(after.steps[2].ok);
  EXPECT_NE(after.steps[2].detail.find("no-kubelet.sock"), std::string::npos);
  EXPECT_FALSE(after.ok());
  EXPECT_EQ(probe_dirs(), dirs_before) << "the probe must remove its bundle and state";
  if (old_tmp)
    setenv("TMPDIR", saved.c_str(), 1);
  else
    unsetenv("TMPDIR");
}

// The probe container catches what the file checks cannot: a shim that starts containers without
// their GPUs (here one that execs runc directly), a missing busybox, a missing runc and a shim that
// hangs, each one clear reason.
TEST_F(InstallTest, ProbeContainerFailuresAreClear) {
  if (!rt::IsRoot()) GTEST_SKIP() << "needs root to mknod the device nodes and to run runc";
  if (!rt::Have("runc")) GTEST_SKIP() << "runc is not installed";
  if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "busybox-static is not installed";
  ASSERT_TRUE(Install(opts_).ok());  // the fixture's shim: `exec runc "$@"`
  ValidateOptions v;
  v.host_root = host_;
  v.gpu.simulate = "dgx-h100";
  v.pod_resources_socket = host_ + "/no-kubelet.sock";
  ValidationReport r = ValidateStack(v);
  ASSERT_EQ(r.steps.size(), 2u) << r.FirstFailure();
  EXPECT_NE(r.steps[1].detail.find("does not see /dev/nvidia0"), std::string::npos)
      << r.steps[1].detail;

  v.probe_busybox = host_ + "/no-busybox";
  r = ValidateStack(v);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_NE(r.steps[1].detail.find("no static busybox at " + host_ + "/no-busybox"),
            std::string::npos)
      << r.steps[1].detail;

  v.probe_busybox = "/bin/busybox";
  v.probe_runc = host_ + "/no-runc";
  r = ValidateStack(v);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_NE(r.steps[1].detail.find(host_ + "/no-runc"), std::string::npos) << r.steps[1].detail;

  // A shim that never returns is cut off at the timeout: no hang.
  v.probe_runc.clear();
  v.probe_timeout_seconds = 1;
  rt::WriteFile(host_ + "/usr/local/gpulet/bin/gpulet-container-runtime",
                "#!/bin/sh\nexec sleep 30\n", 0755);
  r = ValidateStack(v);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_NE(r.steps[1].detail.find("did not finish in 1 s"), std::string::npos)
      << r.steps[1].detail;

  v.container_probe = false;
  r = ValidateStack(v);
  ASSERT_EQ(r.steps.size(), 3u) << r.FirstFailure();
  EXPECT_NE(r.steps[1].detail.find("no probe container"), std::string::npos);
}

}  // namespace
}  // namespace gpulet::node
