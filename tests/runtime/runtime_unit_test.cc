// Unit tests of the runtime pieces: ld cache parsing, CDI generation/parsing, request resolution,
// requirement checks, OCI edits, the shim's bundle editing and argument parsing, rootfs-confined
// path creation, engine configuration. Real files in temporary directories; no containers.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <regex>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cdi.h"
#include "runtime/cdi_refresh.h"
#include "runtime/driver.h"
#include "runtime/edits.h"
#include "runtime/engine_config.h"
#include "runtime/hook.h"
#include "runtime/ldconfig.h"
#include "runtime/request.h"
#include "runtime/rootfs.h"
#include "runtime/shim.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/runtime/fixtures.h"

namespace gpulet::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace ::gpulet::runtime::testing;
namespace fs = std::filesystem;

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("unit");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

Json MinimalSpec(std::vector<std::string> env, bool privileged = false) {
  Json spec = {{"ociVersion", "1.0.2"},
               {"process", {{"args", {"sh"}}, {"env", env}, {"x-unknown-process-field", 7}}},
               {"root", {{"path", "rootfs"}}},
               {"x-vendor-extension", {{"keep", "me"}}}};
  if (privileged) spec["process"]["capabilities"] = {{"bounding", {"CAP_SYS_ADMIN"}}};
  return spec;
}

// The ld cache written by the host's ldconfig for a stand-in driver root parses to its libraries.
TEST_F(TempDirTest, LdCacheFromRealLdconfigListsDriverLibraries) {
  std::string why;
  if (!MakeDriverRoot(dir_, 0, &why)) GTEST_SKIP() << why;
  auto data = ReadFile(dir_ + "/etc/ld.so.cache");
  auto entries = ParseLdCache(data, "cache");
  ASSERT_TRUE(entries.ok()) << entries.status();
  bool found = false;
  for (const auto& e : *entries)
    if (e.name == "libcuda.so.1") {
      found = true;
      EXPECT_EQ(e.path, std::string(kLibDir) + "/libcuda.so.1");  // the soname link
      EXPECT_EQ(e.flags, kLdCacheX8664);
    }
  EXPECT_TRUE(found);
  auto drv = DiscoverDriver(dir_);
  ASSERT_TRUE(drv.ok()) << drv.status();
  EXPECT_EQ(drv->version, kDriverVersion);
  EXPECT_EQ(drv->libraries.size(), 5u);  // links followed to the .so.<version> files
  EXPECT_THAT(drv->libraries,
              ::testing::Contains(std::string(kLibDir) + "/libcuda.so." + kDriverVersion));
  EXPECT_THAT(drv->binaries, ::testing::ElementsAre("/usr/bin/nvidia-smi"));
}

// Issue 24.2: the driver layouts that exist, each as a fake root, through DiscoverDriver and the
// CDI spec `gpulet cdi generate` writes: Debian/Ubuntu packages, RHEL (/usr/lib64), GKE-style
// (/usr/local/nvidia/{lib64,bin}, the cache listing every library again from /lib,
// /usr/bin/nvidia-smi a wrapper script), and a driver container's root under /run/nvidia/driver.
TEST_F(TempDirTest, DriverLayouts) {
  struct Case {
    std::string name, root;
    DriverLayout layout;
    std::string lib_dir;
    std::vector<std::string> binaries;
    std::vector<std::pair<std::string, std::string>> aliases;
  } cases[] = {
      {"debian", "/debian", {}, kLibDir, {"/usr/bin/nvidia-smi"}, {}},
      {"rhel", "/rhel", {"/usr/lib64"}, "/usr/lib64", {"/usr/bin/nvidia-smi"}, {}},
      {"gke",
       "/gke",
       {"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", "/usr/bin", "/lib"},
       "/usr/local/nvidia/lib64",
       {"/usr/local/nvidia/bin/nvidia-smi"},
       {{"/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi"}}},
      {"driver-container", "/run/nvidia/driver", {}, kLibDir, {"/usr/bin/nvidia-smi"}, {}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string root = dir_ + "/" + c.name + c.root, why;
    if (!MakeDriverRoot(root, 0, &why, c.layout)) GTEST_SKIP() << why;
    // A library the cache does not list is found in the driver's directory; a file there with
    // the driver's suffix that is no x86-64 ELF is not.
    std::string v = kDriverVersion;
    ASSERT_TRUE(
        BuildLibrary(root + c.lib_dir + "/libnvidia-late.so." + v, "libnvidia-late.so." + v));
    WriteFile(root + c.lib_dir + "/libnvidia-notelf.so." + v, "not ELF");
    auto drv = DiscoverDriver(root);
    ASSERT_TRUE(drv.ok()) << drv.status();
    ASSERT_EQ(drv->libraries.size(), 6u) << ::testing::PrintToString(drv->libraries);
    EXPECT_THAT(drv->libraries, ::testing::Contains(c.lib_dir + "/libnvidia-late.so." + v));
    for (const auto& l : drv->libraries) EXPECT_EQ(l.substr(0, l.rfind('/')), c.lib_dir);
    EXPECT_EQ(drv->binaries, c.binaries);
    EXPECT_EQ(drv->binary_aliases, c.aliases);
    CdiGenerateOptions opt;
    opt.driver_root = root;
    auto spec = GenerateCdiSpec(FakeInventory(1), opt);
    ASSERT_TRUE(spec.ok()) << spec.status();
    std::map<std::string, std::string> mounts;  // container path -> host path
    for (const auto& m : spec->edits.mounts) {
      EXPECT_TRUE(fs::exists(m.host_path)) << m.host_path;
      EXPECT_TRUE(mounts.emplace(m.container_path, m.host_path).second) << m.container_path;
    }
    EXPECT_EQ(mounts.size(), 6 + c.binaries.size() + c.aliases.size());
    for (const auto& [from, at] : c.aliases) EXPECT_EQ(mounts[at], root + from);
    ASSERT_EQ(spec->edits.hooks.size(), 1u);  // ldconfig's folders: the mounted library dir
    EXPECT_EQ(spec->edits.hooks[0].args,
              std::vector<std::string>(
                  {"gpulet-container-hook", "update-ldcache", "--folder", c.lib_dir}));
  }
  // The default root "/" without a driver falls back to the driver container's root.
  auto host = DiscoverDriver("/");
  if (host.ok() &&
      std::any_of(host->libraries.begin(), host->libraries.end(),
                  [](const std::string& l) { return l.find("/libcuda.so.") != std::string::npos; }))
    GTEST_SKIP() << "this host has an NVIDIA driver under /";
  CdiGenerateOptions opt;
  opt.driver_container_root = dir_ + "/driver-container/run/nvidia/driver";
  std::vector<std::string> warnings;
  auto spec = GenerateCdiSpec(FakeInventory(1), opt, &warnings);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_FALSE(spec->edits.mounts.empty());
  for (const auto& m : spec->edits.mounts)
    EXPECT_THAT(m.host_path, ::testing::StartsWith(opt.driver_container_root + "/")) << m.host_path;
  EXPECT_THAT(absl::StrJoin(warnings, "\n"), HasSubstr("using the driver container's root"));
}

// An agent in a container (runc injected no driver) loads the host's NVML under --host-root: the
// host's own driver first, else a driver container's root; neither is an error naming both.
TEST_F(TempDirTest, FindNvmlLibraryOnTheHostThenInADriverContainer) {
  std::string why;
  const std::string lib = std::string(kLibDir) + "/libnvidia-ml.so." + kDriverVersion;
  std::string host = dir_ + "/host";
  if (!MakeDriverRoot(host, 0, &why)) GTEST_SKIP() << why;
  auto found = FindNvmlLibrary(host);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, host + lib);

  std::string bare = dir_ + "/bare";  // no driver of its own: the driver container's
  ASSERT_TRUE(MakeDriverRoot(bare + "/run/nvidia/driver", 0, &why)) << why;
  found = FindNvmlLibrary(bare);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, bare + "/run/nvidia/driver" + lib);

  found = FindNvmlLibrary(dir_ + "/nothing");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(), HasSubstr(dir_ + "/nothing/run/nvidia/driver"));
}

