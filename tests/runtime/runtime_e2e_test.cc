// End-to-end tests with the real container engines that run here: runc through
// gpulet-container-runtime (CDI and legacy modes), podman with CDI devices and with --runtime,
// containerd's own config parser, and the security cases (symlinked mount targets, LD_PRELOAD).
// Each needs root and its tool, and skips with the reason otherwise.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin/resources.h"
#include "runtime/cdi.h"
#include "runtime/engine_config.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/runtime/fixtures.h"

namespace gpulet::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace ::gpulet::runtime::testing;
namespace fs = std::filesystem;

// runc names the container's cgroup after its id, so tests running side by side (ctest -j) need
// ids of their own: with one shared id their device rules mixed and a test could fail.
std::string ContainerId() { return "gpulet-e2e-" + std::to_string(::getpid()); }

const std::string kBin = std::string(GPULET_BINARY_DIR) + "/bin/";
const std::string kShim = kBin + "gpulet-container-runtime";
const std::string kHook = kBin + "gpulet-container-hook";

// A node: a driver root with 4 GPUs (FakeInventory(4)), its CDI spec (written by `gpulet cdi
// generate`'s code path from a fake inventory), a shim config, and a busybox bundle.
class Node : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!IsRoot()) GTEST_SKIP() << "needs root (mknod, runc)";
    if (!Have("runc")) GTEST_SKIP() << "runc is not installed";
    dir_ = MakeTempDir("e2e");
    std::string why;
    if (!MakeDriverRoot(dir_ + "/driver", 4, &why)) GTEST_SKIP() << why;
    if (!MakeBusyboxRootfs(dir_ + "/bundle/rootfs", &why)) GTEST_SKIP() << why;
    CdiGenerateOptions opt;
    opt.driver_root = dir_ + "/driver";
    opt.hook_path = kHook;
    auto spec = GenerateCdiSpec(FakeInventory(4), opt);
    ASSERT_TRUE(spec.ok()) << spec.status();
    WriteFile(dir_ + "/cdi/nvidia.yaml", CdiSpecToYaml(*spec));
    WriteConfig("auto", true);
  }
  void TearDown() override {
    if (!dir_.empty()) {
      Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
      fs::remove_all(dir_);
    }
  }
  void WriteConfig(const std::string& mode, bool accept_env, const std::string& ldconfig = "") {
    Json c = {{"mode", mode},
              {"runtimes", {"runc"}},
              {"spec-dirs", {dir_ + "/cdi"}},
              {"hook-path", kHook},
              {"accept-nvidia-visible-devices-envvar-when-unprivileged", accept_env}};
    if (!ldconfig.empty()) c["ldconfig"] = ldconfig;
    WriteFile(dir_ + "/runtime.json", c.dump());
  }
  // Makes the CDI spec's update-ldcache hook read this test's runtime.json: the hook clears its
  // environment, so GPULET_RUNTIME_CONFIG does not reach it.
  void HookReadsTestConfig() {
    auto spec = ParseCdiSpec(ReadFile(dir_ + "/cdi/nvidia.yaml"), "nvidia.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_EQ(spec->edits.hooks.size(), 1u);
    spec->edits.hooks[0].args.push_back("--config");
    spec->edits.hooks[0].args.push_back(dir_ + "/runtime.json");
    WriteFile(dir_ + "/cdi/nvidia.yaml", CdiSpecToYaml(*spec));
  }
  // Writes the bundle's config.json (from `runc spec`) running `script` with `env`.
  void Bundle(const std::string& script, std::vector<std::string> env) {
    fs::remove(dir_ + "/bundle/config.json");
    ASSERT_EQ(Sh("cd " + dir_ + "/bundle && runc spec"), 0);
    Json spec = Json::parse(ReadFile(dir_ + "/bundle/config.json"));
    spec["process"]["terminal"] = false;
    spec["process"]["args"] = {"sh", "-c", script};
    for (const auto& e : env) spec["process"]["env"].push_back(e);
    WriteFile(dir_ + "/bundle/config.json", spec.dump(2));
  }
  // Runs the bundle through the shim; returns the exit status, output in *out.
  int RunShim(std::string* out) {
    return Sh("cd " + dir_ + "/bundle && GPULET_RUNTIME_CONFIG=" + dir_ + "/runtime.json " + kShim +
                  " --root " + dir_ + "/runc run " + ContainerId() + " </dev/null",
              out);
  }
  // podman with this test's own storage and configuration (*podman: the command prefix), with the
  // bundle's rootfs imported as `image`.
  void PodmanWithImage(const std::string& image, std::string* podman) {
    WriteFile(dir_ + "/containers.conf", "[containers]\ndefault_ulimits = []\n");
    *podman = "CONTAINERS_CONF=" + dir_ + "/containers.conf podman --root " + dir_ +
              "/storage --runroot " + dir_ +
              "/runroot --cgroup-manager cgroupfs --events-backend file ";
    std::string out;
    ASSERT_EQ(Sh("tar -C " + dir_ + "/bundle/rootfs -c . | " + *podman + "import - " + image, &out),
              0)
        << out;
  }
  std::string dir_;
};

