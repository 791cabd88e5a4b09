#include "plugin/resources.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "testing/gpu/fake_gpu.h"

namespace gpulet::plugin {
namespace {

using gpulet::testing::AddMig;
using gpulet::testing::Dgx1Links;
using gpulet::testing::FakeGpuLayer;
using gpulet::testing::MakeInventory;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

struct Node {
  explicit Node(gpu::Inventory inv, Config cfg = {}) : inv(std::move(inv)), layer(this->inv) {
    cfg.health.unhealthy_devices_file = "";
    health = std::make_unique<HealthMonitor>(&layer, this->inv, cfg.health);
    this->cfg = cfg;
  }
  absl::StatusOr<std::vector<std::shared_ptr<kubelet::Resource>>> Build(
      const std::string& root = "/nonexistent") {
    return BuildResources(inv, cfg, health.get(), root);
  }
  gpu::Inventory inv;
  FakeGpuLayer layer;
  Config cfg;
  std::unique_ptr<HealthMonitor> health;
};

std::map<std::string, size_t> Counts(const std::vector<std::shared_ptr<kubelet::Resource>>& rs) {
  std::map<std::string, size_t> m;
  for (const auto& r : rs) m[r->name()] = r->Devices().size();
  return m;
}

std::shared_ptr<kubelet::Resource> Get(const std::vector<std::shared_ptr<kubelet::Resource>>& rs,
                                       const std::string& name) {
  for (const auto& r : rs)
    if (r->name() == name) return r;
  return nullptr;
}

// Whole GPUs: one nvidia.com/gpu device per GPU, UUID IDs, NUMA node from the inventory.
TEST(ResourcesTest, WholeGpus) {
  Node n(MakeInventory(8, {}));
  auto rs = n.Build();
  ASSERT_TRUE(rs.ok()) << rs.status();
  ASSERT_EQ(rs->size(), 1u);
  auto devs = (*rs)[0]->Devices();
  ASSERT_EQ(devs.size(), 8u);
  EXPECT_EQ(devs[0].id, n.inv.devices[0].uuid);
  EXPECT_EQ(devs[7].numa_node, 1);
  EXPECT_TRUE(devs[3].healthy);
}

// Each device-list strategy yields its edits; several at once combine; CDI-only skips the env.
TEST(ResourcesTest, AllocateEditsPerStrategy) {
  Node n(MakeInventory(4, {}));
  const std::string u0 = n.inv.devices[0].uuid, u2 = n.inv.devices[2].uuid;
  {
    auto r = (*n.Build())[0]->Allocate({u0, u2});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), u0 + "," + u2);
    EXPECT_EQ(r->mounts_size(), 0);
    EXPECT_EQ(r->devices_size(), 0);
  }
  n.cfg.list = {false, true, false, false};
  {
    auto r = (*n.Build())[0]->Allocate({u2});
    EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
    ASSERT_EQ(r->mounts_size(), 1);
    EXPECT_EQ(r->mounts(0).host_path(), "/dev/null");
    EXPECT_EQ(r->mounts(0).container_path(), "/var/run/nvidia-container-devices/" + u2);
  }
  n.cfg.list = {false, false, true, true};
  n.cfg.id_strategy = IdStrategy::kIndex;
  {
    auto r = (*n.Build())[0]->Allocate({u0, u2});
    EXPECT_TRUE(r->envs().empty());
    EXPECT_EQ(r->annotations().at("cdi.k8s.io/gpulet-device-plugin_gpu"),
              "nvidia.com/gpu=0,nvidia.com/gpu=2");
    ASSERT_EQ(r->cdi_devices_size(), 2);
    EXPECT_EQ(r->cdi_devices(1).name(), "nvidia.com/gpu=2");
  }
  n.cfg.list = {true, false, false, true};
  {
    auto r = (*n.Build())[0]->Allocate({u2});
    EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), "2");
    EXPECT_EQ(r->cdi_devices(0).name(), "nvidia.com/gpu=2");
  }
}