// sharing.mps from the agent's container (no driver of its own): the host driver's programs are
// linked with their libraries by soname, so a program run with LD_LIBRARY_PATH=lib/ loads the
// driver's libnvidia-ml.so.1; on a GKE-style host the link is to the ELF, not the wrapper script;
// a driver container's root when the host has none; neither is NotFound naming both roots.
TEST_F(TempDirTest, LinkDriverToolsOnTheHostThenInADriverContainer) {
  std::string why;
  const std::string host = dir_ + "/gke", links = dir_ + "/links";
  if (!MakeDriverRoot(host, 0, &why,
                      {"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", "/usr/bin", "/lib"}))
    GTEST_SKIP() << why;
  auto t = LinkDriverTools(host, links);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->root, host);
  EXPECT_EQ(fs::read_symlink(t->bin_dir + "/nvidia-smi"),
            host + "/usr/local/nvidia/bin/nvidia-smi");
  const std::string v = kDriverVersion;
  for (const std::string& name :
       {std::string("libnvidia-ml.so.1"), std::string("libcuda.so.1"), "libcuda.so." + v})
    EXPECT_THAT(fs::read_symlink(t->lib_dir + "/" + name).string(),
                ::testing::StartsWith(host + "/usr/local/nvidia/lib64/"))
        << name;
  EXPECT_FALSE(fs::exists(t->lib_dir + "/libc.so.6")) << "the host's C library stays out";

  // What the MPS daemon does: dlopen the driver's libraries by soname.
  const std::string prog = dir_ + "/dlopen-nvml";
  WriteFile(prog + ".c",
            "#include <dlfcn.h>\nint main(void) { return dlopen(\"libnvidia-ml.so.1\", "
            "RTLD_NOW) ? 0 : 1; }\n");
  std::string out;
  ASSERT_EQ(Sh("cc -o '" + prog + "' '" + prog + ".c' -ldl", &out), 0) << out;
  EXPECT_EQ(Sh("LD_LIBRARY_PATH='" + t->lib_dir + "' '" + prog + "'", &out), 0) << out;

  // Again (an agent restart in the same pod): the old links are replaced.
  t = LinkDriverTools(host, links);
  ASSERT_TRUE(t.ok()) << t.status();

  const std::string bare = dir_ + "/bare";  // no driver of its own: the driver container's
  ASSERT_TRUE(MakeDriverRoot(bare + "/run/nvidia/driver", 0, &why)) << why;
  t = LinkDriverTools(bare, links);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(fs::read_symlink(t->bin_dir + "/nvidia-smi"),
            bare + "/run/nvidia/driver/usr/bin/nvidia-smi");

  t = LinkDriverTools(dir_ + "/nothing", links);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr(dir_ + "/nothing/run/nvidia/driver"));
}

// A process that sees the host under a mount (the agent's DRA driver at /host, the installer)
// reads the driver there, the driver container's root included, and the spec names host paths:
// the engine that applies it runs on the host. Before, the agent read its own image's root.
TEST_F(TempDirTest, HostRootReadsUnderTheMountAndNamesHostPaths) {
  std::string why;
  const std::string host = dir_ + "/host", in_container = dir_ + "/dc-host";
  if (!MakeDriverRoot(host, 0, &why)) GTEST_SKIP() << why;
  if (!MakeDriverRoot(in_container + "/run/nvidia/driver", 0, &why)) GTEST_SKIP() << why;
  CdiGenerateOptions opt;
  opt.host_root = host;
  auto spec = GenerateCdiSpec(FakeInventory(1), opt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_FALSE(spec->edits.mounts.empty());
  for (const auto& m : spec->edits.mounts) {
    EXPECT_THAT(m.host_path, ::testing::Not(HasSubstr(host))) << m.host_path;
    EXPECT_TRUE(std::filesystem::exists(host + m.host_path)) << m.host_path;
  }
  for (const auto& d : spec->devices)
    for (const auto& n : d.edits.device_nodes)
      EXPECT_THAT(n.host_path, ::testing::Not(HasSubstr(host))) << n.path;
  EXPECT_EQ(spec->edits.hooks.at(0).args.back(), kLibDir);

  // A trailing slash names the same mount.
  opt.host_root = host + "/";
  auto slashed = GenerateCdiSpec(FakeInventory(1), opt);
  ASSERT_TRUE(slashed.ok()) << slashed.status();
  EXPECT_EQ(CdiSpecToJson(*slashed), CdiSpecToJson(*spec));

  // No driver under the host's /: its driver container's root, under the mount too.
  opt.host_root = in_container;
  std::vector<std::string> warnings;
  spec = GenerateCdiSpec(FakeInventory(1), opt, &warnings);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_FALSE(spec->edits.mounts.empty());
  for (const auto& m : spec->edits.mounts)
    EXPECT_THAT(m.host_path, ::testing::StartsWith("/run/nvidia/driver/")) << m.host_path;
  EXPECT_THAT(absl::StrJoin(warnings, "\n"), HasSubstr("root /run/nvidia/driver"));
}

// Truncated, foreign or corrupted ld caches are one clear error, never a crash.
TEST(LdCache, BadInputsAreErrors) {
  EXPECT_THAT(std::string(ParseLdCache("", "c").status().message()),
              HasSubstr("not a glibc ld.so.cache"));
  EXPECT_FALSE(ParseLdCache("garbage garbage garbage garbage garbage garbage", "c").ok());
  std::string h = "glibc-ld.so.cache1.1";
  h.resize(48, '\0');
  std::string many = h;
  uint32_t n = 1000;
  std::memcpy(many.data() + 20, &n, 4);
  EXPECT_THAT(std::string(ParseLdCache(many, "c").status().message()), HasSubstr("truncated"));
  std::string bad = h;
  n = 1;
  std::memcpy(bad.data() + 20, &n, 4);
  std::string entry(24, '\0');
  uint32_t off = 1u << 30;
  std::memcpy(entry.data() + 4, &off, 4);
  bad += entry;
  EXPECT_THAT(std::string(ParseLdCache(bad, "c").status().message()), HasSubstr("outside"));
}

// Generated specs name devices per strategy (docs/runtime.md) and read back the same.
TEST_F(TempDirTest, GeneratedSpecNamesAndRoundTrip) {
  std::string why;
  if (!MakeDriverRoot(dir_, 2, &why)) GTEST_SKIP() << why;
  WriteFile(
      dir_ + "/proc/driver/nvidia-caps/mig-minors",
      "gpu0/gi1/access 21\ngpu0/gi1/ci0/access 22\ngpu0/gi2/access 30\ngpu0/gi2/ci0/access 31\n");
  CdiGenerateOptions opt;
  opt.driver_root = dir_;
  auto spec = GenerateCdiSpec(FakeInventory(2, /*mig=*/true), opt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<std::string> names;
  for (const auto& d : spec->devices) names.push_back(d.name);
  EXPECT_THAT(
      names, ::testing::UnorderedElementsAre("0", "GPU-00000000-1111-2222-3333-444444444444", "0:0",
                                             "MIG-00000000-aaaa-bbbb-cccc-dddddddddddd", "0:1",
                                             "MIG-00000001-aaaa-bbbb-cccc-dddddddddddd", "1",
                                             "GPU-00000001-1111-2222-3333-444444444444", "all"));
  EXPECT_EQ(spec->kind, "nvidia.com/gpu");
  EXPECT_EQ(spec->cdi_version, "0.5.0");  // hostPath (driver root is not "/")
  for (const auto& d : spec->devices) {
    if (d.name == "0:1") {
      ASSERT_EQ(d.edits.device_nodes.size(), 3u);
      EXPECT_EQ(d.edits.device_nodes[1].path, "/dev/nvidia-caps/nvidia-cap30");
    }
    // "all" is every device, MIG devices' capability nodes included (as nvidia-ctk's): without
    // them a container asking for all GPUs on a MIG node sees no MIG device (tests/compat/cdi.sh).
    if (d.name == "all") {
      std::vector<std::string> paths;
      for (const auto& n : d.edits.device_nodes) paths.push_back(n.path);
      EXPECT_THAT(paths, ::testing::UnorderedElementsAre(
                             "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21",
                             "/dev/nvidia-caps/nvidia-cap22", "/dev/nvidia-caps/nvidia-cap30",
                             "/dev/nvidia-caps/nvidia-cap31"));
    }
  }
  for (bool json : {false, true}) {
    std::string text = json ? CdiSpecToJson(*spec) : CdiSpecToYaml(*spec);
    auto back = ParseCdiSpec(text, "gen");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
    ASSERT_EQ(back->devices.size(), spec->devices.size());
    for (size_t i = 0; i < back->devices.size(); ++i) {
      EXPECT_EQ(back->devices[i].name, spec->devices[i].name);
      EXPECT_EQ(back->devices[i].edits.device_nodes.size(),
                spec->devices[i].edits.device_nodes.size());
    }
    EXPECT_EQ(back->edits.mounts.size(), spec->edits.mounts.size());
    EXPECT_EQ(back->edits.hooks.size(), 1u);
    EXPECT_EQ(back->edits.hooks[0].env,
              std::vector<std::string>{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"});
  }
  // JSON takes a faster reader than YAML; both must read the same spec.
  auto from_yaml = ParseCdiSpec(CdiSpecToYaml(*spec), "y"),
       from_json = ParseCdiSpec(CdiSpecToJson(*spec), "y");
  ASSERT_TRUE(from_yaml.ok() && from_json.ok());
  EXPECT_EQ(CdiSpecToJson(*from_json), CdiSpecToJson(*from_yaml));
  opt.names = NameStrategy::kIndex;
  auto idx = GenerateCdiSpec(FakeInventory(2), opt);
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->devices.size(), 3u);  // "0", "1", "all"
}

// Malformed CDI specs are rejected with file:line.
TEST(CdiSpec, MalformedSpecsNameFileAndLine) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n    "
       "deviceNodes:\n    - path: dev/nvidia0\n",
       "x.yaml:7: deviceNodes.path \"dev/nvidia0\" is not absolute"},
      {"cdiVersion: 0.5.0\nkind: nvidia\ndevices: []\n",
       "x.yaml:2: kind \"nvidia\" is not vendor/class"},
      {"cdiVersion: 9.9.9\nkind: a.com/b\n", "unsupported cdiVersion"},
      {"cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- name: x\n  containerEdits:\n    hooks:\n    "
       "- hookName: sometime\n      path: /bin/true\n",
       "x.yaml:7: unknown hookName"},
      {"cdiVersion: 0.5.0\nkind: a.com/b\ndevices: [\n", "x.yaml:"},
      {"[1, 2]", "must be a mapping"},
      {"cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- name: 'a b'\n  containerEdits: {}\n",
       "invalid device name"},
      // JSON (the fast reader) still names the line of a bad value.
      {"{\"cdiVersion\": \"0.5.0\",\n \"kind\": \"nvidia\",\n \"devices\": []}",
       "x.yaml:2: kind \"nvidia\""},
      {"{\"cdiVersion\": \"0.5.0\", \"kind\": \"a.com/b\",\n\"devices\": [{\"name\": "
       "\"0\",\n\"containerEdits\": "
       "{\"deviceNodes\": [{\"path\": \"/dev/x\",\n \"major\": \"one\"}]}}]}",
       "x.yaml:4: major must be a number"},
  };
  for (const auto& c : cases) {
    auto s = ParseCdiSpec(c.text, "x.yaml");
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.want));
  }
}