constexpr char kProbe[] =
    "ls -l /dev | grep nvidia; ls /usr/lib/x86_64-linux-gnu 2>/dev/null; "
    "grep -c libcuda.so.1 /etc/ld.so.cache 2>/dev/null; /usr/bin/nvidia-smi 2>/dev/null; true";

// NVIDIA_VISIBLE_DEVICES=1: exactly /dev/nvidia1 (195:1), the control nodes, the compute and
// utility libraries (not video/graphics), nvidia-smi, and an ld cache that knows libcuda.so.1.
TEST_F(Node, RuncSeesExactlyTheRequestedGpu) {
  Bundle(kProbe, {"NVIDIA_VISIBLE_DEVICES=1"});
  std::string out;
  ASSERT_EQ(RunShim(&out), 0) << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("c[-rwx]+ +1 +0 +0 +195, +1 .*nvidia1\n"));
  for (const char* gone :
       {"nvidia0", "nvidia2", "nvidia3", "nvidia-modeset", "libnvidia-encode", "libnvidia-glcore"})
    EXPECT_THAT(out, Not(HasSubstr(gone))) << out;
  for (const char* there : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "libcuda.so.550.54.15",
                            "libnvidia-ml.so.550.54.15", "libnvidia-ptxjitcompiler.so.550.54.15",
                            "stand-in nvidia-smi"})
    EXPECT_THAT(out, HasSubstr(there)) << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("\n[1-9][0-9]*\n"));  // ld cache entries for libcuda
  // The original bundle was rewritten in place, not half-written: still valid JSON.
  EXPECT_FALSE(Json::parse(ReadFile(dir_ + "/bundle/config.json"), nullptr, false).is_discarded());
}

// No variable: nothing at all; NVIDIA_VISIBLE_DEVICES=none: the driver but no GPU. (In this order:
// a reused rootfs keeps the empty mount targets runc created.)
TEST_F(Node, RuncNoneAndNoRequest) {
  Bundle(kProbe, {});
  std::string out;
  ASSERT_EQ(RunShim(&out), 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("nvidia"))) << out;
  Bundle(kProbe, {"NVIDIA_VISIBLE_DEVICES=none"});
  ASSERT_EQ(RunShim(&out), 0) << out;
  EXPECT_THAT(out, Not(::testing::ContainsRegex("nvidia[0-9]"))) << out;
  EXPECT_THAT(out, HasSubstr("nvidiactl"));
}

// Default policy: an unprivileged image's own NVIDIA_VISIBLE_DEVICES=all grants nothing; the
// device plugin's volume-mount list does.
TEST_F(Node, ImageEnvvarDoesNotGrantGpusByDefault) {
  WriteConfig("auto", /*accept_env=*/false);
  Bundle(kProbe, {"NVIDIA_VISIBLE_DEVICES=all"});
  std::string out;
  ASSERT_EQ(RunShim(&out), 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("nvidia"))) << out;
  Json spec = Json::parse(ReadFile(dir_ + "/bundle/config.json"));
  spec["mounts"].push_back(
      {{"destination",
        "/var/run/nvidia-container-devices/GPU-00000002-1111-2222-3333-444444444444"},
       {"type", "bind"},
       {"source", "/dev/null"},
       {"options", {"ro", "bind"}}});
  WriteFile(dir_ + "/bundle/config.json", spec.dump());
  ASSERT_EQ(RunShim(&out), 0) << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("195, +2 .*nvidia2\n")) << out;
  EXPECT_THAT(out, Not(HasSubstr("nvidia3"))) << out;
}

