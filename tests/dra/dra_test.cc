// The DRA driver against the fake API server and a kubelet-side gRPC client over real unix
// sockets: what the kubelet and the scheduler see of gpulet as a DRA driver.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "abi/vgpu_accounting.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"
#include "dra/devices.h"
#include "dra/driver.h"
#include "gmock/gmock.h"
#include "gpu/selection.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "k8s/dra/v1/api.grpc.pb.h"
#include "k8s/dra/v1beta1/api.grpc.pb.h"
#include "k8s/pluginregistration/v1/api.grpc.pb.h"
#include "plugin/config.h"
#include "runtime/cdi.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/runtime/fixtures.h"

namespace gpulet::dra {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;
namespace rt = runtime::testing;

constexpr char kNode[] = "node-a";

// 4 H100s: 0-1 and 2-3 NVLinked pairs; GPU 3 has MIG on with two devices.
gpu::Inventory Inventory() {
  std::vector<std::vector<int>> links = {{0, 4, 0, 0}, {4, 0, 0, 0}, {0, 0, 0, 4}, {0, 0, 4, 0}};
  gpu::Inventory inv = gpulet::testing::MakeInventory(4, links);
  inv.driver_version = "580.159.04";
  inv.cuda_driver_version = 13000;
  for (auto& d : inv.devices) {
    d.memory_bytes = 81559ull << 20;
    d.sm_count = 132;
    d.architecture = "Hopper";
    d.brand = "NVIDIA";
    d.cc_major = 9;
    d.pci_bus_id = absl::StrFormat("00000000:%02X:00.0", 0x18 + d.index);
  }
  gpulet::testing::AddMig(inv, 3, {"3g.40gb", "1g.10gb"});
  inv.devices[3].mig_devices[0].memory_bytes = 40192ull << 20;
  inv.devices[3].mig_devices[1].memory_bytes = 9856ull << 20;
  return inv;
}

// Health the test sets, with the change signal the HealthMonitor would move.
struct Health {
  std::mutex mu;
  std::set<std::pair<uint32_t, int>> bad;
  kubelet::ChangeNotifier changes;
  void Set(uint32_t gpu, int mig, bool healthy) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (healthy)
        bad.erase({gpu, mig});
      else
        bad.insert({gpu, mig});
    }
    changes.Notify();
  }
  Driver::HealthFn Fn() {
    return [this](uint32_t g, int m) {
      std::lock_guard<std::mutex> l(mu);
      return !bad.count({g, m}) && !bad.count({g, -1});
    };
  }
};

class DraTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    driver_root_ = rt::MakeTempDir("dra-root");
    std::string why;
    ok_root_ = rt::MakeDriverRoot(driver_root_, 4, &why);
    if (!ok_root_) root_why_ = why;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(driver_root_); }

  void SetUp() override {
    if (!ok_root_) GTEST_SKIP() << root_why_;
    ASSERT_TRUE(api_.Start());
    api_.CreateNode({{"metadata", {{"name", kNode}}}});
    k8s::Config cfg;
    cfg.server = api_.url();
    cfg.max_attempts = 2;
    cfg.initial_backoff = std::chrono::milliseconds(1);
    client_ = std::make_unique<k8s::Client>(cfg);
    dir_ = rt::MakeTempDir("dra");
    layer_ = std::make_unique<gpulet::testing::FakeGpuLayer>(Inventory());
  }
  void TearDown() override {
    driver_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  DriverOptions Options() {
    DriverOptions o;
    o.node_name = kNode;
    o.kubelet_dir = dir_ + "/kubelet";
    o.cdi_dir = dir_ + "/cdi";
    o.state_dir = dir_ + "/state";
    o.cdi.driver_root = driver_root_;
    o.cdi.hook_path = "";
    o.library_host_path = "/opt/gpulet/libgpulet-vcuda.so";
    o.devices.host_root = dir_;
    return o;
  }
  void StartDriver(DriverOptions o) {
    driver_ = std::make_unique<Driver>(layer_.get(), client_.get(), health_.Fn(), &health_.changes,
                                       std::move(o));
    ASSERT_TRUE(driver_->Start().ok());
  }
  void StartDriver() { StartDriver(Options()); }

  json Slice() {
    json s;
    api_.GetObject("resourceslices", "", absl::StrCat(kNode, "-", kDriverName), &s);
    return s;
  }

  // A claim allocated by "the scheduler": `results` are (request, device) pairs.
  json MakeClaim(const std::string& name, std::vector<std::pair<std::string, std::string>> results,
                 json config = json::array(), const std::string& pool = kNode) {
    json res = json::array();
    for (const auto& [req, dev] : results)
      res.push_back({{"request", req}, {"driver", kDriverName}, {"pool", pool}, {"device", dev}});
    json claim = {
        {"metadata", {{"name", name}, {"namespace", "team"}}},
        {"spec", {{"devices", {{"requests", json::array()}}}}},
        {"status", {{"allocation", {{"devices", {{"results", res}, {"config", config}}}}}}}};
    return api_.CreateObject("resourceclaims", claim);
  }

  // The kubelet's side: GetInfo on the registration socket, then the endpoint it names.
  std::shared_ptr<grpc::Channel> KubeletChannel(pluginregistration::PluginInfo* info) {
    auto reg = pluginregistration::Registration::NewStub(grpc::CreateChannel(
        "unix:" + driver_->registration_socket(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    EXPECT_TRUE(reg->GetInfo(&ctx, pluginregistration::InfoRequest(), info).ok());
    return grpc::CreateChannel("unix:" + info->endpoint(), grpc::InsecureChannelCredentials());
  }

  drav1::NodePrepareResourcesResponse PrepareV1(const json& claim) {
    pluginregistration::PluginInfo info;
    auto stub = drav1::DRAPlugin::NewStub(KubeletChannel(&info));
    drav1::NodePrepareResourcesRequest req;
    auto* c = req.add_claims();
    c->set_namespace_(claim["metadata"]["namespace"]);
    c->set_name(claim["metadata"]["name"]);
    c->set_uid(claim["metadata"]["uid"]);
    drav1::NodePrepareResourcesResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    EXPECT_TRUE(stub->NodePrepareResources(&ctx, req, &resp).ok());
    return resp;
  }

  runtime::CdiSpec SpecOf(const PreparedClaim& c) {
    auto spec = runtime::ParseCdiSpec(rt::ReadFile(c.spec_file), c.spec_file);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? *spec : runtime::CdiSpec{};
  }

  static inline std::string driver_root_, root_why_;
  static inline bool ok_root_ = false;
  testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  std::string dir_;
  std::unique_ptr<gpulet::testing::FakeGpuLayer> layer_;
  Health health_;
  std::unique_ptr<Driver> driver_;
};

TEST(DraDevicesTest, AttributesCapacityAndNames) {
  auto devs = BuildDevices(Inventory(), DeviceOptions{});
  ASSERT_TRUE(devs.ok()) << devs.status();
  ASSERT_EQ(devs->size(), 5u);  // GPUs 0-2 whole, GPU 3 as its two MIG devices
  const json& g0 = (*devs)[0].entry;
  EXPECT_EQ(g0["name"], "gpu-0");
  const json& a = g0["attributes"];
  EXPECT_EQ(a["type"]["string"], "gpu");
  EXPECT_EQ(a["uuid"]["string"], (*devs)[0].uuid);
  EXPECT_EQ(a["index"]["int"], 0);
  EXPECT_EQ(a["minor"]["int"], 0);
  EXPECT_EQ(a["productName"]["string"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(a["architecture"]["string"], "hopper");
  EXPECT_EQ(a["brand"]["string"], "NVIDIA");
  EXPECT_EQ(a["driverVersion"]["version"], "580.159.4");  // semver: no leading zero
  EXPECT_EQ(a["cudaDriverVersion"]["version"], "13.0.0");
  EXPECT_EQ(a["cudaComputeCapability"]["version"], "9.0.0");
  EXPECT_EQ(a["pcieBusID"]["string"], "00000000:18:00.0");
  EXPECT_EQ(a["nvlinkDomain"]["int"], 0);
  EXPECT_EQ(g0["capacity"]["memory"]["value"], "81559Mi");
  EXPECT_FALSE(g0.contains("allowMultipleAllocations"));
  EXPECT_EQ((*devs)[2].entry["attributes"]["nvlinkDomain"]["int"], 2);  // the 2-3 pair
  const json& m = (*devs)[3].entry;
  EXPECT_EQ(m["name"], "gpu-3-mig-1-0");
  EXPECT_EQ(m["attributes"]["type"]["string"], "mig");
  EXPECT_EQ(m["attributes"]["profile"]["string"], "3g.40gb");
  EXPECT_EQ(m["attributes"]["parentIndex"]["int"], 3);
  EXPECT_EQ(m["capacity"]["memory"]["value"], "40192Mi");

  DeviceOptions cc;
  cc.consumable_capacity = true;
  auto shared = BuildDevices(Inventory(), cc);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ((*shared)[0].entry["allowMultipleAllocations"], true);
  EXPECT_EQ((*shared)[0].entry["capacity"]["cores"]["requestPolicy"]["validRange"]["max"], "100");
  // The API server refuses a default off the min + k * step grid (81559Mi is; so was the slice).
  EXPECT_EQ((*shared)[0].entry["capacity"]["memory"]["requestPolicy"]["default"], "81408Mi");
  EXPECT_EQ(WholeShareBytes(uint64_t{81559} << 20), uint64_t{81408} << 20);
  // The scheduler consumes all of a capacity without a policy for every claim: one share a GPU.
  EXPECT_EQ((*shared)[0].entry["capacity"]["multiprocessors"]["requestPolicy"]["default"], "0");
  EXPECT_FALSE((*shared)[3].entry.contains("allowMultipleAllocations"));  // MIG: exclusive

  DeviceOptions sel;
  sel.selection = "1,GPU-nope";
  EXPECT_THAT(std::string(BuildDevices(Inventory(), sel).status().message()),
              HasSubstr("\"GPU-nope\" is not on this node"));
  auto ids = gpu::DevicePluginIds(Inventory(), "3");
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->count("3") && ids->count("3:0") && ids->count("3:1"));
  EXPECT_TRUE(ids->count(Inventory().devices[3].mig_devices[1].uuid));
  EXPECT_FALSE(ids->count("0"));
  EXPECT_EQ(SemverOf("550.54.15"), "550.54.15");
  EXPECT_EQ(SemverOf("x"), "");
}

TEST(DraConfigTest, VgpuConfigAndQuantities) {
  auto l = ParseVgpuConfig({{"apiVersion", kConfigApiVersion},
                            {"kind", "VgpuConfig"},
                            {"memory", "4Gi"},
                            {"cores", 30}});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->memory_bytes, 4ll << 30);
  EXPECT_EQ(l->cores, 30);
  EXPECT_THAT(
      std::string(ParseVgpuConfig(
                      {{"apiVersion", kConfigApiVersion}, {"kind", "VgpuConfig"}, {"cores", 150}})
                      .status()
                      .message()),
      HasSubstr("parameters.cores: 150 must be an integer 1..100"));
  EXPECT_THAT(std::string(ParseVgpuConfig({{"apiVersion", kConfigApiVersion},
                                           {"kind", "VgpuConfig"},
                                           {"memory", "100Mi"}})
                              .status()
                              .message()),
              HasSubstr("multiple of 256Mi"));
  EXPECT_THAT(std::string(ParseVgpuConfig({{"apiVersion", kConfigApiVersion},
                                           {"kind", "VgpuConfig"},
                                           {"memroy", "1Gi"}})
                              .status()
                              .message()),
              HasSubstr("parameters.memroy: unknown field"));
  EXPECT_FALSE(ParseVgpuConfig({{"kind", "Other"}}).ok());
  EXPECT_EQ(*ParseQuantity("512Mi"), 512ll << 20);
  EXPECT_EQ(*ParseQuantity("2G"), 2000000000ll);
  EXPECT_FALSE(ParseQuantity("1.5Gi").ok());
  EXPECT_FALSE(ParseQuantity("-1").ok());
}

TEST(DraConfigTest, PluginConfigSection) {
  auto c = plugin::ParseConfig(
      "version: v1\ngpulet:\n  dra:\n    gpus: \"0, 3\"\n    consumableCapacity: true\n"
      "    cdiDir: /run/cdi\n",
      "config.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dra.gpus, "0, 3");
  EXPECT_TRUE(c->dra.consumable_capacity);
  EXPECT_EQ(c->dra.cdi_dir, "/run/cdi");
  EXPECT_EQ(c->dra.state_dir, "/var/lib/gpulet/dra");
  auto bad =
      plugin::ParseConfig("version: v1\ngpulet:\n  dra:\n    stateDir: relative\n", "config.yaml");
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("config.yaml:4: gpulet.dra.stateDir: must be an absolute path"));
  auto unknown = plugin::ParseConfig("version: v1\ngpulet:\n  dra:\n    gpu: all\n", "c.yaml");
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("gpulet.dra.gpu: unknown key"));
}

TEST_F(DraTest, PublishesSliceAndFollowsHealth) {
  StartDriver();
  json s = Slice();
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["spec"]["driver"], kDriverName);
  EXPECT_EQ(s["spec"]["nodeName"], kNode);
  EXPECT_EQ(s["spec"]["pool"]["name"], kNode);
  EXPECT_EQ(s["spec"]["pool"]["generation"], 1);
  EXPECT_EQ(s["spec"]["pool"]["resourceSliceCount"], 1);
  EXPECT_EQ(s["spec"]["devices"].size(), 5u);
  EXPECT_EQ(s["metadata"]["ownerReferences"][0]["kind"], "Node");

  // An XID on GPU 1: the device leaves the slice, in a new pool generation, promptly.
  auto t0 = std::chrono::steady_clock::now();
  health_.Set(1, -1, false);
  json after;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    after = Slice();
    if (after["spec"]["pool"]["generation"] == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(after["spec"]["pool"]["generation"], 2);
  EXPECT_EQ(after["spec"]["devices"].size(), 4u);
  for (const auto& d : after["spec"]["devices"]) EXPECT_NE(d["name"], "gpu-1");
  EXPECT_LT(ms, 1000);
  std::printf("figure: health change -> updated ResourceSlice %.1f ms\n", ms);
  // A MIG device alone.
  health_.Set(3, 1, false);
  for (int i = 0; i < 500 && Slice()["spec"]["pool"]["generation"] != 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(Slice()["spec"]["devices"].size(), 3u);
  health_.Set(1, -1, true);
  health_.Set(3, 1, true);
  for (int i = 0; i < 500 && Slice()["spec"]["devices"].size() != 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(Slice()["spec"]["devices"].size(), 5u);

  // A restarted agent that finds its slice current writes nothing.
  int64_t gen = Slice()["spec"]["pool"]["generation"];
  int64_t puts = api_.request_count("PUT"), posts = api_.request_count("POST");
  driver_.reset();
  StartDriver();
  EXPECT_EQ(Slice()["spec"]["pool"]["generation"], gen);
  EXPECT_EQ(api_.request_count("PUT"), puts);
  EXPECT_EQ(api_.request_count("POST"), posts);
}

TEST_F(DraTest, RemovesStaleSlicesOfOtherLayouts) {
  api_.CreateObject("resourceslices",
                    {{"metadata", {{"name", "node-a-old"}}},
                     {"spec",
                      {{"driver", kDriverName},
                       {"nodeName", kNode},
                       {"pool", {{"name", "old"}, {"generation", 1}, {"resourceSliceCount", 1}}},
                       {"devices", json::array()}}}});
  api_.CreateObject("resourceslices",
                    {{"metadata", {{"name", "other-driver"}}},
                     {"spec",
                      {{"driver", "other.example.com"},
                       {"nodeName", kNode},
                       {"pool", {{"name", kNode}, {"generation", 1}, {"resourceSliceCount", 1}}},
                       {"devices", json::array()}}}});
  StartDriver();
  json s;
  EXPECT_FALSE(api_.GetObject("resourceslices", "", "node-a-old", &s));
  EXPECT_TRUE(api_.GetObject("resourceslices", "", "other-driver", &s));
}

TEST_F(DraTest, RegistrationAndPrepareOverGrpc) {
  StartDriver();
  json claim = MakeClaim("one-gpu", {{"gpu", "gpu-0"}});
  pluginregistration::PluginInfo info;
  KubeletChannel(&info);
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), kDriverName);
  EXPECT_EQ(info.endpoint(), driver_->service_socket());
  EXPECT_THAT(
      std::vector<std::string>(info.supported_versions().begin(), info.supported_versions().end()),
      ::testing::ElementsAre("v1.DRAPlugin", "v1beta1.DRAPlugin"));

  std::string uid = claim["metadata"]["uid"];
  auto resp = PrepareV1(claim);
  ASSERT_EQ(resp.claims().count(uid), 1u);
  const auto& r = resp.claims().at(uid);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.devices_size(), 1);
  EXPECT_EQ(r.devices(0).pool_name(), kNode);
  EXPECT_EQ(r.devices(0).device_name(), "gpu-0");
  EXPECT_EQ(r.devices(0).request_names(0), "gpu");
  ASSERT_EQ(r.devices(0).cdi_device_ids_size(), 1);
  EXPECT_EQ(r.devices(0).cdi_device_ids(0), absl::StrCat("gpu.gpulet.io/claim=", uid, "-gpu-0"));

  // The spec: the GPU's device node and the driver's shared edits, readable by the CDI parser.
  auto prepared = driver_->prepared();
  ASSERT_EQ(prepared.size(), 1u);
  EXPECT_EQ(prepared[0].spec_file, absl::StrCat(dir_, "/cdi/gpu.gpulet.io-claim_", uid, ".json"));
  runtime::CdiSpec spec = SpecOf(prepared[0]);
  EXPECT_EQ(spec.kind, "gpu.gpulet.io/claim");
  ASSERT_EQ(spec.devices.size(), 1u);
  ASSERT_EQ(spec.devices[0].edits.device_nodes.size(), 1u);
  EXPECT_THAT(spec.devices[0].edits.device_nodes[0].path, "/dev/nvidia0");
  EXPECT_THAT(spec.edits.env, ::testing::Contains("NVIDIA_VISIBLE_DEVICES=void"));
  runtime::CdiRegistry reg;
  ASSERT_TRUE(reg.Load({dir_ + "/cdi"}).ok());
  EXPECT_TRUE(reg.Resolve({r.devices(0).cdi_device_ids(0)}).ok());

  // The device status with a Ready condition, written by the sync thread.
  json st;
  for (int i = 0; i < 500; ++i) {
    api_.GetObject("resourceclaims", "team", "one-gpu", &st);
    if (st["status"].contains("devices")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(st["status"].contains("devices")) << st.dump();
  EXPECT_EQ(st["status"]["devices"][0]["device"], "gpu-0");
  EXPECT_EQ(st["status"]["devices"][0]["conditions"][0]["type"], "Ready");
  EXPECT_EQ(st["status"]["devices"][0]["conditions"][0]["status"], "True");
  // The device fails: its claim's condition turns False.
  health_.Set(0, -1, false);
  for (int i = 0; i < 500; ++i) {
    api_.GetObject("resourceclaims", "team", "one-gpu", &st);
    if (st["status"]["devices"][0]["conditions"][0]["status"] == "False") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(st["status"]["devices"][0]["conditions"][0]["status"], "False");
  EXPECT_EQ(st["status"]["devices"][0]["conditions"][0]["reason"], "DeviceUnhealthy");

  // v1beta1 (kubelets 1.32-1.33) on the same endpoint: unprepare.
  auto beta = drav1beta1::DRAPlugin::NewStub(
      grpc::CreateChannel("unix:" + info.endpoint(), grpc::InsecureChannelCredentials()));
  drav1beta1::NodeUnprepareResourcesRequest ureq;
  auto* c = ureq.add_claims();
  c->set_namespace_("team");
  c->set_name("one-gpu");
  c->set_uid(uid);
  drav1beta1::NodeUnprepareResourcesResponse uresp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(beta->NodeUnprepareResources(&ctx, ureq, &uresp).ok());
  ASSERT_EQ(uresp.claims().count(uid), 1u);
  EXPECT_EQ(uresp.claims().at(uid).error(), "");
  EXPECT_FALSE(std::filesystem::exists(prepared[0].spec_file));
  EXPECT_TRUE(driver_->prepared().empty());
}

TEST_F(DraTest, PrepareIsIdempotentAndSurvivesRestart) {
  StartDriver();
  json claim = MakeClaim("pair", {{"gpus", "gpu-0"}, {"gpus", "gpu-1"}});
  std::string uid = claim["metadata"]["uid"];
  auto first = driver_->Prepare("team", "pair", uid);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->devices.size(), 2u);
  int64_t gets = api_.request_count("GET");
  auto again = driver_->Prepare("team", "pair", uid);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->devices[1].cdi_ids, first->devices[1].cdi_ids);
  EXPECT_EQ(api_.request_count("GET"), gets);  // answered from the checkpointed state

  // Restart; the CDI directory was lost meanwhile (tmpfs after a reboot).
  driver_.reset();
  std::filesystem::remove_all(dir_ + "/cdi");
  StartDriver();
  auto p = driver_->prepared();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].uid, uid);
  EXPECT_TRUE(std::filesystem::exists(p[0].spec_file));
  EXPECT_EQ(SpecOf(p[0]).devices.size(), 2u);
  auto after = driver_->Prepare("team", "pair", uid);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->devices[0].cdi_ids, first->devices[0].cdi_ids);
  ASSERT_TRUE(driver_->Unprepare(uid).ok());
  ASSERT_TRUE(driver_->Unprepare(uid).ok());  // twice: already done
  driver_.reset();
  StartDriver();
  EXPECT_TRUE(driver_->prepared().empty());
}