// The version a spec must declare follows what it uses, as the CDI library in containerd and CRI-O
// checks it: a DRA claim's devices are named by its uid, which starts with a digit 10 times in 16,
// and a 0.3.0 spec of such a device was skipped by containerd 2 ("unresolvable CDI devices",
// found on the real cluster when the device nodes needed no host path).
TEST(CdiSpec, VersionFollowsWhatTheSpecUses) {
  CdiSpec s;
  s.kind = "gpu.gpulet.io/claim";
  s.devices.push_back({"abc-gpu-0", {}});
  s.devices[0].edits.device_nodes.push_back({"/dev/nvidia0"});
  EXPECT_EQ(MinimumCdiVersion(s), "0.3.0");
  s.devices[0].name = "57ba550e-gpu-0";
  EXPECT_EQ(MinimumCdiVersion(s), "0.5.0") << "a device name starting with a digit";
  s.kind = "nvidia.com/gpu.shared";
  EXPECT_EQ(MinimumCdiVersion(s), "0.6.0") << "a dot in the kind's class";
  s.kind = "nvidia.com/gpu";
  s.devices[0].name = "a";
  s.edits.mounts.push_back({"/h", "/c", "bind", {"ro"}});
  EXPECT_EQ(MinimumCdiVersion(s), "0.4.0") << "a mount type";

  // Read back: a spec that declares less than it uses is refused, naming the version it needs.
  auto old = ParseCdiSpec(
      "cdiVersion: 0.3.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n"
      "    deviceNodes:\n    - path: /dev/nvidia0\n",
      "x.yaml");
  ASSERT_FALSE(old.ok());
  EXPECT_THAT(std::string(old.status().message()),
              HasSubstr("x.yaml:1: cdiVersion \"0.3.0\" is too old for what the spec uses: it "
                        "must be at least 0.5.0"));
  EXPECT_TRUE(ParseCdiSpec("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n"
                           "  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n",
                           "x.yaml")
                  .ok());
}

// One invalid spec in a CDI directory (another vendor's, an older gpulet's 0.3.0 spec of a claim
// whose uid starts with a digit) is skipped, as containerd skips it; the other specs' devices still
// resolve, and asking for a device it would have held names the file and what is wrong.
TEST_F(TempDirTest, AnInvalidSpecIsSkippedNotFatal) {
  WriteFile(dir_ + "/cdi/good.yaml",
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n"
            "    deviceNodes:\n    - path: /dev/nvidia0\n");
  WriteFile(dir_ + "/cdi/old-claim.json",
            "{\"cdiVersion\": \"0.3.0\", \"kind\": \"gpu.gpulet.io/claim\", \"devices\": "
            "[{\"name\": \"5b-gpu-0\", \"containerEdits\": {\"deviceNodes\": [{\"path\": "
            "\"/dev/nvidia1\"}]}}]}\n");
  WriteFile(dir_ + "/cdi/broken.yaml", "cdiVersion: [\n");
  CdiRegistry reg;
  ASSERT_TRUE(reg.Load({dir_ + "/cdi"}).ok());
  EXPECT_EQ(reg.skipped().size(), 2u);
  auto good = reg.Resolve({"nvidia.com/gpu=0"});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->device_nodes.at(0).path, "/dev/nvidia0");
  auto old = reg.Resolve({"gpu.gpulet.io/claim=5b-gpu-0"});
  ASSERT_FALSE(old.ok());
  EXPECT_THAT(std::string(old.status().message()),
              AllOf(HasSubstr("unresolvable CDI device gpu.gpulet.io/claim=5b-gpu-0"),
                    HasSubstr(dir_ + "/cdi/old-claim.json:1: cdiVersion \"0.3.0\" is too old"),
                    HasSubstr(dir_ + "/cdi/broken.yaml")));
}

// An unprivileged image's own NVIDIA_VISIBLE_DEVICES grants nothing by default; privileged
// containers, the opt-in setting, volume mounts and CDI annotations do.
TEST(Request, EnvvarTrustAndSources) {
  RuntimeConfig cfg;
  auto r = ResolveRequest(MinimalSpec({"NVIDIA_VISIBLE_DEVICES=all"}), cfg);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->gpu_container);
  r = ResolveRequest(MinimalSpec({"NVIDIA_VISIBLE_DEVICES=all"}, /*privileged=*/true), cfg);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->devices, ::testing::ElementsAre("nvidia.com/gpu=all"));
  cfg.accept_envvar_when_unprivileged = true;
  r = ResolveRequest(MinimalSpec({"NVIDIA_VISIBLE_DEVICES=1,GPU-abc, 0:1"}), cfg);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->devices, ::testing::ElementsAre("nvidia.com/gpu=1", "nvidia.com/gpu=GPU-abc",
                                                 "nvidia.com/gpu=0:1"));
  EXPECT_EQ(r->capabilities, (std::set<std::string>{"utility", "compute"}));
  for (const char* v : {"void", ""}) {
    r = ResolveRequest(MinimalSpec({std::string("NVIDIA_VISIBLE_DEVICES=") + v}), cfg);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->gpu_container) << v;
  }
  r = ResolveRequest(MinimalSpec({"NVIDIA_VISIBLE_DEVICES=none"}), cfg);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->gpu_container);
  EXPECT_TRUE(r->devices.empty());

  RuntimeConfig def;
  Json vol = MinimalSpec({"NVIDIA_VISIBLE_DEVICES=all"});
  vol["mounts"] = {{{"destination", "/var/run/nvidia-container-devices/GPU-0a"},
                    {"source", "/dev/null"},
                    {"type", "bind"}}};
  r = ResolveRequest(vol, def);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->devices, ::testing::ElementsAre("nvidia.com/gpu=GPU-0a"));
  Json ann = MinimalSpec({});
  ann["annotations"] = {{"cdi.k8s.io/gpulet", "nvidia.com/gpu=0,nvidia.com/gpu=1"}};
  r = ResolveRequest(ann, def);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->from_cdi);
  EXPECT_THAT(r->devices, ::testing::ElementsAre("nvidia.com/gpu=0", "nvidia.com/gpu=1"));
  ann["annotations"]["cdi.k8s.io/gpulet"] = "not a name";
  EXPECT_FALSE(ResolveRequest(ann, def).ok());
  auto bad = ResolveRequest(
      MinimalSpec({"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,warp"}, true),
      def);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown capability \"warp\""));
}