// Issue 14.1: a pod's emptyDir (or an image VOLUME) mounted at
// /var/run/nvidia-container-devices/all is not the device plugin's grant (a bind of /dev/null with
// an id it issues): in CDI and legacy mode the container starts with no GPU at all (it used to get
// every GPU); /dev/null at "all" is refused before runc runs.
TEST_F(Node, VolumeAtTheDeviceListPathGrantsNothing) {
  fs::create_directories(dir_ + "/emptydir");
  for (const char* mode : {"auto", "legacy"}) {
    SCOPED_TRACE(mode);
    WriteConfig(mode, /*accept_env=*/false);
    Bundle(kProbe, {"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"});
    Json spec = Json::parse(ReadFile(dir_ + "/bundle/config.json"));
    Json with_dir = spec;
    with_dir["mounts"].push_back({{"destination", "/var/run/nvidia-container-devices/all"},
                                  {"type", "bind"},
                                  {"source", dir_ + "/emptydir"},
                                  {"options", {"rbind", "rprivate"}}});
    WriteFile(dir_ + "/bundle/config.json", with_dir.dump());
    std::string out;
    ASSERT_EQ(RunShim(&out), 0) << out;
    EXPECT_THAT(out, Not(HasSubstr("nvidia"))) << out;
    Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
    Json with_null = spec;
    with_null["mounts"].push_back({{"destination", "/var/run/nvidia-container-devices/all"},
                                   {"type", "bind"},
                                   {"source", "/dev/null"},
                                   {"options", {"rbind", "ro"}}});
    WriteFile(dir_ + "/bundle/config.json", with_null.dump());
    EXPECT_NE(RunShim(&out), 0) << out;
    EXPECT_THAT(out, HasSubstr("\"all\" is not a device id the device plugin issues")) << out;
    EXPECT_THAT(out, Not(HasSubstr("nvidia0"))) << out;
    Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
  }
}

// Legacy mode: the prestart hook creates the nodes, mounts the libraries and runs ldconfig.
TEST_F(Node, LegacyHookGivesTheGpu) {
  WriteConfig("legacy", true);
  Bundle(kProbe, {"NVIDIA_VISIBLE_DEVICES=2"});
  std::string out;
  ASSERT_EQ(RunShim(&out), 0) << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("195, +2 .*nvidia2\n")) << out;
  EXPECT_THAT(out, Not(HasSubstr("nvidia1"))) << out;
  EXPECT_THAT(out, HasSubstr("libcuda.so.550.54.15"));
  EXPECT_THAT(out, HasSubstr("stand-in nvidia-smi"));
  EXPECT_THAT(out, ::testing::ContainsRegex("\n[1-9][0-9]*\n"));
}

// Legacy mode: an unmet NVIDIA_REQUIRE_CUDA stops the container with a clear message.
TEST_F(Node, LegacyHookEnforcesRequirements) {
  WriteConfig("legacy", true);
  Bundle("echo started", {"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"});
  std::string out;
  EXPECT_NE(RunShim(&out), 0);
  EXPECT_THAT(out, HasSubstr("gpulet-container-hook prestart: unsatisfied requirement"));
  EXPECT_THAT(out, HasSubstr("cuda>=13.0"));
  EXPECT_THAT(out, Not(HasSubstr("started")));
}