// The vGPU resources' grants (whole GPUs by UUID, made elsewhere) reach the container as this
// node's own resources deliver GPUs: each strategy's edits, device specs with passDeviceSpecs.
TEST(ResourcesTest, GpuDeliveryOfAGrantFollowsTheStrategies) {
  auto root = std::filesystem::temp_directory_path() / ("dp-deliver-" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "dev");
  std::ofstream(root / "dev/nvidiactl") << "";
  auto inv = MakeInventory(4, {});
  const std::string u2 = inv.devices[2].uuid;
  Config cfg;
  cfg.list = {false, true, false, true};  // volume-mounts, cdi-cri
  cfg.pass_device_specs = true;
  auto deliver = MakeGpuDelivery(inv, cfg, root.string(), "tencent.com/vcuda-core");
  ASSERT_TRUE(deliver.ok()) << deliver.status();
  v1beta1::ContainerAllocateResponse r;
  (*deliver)({u2, "GPU-not-on-this-node"}, &r);
  ASSERT_EQ(r.cdi_devices_size(), 1);
  EXPECT_EQ(r.cdi_devices(0).name(), "nvidia.com/gpu=" + u2);
  ASSERT_EQ(r.mounts_size(), 1);
  EXPECT_EQ(r.mounts(0).container_path(), "/var/run/nvidia-container-devices/" + u2);
  std::vector<std::string> nodes;
  for (const auto& d : r.devices()) nodes.push_back(d.container_path());
  EXPECT_THAT(nodes, UnorderedElementsAre("/dev/nvidiactl",
                                          "/dev/nvidia" + std::to_string(inv.devices[2].minor)));
  cfg.list = {false, false, true, false};  // cdi-annotations: the key names the vGPU resource
  cfg.pass_device_specs = false;
  deliver = MakeGpuDelivery(inv, cfg, root.string(), "tencent.com/vcuda-core");
  ASSERT_TRUE(deliver.ok());
  v1beta1::ContainerAllocateResponse a;
  (*deliver)({u2}, &a);
  EXPECT_EQ(a.annotations().at("cdi.k8s.io/gpulet-device-plugin_vcuda-core"),
            "nvidia.com/gpu=" + u2);
  EXPECT_EQ(a.devices_size(), 0);
  std::filesystem::remove_all(root);
}

// passDeviceSpecs lists the control nodes present under the dev root and /dev/nvidia<minor>;
// a MIG device adds its GI and CI capability nodes from mig-minors.
TEST(ResourcesTest, DeviceSpecsIncludingMigCaps) {
  auto root = std::filesystem::temp_directory_path() / ("dp-specs-" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "dev");
  std::filesystem::create_directories(root / "proc/driver/nvidia-caps");
  for (const char* d : {"nvidiactl", "nvidia-uvm"}) std::ofstream(root / "dev" / d) << "";
  std::ofstream(root / "proc/driver/nvidia-caps/mig-minors")
      << "config 1\nmonitor 2\ngpu1/gi2/access 21\ngpu1/gi2/ci0/access 22\n";
  auto inv = MakeInventory(2, {});
  AddMig(inv, 1, {"3g.20gb", "3g.20gb"});
  Config cfg;
  cfg.pass_device_specs = true;
  cfg.mig_strategy = MigStrategy::kMixed;
  Node n(inv, cfg);
  auto rs = n.Build(root.string());
  ASSERT_TRUE(rs.ok()) << rs.status();
  auto whole = Get(*rs, "nvidia.com/gpu")->Allocate({inv.devices[0].uuid});
  std::vector<std::string> paths;
  for (const auto& d : whole->devices()) {
    paths.push_back(d.container_path());
    EXPECT_EQ(d.host_path(), d.container_path());
    EXPECT_EQ(d.permissions(), "rw");
  }
  EXPECT_THAT(paths, ElementsAre("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"));
  auto mig = Get(*rs, "nvidia.com/mig-3g.20gb");
  ASSERT_NE(mig, nullptr);
  auto m = mig->Allocate({inv.devices[1].mig_devices[1].uuid});
  paths.clear();
  for (const auto& d : m->devices()) paths.push_back(d.container_path());
  EXPECT_THAT(paths, ElementsAre("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1",
                                 "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"));
  n.cfg.dev_root = "/run/nvidia/driver";
  std::filesystem::create_directories(root / "run/nvidia/driver/dev");
  std::ofstream(root / "run/nvidia/driver/dev/nvidia-modeset") << "";
  auto moved = Get(*n.Build(root.string()), "nvidia.com/gpu")->Allocate({inv.devices[0].uuid});
  EXPECT_EQ(moved->devices(0).container_path(), "/dev/nvidia-modeset");
  EXPECT_EQ(moved->devices(0).host_path(), "/run/nvidia/driver/dev/nvidia-modeset");
  std::filesystem::remove_all(root);
}