TEST_F(DraTest, FractionalClaimGetsInterposerLimits) {
  StartDriver();
  json cfg = json::array({{{"source", "FromClaim"},
                           {"requests", {"gpu"}},
                           {"opaque",
                            {{"driver", kDriverName},
                             {"parameters",
                              {{"apiVersion", kConfigApiVersion},
                               {"kind", "VgpuConfig"},
                               {"memory", "4Gi"},
                               {"cores", 30}}}}}}});
  json claim = MakeClaim("frac", {{"gpu", "gpu-2"}}, cfg);
  std::string uid = claim["metadata"]["uid"];
  auto p = driver_->Prepare("team", "frac", uid);
  ASSERT_TRUE(p.ok()) << p.status();
  runtime::CdiSpec spec = SpecOf(*p);
  ASSERT_EQ(spec.devices.size(), 1u);
  const auto& e = spec.devices[0].edits;
  EXPECT_THAT(e.env, ::testing::IsSupersetOf(std::vector<std::string>{
                         "GPULET_VGPU_MEMORY_LIMIT=4294967296", "GPULET_VGPU_CORE_LIMIT=30",
                         "LD_PRELOAD=/usr/lib/gpulet/libgpulet-vcuda.so", "GPULET_VGPU_DISABLE=0",
                         "GPULET_VGPU_UUID=" + Inventory().devices[2].uuid}));
  ASSERT_EQ(e.mounts.size(), 4u);
  EXPECT_EQ(e.mounts[0].host_path, p->accounting_dir + "/accounting");
  EXPECT_EQ(e.mounts[0].container_path, "/var/run/gpulet/vgpu/accounting");
  // The limits the interposer reads, read-only (issue 31.6), and the preload file.
  EXPECT_EQ(e.mounts[1].host_path, p->accounting_dir + "/limits");
  EXPECT_EQ(e.mounts[1].container_path, "/var/run/gpulet/vgpu/limits");
  EXPECT_THAT(e.mounts[1].options, ::testing::Contains("ro"));
  EXPECT_THAT(ReadFileToString(e.mounts[1].host_path).value_or(""),
              ::testing::HasSubstr("\nGPULET_VGPU_MEMORY_LIMIT=4294967296\n"));
  EXPECT_EQ(e.mounts[2].host_path, "/opt/gpulet/libgpulet-vcuda.so");
  EXPECT_EQ(e.mounts[3].container_path, "/etc/ld.so.preload");
  EXPECT_THAT(e.mounts[3].options, ::testing::Contains("ro"));
  EXPECT_EQ(ReadFileToString(e.mounts[3].host_path).value_or(""),
            "/usr/lib/gpulet/libgpulet-vcuda.so\n");
  EXPECT_EQ(std::filesystem::file_size(p->accounting_dir + "/accounting"),
            sizeof(vgpu::AccountingRegion));
  ASSERT_TRUE(driver_->Unprepare(uid).ok());
  EXPECT_FALSE(std::filesystem::exists(p->accounting_dir));

  // Consumable capacity: what the scheduler set aside is the limit.
  json c2 = MakeClaim("share", {{"gpu", "gpu-0"}});
  c2["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {{"memory", "8Gi"},
                                                                             {"cores", "25"}};
  c2["status"]["allocation"]["devices"]["results"][0]["shareID"] = "abc";
  ASSERT_TRUE(api_.UpdateObject("resourceclaims", c2));
  auto p2 = driver_->Prepare("team", "share", c2["metadata"]["uid"]);
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_THAT(SpecOf(*p2).devices[0].edits.env,
              ::testing::IsSupersetOf(
                  {"GPULET_VGPU_MEMORY_LIMIT=8589934592", "GPULET_VGPU_CORE_LIMIT=25"}));
  // Its status entry names the share (the API refuses one without the allocation's shareID).
  json st;
  for (int i = 0; i < 500; ++i) {
    api_.GetObject("resourceclaims", "team", "share", &st);
    if (st["status"].contains("devices")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(st["status"].contains("devices")) << st.dump();
  EXPECT_EQ(st["status"]["devices"][0].value("shareID", ""), "abc");
  // A claim that names no amount consumes the defaults, the whole GPU: no limit, no interposer.
  json c3 = MakeClaim("whole", {{"gpu", "gpu-1"}});
  c3["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {{"memory", "81408Mi"},
                                                                             {"cores", "100"}};
  c3["status"]["allocation"]["devices"]["results"][0]["shareID"] = "def";
  ASSERT_TRUE(api_.UpdateObject("resourceclaims", c3));
  auto p3 = driver_->Prepare("team", "whole", c3["metadata"]["uid"]);
  ASSERT_TRUE(p3.ok()) << p3.status();
  runtime::CdiSpec whole = SpecOf(*p3);
  for (const std::string& e : whole.devices[0].edits.env)
    EXPECT_FALSE(absl::StartsWith(e, "GPULET_VGPU_MEMORY_LIMIT=")) << e;
}

TEST_F(DraTest, PrepareErrorsNameTheProblem) {
  StartDriver();
  auto msg = [&](const std::string& ns, const std::string& name, const std::string& uid) {
    auto p = driver_->Prepare(ns, name, uid);
    EXPECT_FALSE(p.ok());
    return std::string(p.status().message());
  };
  EXPECT_THAT(msg("team", "missing", "u-1"), HasSubstr("reading ResourceClaim team/missing"));
  json c = MakeClaim("elsewhere", {{"gpu", "gpu-0"}}, json::array(), "node-b");
  EXPECT_THAT(msg("team", "elsewhere", c["metadata"]["uid"]), HasSubstr("from pool node-b"));
  c = MakeClaim("ghost", {{"gpu", "gpu-9"}});
  EXPECT_THAT(msg("team", "ghost", c["metadata"]["uid"]), HasSubstr("device gpu-9 is not on node"));
  c = MakeClaim("renamed", {{"gpu", "gpu-0"}});
  EXPECT_THAT(msg("team", "renamed", "not-the-uid"), HasSubstr("deleted and created again"));
  EXPECT_THAT(msg("Team/../x", "a", "u"), HasSubstr("not a valid namespace"));
  json bad = json::array(
      {{{"opaque",
         {{"driver", kDriverName},
          {"parameters",
           {{"apiVersion", kConfigApiVersion}, {"kind", "VgpuConfig"}, {"cores", 0}}}}}}});
  c = MakeClaim("badcfg", {{"gpu", "gpu-0"}}, bad);
  EXPECT_THAT(msg("team", "badcfg", c["metadata"]["uid"]), HasSubstr("parameters.cores: 0"));
  health_.Set(1, -1, false);
  c = MakeClaim("sick", {{"gpu", "gpu-1"}});
  EXPECT_THAT(msg("team", "sick", c["metadata"]["uid"]), HasSubstr("is unhealthy"));
  json unalloc = api_.CreateObject("resourceclaims",
                                   {{"metadata", {{"name", "pending"}, {"namespace", "team"}}}});
  EXPECT_THAT(msg("team", "pending", unalloc["metadata"]["uid"]), HasSubstr("is not allocated"));
  // Errors travel per claim in the gRPC answer; the call itself succeeds.
  auto resp = PrepareV1(c);
  EXPECT_THAT(resp.claims().at(c["metadata"]["uid"]).error(), HasSubstr("is unhealthy"));
  EXPECT_TRUE(driver_->prepared().empty());
}

TEST_F(DraTest, CorruptCheckpointIsAClearError) {
  rt::WriteFile(dir_ + "/state/prepared/u1.json", "{\"version\": 7}");
  driver_ = std::make_unique<Driver>(layer_.get(), client_.get(), health_.Fn(), &health_.changes,
                                     Options());
  absl::Status s = driver_->Start();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("prepared/u1.json: not a gpulet DRA claim checkpoint"));
}

}  // namespace
}  // namespace gpulet::dra