// Issue 24.2, as measured on an Ubuntu 24.04 H200 node: the driver in
// /usr/local/nvidia/{lib64,bin}, the ld cache listing every library again from /lib,
// /usr/bin/nvidia-smi a #!/bin/sh script that execs /usr/local/nvidia/bin/nvidia-smi. In both modes
// `nvidia-smi` (found on PATH, in an image without a shell of its own it could rely on) and its
// full path run the real binary, the libraries are there once, and the container's ld cache finds
// libcuda.
TEST_F(Node, GkeStyleDriverLayout) {
  std::string root = dir_ + "/gke", why;
  DriverLayout gke{"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", "/usr/bin", "/lib"};
  if (!MakeDriverRoot(root, 4, &why, gke)) GTEST_SKIP() << why;
  CdiGenerateOptions opt;
  opt.driver_root = root;
  opt.hook_path = kHook;
  auto spec = GenerateCdiSpec(FakeInventory(4), opt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  WriteFile(dir_ + "/cdi/nvidia.yaml", CdiSpecToYaml(*spec));
  for (const char* mode : {"auto", "legacy"}) {
    SCOPED_TRACE(mode);
    WriteConfig(mode, true);
    Bundle(
        "nvidia-smi; /usr/local/nvidia/bin/nvidia-smi; ls /usr/local/nvidia/lib64 /lib; "
        "grep -c libcuda.so.1 /etc/ld.so.cache; true",
        {"NVIDIA_VISIBLE_DEVICES=1"});
    std::string out;
    ASSERT_EQ(RunShim(&out), 0) << out;
    std::regex elf("stand-in nvidia-smi \\(ELF\\)");
    auto runs =
        std::distance(std::sregex_iterator(out.begin(), out.end(), elf), std::sregex_iterator());
    EXPECT_EQ(runs, 2) << out;
    EXPECT_THAT(out, HasSubstr("libcuda.so.550.54.15")) << out;
    EXPECT_THAT(out, ::testing::ContainsRegex("\n[1-9][0-9]*\n"))
        << out;  // libcuda in the ld cache
    EXPECT_THAT(out, Not(HasSubstr("/lib:\n")))
        << out;  // each library mounted once, not from /lib too
    Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
  }
}

// Issue 24.1: on Ubuntu /sbin/ldconfig is a #!/bin/sh wrapper around /sbin/ldconfig.real. The hook
// fexecve()d the configured file, so the kernel ran the image's /bin/sh for the script inside the
// chroot, which could not find ldconfig.real there (status 32512): no GPU container started. With
// the wrapper configured, both modes now run the static ldconfig.real and the ld cache is made.
TEST_F(Node, LdconfigBehindAWrapperScript) {
  std::string real = HostStaticLdconfig();
  if (real.empty()) GTEST_SKIP() << "no static host ldconfig to copy";
  std::string host = dir_ + "/ubuntu";
  WriteFile(host + "/sbin/ldconfig",
            "#!/bin/sh\n# as Ubuntu's: dpkg trigger logic, then\nexec /sbin/ldconfig.real \"$@\"\n",
            0755);
  fs::copy_file(real, host + "/sbin/ldconfig.real");
  ASSERT_NO_FATAL_FAILURE(HookReadsTestConfig());
  for (const char* mode : {"auto", "legacy"}) {
    SCOPED_TRACE(mode);
    WriteConfig(mode, true, host + "/sbin/ldconfig");
    Bundle(kProbe, {"NVIDIA_VISIBLE_DEVICES=1"});
    std::string out;
    ASSERT_EQ(RunShim(&out), 0) << out;
    EXPECT_THAT(out, ::testing::ContainsRegex("\n[1-9][0-9]*\n"))
        << out;  // libcuda in the ld cache
    Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
  }
}

// Issue 14.9: ldconfig runs as host root chrooted into the image: it gets only CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH (bit 1 and 2: 0x6) in its effective, permitted and bounding sets, and
// no_new_privs. A static stand-in "ldconfig" writes what it holds into the rootfs's ld cache file.
TEST_F(Node, LdconfigRunsWithOnlyTheCapabilitiesItNeeds) {
  std::string ld = dir_ + "/capld/sbin/ldconfig", src = dir_ + "/capld.c";
  WriteFile(
      src,
      "#include <stdio.h>\n#include <sys/prctl.h>\n#include <sys/syscall.h>\n#include <unistd.h>\n"
      "#include <linux/capability.h>\n"
      "int main(void) {\n"
      "  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};\n"
      "  struct __user_cap_data_struct d[2] = {{0}};\n"
      "  syscall(SYS_capget, &h, d);\n"
      "  unsigned long long bnd = 0;\n"
      "  for (int c = 0; c < 64; ++c)\n"
      "    if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1) bnd |= 1ull << c;\n"
      "  FILE* f = fopen(\"/etc/ld.so.cache\", \"w\");\n"
      "  if (!f) return 1;\n"
      "  unsigned long long eff = d[0].effective | (unsigned long long)d[1].effective << 32;\n"
      "  unsigned long long prm = d[0].permitted | (unsigned long long)d[1].permitted << 32;\n"
      "  fprintf(f, \"eff=%llx prm=%llx bnd=%llx nnp=%d\\n\", eff, prm, bnd,\n"
      "          prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));\n"
      "  return fclose(f) != 0;\n}\n");
  fs::create_directories(dir_ + "/capld/sbin");
  std::string out;
  if (Sh("cc -static -O1 -o " + ld + " " + src, &out) != 0)
    GTEST_SKIP() << "cannot link statically: " << out;
  ASSERT_NO_FATAL_FAILURE(HookReadsTestConfig());
  for (const char* mode : {"auto", "legacy"}) {
    SCOPED_TRACE(mode);
    WriteConfig(mode, true, ld);
    Bundle("cat /etc/ld.so.cache", {"NVIDIA_VISIBLE_DEVICES=1"});
    ASSERT_EQ(RunShim(&out), 0) << out;
    EXPECT_THAT(out, HasSubstr("eff=6 prm=6 bnd=6 nnp=1")) << out;
    Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
  }
}

// CVE-2024-0132 class: the image's library directory is a symlink to a host directory. Neither
// runc (CDI mode) nor our hook (legacy mode) may create or mount anything there.
TEST_F(Node, SymlinkedMountTargetsStayInsideTheRootfs) {
  for (const char* mode : {"auto", "legacy"}) {
    std::string host = dir_ + "/host-" + mode;
    fs::create_directories(host);
    fs::remove_all(dir_ + "/bundle/rootfs/usr");
    fs::create_directories(dir_ + "/bundle/rootfs/usr/lib");
    fs::create_symlink(host, dir_ + "/bundle/rootfs/usr/lib/x86_64-linux-gnu");
    fs::create_symlink(host, dir_ + "/bundle/rootfs/usr/bin");
    WriteConfig(mode, true);
    Bundle("ls /usr/lib/x86_64-linux-gnu/", {"NVIDIA_VISIBLE_DEVICES=0"});
    std::string out;
    RunShim(&out);  // may succeed (resolved inside) or fail closed; never touch the host
    EXPECT_TRUE(fs::is_empty(host)) << mode << ": wrote outside the rootfs\n" << out;
    Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
  }
}

// CVE-2025-23266 class: LD_PRELOAD in the image's environment (or leaked into the hook's) never
// loads code into the hook or what it runs. The preload library is proven live first.
TEST_F(Node, LdPreloadNeverReachesTheHook) {
  std::string marker = dir_ + "/preloaded";
  ASSERT_TRUE(BuildLibrary(dir_ + "/evil.so", "evil.so",
                           "#include <stdio.h>\n__attribute__((constructor)) static void f(void) {"
                           " FILE* m = fopen(\"" +
                               marker + "\", \"a\"); if (m) { fputs(\"x\", m); fclose(m); } }\n"));
  ASSERT_EQ(Sh("LD_PRELOAD=" + dir_ + "/evil.so /bin/true"), 0);
  ASSERT_TRUE(fs::exists(marker)) << "the test's preload library does not work";
  fs::remove(marker);
  for (const char* mode : {"auto", "legacy"}) {
    WriteConfig(mode, true);
    Bundle("echo ran",
           {"NVIDIA_VISIBLE_DEVICES=0", "LD_PRELOAD=" + dir_ + "/evil.so", "LD_LIBRARY_PATH=/tmp"});
    std::string out;
    ASSERT_EQ(RunShim(&out), 0) << out;
    EXPECT_THAT(out, HasSubstr("ran"));
    EXPECT_FALSE(fs::exists(marker)) << mode << ": preload ran in a hook";
    Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
  }
  // Even when a runtime hands the hook a poisoned environment, nothing is loaded into it.
  std::string out;
  Sh("echo '{\"pid\": 1, \"bundle\": \"/nonexistent\"}' | LD_PRELOAD=" + dir_ + "/evil.so " +
         kHook + " update-ldcache --folder /usr/lib",
     &out);
  EXPECT_FALSE(fs::exists(marker)) << "preload ran in the hook process";
}

// Legacy mode adds the cgroup allow rules for the nodes its hook creates: /dev/nvidia2 opens as far
// as the (absent) driver ("No such device or address"), where the device cgroup would refuse it
// ("Operation not permitted"). Proven by running the same bundle without those rules.
TEST_F(Node, LegacyModeAllowsTheInjectedDevicesInTheCgroup) {
  WriteConfig("legacy", true);
  Bundle("head -c1 /dev/nvidia2; head -c1 /dev/nvidiactl; true", {"NVIDIA_VISIBLE_DEVICES=2"});
  std::string out;
  ASSERT_EQ(RunShim(&out), 0) << out;
  EXPECT_THAT(out, HasSubstr("/dev/nvidia2: No such device or address")) << out;
  EXPECT_THAT(out, HasSubstr("/dev/nvidiactl: No such device or address")) << out;
  EXPECT_THAT(out, Not(HasSubstr("Operation not permitted"))) << out;
  Json spec = Json::parse(ReadFile(dir_ + "/bundle/config.json"));
  Json kept = Json::array();
  for (const auto& rule : spec["linux"]["resources"]["devices"])
    if (!rule.value("allow", false) || rule.value("major", 0) != 195) kept.push_back(rule);
  ASSERT_LT(kept.size(), spec["linux"]["resources"]["devices"].size());
  spec["linux"]["resources"]["devices"] = kept;
  WriteFile(dir_ + "/bundle/config.json", spec.dump());
  Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
  // runc directly: the shim would see its hook and leave the spec alone anyway.
  Sh("cd " + dir_ + "/bundle && runc --root " + dir_ + "/runc run " + ContainerId() + " </dev/null",
     &out);
  EXPECT_THAT(out, HasSubstr("/dev/nvidia2: Operation not permitted")) << out;
}

// The GPU device nodes (name -> "major:minor") a container's `ls -l /dev` shows.
std::map<std::string, std::string> GpuNodes(const std::string& ls) {
  std::map<std::string, std::string> nodes;
  static const std::regex line(R"(c[-rwx]+ +\d+ +\d+ +\d+ +(\d+), +(\d+) .* (nvidia\d+)\n)");
  for (std::sregex_iterator it(ls.begin(), ls.end(), line), end; it != end; ++it)
    nodes[(*it)[3]] = (*it)[1].str() + ":" + (*it)[2].str();
  return nodes;
}

// Issue 3's cross-check: what the device plugin's Allocate returns for GPUs 1 and 3 (envvar with
// UUIDs, CDI annotations with indices, volume mounts), for the same inventory the CDI spec was
// generated from, put into the container config as the kubelet and the engine do, and run by runc
// through our shim (CDI and legacy mode) and by podman --runtime: the container has exactly
// /dev/nvidia1 (195:1) and /dev/nvidia3 (195:3) and no other GPU node.
TEST_F(Node, DevicePluginAllocationGivesExactlyThoseGpus) {
  gpu::Inventory inv = FakeInventory(4);
  gpulet::testing::FakeGpuLayer layer(inv);
  plugin::Config pc;
  pc.health.unhealthy_devices_file = "";
  plugin::HealthMonitor health(&layer, inv, pc.health);
  const std::vector<std::string> ids = {inv.devices[1].uuid, inv.devices[3].uuid};
  const std::map<std::string, std::string> want = {{"nvidia1", "195:1"}, {"nvidia3", "195:3"}};
  struct Strategy {
    std::string name;
    plugin::ListStrategies list;
    plugin::IdStrategy id;
    bool accept_env;  // the runtime setting the strategy needs (docs/runtime.md, Security)
  } strategies[] = {
      {"envvar", {true, false, false, false}, plugin::IdStrategy::kUuid, true},
      {"cdi-annotations", {false, false, true, false}, plugin::IdStrategy::kIndex, false},
      {"volume-mounts", {false, true, false, false}, plugin::IdStrategy::kUuid, false},
  };
  const std::string probe = "ls -l /dev | grep nvidia";
  bool podman = Have("podman");
  std::string p, out;
  if (podman) {
    ASSERT_NO_FATAL_FAILURE(PodmanWithImage("gpulet-xc:latest", &p));
  }
  for (const auto& st : strategies) {
    pc.list = st.list;
    pc.id_strategy = st.id;
    auto resources = plugin::BuildResources(inv, pc, &health, dir_ + "/driver");
    ASSERT_TRUE(resources.ok()) << resources.status();
    auto alloc = (*resources)[0]->Allocate(ids);
    ASSERT_TRUE(alloc.ok()) << alloc.status();
    std::vector<std::string> env, podman_args;
    for (const auto& [k, v] : alloc->envs()) {
      env.push_back(k + "=" + v);
      podman_args.push_back("-e '" + k + "=" + v + "'");
    }
    // podman splits --annotation at commas (a CSV list) unless the value is quoted.
    for (const auto& [k, v] : alloc->annotations())
      podman_args.push_back("--annotation '\"" + k + "=" + v + "\"'");
    for (const auto& m : alloc->mounts())
      podman_args.push_back("-v " + m.host_path() + ":" + m.container_path() +
                            (m.read_only() ? ":ro" : ""));
    for (const std::string mode : {"auto", "legacy"}) {
      if (mode == "legacy" && st.list.cdi_annotations) continue;  // CDI names mean CDI mode
      SCOPED_TRACE(st.name + " / " + mode);
      WriteConfig(mode, st.accept_env);
      Bundle(probe, env);
      Json spec = Json::parse(ReadFile(dir_ + "/bundle/config.json"));
      for (const auto& [k, v] : alloc->annotations()) spec["annotations"][k] = v;
      for (const auto& m : alloc->mounts())
        spec["mounts"].push_back({{"destination", m.container_path()},
                                  {"type", "bind"},
                                  {"source", m.host_path()},
                                  {"options", {"rbind", m.read_only() ? "ro" : "rw"}}});
      WriteFile(dir_ + "/bundle/config.json", spec.dump());
      ASSERT_EQ(RunShim(&out), 0) << out;
      EXPECT_EQ(GpuNodes(out), want) << out;
      Sh("runc --root " + dir_ + "/runc delete -f " + ContainerId() + " >/dev/null 2>&1");
    }
    if (!podman) continue;
    SCOPED_TRACE(st.name + " / podman");
    WriteConfig("auto", st.accept_env);
    // podman (conmon) starts the runtime with an environment of its own: the wrapper gives the
    // shim this test's configuration.
    WriteFile(
        dir_ + "/shim.sh",
        "#!/bin/sh\nGPULET_RUNTIME_CONFIG=" + dir_ + "/runtime.json exec " + kShim + " \"$@\"\n",
        0755);
    ASSERT_EQ(Sh(p + "--runtime " + dir_ + "/shim.sh run --rm --network none " +
                     absl::StrJoin(podman_args, " ") + " gpulet-xc:latest sh -c '" + probe + "'",
                 &out),
              0)
        << out;
    EXPECT_EQ(GpuNodes(out), want) << out;
  }
  if (podman)
    Sh(p + "rmi -f gpulet-xc:latest >/dev/null");
  else
    GTEST_SKIP() << "runc checked; podman is not installed";
}

// podman: --device nvidia.com/gpu=0 from the generated spec, and --runtime gpulet-container-runtime
// with the device plugin's volume-mount list. podman 4.3 ignores containers.conf `cdi_spec_dirs`
// (tried: "unresolvable CDI devices"), so the spec goes to /var/run/cdi under a unique name for the
// test's duration; the test skips when the machine already has an nvidia.com/gpu spec there.
TEST_F(Node, Podman) {
  if (!Have("podman")) GTEST_SKIP() << "podman is not installed";
  for (const char* d : {"/etc/cdi", "/var/run/cdi"})
    if (fs::exists(d))
      for (const auto& e : fs::directory_iterator(d))
        if (ReadFile(e.path()).find("nvidia.com/gpu") != std::string::npos)
          GTEST_SKIP() << "this machine has its own nvidia.com/gpu CDI spec " << e.path();
  bool made_dir = !fs::exists("/var/run/cdi");
  fs::create_directories("/var/run/cdi");
  std::string spec_file = "/var/run/cdi/gpulet-e2e-" + std::to_string(::getpid()) + ".yaml";
  fs::copy_file(dir_ + "/cdi/nvidia.yaml", spec_file);
  struct Cleanup {
    std::string f;
    bool dir;
    ~Cleanup() {
      fs::remove(f);
      if (dir) fs::remove("/var/run/cdi");
    }
  } cleanup{spec_file, made_dir};
  std::string p, out;
  ASSERT_NO_FATAL_FAILURE(PodmanWithImage("gpulet-e2e:latest", &p));
  ASSERT_EQ(Sh(p + "run --rm --network none --device nvidia.com/gpu=0 gpulet-e2e:latest sh -c '" +
                   kProbe + "'",
               &out),
            0)
      << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("195, +0 .*nvidia0\n")) << out;
  EXPECT_THAT(out, Not(HasSubstr("nvidia1"))) << out;
  EXPECT_THAT(out, HasSubstr("libcuda.so.550.54.15"));
  ASSERT_EQ(Sh("GPULET_RUNTIME_CONFIG=" + dir_ + "/runtime.json " + p + "--runtime " + kShim +
                   " run --rm --network none -v "
                   "/dev/null:/var/run/nvidia-container-devices/3:ro gpulet-e2e:latest sh -c '" +
                   kProbe + "'",
               &out),
            0)
      << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("195, +3 .*nvidia3\n")) << out;
  EXPECT_THAT(out, Not(HasSubstr("nvidia0"))) << out;
  Sh(p + "rmi -f gpulet-e2e:latest >/dev/null");
}