// Unknown, duplicate and unhealthy IDs are InvalidArgument naming the ID.
TEST(ResourcesTest, BadIdsAreInvalidArgumentNamingTheId) {
  Node n(MakeInventory(4, {}));
  auto r = (*n.Build())[0];
  auto s = r->Allocate({"GPU-nope"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("\"GPU-nope\""));
  const std::string u1 = n.inv.devices[1].uuid;
  s = r->Allocate({u1, u1});
  EXPECT_THAT(s.status().message(), HasSubstr("\"" + u1 + "\" is requested twice"));
  n.health->Start();  // subscribes to the layer's events
  n.layer.Emit(1, 79);
  s = r->Allocate({u1});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("Unhealthy: XID 79"));
  EXPECT_FALSE(r->Preferred({"GPU-x"}, {}, 1).ok());
  EXPECT_FALSE(r->Allocate({}).ok());
}

// NVIDIA_VISIBLE_DEVICES lists index IDs in index order whatever the request's order (NVIDIA's
// is Go's map order, random: issue 16 [id-order]); UUIDs keep the request's order, as NVIDIA's.
TEST(ResourcesTest, IndexIdsAreListedInIndexOrder) {
  auto inv = MakeInventory(4, {}, "NVIDIA A100-SXM4-40GB");
  AddMig(inv, 0, std::vector<std::string>(7, "1g.5gb"));
  AddMig(inv, 1, {"3g.20gb", "2g.10gb", "1g.5gb"});
  Config cfg;
  cfg.mig_strategy = MigStrategy::kMixed;
  cfg.id_strategy = IdStrategy::kIndex;
  Node n(inv, cfg);
  auto rs = n.Build();
  ASSERT_TRUE(rs.ok()) << rs.status();
  const std::string m12 = inv.devices[1].mig_devices[2].uuid;
  const std::string m03 = inv.devices[0].mig_devices[3].uuid;
  auto r = Get(*rs, "nvidia.com/mig-1g.5gb")->Allocate({m12, m03});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), "0:3,1:2");
  const std::string u2 = inv.devices[2].uuid, u3 = inv.devices[3].uuid;
  auto whole = Get(*rs, "nvidia.com/gpu")->Allocate({u3, u2});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->envs().at("NVIDIA_VISIBLE_DEVICES"), "2,3");
  n.cfg.id_strategy = IdStrategy::kUuid;
  auto by_uuid = Get(*n.Build(), "nvidia.com/gpu")->Allocate({u3, u2});
  ASSERT_TRUE(by_uuid.ok()) << by_uuid.status();
  EXPECT_EQ(by_uuid->envs().at("NVIDIA_VISIBLE_DEVICES"), u3 + "," + u2);
}

// MIG none / single / mixed name and count resources as NVIDIA does (a100-mig layout).
TEST(ResourcesTest, MigStrategies) {
  auto inv = MakeInventory(4, {}, "NVIDIA A100-SXM4-40GB");
  AddMig(inv, 0, std::vector<std::string>(7, "1g.5gb"));
  AddMig(inv, 1, {"3g.20gb", "2g.10gb", "1g.5gb"});
  AddMig(inv, 2, {"3g.20gb", "3g.20gb"});
  Config cfg;
  EXPECT_THAT(Counts(*Node(inv, cfg).Build()),
              ::testing::ContainerEq(std::map<std::string, size_t>{{"nvidia.com/gpu", 4}}));
  cfg.mig_strategy = MigStrategy::kMixed;
  EXPECT_THAT(Counts(*Node(inv, cfg).Build()),
              ::testing::ContainerEq(std::map<std::string, size_t>{{"nvidia.com/gpu", 1},
                                                                   {"nvidia.com/mig-1g.5gb", 8},
                                                                   {"nvidia.com/mig-2g.10gb", 1},
                                                                   {"nvidia.com/mig-3g.20gb", 3}}));
  cfg.mig_strategy = MigStrategy::kSingle;
  auto single = Node(inv, cfg).Build();
  ASSERT_FALSE(single.ok());
  EXPECT_THAT(single.status().message(), HasSubstr("single"));
  // Single with one profile everywhere: MIG devices become nvidia.com/gpu.
  auto uniform = MakeInventory(2, {}, "NVIDIA A100-SXM4-40GB");
  AddMig(uniform, 0, std::vector<std::string>(7, "1g.5gb"));
  AddMig(uniform, 1, std::vector<std::string>(7, "1g.5gb"));
  Node uniform_node(uniform, cfg);  // outlives the resources, which point at its health monitor
  auto rs = uniform_node.Build();
  ASSERT_TRUE(rs.ok()) << rs.status();
  EXPECT_THAT(Counts(*rs),
              ::testing::ContainerEq(std::map<std::string, size_t>{{"nvidia.com/gpu", 14}}));
  // A +me profile is its own resource with '+' turned into '.'.
  auto me = MakeInventory(1, {}, "NVIDIA A100-SXM4-40GB");
  AddMig(me, 0, {"1g.5gb+me", "1g.5gb"});
  cfg.mig_strategy = MigStrategy::kMixed;
  EXPECT_THAT(Counts(*Node(me, cfg).Build()),
              ::testing::ContainerEq(std::map<std::string, size_t>{
                  {"nvidia.com/mig-1g.5gb", 1}, {"nvidia.com/mig-1g.5gb.me", 1}}));
  // Index IDs for MIG are "<gpu>:<mig>".
  cfg.checkpoint_id_strategy = IdStrategy::kIndex;
  Node me_node(me, cfg);
  auto idx = me_node.Build();
  EXPECT_EQ(Get(*idx, "nvidia.com/mig-1g.5gb.me")->Devices()[0].id, "0:0");
}