// Issue 14.1: only the device plugin's grant (a bind of /dev/null at
// /var/run/nvidia-container-devices/<id>, with an id the plugin issues) asks for GPUs. An emptyDir
// or image VOLUME at /var/run/nvidia-container-devices/all used to give every GPU.
TEST(Request, VolumeMountGrantsOnlyFromTheDevicePlugin) {
  RuntimeConfig cfg;
  auto with = [](Json mount) {
    Json spec = MinimalSpec({});
    spec["mounts"] = Json::array({mount});
    return spec;
  };
  auto mount = [](const std::string& dst, const std::string& src, const std::string& type,
                  std::vector<std::string> opts = {"rbind", "ro"}) {
    Json m = {{"destination", dst}, {"source", src}, {"options", opts}};
    if (!type.empty()) m["type"] = type;
    return m;
  };
  const std::string dir = "/var/run/nvidia-container-devices/";
  struct Grant {
    Json m;
    std::string device;
  } grants[] = {
      {mount(dir + "GPU-00000002-1111-2222-3333-444444444444", "/dev/null", "bind"),
       "nvidia.com/gpu=GPU-00000002-1111-2222-3333-444444444444"},
      {mount(dir + "3", "/dev/null", "bind"), "nvidia.com/gpu=3"},
      {mount(dir + "0:1", "//dev/./null", "", {"bind", "ro"}), "nvidia.com/gpu=0:1"},
      {mount(dir + "MIG-aaaa-bbbb/", "/dev/null", "bind"), "nvidia.com/gpu=MIG-aaaa-bbbb"},
      {mount("/var/run/x/../nvidia-container-devices/1", "/dev/null", "bind"), "nvidia.com/gpu=1"},
  };
  for (const auto& g : grants) {
    auto r = ResolveRequest(with(g.m), cfg);
    ASSERT_TRUE(r.ok()) << g.m << r.status();
    EXPECT_THAT(r->devices, ::testing::ElementsAre(g.device)) << g.m;
  }
  // Not the plugin's grant: an ordinary mount that asks for nothing.
  const std::string empty_dir = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~empty-dir/x";
  for (const Json& m :
       {mount(dir + "all", empty_dir, "bind"),
        mount(dir + "all", "/var/lib/docker/volumes/v/_data", "", {"rbind"}),
        mount(dir + "0", "tmpfs", "tmpfs", {"nosuid"}), mount(dir + "0", "/dev/null", "", {"ro"}),
        mount(dir + "0", "/dev/null/../zero", "bind"),
        mount(dir + "../../../etc/0", "/dev/null", "bind"),
        mount("/var/run/nvidia-container-devices", "/dev/null", "bind")}) {
    auto r = ResolveRequest(with(m), cfg);
    ASSERT_TRUE(r.ok()) << m << r.status();
    EXPECT_FALSE(r->gpu_container) << m;
  }
  // /dev/null at an id the plugin never issues: refused, naming the mount.
  for (const char* id : {"all", "none", "0/1", "nvidia.com/gpu=0", "GPU-../../x", "-1", ""}) {
    Json m = mount(dir + id + (std::string(id).empty() ? "." : ""), "/dev/null", "bind");
    auto r = ResolveRequest(with(m), cfg);
    if (std::string(id).empty()) {  // the directory itself: not a grant
      ASSERT_TRUE(r.ok());
      EXPECT_FALSE(r->gpu_container);
      continue;
    }
    ASSERT_FALSE(r.ok()) << id;
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("is not a device id the device plugin issues"));
  }
}

// NVIDIA_REQUIRE_* expressions: space is OR, comma is AND; unmet ones are named.
TEST(Request, Requirements) {
  DriverFacts f{"550.54.15", "12.4"};
  EXPECT_TRUE(CheckRequirements({"cuda>=12.4"}, f).ok());
  EXPECT_TRUE(CheckRequirements({"cuda>=12.0,driver>=550"}, f).ok());
  EXPECT_TRUE(CheckRequirements({"cuda>=13.0 driver>=550"}, f).ok());
  auto s = CheckRequirements({"cuda>=12.5"}, f);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("unsatisfied requirement \"cuda>=12.5\""));
  EXPECT_FALSE(CheckRequirements({"cuda>=12.0,driver<550"}, f).ok());
  EXPECT_THAT(std::string(CheckRequirements({"gpu>=1"}, f).message()),
              HasSubstr("unsupported constraint"));
}

// Edits keep unknown fields, and a failing edit leaves the spec as it was.
TEST(Edits, PreserveUnknownFieldsAllOrNothing) {
  Json spec = MinimalSpec({"A=1"});
  ContainerEdits e;
  e.env = {"A=2", "B=3"};
  DeviceNode d;
  d.path = "/dev/nvidia0";
  d.major = 195, d.minor = 0, d.file_mode = 0666;
  e.device_nodes.push_back(d);
  e.mounts.push_back({"/h/libcuda.so.1", "/usr/lib/libcuda.so.1", "", {}});
  ASSERT_TRUE(ApplyEdits(e, spec).ok());
  EXPECT_EQ(spec["x-vendor-extension"]["keep"], "me");
  EXPECT_EQ(spec["process"]["x-unknown-process-field"], 7);
  EXPECT_EQ(spec["process"]["env"], Json({"A=2", "B=3"}));
  EXPECT_EQ(spec["linux"]["devices"][0]["major"], 195);
  EXPECT_EQ(spec["linux"]["resources"]["devices"][0]["access"], "rwm");
  EXPECT_EQ(spec["mounts"][0]["options"][0], "ro");
  Json broken = MinimalSpec({});
  broken["linux"] = {{"devices", "not a list"}};
  Json before = broken;
  EXPECT_FALSE(ApplyEdits(e, broken).ok());
  EXPECT_EQ(broken, before);
}

// runc's command line: global flags with values, the command, --bundle in its forms.
TEST(Shim, ParsesRuncArguments) {
  auto a = ParseRuncArgs({"--root", "/run/x", "--log", "/l.json", "--log-format", "json", "create",
                          "--bundle", "/b", "--pid-file", "/p", "id"});
  EXPECT_EQ(a.command, "create");
  EXPECT_EQ(a.bundle, "/b");
  EXPECT_EQ(a.log_file, "/l.json");
  EXPECT_EQ(a.log_format, "json");
  EXPECT_EQ(ParseRuncArgs({"--systemd-cgroup", "run", "-b", "/c", "id"}).bundle, "/c");
  EXPECT_EQ(ParseRuncArgs({"create", "--bundle=/d", "id"}).bundle, "/d");
  EXPECT_EQ(ParseRuncArgs({"state", "id"}).command, "state");
  EXPECT_EQ(ParseRuncArgs({"create", "id"}).bundle, ".");
}

// The OCI state on stdin is validated.
TEST(Hook, ContainerStateValidation) {
  EXPECT_TRUE(
      ParseContainerState(R"({"ociVersion":"1.0.2","id":"x","pid":42,"bundle":"/b"})").ok());
  EXPECT_TRUE(ParseContainerState(R"({"pid":42,"bundlePath":"/b"})").ok());
  for (const char* bad :
       {"", "{", "[]", R"({"pid":0,"bundle":"/b"})", R"({"pid":"1","bundle":"/b"})",
        R"({"pid":1,"bundle":"rel"})", R"({"pid":1})"})
    EXPECT_FALSE(ParseContainerState(bad).ok()) << bad;
}