// The containerd daemon (root, state and socket in a temporary dir) runs a podman-saved image with
// `ctr run --runc-binary=<our shim> --env NVIDIA_VISIBLE_DEVICES=0`: privileged, it gets GPU 0; as
// an unprivileged container under the default policy (accept-envvar off), nothing.
TEST_F(Node, ContainerdCtrRun) {
  if (!Have("containerd") || !Have("ctr") || !Have("podman"))
    GTEST_SKIP() << "needs containerd, ctr and podman";
  std::string c = dir_ + "/ctrd";
  fs::create_directories(c);
  WriteFile(c + "/config.toml",
            "version = 2\nroot = \"" + c + "/root\"\nstate = \"" + c +
                "/state\"\n[grpc]\naddress = \"" + c +
                "/sock\"\n"
                "[ttrpc]\naddress = \"\"\n[debug]\naddress = \"\"\n[metrics]\naddress = \"\"\n"
                "[plugins.\"io.containerd.grpc.v1.cri\"]\ndisable_tcp_service = true\n");
  WriteConfig("auto", /*accept_env=*/false);
  std::string p, out;
  ASSERT_NO_FATAL_FAILURE(PodmanWithImage("gpulet-ctr:latest", &p));
  ASSERT_EQ(Sh(p + "save --format oci-archive -o " + c + "/img.tar gpulet-ctr:latest", &out), 0)
      << out;
  // The shim inherits containerd's environment: that is how it finds this test's config.
  ASSERT_EQ(Sh("GPULET_RUNTIME_CONFIG=" + dir_ + "/runtime.json setsid containerd --config " + c +
               "/config.toml >" + c + "/log 2>&1 & echo $! > " + c + "/pid"),
            0);
  std::string ctr = "ctr --address " + c + "/sock ";
  bool up = false;
  for (int i = 0; i < 100 && !up; ++i, ::usleep(100000)) up = Sh(ctr + "version >/dev/null") == 0;
  struct Stop {
    std::string pidfile;
    ~Stop() { Sh("kill $(cat " + pidfile + ") 2>/dev/null; sleep 0.5"); }
  } stop{c + "/pid"};
  ASSERT_TRUE(up) << ReadFile(c + "/log");
  ASSERT_EQ(Sh(ctr + "images import --base-name localhost/gpulet-ctr " + c + "/img.tar", &out), 0)
      << out;
  std::string run = ctr + "run --rm --runc-binary=" + kShim + " --env NVIDIA_VISIBLE_DEVICES=0 ";
  ASSERT_EQ(Sh(run + "--privileged localhost/gpulet-ctr:latest t1 sh -c 'ls -l /dev | grep nvidia'",
               &out),
            0)
      << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("195, +0 .*nvidia0\n")) << out;
  EXPECT_THAT(out, Not(HasSubstr("nvidia1"))) << out;
  Sh(run + "localhost/gpulet-ctr:latest t2 sh -c 'ls -l /dev | grep nvidia; true'", &out);
  EXPECT_THAT(out, Not(::testing::ContainsRegex("nvidia[0-9]"))) << out;
}