// Time-slicing: "<id>::<n>" replicas, renameByDefault, per-device selection leaves the rest
// whole, per-resource rename, failRequestsGreaterThanOne.
TEST(ResourcesTest, TimeSlicing) {
  auto cfg = ParseConfig(R"(sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      rename: gpu-fraction
      replicas: 3
      devices: ["1", "2"]
)",
                         "t.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  Node n(MakeInventory(4, {}), *cfg);
  auto rs = n.Build();
  ASSERT_TRUE(rs.ok()) << rs.status();
  EXPECT_THAT(Counts(*rs), ::testing::ContainerEq(std::map<std::string, size_t>{
                               {"nvidia.com/gpu", 2}, {"nvidia.com/gpu-fraction", 6}}));
  auto shared = Get(*rs, "nvidia.com/gpu-fraction");
  const std::string u1 = n.inv.devices[1].uuid;
  EXPECT_EQ(shared->Devices()[0].id, u1 + "::0");
  auto r = shared->Allocate({u1 + "::2"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), u1);
  auto two = shared->Allocate({u1 + "::0", u1 + "::1"});
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(two.status().message(), HasSubstr("\"" + u1 + "::1\""));
  // Without failRequestsGreaterThanOne, two replicas of one GPU are one device to the container.
  n.cfg.fail_requests_greater_than_one = false;
  auto again = Get(*n.Build(), "nvidia.com/gpu-fraction")->Allocate({u1 + "::0", u1 + "::1"});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->envs().at("NVIDIA_VISIBLE_DEVICES"), u1);
  // A device the list names that does not exist is an error naming the entry's line.
  auto bad = ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
      "      replicas: 2\n      devices: [\"9\"]\n",
      "u.yaml");
  auto err = Node(MakeInventory(4, {}), *bad).Build();
  EXPECT_THAT(err.status().message(), HasSubstr("u.yaml:4"));
  EXPECT_THAT(err.status().message(), HasSubstr("\"9\""));
}

// Replicas are spread over GPUs (distributed) or stacked (packed), honouring must_include.
TEST(ResourcesTest, ReplicaPolicies) {
  auto cfg = ParseConfig(
      "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
      "    - name: nvidia.com/gpu\n      replicas: 4\n",
      "r.yaml");
  Node n(MakeInventory(2, {}), *cfg);
  auto shared = Get(*n.Build(), "nvidia.com/gpu.shared");
  ASSERT_NE(shared, nullptr);
  std::vector<std::string> all;
  for (const auto& d : shared->Devices()) all.push_back(d.id);
  const std::string u0 = n.inv.devices[0].uuid, u1 = n.inv.devices[1].uuid;
  auto d = shared->Preferred(all, {}, 2);
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(*d, UnorderedElementsAre(u0 + "::0", u1 + "::0"));
  // GPU 0 already has two replicas in use: distributed picks GPU 1.
  std::vector<std::string> avail = {u0 + "::2", u0 + "::3", u1 + "::0",
                                    u1 + "::1", u1 + "::2", u1 + "::3"};
  EXPECT_THAT(*shared->Preferred(avail, {}, 1), ElementsAre(u1 + "::0"));
  EXPECT_THAT(*shared->Preferred(avail, {u0 + "::3"}, 2), ElementsAre(u0 + "::3", u1 + "::0"));
  n.cfg.shared_policy = SharedPolicy::kPacked;
  shared = Get(*n.Build(), "nvidia.com/gpu.shared");
  EXPECT_THAT(*shared->Preferred(avail, {}, 2), ElementsAre(u0 + "::2", u0 + "::3"));
}