// Issue 24.1 / 14.9: the host layouts of ldconfig. Ubuntu: /sbin/ldconfig is a #!/bin/sh wrapper
// around the static /sbin/ldconfig.real; Debian: /sbin/ldconfig is the static ELF; RHEL family:
// /usr/sbin/ldconfig (where /sbin is not merged). A script is never chosen, a dynamically linked
// ELF is refused.
TEST_F(TempDirTest, LdconfigLayouts) {
  std::string static_elf = HostStaticLdconfig();
  if (static_elf.empty()) GTEST_SKIP() << "no static host ldconfig to copy";
  const std::string wrapper = "#!/bin/sh\n# dpkg trigger logic\nexec /sbin/ldconfig.real \"$@\"\n";
  auto copy = [&](const std::string& to) {
    fs::create_directories(fs::path(to).parent_path());
    fs::copy_file(static_elf, to, fs::copy_options::overwrite_existing);
  };
  // Ubuntu.
  std::string ubuntu = dir_ + "/ubuntu";
  WriteFile(ubuntu + "/sbin/ldconfig", wrapper, 0755);
  copy(ubuntu + "/sbin/ldconfig.real");
  auto ld = OpenLdconfig("", ubuntu);
  ASSERT_TRUE(ld.ok()) << ld.status();
  EXPECT_EQ(ld->path, ubuntu + "/sbin/ldconfig.real");
  ld = OpenLdconfig(ubuntu + "/sbin/ldconfig");  // configured as the wrapper: its .real
  ASSERT_TRUE(ld.ok()) << ld.status();
  EXPECT_EQ(ld->path, ubuntu + "/sbin/ldconfig.real");
  // Debian.
  std::string debian = dir_ + "/debian";
  copy(debian + "/sbin/ldconfig");
  ld = OpenLdconfig("", debian + "/");
  ASSERT_TRUE(ld.ok()) << ld.status();
  EXPECT_EQ(ld->path, debian + "/sbin/ldconfig");
  // RHEL family without a merged /sbin.
  std::string rhel = dir_ + "/rhel";
  copy(rhel + "/usr/sbin/ldconfig");
  ld = OpenLdconfig("", rhel);
  ASSERT_TRUE(ld.ok()) << ld.status();
  EXPECT_EQ(ld->path, rhel + "/usr/sbin/ldconfig");
  // A wrapper without the binary it wraps: one error naming the file and why.
  std::string wrapped = dir_ + "/wrapped";
  WriteFile(wrapped + "/sbin/ldconfig", wrapper, 0755);
  ld = OpenLdconfig("", wrapped);
  ASSERT_FALSE(ld.ok());
  EXPECT_THAT(std::string(ld.status().message()),
              HasSubstr(wrapped + "/sbin/ldconfig is a script"));
  // A dynamically linked ldconfig would load the image's ld.so as host root.
  std::string dynamic = dir_ + "/dynamic";
  fs::create_directories(dynamic + "/sbin");
  fs::copy_file("/bin/true", dynamic + "/sbin/ldconfig");
  ld = OpenLdconfig("", dynamic);
  ASSERT_FALSE(ld.ok());
  EXPECT_THAT(std::string(ld.status().message()), HasSubstr("dynamically linked (PT_INTERP)"));
  // Not an executable at all, and nothing there.
  WriteFile(dir_ + "/text/sbin/ldconfig", "hello world, not ELF", 0755);
  EXPECT_THAT(std::string(OpenLdconfig("", dir_ + "/text").status().message()),
              HasSubstr("not an ELF executable"));
  EXPECT_EQ(OpenLdconfig("", dir_ + "/none").status().code(), absl::StatusCode::kNotFound);
  // The runtime config: the key is optional (auto), but when given it must be absolute.
  WriteFile(dir_ + "/rt.json", "{\"ldconfig\": \"ldconfig\"}");
  EXPECT_FALSE(LoadRuntimeConfig(dir_ + "/rt.json").ok());
  WriteFile(dir_ + "/rt.json", "{}");
  auto cfg = LoadRuntimeConfig(dir_ + "/rt.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->ldconfig, "");
}

class BundleTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    fs::create_directories(dir_ + "/bundle/rootfs");
    fs::create_directories(dir_ + "/cdi");
    WriteFile(dir_ + "/host/nvidia0", "");
    WriteFile(dir_ + "/host/libcuda.so.550.54.15", "");
    // Device nodes carry their numbers, so no host node (or root) is needed here.
    WriteFile(dir_ + "/cdi/nvidia.yaml",
              "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
              "- name: '0'\n  containerEdits:\n    deviceNodes:\n"
              "    - {path: /dev/nvidia0, type: c, major: 195, minor: 0, fileMode: 438}\n"
              "containerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n"
              "  deviceNodes:\n  - {path: /dev/nvidiactl, type: c, major: 195, minor: 255, "
              "fileMode: 438}\n"
              "  mounts:\n  - {hostPath: " +
                  dir_ +
                  "/host/libcuda.so.550.54.15, containerPath: "
                  "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15, options: [ro, nosuid, nodev, "
                  "bind]}\n");
    cfg_.spec_dirs = {dir_ + "/cdi"};
    cfg_.accept_envvar_when_unprivileged = true;
  }
  std::string Config() { return dir_ + "/bundle/config.json"; }
  RuntimeConfig cfg_;
};

// CDI mode: the requested device, the shared edits, unknown fields kept; no request: untouched.
TEST_F(BundleTest, ShimAppliesCdiEdits) {
  WriteFile(Config(), MinimalSpec({"NVIDIA_VISIBLE_DEVICES=0"}).dump());
  auto r = ModifyBundle(dir_ + "/bundle", cfg_);
  ASSERT_TRUE(r.ok()) << r.status();
  Json spec = Json::parse(ReadFile(Config()));
  EXPECT_EQ(spec["x-vendor-extension"]["keep"], "me");
  ASSERT_EQ(spec["linux"]["devices"].size(), 2u);
  EXPECT_EQ(spec["linux"]["devices"][0]["path"], "/dev/nvidiactl");
  EXPECT_EQ(spec["linux"]["devices"][1]["path"], "/dev/nvidia0");
  EXPECT_EQ(GetEnv(spec, "NVIDIA_VISIBLE_DEVICES"), "void");
  EXPECT_EQ(spec["mounts"][0]["destination"], "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");

  std::string plain = MinimalSpec({"PATH=/bin"}).dump();
  WriteFile(Config(), plain);
  r = ModifyBundle(dir_ + "/bundle", cfg_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "no GPU request");
  EXPECT_EQ(ReadFile(Config()), plain);
}

// Malformed config.json and unknown devices fail and leave config.json intact; a broken CDI spec
// beside the good one is skipped (as containerd skips it) and named when a device is not found.
TEST_F(BundleTest, ShimFailuresLeaveConfigIntact) {
  for (std::string text : {std::string("{\"ociVersion\": \"1.0.2\", \"process\": "),
                           std::string("[]"), std::string("{\"ociVersion\":\"1\",\"root\":{}}")}) {
    WriteFile(Config(), text);
    auto r = ModifyBundle(dir_ + "/bundle", cfg_);
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("config.json"));
    EXPECT_EQ(ReadFile(Config()), text);
  }
  std::string unknown = MinimalSpec({"NVIDIA_VISIBLE_DEVICES=7"}).dump();
  WriteFile(Config(), unknown);
  auto r = ModifyBundle(dir_ + "/bundle", cfg_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("unresolvable CDI device nvidia.com/gpu=7"));
  EXPECT_EQ(ReadFile(Config()), unknown);
  WriteFile(dir_ + "/cdi/broken.json", "{\"cdiVersion\": \"0.5.0\", \"kind\": 3");
  WriteFile(Config(), unknown);
  r = ModifyBundle(dir_ + "/bundle", cfg_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("unresolvable CDI device nvidia.com/gpu=7"),
                    HasSubstr("specs skipped as invalid"), HasSubstr("broken.json:1")));
  EXPECT_EQ(ReadFile(Config()), unknown);
  WriteFile(Config(), MinimalSpec({"NVIDIA_VISIBLE_DEVICES=0"}).dump());
  r = ModifyBundle(dir_ + "/bundle", cfg_);
  EXPECT_TRUE(r.ok()) << "one broken spec must not take the good one's devices: " << r.status();
}