// `gpulet agent --cdi-spec` on a simulated MIG node: the spec appears (JSON, whole GPUs and MIG
// devices, "all") while the agent serves, and is not rewritten while the GPU set stays the same
// (same inode across several 200 ms check intervals).
TEST(Agent, KeepsTheCdiSpecOfTheNode) {
  std::string gpulet = kBin + "gpulet";
  if (::access(gpulet.c_str(), X_OK) != 0) GTEST_SKIP() << "gpulet is not built";
  std::string dir = MakeTempDir("agent"), why;
  if (!MakeDriverRoot(dir + "/driver", 0, &why)) GTEST_SKIP() << why;
  fs::create_directories(dir + "/dp");
  fs::create_directories(dir + "/cdi");
  std::string spec = dir + "/cdi/nvidia.json";
  ASSERT_EQ(
      Sh(gpulet + " agent --simulate a100-mig --sim-root " + dir + "/sim --device-plugin-dir " +
         dir + "/dp --kubelet-socket '' --metrics-address 127.0.0.1:0 --labels-output " + dir +
         "/labels --cdi-spec " + spec + " --cdi-driver-root " + dir +
         "/driver --cdi-interval 200ms >" + dir + "/log 2>&1 & echo $! >" + dir + "/pid"),
      0);
  struct Stop {
    std::string dir;
    ~Stop() {
      Sh("kill $(cat " + dir + "/pid) 2>/dev/null; sleep 0.3");
      fs::remove_all(dir);
    }
  } stop{dir};
  for (int i = 0; i < 100 && !fs::exists(spec); ++i) ::usleep(100000);
  ASSERT_TRUE(fs::exists(spec)) << ReadFile(dir + "/log");
  auto parsed = ParseCdiSpec(ReadFile(spec), spec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::set<std::string> names;
  for (const auto& d : parsed->devices) names.insert(d.name);
  EXPECT_TRUE(names.count("0") && names.count("0:0") && names.count("all")) << ReadFile(spec);
  EXPECT_EQ(ReadFile(spec).front(), '{');
  struct stat before, after;
  ASSERT_EQ(::stat(spec.c_str(), &before), 0);
  ::usleep(1000000);
  ASSERT_EQ(::stat(spec.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino) << "rewritten although the GPUs did not change";
}

// containerd parses what `gpulet runtime configure` wrote and shows our runtime.
TEST(Containerd, ConfigDumpAcceptsConfiguredFile) {
  if (!Have("containerd")) GTEST_SKIP() << "containerd is not installed";
  std::string dir = MakeTempDir("ctrd");
  std::string cfg = dir + "/config.toml";
  WriteFile(cfg, "version = 2\nroot = \"" + dir + "/root\"\nstate = \"" + dir + "/state\"\n");
  ConfigureOptions o;  // what `gpulet runtime configure --runtime containerd ...` runs
  o.config_path = cfg;
  o.runtime_path = kShim;
  o.set_as_default = o.enable_cdi = true;
  auto plan = PlanConfigure(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(ApplyChanges(*plan).ok());
  std::string out;
  ASSERT_EQ(Sh("containerd --config " + cfg + " config dump", &out), 0) << out;
  EXPECT_THAT(
      out, HasSubstr("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]"));
  EXPECT_THAT(out, HasSubstr("BinaryName = \"" + kShim + "\""));
  EXPECT_THAT(out, HasSubstr("default_runtime_name = \"nvidia\""));
  // (enable_cdi is written too, but containerd 1.6, Debian 12's, has no CDI and drops the key.)
  auto again = PlanConfigure(o);
  ASSERT_TRUE(again.ok());
  for (const auto& c : *again) EXPECT_FALSE(c.changed()) << c.path;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gpulet::runtime