// Distributed replicas: where the policy leaves a choice of GPUs, the topology score makes it
// (issue 16 [replica-preferred]: NVIDIA's answer scored higher on a DGX-1). Must-include replicas
// on GPUs 6 and 7 leave six unused GPUs for two more replicas; the first two in ID order (0, 1)
// have no NVLink to 6 or 7, while 4 and 5 complete their NVLink quad.
TEST(ResourcesTest, ReplicaTiesGoToTheTopologyScore) {
  auto cfg = ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n",
      "r.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  Node n(MakeInventory(8, Dgx1Links()), *cfg);
  auto shared = Get(*n.Build(), "nvidia.com/gpu");
  ASSERT_NE(shared, nullptr);
  std::vector<std::string> all;
  for (const auto& d : shared->Devices()) all.push_back(d.id);
  auto id = [&](int g, int r) { return n.inv.devices[g].uuid + "::" + std::to_string(r); };
  auto four = shared->Preferred(all, {id(6, 0), id(7, 2)}, 4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_THAT(*four, UnorderedElementsAre(id(6, 0), id(7, 2), id(4, 0), id(5, 0)));
  // The policy still comes first: with GPUs 4 and 5 partly in use, the unused GPUs are taken
  // (2 and 3: 2-6 and 3-7 are NVLinks, 2-3 a double one), however good 4 and 5 are.
  std::vector<std::string> avail;
  for (const auto& a : all)
    if (a != id(4, 1) && a != id(5, 1)) avail.push_back(a);
  auto spread = shared->Preferred(avail, {id(6, 0), id(7, 2)}, 4);
  ASSERT_TRUE(spread.ok()) << spread.status();
  EXPECT_THAT(*spread, UnorderedElementsAre(id(6, 0), id(7, 2), id(2, 0), id(3, 0)));
  // A request larger than one level: every GPU gets one before any gets a second, and the
  // second replicas go to the best-linked GPUs of the rest.
  auto ten = shared->Preferred(all, {}, 10);
  ASSERT_TRUE(ten.ok()) << ten.status();
  std::map<std::string, int> per_gpu;
  for (const auto& d : *ten) ++per_gpu[d.substr(0, d.find("::"))];
  EXPECT_EQ(per_gpu.size(), 8u);
}

// Per-resource renaming by product-name pattern works (NVIDIA parses but ignores it).
TEST(ResourcesTest, RenameByPattern) {
  auto inv = MakeInventory(3, {});
  inv.devices[2].name = "Tesla T4";
  auto cfg = ParseConfig(
      "resources:\n  gpus:\n  - pattern: \"*T4*\"\n    name: t4\n"
      "  - pattern: \"*H100*\"\n    name: h100\n",
      "p.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_THAT(Counts(*Node(inv, *cfg).Build()),
              ::testing::ContainerEq(
                  std::map<std::string, size_t>{{"nvidia.com/h100", 2}, {"nvidia.com/t4", 1}}));
  inv.devices[1].name = "Quadro";
  auto err = Node(inv, *cfg).Build();
  EXPECT_THAT(err.status().message(), HasSubstr("GPU 1 (Quadro) matches no resources.gpus"));
}

// GetPreferredAllocation for whole GPUs is the topology optimum (DGX-1 quad).
TEST(ResourcesTest, PreferredIsTopologyAware) {
  Node n(MakeInventory(8, Dgx1Links()));
  auto r = (*n.Build())[0];
  std::vector<std::string> all;
  for (const auto& d : r->Devices()) all.push_back(d.id);
  auto four = r->Preferred(all, {all[6]}, 4);
  ASSERT_TRUE(four.ok());
  EXPECT_THAT(*four, UnorderedElementsAre(all[4], all[5], all[6], all[7]));
}

}  // namespace
}  // namespace gpulet::plugin