// Legacy mode adds our prestart hook once, with an explicit environment.
TEST_F(BundleTest, ShimLegacyModeAddsHookOnce) {
  cfg_.mode = "legacy";
  WriteFile(Config(), MinimalSpec({"NVIDIA_VISIBLE_DEVICES=0"}).dump());
  ASSERT_TRUE(ModifyBundle(dir_ + "/bundle", cfg_).ok());
  ASSERT_TRUE(ModifyBundle(dir_ + "/bundle", cfg_).ok());
  Json spec = Json::parse(ReadFile(Config()));
  ASSERT_EQ(spec["hooks"]["prestart"].size(), 1u);
  EXPECT_EQ(spec["hooks"]["prestart"][0]["args"], Json({"gpulet-container-hook", "prestart"}));
  EXPECT_EQ(spec["hooks"]["prestart"][0]["env"], Json({"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}));
  // The hook makes the nodes; the cgroup allow rules (runc applies them before hooks) come now,
  // once, and no linux.devices entry.
  EXPECT_FALSE(spec["linux"].contains("devices"));
  Json want = Json::array();
  for (int minor : {255, 0})
    want.push_back(
        {{"allow", true}, {"type", "c"}, {"major", 195}, {"minor", minor}, {"access", "rwm"}});
  EXPECT_EQ(spec["linux"]["resources"]["devices"], want);
  // An unknown device fails before anything is written.
  std::string unknown = MinimalSpec({"NVIDIA_VISIBLE_DEVICES=5"}).dump();
  WriteFile(Config(), unknown);
  EXPECT_FALSE(ModifyBundle(dir_ + "/bundle", cfg_).ok());
  EXPECT_EQ(ReadFile(Config()), unknown);
}

// The real shim binary never starts the low-level runtime on a bad config.json, and does start it
// (unchanged arguments) for other commands.
TEST_F(BundleTest, ShimBinaryFailsClosed) {
  std::string marker = dir_ + "/runtime-ran";
  WriteFile(dir_ + "/fake-runc", "#!/bin/sh\necho \"$@\" > " + marker + "\n", 0755);
  WriteFile(dir_ + "/config.json",
            Json({{"runtimes", {dir_ + "/fake-runc"}},
                  {"spec-dirs", {dir_ + "/cdi"}},
                  {"accept-nvidia-visible-devices-envvar-when-unprivileged", true}})
                .dump());
  std::string shim = std::string(GPULET_BINARY_DIR) + "/bin/gpulet-container-runtime";
  std::string env = "GPULET_RUNTIME_CONFIG=" + dir_ + "/config.json ";
  WriteFile(Config(), "{not json");
  std::string out;
  EXPECT_NE(Sh(env + shim + " --log " + dir_ + "/log.json --log-format json create --bundle " +
                   dir_ + "/bundle id1",
               &out),
            0);
  EXPECT_THAT(out, HasSubstr("container not started"));
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_EQ(ReadFile(Config()), "{not json");
  EXPECT_THAT(ReadFile(dir_ + "/log.json"), HasSubstr("\"level\":\"error\""));
  EXPECT_EQ(Sh(env + shim + " --root /x state id1", &out), 0) << out;
  EXPECT_EQ(ReadFile(marker), "--root /x state id1\n");
  WriteFile(dir_ + "/config.json", "{\"mode\": \"fast\"}");
  EXPECT_NE(Sh(env + shim + " state id1", &out), 0);
  EXPECT_THAT(out, HasSubstr("mode \"fast\" is not auto, cdi or legacy"));
}

// Issue 22: the shim and the hook say what they are on --version / --help; the shim then passes the
// flag on to the runtime it fronts (tools that parse runc's version still find it).
TEST_F(BundleTest, ShimAndHookIdentifyThemselves) {
  WriteFile(dir_ + "/fake-runc", "#!/bin/sh\necho \"runc said $@\"\n", 0755);
  WriteFile(dir_ + "/config.json", Json({{"runtimes", {dir_ + "/fake-runc"}}}).dump());
  std::string env = "GPULET_RUNTIME_CONFIG=" + dir_ + "/config.json ";
  std::string bin = std::string(GPULET_BINARY_DIR) + "/bin/";
  std::string out;
  EXPECT_EQ(Sh(env + bin + "gpulet-container-runtime --version", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("gpulet-container-runtime 0."));
  EXPECT_THAT(out, HasSubstr("runc said --version"));
  EXPECT_EQ(Sh(env + bin + "gpulet-container-runtime --help", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("OCI runtime shim"));
  EXPECT_THAT(out, HasSubstr("runc said --help"));
  EXPECT_EQ(Sh(bin + "gpulet-container-hook --version", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("gpulet-container-hook 0."));
  EXPECT_EQ(Sh(bin + "gpulet-container-hook --help", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("update-ldcache"));
  EXPECT_NE(Sh(bin + "gpulet-container-hook frobnicate", &out), 0);
  EXPECT_THAT(out, HasSubstr("unknown command"));
}

// Creation inside a rootfs never leaves it, whatever symlinks the image holds (CVE-2024-0132
// class).
TEST_F(TempDirTest, RootfsSymlinksCannotEscape) {
  std::string rootfs = dir_ + "/rootfs", host = dir_ + "/host-target";
  fs::create_directories(rootfs + "/usr");
  fs::create_directories(host);
  fs::create_symlink(host, rootfs + "/usr/lib");               // absolute, at a host path
  fs::create_symlink("../../../../../../..", rootfs + "/up");  // relative, climbing out
  fs::create_symlink(host + "/evil", rootfs + "/file-link");   // a file target pointing out
  auto root = OpenRoot(rootfs);
  ASSERT_TRUE(root.ok());
  // A dangling in-root target fails closed; it must never create on the host.
  auto through_abs = CreateFileInRoot(*root, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  fs::create_directories(rootfs + host);  // once the in-root target exists, creation goes there
  ASSERT_TRUE(CreateFileInRoot(*root, "/usr/lib/x86_64-linux-gnu/libcuda.so.1").ok());
  ASSERT_TRUE(MkdirAllInRoot(*root, "/up/etc/evil").ok());
  ASSERT_TRUE(MknodInRoot(*root, "/up/dev/fifo", S_IFIFO | 0600, 0).ok());
  auto f = CreateFileInRoot(*root, "/file-link");
  EXPECT_TRUE(fs::is_empty(host)) << "something was created outside the rootfs";
  EXPECT_TRUE(fs::exists(rootfs + host + "/x86_64-linux-gnu/libcuda.so.1"));
  EXPECT_TRUE(fs::exists(rootfs + "/etc/evil"));
  EXPECT_TRUE(fs::exists(rootfs + "/dev/fifo"));
  EXPECT_FALSE(MkdirAllInRoot(*root, "/a/../b").ok());
}

// Issue 14.9: the legacy hook's read-only library mount. The old code bound the library read-write
// through the target fd, then resolved the container path a second time to remount it read-only:
// a sibling swapping that path in between (here: the directory renamed and replaced by one whose
// entry is a symlink elsewhere in the rootfs) left the library mounted writable. BindReadOnly never
// resolves the path again: the mount on the target fd is read-only from the start, and the
// swapped-in file is not touched. In a private mount namespace of a child (needs root).
TEST_F(TempDirTest, BindReadOnlyIgnoresAPathSwappedAfterTheTargetWasOpened) {
  if (!IsRoot()) GTEST_SKIP() << "needs root (mount namespaces)";
  std::string rootfs = dir_ + "/rootfs", lib = dir_ + "/host-libcuda.so";
  WriteFile(lib, "host library");
  WriteFile(rootfs + "/other", "other file");
  fs::create_directories(rootfs + "/usr/lib");
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto step = [](bool ok, int code) {
      if (!ok) ::_exit(code);
    };
    step(::unshare(CLONE_NEWNS) == 0, 10);
    step(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0, 11);
    auto root = OpenRoot(rootfs);
    step(root.ok(), 12);
    auto target = CreateFileInRoot(*root, "/usr/lib/libcuda.so");
    step(target.ok(), 13);
    // The swap: the opened target moves away; the path now names a symlink to another file.
    fs::rename(rootfs + "/usr/lib", rootfs + "/usr/lib-moved");
    fs::create_directories(rootfs + "/usr/lib");
    fs::create_symlink("/other", rootfs + "/usr/lib/libcuda.so");
    step(BindReadOnly(lib, *root, "/usr/lib/libcuda.so", *target).ok(), 14);
    step(ReadFile(rootfs + "/usr/lib-moved/libcuda.so") == "host library", 15);
    int fd = ::open((rootfs + "/usr/lib-moved/libcuda.so").c_str(), O_WRONLY);
    step(fd < 0 && errno == EROFS, 16);
    step(ReadFile(rootfs + "/other") == "other file", 17);
    fd = ::open((rootfs + "/other").c_str(), O_WRONLY);
    step(fd >= 0, 18);  // not mounted over: still the rootfs's own writable file
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed at step " << WEXITSTATUS(status);
}

// Issue 14.10 (found by fuzzing): hostile config.json, daemon.json and CDI specs are one clear
// error, never std::terminate. 5e370551615 and 1e999 are nlohmann out_of_range, not parse_error;
// a non-UTF-8 string from a YAML CDI spec made the shim's config.json dump throw.
TEST_F(TempDirTest, HostileParserInputsAreErrors) {
  WriteFile(dir_ + "/config.json",
            "{\"ociVersion\": \"1.0.2\", \"process\": {}, \"root\": {\"path\": \"r\"}, \"n\": "
            "5e370551615}");
  auto spec = LoadOciSpec(dir_ + "/config.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("config.json: invalid JSON"));

  WriteFile(dir_ + "/daemon.json", "{\"log-opts\": {\"max-size\": 1e999}}");
  ConfigureOptions o;
  o.engine = Engine::kDocker;
  o.config_path = dir_ + "/daemon.json";
  o.runtime_path = "/usr/bin/gpulet-container-runtime";
  auto plan = PlanConfigure(o);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("daemon.json: invalid JSON"));
  o.config_path = dir_ + "/new-daemon.json";
  o.runtime_path = "/opt/\xff/gpulet-container-runtime";
  EXPECT_FALSE(PlanConfigure(o).ok());

  const std::string bad =
      "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n"
      "    env: [\"A=\xff\xfe\"]\n";
  auto cdi = ParseCdiSpec(bad, "bad.yaml");
  ASSERT_FALSE(cdi.ok());
  EXPECT_THAT(std::string(cdi.status().message()), HasSubstr("bad.yaml:6: env is not valid UTF-8"));
  for (const char* s : {"\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"})
    EXPECT_FALSE(
        ParseCdiSpec("cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- name: x\n  containerEdits:\n"
                     "    env: [\"A=" +
                         std::string(s) + "\"]\n",
                     "x")
            .ok())
        << s;
  EXPECT_TRUE(
      ParseCdiSpec("cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- name: x\n  containerEdits:\n"
                   "    env: [\"A=gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80\"]\n",
                   "x")
          .ok());
  // A generated spec holds host file names, which need not be UTF-8: written, not thrown.
  CdiSpec gen;
  gen.kind = "nvidia.com/gpu";
  gen.devices.push_back({"0", {}});
  gen.edits.mounts.push_back({"/host/lib\xff.so", "/lib\xff.so", "", {}});
  EXPECT_THAT(CdiSpecToJson(gen), HasSubstr("/lib"));
  // And an edit that cannot be written as JSON leaves config.json as it was.
  Json oci = MinimalSpec({});
  std::string before = oci.dump();
  WriteFile(dir_ + "/c2.json", before);
  oci["process"]["env"].push_back("A=\xff");
  EXPECT_FALSE(SaveOciSpec(dir_ + "/c2.json", oci).ok());
  EXPECT_EQ(ReadFile(dir_ + "/c2.json"), before);
}

// A node configured by NVIDIA's toolkit (imports = ["conf.d/*.toml"], conf.d/99-nvidia.toml with
// the CRI section) moving to gpulet: NVIDIA's drop-in sorts after 99-gpulet.toml and would replace
// gpulet's CRI section, so it is emptied (kept as .bak). Found by
// tests/compat/runtime_configure.sh.
TEST_F(TempDirTest, ContainerdLaterDropInOfAnotherToolIsEmptied) {
  const std::string cri =
      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n";
  WriteFile(dir_ + "/config.toml", "version = 2\nimports = [\"" + dir_ + "/conf.d/*.toml\"]\n");
  WriteFile(dir_ + "/conf.d/99-nvidia.toml",
            "version = 2\n" + cri + "BinaryName = \"/usr/bin/nvidia-container-runtime\"\n");
  WriteFile(dir_ + "/conf.d/10-mirrors.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n");
  WriteFile(dir_ + "/conf.d/zz-other.toml",
            "version = 2\n[plugins.\"io.containerd.other\"]\na = 1\n");
  ConfigureOptions o;
  o.config_path = dir_ + "/config.toml";
  o.runtime_path = "/usr/bin/gpulet-container-runtime";
  std::vector<std::string> notes;
  auto plan = PlanConfigure(o, &notes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(ApplyChanges(*plan).ok());
  EXPECT_THAT(ReadFile(dir_ + "/conf.d/99-nvidia.toml"),
              HasSubstr("Emptied by `gpulet runtime configure`"));
  EXPECT_THAT(ReadFile(dir_ + "/conf.d/99-nvidia.toml.bak"), HasSubstr("nvidia-container-runtime"));
  // Loaded before ours (10-) or without the CRI section: left alone.
  EXPECT_THAT(ReadFile(dir_ + "/conf.d/10-mirrors.toml"), HasSubstr("registry"));
  EXPECT_THAT(ReadFile(dir_ + "/conf.d/zz-other.toml"), HasSubstr("a = 1"));
  EXPECT_THAT(absl::StrJoin(notes, "\n"), HasSubstr("99-nvidia.toml (another tool's drop-in"));
  // A second run changes nothing.
  auto again = PlanConfigure(o);
  ASSERT_TRUE(again.ok());
  for (const auto& c : *again) EXPECT_FALSE(c.changed()) << c.path;
}

// Docker: other keys kept, second run changes nothing, backup kept, bad JSON untouched.
TEST_F(TempDirTest, DockerDaemonJson) {
  std::string p = dir_ + "/daemon.json";
  std::string orig =
      "{\"log-driver\": \"journald\", \"runtimes\": {\"other\": {\"path\": \"/x\"}}}";
  WriteFile(p, orig);
  ConfigureOptions o;
  o.engine = Engine::kDocker;
  o.config_path = p;
  o.runtime_path = "/usr/bin/gpulet-container-runtime";
  o.set_as_default = o.enable_cdi = true;
  auto plan = PlanConfigure(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(UnifiedDiff((*plan)[0]), HasSubstr("+    \"default-runtime\": \"nvidia\""));
  EXPECT_EQ(ReadFile(p), orig);  // planning writes nothing
  ASSERT_TRUE(ApplyChanges(*plan).ok());
  Json j = Json::parse(ReadFile(p));
  EXPECT_EQ(j["log-driver"], "journald");
  EXPECT_EQ(j["runtimes"]["other"]["path"], "/x");
  EXPECT_EQ(j["runtimes"]["nvidia"]["path"], "/usr/bin/gpulet-container-runtime");
  EXPECT_EQ(j["features"]["cdi"], true);
  EXPECT_EQ(ReadFile(p + ".bak"), orig);
  std::string after = ReadFile(p);
  auto again = PlanConfigure(o);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE((*again)[0].changed());
  WriteFile(p, "{\"a\": ");
  auto bad = PlanConfigure(o);
  ASSERT_FALSE(bad.ok());
  // FILE:LINE:COLUMN, as every config error; not the JSON library's exception text.
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("daemon.json:1:7: invalid JSON"));
  EXPECT_THAT(std::string(bad.status().message()), Not(HasSubstr("json.exception")));
}

// `runtime configure --runtime containerd --config path` with the shim at its usual place.
ConfigureOptions ContainerdAt(const std::string& path) {
  ConfigureOptions o;
  o.config_path = path;
  o.runtime_path = "/usr/bin/gpulet-container-runtime";
  return o;
}

// containerd v2/v3: drop-in with the runtime, imports in the main file; idempotent; bad TOML named.
TEST_F(TempDirTest, ContainerdDropIn) {
  for (int version : {2, 3}) {
    std::string d = dir_ + "/v" + std::to_string(version);
    std::string cri = version == 2 ? "io.containerd.grpc.v1.cri" : "io.containerd.cri.v1.runtime";
    std::string p = d + "/config.toml";
    WriteFile(p, "version = " + std::to_string(version) + "\n# operator comment\n[plugins.\"" +
                     cri +
                     "\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
                     "  pod_annotations = [\"io.katacontainers.*\", \"cdi.k8s.io/*\"]\n"
                     "  container_annotations = [\"*\"]\n"
                     "  [plugins.\"" +
                     cri + "\".containerd.runtimes.runc.options]\n    SystemdCgroup = true\n");
    ConfigureOptions o;
    o.config_path = p;
    o.runtime_path = "/opt/gpulet/bin/gpulet-container-runtime";
    o.set_as_default = o.enable_cdi = true;
    std::vector<std::string> notes;
    auto plan = PlanConfigure(o, &notes);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(ApplyChanges(*plan).ok());
    std::string drop = ReadFile(d + "/conf.d/99-gpulet.toml");
    // Issue 14.14: pod annotations that reach the container config as cdi.k8s.io/* would let any
    // pod name any GPU: those pass-through entries are not copied into gpulet's runtime entry.
    size_t nvidia = drop.find("runtimes.nvidia]");
    ASSERT_NE(nvidia, std::string::npos) << drop;
    std::string entry = drop.substr(nvidia);
    std::smatch next;  // up to the next table header
    if (std::regex_search(entry, next, std::regex("\n *\\[")))
      entry = entry.substr(0, next.position(0));
    EXPECT_THAT(entry, HasSubstr("pod_annotations = [ 'io.katacontainers.*' ]")) << drop;
    // Container annotations come from the kubelet (the device plugin's cdi-annotations answer),
    // not from pod authors: runc's "*" is kept, and covers cdi.k8s.io/*.
    EXPECT_THAT(entry, HasSubstr("container_annotations = [ '*' ]")) << drop;
    EXPECT_THAT(absl::StrJoin(notes, "\n"),
                HasSubstr("not copied into the gpulet runtime's pod_annotations"));
    EXPECT_THAT(drop, HasSubstr("BinaryName = '/opt/gpulet/bin/gpulet-container-runtime'"));
    EXPECT_THAT(drop, HasSubstr("SystemdCgroup = true"));  // runc's options carried over
    EXPECT_THAT(drop, HasSubstr("default_runtime_name = 'nvidia'"));
    EXPECT_THAT(drop, HasSubstr("enable_cdi = true"));
    EXPECT_THAT(drop, HasSubstr(cri));
    EXPECT_THAT(ReadFile(p), HasSubstr(d + "/conf.d/99-gpulet.toml"));
    auto again = PlanConfigure(o);
    ASSERT_TRUE(again.ok());
    for (const auto& c : *again) EXPECT_FALSE(c.changed()) << c.path << "\n" << UnifiedDiff(c);
  }
  {
    // A plain containerd 1.6 config: gpulet's entry lets the device plugin's cdi.k8s.io/*
    // container annotations through (the cdi-annotations strategy; docs/runtime.md, Security).
    std::string p = dir_ + "/plain/config.toml";
    WriteFile(p, "version = 2\n");
    ConfigureOptions o = ContainerdAt(p);
    auto plan = PlanConfigure(o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(ApplyChanges(*plan).ok());
    EXPECT_THAT(ReadFile(dir_ + "/plain/conf.d/99-gpulet.toml"),
                HasSubstr("container_annotations = [ 'cdi.k8s.io/*' ]"));
  }
  std::string p = dir_ + "/bad.toml";
  WriteFile(p, "version = 2\n[plugins\n");
  ConfigureOptions o = ContainerdAt(p);
  auto bad = PlanConfigure(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad.toml:2"));
  WriteFile(p, "[plugins.cri]\n");
  EXPECT_THAT(std::string(PlanConfigure(o).status().message()), HasSubstr("version 1"));
}

// Issue 22.3: `runtime configure` keeps an existing file's mode and owner (0600: it may hold
// registry credentials), --dry-run's diff is one `patch` applies (it printed bare "@@" lines), and
// a failed write names the target, not WriteFileAtomic's temporary file.
TEST_F(TempDirTest, ConfigureKeepsModeOwnerAndPrintsAPatch) {
  if (!Have("patch")) GTEST_SKIP() << "patch is not installed";
  std::string p = dir_ + "/daemon.json";
  std::string lines;
  for (int i = 0; i < 12; ++i)
    lines += "    \"k" + std::to_string(i) + "\": " + std::to_string(i) + ",\n";
  WriteFile(p, "{\n" + lines + "    \"runtimes\": {}\n}", 0600);  // no newline at the end
  if (IsRoot()) ASSERT_EQ(::chown(p.c_str(), 1234, 5678), 0);
  ConfigureOptions o;
  o.engine = Engine::kDocker;
  o.config_path = p;
  o.runtime_path = "/usr/bin/gpulet-container-runtime";
  o.set_as_default = true;
  auto plan = PlanConfigure(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The diff turns the old text into the new one, through patch.
  auto patched = [&](const FileChange& c) {
    WriteFile(dir_ + "/orig", c.existed ? c.before : "");
    WriteFile(dir_ + "/d.diff", UnifiedDiff(c));
    std::string out;
    EXPECT_EQ(Sh("patch -s -o " + dir_ + "/out " + dir_ + "/orig < " + dir_ + "/d.diff", &out), 0)
        << out << "\n"
        << UnifiedDiff(c);
    return ReadFile(dir_ + "/out");
  };
  const FileChange& change = (*plan)[0];
  EXPECT_THAT(UnifiedDiff(change),
              ::testing::ContainsRegex("\n@@ -[0-9]+,[0-9]+ \\+[0-9]+,[0-9]+ @@\n"));
  EXPECT_EQ(patched(change), change.after);
  std::string toml_path = dir_ + "/ctrd/config.toml";
  WriteFile(toml_path, "version = 2\n# a\n# b\n# c\n# d\n# e\n# f\n# g\n[plugins]\n");
  auto ctrd = PlanConfigure(ContainerdAt(toml_path));
  ASSERT_TRUE(ctrd.ok()) << ctrd.status();
  for (const auto& c : *ctrd) EXPECT_EQ(patched(c), c.after) << c.path;  // a new file and an edit
  FileChange two{dir_ + "/x", true, "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\n",
                 "a\nB\nc\nd\ne\nf\ng\nh\ni\nj\nk\nL\nm"};
  EXPECT_EQ(patched(two), two.after);  // two hunks, and a last line without a newline

  ASSERT_TRUE(ApplyChanges(*plan).ok());
  struct stat st;
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  if (IsRoot()) {
    EXPECT_EQ(st.st_uid, 1234u);
    EXPECT_EQ(st.st_gid, 5678u);
  }
  // The target turned into a directory between plan and apply: the error names it.
  auto again = PlanConfigure(o);
  ASSERT_TRUE(again.ok());
  (*again)[0].after += " ";
  fs::remove(p);
  fs::create_directories(p + "/sub");
  absl::Status s = ApplyChanges(*again);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("cannot write " + p + ": "));
}

// CRI-O: a drop-in with the runtime and, with --set-as-default, the default runtime.
TEST_F(TempDirTest, CrioDropIn) {
  ConfigureOptions o;
  o.engine = Engine::kCrio;
  o.config_path = dir_ + "/crio.conf";
  o.runtime_path = "/usr/bin/gpulet-container-runtime";
  o.set_as_default = true;
  WriteFile(o.config_path,
            "[crio.runtime.runtimes.runc]\nruntime_path = \"/usr/bin/runc\"\n"
            "allowed_annotations = [\"io.kubernetes.cri-o.Devices\", \"cdi.k8s.io\"]\n");
  auto plan = PlanConfigure(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(ApplyChanges(*plan).ok());
  std::string drop = ReadFile(dir_ + "/crio.conf.d/99-gpulet.toml");
  EXPECT_THAT(drop, HasSubstr("allowed_annotations = [ 'io.kubernetes.cri-o.Devices' ]")) << drop;
  EXPECT_THAT(drop, Not(HasSubstr("cdi.k8s.io"))) << drop;
  EXPECT_THAT(drop, HasSubstr("runtime_path = '/usr/bin/gpulet-container-runtime'"));
  EXPECT_THAT(drop, HasSubstr("runtime_type = 'oci'"));
  EXPECT_THAT(drop, HasSubstr("default_runtime = 'nvidia'"));
}

std::vector<std::string> SpecDeviceNames(const std::string& path) {
  std::vector<std::string> names;
  auto spec = ParseCdiSpec(ReadFile(path), path);
  if (spec.ok())
    for (const auto& d : spec->devices) names.push_back(d.name);
  return names;
}

// The agent's refresher writes the spec, leaves an unchanged file alone (same inode: not even
// rewritten), follows the GPU set (MIG enabled, a GPU gone) and, started, reacts to a GPU event
// without waiting for its (here one-hour) interval. A generation failure keeps the last file.
TEST_F(TempDirTest, CdiRefresherFollowsTheGpuSet) {
  std::string why;
  if (!MakeDriverRoot(dir_ + "/driver", 0, &why)) GTEST_SKIP() << why;
  WriteFile(
      dir_ + "/driver/proc/driver/nvidia-caps/mig-minors",
      "gpu0/gi1/access 21\ngpu0/gi1/ci0/access 22\ngpu0/gi2/access 30\ngpu0/gi2/ci0/access 31\n");
  gpulet::testing::FakeGpuLayer gpu(FakeInventory(2));
  CdiGenerateOptions o;
  o.driver_root = dir_ + "/driver";
  o.names = NameStrategy::kIndex;
  std::string path = dir_ + "/cdi/nvidia.json";
  CdiRefresher r(&gpu, path, o, std::chrono::hours(1));
  ASSERT_FALSE(r.RefreshOnce().status().ok());  // no directory yet: an error naming the file
  fs::create_directories(dir_ + "/cdi");
  ASSERT_EQ(r.RefreshOnce().value_or(false), true);
  EXPECT_EQ(ReadFile(path).front(), '{');  // JSON for a .json path
  EXPECT_THAT(SpecDeviceNames(path), ::testing::ElementsAre("0", "1", "all"));
  struct stat before, after;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  EXPECT_EQ(r.RefreshOnce().value_or(true), false);
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);

  gpu.SetInventory(FakeInventory(2, /*mig=*/true));  // MIG reconfiguration, seen after re-init
  ASSERT_EQ(r.RefreshOnce().value_or(false), true);
  EXPECT_THAT(SpecDeviceNames(path), ::testing::ElementsAre("0", "0:0", "0:1", "1", "all"));

  gpu::Inventory none = FakeInventory(0);
  gpu.SetInventory(none);  // nothing to describe: an error, the last good spec stays
  EXPECT_FALSE(r.RefreshOnce().ok());
  EXPECT_THAT(SpecDeviceNames(path), ::testing::ElementsAre("0", "0:0", "0:1", "1", "all"));

  r.Start();
  gpu::Inventory lost = FakeInventory(2);
  lost.devices.erase(lost.devices.begin());  // GPU 0 fell off the bus; NVML re-initialised
  gpu.SetInventory(lost);
  gpu.Emit(0, 79);
  std::vector<std::string> names;
  for (int i = 0; i < 100 && names != std::vector<std::string>{"1", "all"}; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    names = SpecDeviceNames(path);
  }
  EXPECT_THAT(names, ::testing::ElementsAre("1", "all"));
  r.Stop();
}

}  // namespace
}  // namespace gpulet::runtime
