// Node-side vGPU assignment against the fake API server: finding the pod of an Allocate, two
// identical pods, the container contract (env, mounts), checkpoint across restarts, release,
// correction from the kubelet's record, and the kubelet resources' device lists and preferences.
#include "vgpu/node/node.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "abi/vgpu_accounting.h"
#include "common/fs.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/common/fake_clock.h"

namespace gpulet::vgpu {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kUnits = 318;

std::vector<std::string> Ids(const std::string& uuid, const char* kind, int n, int from = 0) {
  std::vector<std::string> out;
  for (int i = from; i < from + n; ++i) out.push_back(uuid + kind + std::to_string(i));
  return out;
}

json PodObj(const std::string& name, int cores, int mem, int64_t bind_time = 0,
            const std::string& gpus = "") {
  json limits = {{"tencent.com/vcuda-core", std::to_string(cores)}};
  if (mem) limits["tencent.com/vcuda-memory"] = std::to_string(mem);
  json pod = {
      {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", json::object()}}},
      {"spec",
       {{"nodeName", "node-1"},
        {"containers", json::array({{{"name", "cuda"}, {"resources", {{"limits", limits}}}}})}}}};
  if (bind_time)
    pod["metadata"]["annotations"]["gpulet.io/vgpu-bind-time"] = std::to_string(bind_time);
  if (!gpus.empty()) {
    pod["metadata"]["annotations"]["gpulet.io/vgpu-node"] = "node-1";
    pod["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"] = gpus;
  }
  return pod;
}

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (std::filesystem::temp_directory_path() / "vgpu-node-XXXXXX").string();
    dir_ = mkdtemp(t.data());
    ASSERT_TRUE(api_.Start());
    k8s::Config c;
    c.server = api_.url();
    c.initial_backoff = std::chrono::milliseconds(1);
    client_ = std::make_unique<k8s::Client>(c);
    opts_.node_name = "node-1";
    opts_.state_dir = dir_ + "/state";
    pool_ = {{"GPU-0", 0, kUnits}, {"GPU-1", 1, kUnits}};
    assigner_ = Make();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::shared_ptr<NodeAssigner> Make() {
    auto a = std::make_shared<NodeAssigner>(opts_, pool_, client_.get());
    EXPECT_TRUE(a->Load().ok());
    return a;
  }
  // One container's two Allocate calls (in the given order); returns the full response.
  v1beta1::ContainerAllocateResponse AllocPair(NodeAssigner& a, const std::string& gpu, int cores,
                                               int mem, bool memory_first = false, int from = 0) {
    auto c = Ids(gpu, "::vc", cores, from), m = Ids(gpu, "::vm", mem, from);
    auto first = a.Allocate(!memory_first, memory_first ? m : c);
    EXPECT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->envs_size(), 0);
    auto second = a.Allocate(memory_first, memory_first ? c : m);
    EXPECT_TRUE(second.ok()) << second.status();
    return second.ok() ? *second : v1beta1::ContainerAllocateResponse();
  }
  std::string PodOf(const v1beta1::ContainerAllocateResponse& r) {
    return r.annotations().at("gpulet.io/vgpu-container");
  }

  std::string dir_;
  testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  NodeOptions opts_;
  std::vector<PoolGpu> pool_;
  std::shared_ptr<NodeAssigner> assigner_;
};

// The seed pod placed by the extender gets its annotated GPU and the interposer contract:
// limits in env, the accounting file mounted read-write, the library mounted read-only and
// preloaded, NVIDIA_VISIBLE_DEVICES for the runtime; the pod is marked assigned.
TEST_F(NodeTest, SeedPodContract) {
  api_.CreatePod(PodObj("seed", 30, 20, 1, "GPU-1"));
  auto r = AllocPair(*assigner_, "GPU-0", 30, 20);  // kubelet's IDs need not be on that GPU
  EXPECT_EQ(r.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");
  EXPECT_EQ(r.envs().at("GPULET_VGPU_MEMORY_LIMIT"), std::to_string(20ull * 256 * 1024 * 1024));
  EXPECT_EQ(r.envs().at("GPULET_VGPU_CORE_LIMIT"), "30");
  EXPECT_EQ(r.envs().at("GPULET_VGPU_CORE_CEILING"), "30");
  EXPECT_EQ(r.envs().at("GPULET_VGPU_ACCOUNTING"), "/var/run/gpulet/vgpu/accounting");
  EXPECT_EQ(r.envs().at("LD_PRELOAD"), "/usr/lib/gpulet/libgpulet-vcuda.so");
  // An image's ENV GPULET_VGPU_DISABLE=1 is overridden by the Allocate env (issue 14.5).
  EXPECT_EQ(r.envs().at("GPULET_VGPU_DISABLE"), "0");
  ASSERT_EQ(r.mounts_size(), 4);
  json pod;
  ASSERT_TRUE(api_.GetPod("default", "seed", &pod));
  std::string uid = pod["metadata"]["uid"];
  EXPECT_EQ(r.mounts(0).host_path(), opts_.state_dir + "/" + uid + "/cuda/accounting");
  EXPECT_EQ(r.mounts(0).container_path(), "/var/run/gpulet/vgpu/accounting");
  EXPECT_FALSE(r.mounts(0).read_only());
  // The limits the interposer reads (issue 31.6): a read-only file, not the environment a
  // tenant's entrypoint or ConfigMap can change.
  EXPECT_EQ(r.mounts(1).container_path(), "/var/run/gpulet/vgpu/limits");
  EXPECT_TRUE(r.mounts(1).read_only());
  auto limits = ReadFileToString(r.mounts(1).host_path());
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_THAT(
      *limits,
      HasSubstr("\nGPULET_VGPU_MEMORY_LIMIT=" + std::to_string(20ull * 256 * 1024 * 1024) + "\n"));
  EXPECT_THAT(*limits, HasSubstr("\nGPULET_VGPU_UUID=GPU-1\n"));
  EXPECT_THAT(*limits, HasSubstr("\nGPULET_VGPU_CORE_LIMIT=30\n"));
  EXPECT_THAT(*limits, HasSubstr("\nGPULET_VGPU_DISABLE=0\n"));
  EXPECT_EQ(r.mounts(2).container_path(), "/usr/lib/gpulet/libgpulet-vcuda.so");
  EXPECT_TRUE(r.mounts(2).read_only());
  // Every process of the container loads the interposer, whatever its LD_PRELOAD says.
  EXPECT_EQ(r.mounts(3).container_path(), "/etc/ld.so.preload");
  EXPECT_TRUE(r.mounts(3).read_only());
  EXPECT_EQ(ReadFileToString(r.mounts(3).host_path()).value_or(""),
            "/usr/lib/gpulet/libgpulet-vcuda.so\n");
  // The accounting file exists, sized as a valid empty region.
  auto size = std::filesystem::file_size(r.mounts(0).host_path());
  EXPECT_EQ(size, sizeof(AccountingRegion));
  EXPECT_EQ(pod["metadata"]["annotations"]["gpulet.io/vgpu-assigned"], "true");
}

// The granted GPU reaches the container as the device plugin's delivery puts it (device nodes,
// CDI names): NVIDIA_VISIBLE_DEVICES alone reaches nothing unless gpulet's shim is the runtime.
// The UUID stays in NVIDIA_VISIBLE_DEVICES whatever the delivery wrote there (for the shim), and is
// in GPULET_VGPU_UUID, which the interposer reads (a CDI spec sets NVIDIA_VISIBLE_DEVICES=void).
TEST_F(NodeTest, TheGrantedGpuIsDeliveredAsTheDevicePluginDeliversGpus) {
  std::vector<std::string> delivered;
  opts_.deliver = [&](const std::vector<std::string>& uuids,
                      v1beta1::ContainerAllocateResponse* r) {
    delivered = uuids;
    for (const auto& u : uuids) r->add_cdi_devices()->set_name("nvidia.com/gpu=" + u);
    (*r->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = "/var/run/nvidia-container-devices";
  };
  assigner_ = Make();
  api_.CreatePod(PodObj("seed", 30, 20, 1, "GPU-1"));
  auto r = AllocPair(*assigner_, "GPU-0", 30, 20);
  EXPECT_THAT(delivered, ElementsAre("GPU-1"));
  ASSERT_EQ(r.cdi_devices_size(), 1);
  EXPECT_EQ(r.cdi_devices(0).name(), "nvidia.com/gpu=GPU-1");
  EXPECT_EQ(r.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");
  EXPECT_EQ(r.envs().at("GPULET_VGPU_UUID"), "GPU-1");
  EXPECT_EQ(r.envs().at("GPULET_VGPU_CORE_LIMIT"), "30");
}

// Two identical pods arriving together get one grant each, in bind order, on different records;
// a third Allocate with nothing left to serve is a clear error.
TEST_F(NodeTest, TwoIdenticalPods) {
  api_.CreatePod(PodObj("b", 50, 100, 2));
  api_.CreatePod(PodObj("a", 50, 100, 1));
  auto r1 = AllocPair(*assigner_, "GPU-0", 50, 100);
  auto r2 = AllocPair(*assigner_, "GPU-0", 50, 100, true, 50);
  EXPECT_EQ(PodOf(r1), "default/a/cuda");
  EXPECT_EQ(PodOf(r2), "default/b/cuda");
  // Without extender annotations the node places them itself (binpack: both on one GPU).
  EXPECT_EQ(r1.envs().at("NVIDIA_VISIBLE_DEVICES"), r2.envs().at("NVIDIA_VISIBLE_DEVICES"));
  EXPECT_EQ(assigner_->grants().size(), 2u);
  auto third = assigner_->Allocate(true, Ids("GPU-1", "::vc", 50));
  ASSERT_FALSE(third.ok());
  EXPECT_THAT(third.status().message(), HasSubstr("no Pending pod bound to node node-1"));
  // The node wrote where it put them, so the extender can rebuild its state.
  json a;
  ASSERT_TRUE(api_.GetPod("default", "a", &a));
  EXPECT_EQ(a["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"],
            r1.envs().at("NVIDIA_VISIBLE_DEVICES"));
}

// Same cores, different memory: the pair of calls matches on both numbers, whatever comes first.
TEST_F(NodeTest, PairMatchesCoresAndMemory) {
  api_.CreatePod(PodObj("small", 30, 10, 1));
  api_.CreatePod(PodObj("large", 30, 40, 2));
  auto r = AllocPair(*assigner_, "GPU-0", 30, 40, /*memory_first=*/true);
  EXPECT_EQ(PodOf(r), "default/large/cuda");
  EXPECT_EQ(r.envs().at("GPULET_VGPU_MEMORY_LIMIT"), std::to_string(40ull << 28));
  auto s = AllocPair(*assigner_, "GPU-0", 30, 10, false, 30);
  EXPECT_EQ(PodOf(s), "default/small/cuda");
}

// Whole GPUs: one call, exclusive GPUs, no limits or injection; shares never land on them.
TEST_F(NodeTest, WholeGpuIsExclusive) {
  api_.CreatePod(PodObj("share", 10, 4, 1));
  api_.CreatePod(PodObj("whole", 100, 0, 2));
  AllocPair(*assigner_, "GPU-0", 10, 4);
  auto w = assigner_->Allocate(true, Ids("GPU-1", "::vc", 100));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE(w->envs().contains("GPULET_VGPU_MEMORY_LIMIT"));
  EXPECT_FALSE(w->envs().contains("LD_PRELOAD"));
  std::string whole_gpu = w->envs().at("NVIDIA_VISIBLE_DEVICES");
  std::string share_gpu = assigner_->grants()[0].gpus[0];
  EXPECT_NE(whole_gpu, share_gpu);
  // Nothing is left for a second whole GPU or for a share on the whole one.
  api_.CreatePod(PodObj("whole2", 100, 0, 3));
  auto w2 = assigner_->Allocate(true, Ids("GPU-0", "::vc", 100));
  ASSERT_FALSE(w2.ok());
  EXPECT_THAT(w2.status().message(), HasSubstr("is not free in this node's grants"));
}

// Found by cluster.nodes: a pod the extender put on a GPU that is full here (its books were
// behind), and whose kubelet booking lies on another full GPU, is refused, naming both; it used to
// be granted with no GPU at all (and recorded so, with an empty GPU list).
TEST_F(NodeTest, APodWithNowhereToRunIsRefusedNotGrantedWithoutAGpu) {
  api_.CreatePod(PodObj("a", 90, 8, 1, "GPU-0"));
  api_.CreatePod(PodObj("b", 90, 8, 2, "GPU-1"));
  AllocPair(*assigner_, "GPU-0", 90, 8);
  AllocPair(*assigner_, "GPU-1", 90, 8);
  api_.CreatePod(PodObj("c", 90, 8, 3, "GPU-0"));
  auto first = assigner_->Allocate(true, Ids("GPU-1", "::vc", 90));
  ASSERT_TRUE(first.ok()) << first.status();  // the first of the pair only waits for the second
  auto c = assigner_->Allocate(false, Ids("GPU-1", "::vm", 8));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("default/c"));
  EXPECT_THAT(c.status().message(), HasSubstr("the extender's GPUs GPU-0 are full"));
  EXPECT_THAT(c.status().message(), HasSubstr("GPU-1 is not free in this node's grants"));
  EXPECT_EQ(assigner_->grants().size(), 2u);
  json pod;
  ASSERT_TRUE(api_.GetPod("default", "c", &pod));
  EXPECT_EQ(pod["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"], "GPU-0")
      << "the extender's record stays";
}

// The opt-out GPULET_VGPU_DISABLE=1 on the container keeps limits in env but injects nothing;
// the soft-limit annotation raises the ceiling.
TEST_F(NodeTest, OptOutAndSoftLimit) {
  json pod = PodObj("opt", 20, 8, 1);
  pod["spec"]["containers"][0]["env"] =
      json::array({{{"name", "GPULET_VGPU_DISABLE"}, {"value", "1"}}});
  pod["metadata"]["annotations"]["tencent.com/vcuda-core-limit"] = "60";
  api_.CreatePod(pod);
  auto r = AllocPair(*assigner_, "GPU-0", 20, 8);
  EXPECT_FALSE(r.envs().contains("LD_PRELOAD"));
  EXPECT_EQ(r.envs().at("GPULET_VGPU_DISABLE"), "1");
  // The opt-out is in the read-only limits file too; nothing else is mounted.
  ASSERT_EQ(r.mounts_size(), 1);
  EXPECT_EQ(r.mounts(0).container_path(), "/var/run/gpulet/vgpu/limits");
  EXPECT_THAT(ReadFileToString(r.mounts(0).host_path()).value_or(""),
              HasSubstr("\nGPULET_VGPU_DISABLE=1\n"));
}

// The checkpoint survives a restart: the new assigner knows the grant and does not hand the
// same container out again; release drops grants of pods that are gone.
TEST_F(NodeTest, RestartAndRelease) {
  api_.CreatePod(PodObj("p", 40, 16, 1, "GPU-0"));
  AllocPair(*assigner_, "GPU-0", 40, 16);
  auto restarted = Make();
  ASSERT_EQ(restarted->grants().size(), 1u);
  EXPECT_EQ(restarted->grants()[0].gpus, std::vector<std::string>{"GPU-0"});
  auto again = restarted->Allocate(true, Ids("GPU-0", "::vc", 40, 40));
  EXPECT_FALSE(again.ok() && again->envs_size() > 0);
  std::string acc_dir = restarted->grants()[0].accounting_dir;
  ASSERT_TRUE(std::filesystem::exists(acc_dir));
  ASSERT_TRUE(api_.DeletePod("default", "p"));
  ASSERT_TRUE(restarted->ReleaseGoneFromApi().ok());
  EXPECT_TRUE(restarted->grants().empty());
  EXPECT_FALSE(std::filesystem::exists(acc_dir));
  EXPECT_TRUE(Make()->grants().empty());
}

// With the watch on this node's pods, housekeeping lists nothing and an ended pod's grant is
// freed from its watch event (Succeeded, or deleted), without waiting for a reconcile.
TEST_F(NodeTest, WatchFreesEndedPodsAndHousekeepingListsNothing) {
  assigner_->StartWatching();
  for (int i = 0; i < 400 && !assigner_->watch_synced(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(assigner_->watch_synced());
  api_.CreatePod(PodObj("p", 40, 16, 1, "GPU-0"));
  AllocPair(*assigner_, "GPU-0", 40, 16);
  ASSERT_EQ(assigner_->grants().size(), 1u);
  int64_t gets = api_.request_count("GET");
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(assigner_->ReleaseGoneFromApi().ok());
  EXPECT_EQ(api_.request_count("GET"), gets);  // from the watch's view, no LIST
  EXPECT_EQ(assigner_->grants().size(), 1u);
  auto freed_within_1s = [&] {
    for (int i = 0; i < 200 && !assigner_->grants().empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return assigner_->grants().empty();
  };
  ASSERT_TRUE(api_.SetPodPhase("default", "p", "Succeeded"));
  EXPECT_TRUE(freed_within_1s()) << "Succeeded pod still holds its grant";
  api_.CreatePod(PodObj("q", 30, 8, 1, "GPU-1"));
  AllocPair(*assigner_, "GPU-1", 30, 8);
  ASSERT_EQ(assigner_->grants().size(), 1u);
  ASSERT_TRUE(api_.DeletePod("default", "q"));
  EXPECT_TRUE(freed_within_1s()) << "deleted pod still holds its grant";
  assigner_->StopWatching();
}

// A corrupt checkpoint is an error naming the file, not a silent reset.
TEST_F(NodeTest, CorruptCheckpoint) {
  std::filesystem::create_directories(opts_.state_dir);
  ASSERT_TRUE(WriteFileAtomic(opts_.state_dir + "/assignments.json", "{not json").ok());
  NodeAssigner a(opts_, pool_, client_.get());
  absl::Status s = a.Load();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("assignments.json"));
}

// A checkpoint with wrong-typed or out-of-range fields is an error naming the file, the grant and
// the field; it used to throw from json::value() and abort the agent at every start.
TEST_F(NodeTest, CheckpointWithWrongTypes) {
  std::filesystem::create_directories(opts_.state_dir);
  const std::pair<const char*, const char*> cases[] = {
      {R"({"grants":[{"podUID":5}]})", "grant #0: \"podUID\" must be a string"},
      {R"({"grants":[{"cores":1e999}]})", ""},
      {R"({"grants":[{"cores":-1}]})", "\"cores\" must be an integer"},
      {R"({"grants":[{"gpus":"GPU-0"}]})", "\"gpus\" must be a short list of strings"},
      {R"({"grants":[{"podUID":"a"}, 7]})", "grant #1 is not an object"},
      {R"({"grants":[{"inject":"yes"}]})", "\"inject\" must be true or false"},
      {R"({"grants":{}})", "not a gpulet vGPU checkpoint"},
      {R"([1,2])", "not a gpulet vGPU checkpoint"},
  };
  for (const auto& [text, want] : cases) {
    ASSERT_TRUE(WriteFileAtomic(opts_.state_dir + "/assignments.json", text).ok());
    NodeAssigner a(opts_, pool_, client_.get());
    absl::Status st = a.Load();
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_THAT(st.message(), HasSubstr("assignments.json")) << text;
    EXPECT_THAT(st.message(), HasSubstr(want)) << text;
  }
}

// Identical pods admitted in the other order: the kubelet's record (PodResources) shows whose
// devices are whose; the grants and the pods' annotations are corrected.
TEST_F(NodeTest, CorrectionFromKubeletRecord) {
  api_.CreatePod(PodObj("a", 60, 8, 1));
  api_.CreatePod(PodObj("b", 60, 8, 2));
  auto ra = AllocPair(*assigner_, "GPU-0", 60, 8);            // we think: a
  auto rb = AllocPair(*assigner_, "GPU-1", 60, 8, false, 0);  // we think: b
  ASSERT_EQ(PodOf(ra), "default/a/cuda");
  std::string gpu_given_first = ra.envs().at("NVIDIA_VISIBLE_DEVICES");
  std::string gpu_given_second = rb.envs().at("NVIDIA_VISIBLE_DEVICES");
  ASSERT_NE(gpu_given_first, gpu_given_second);
  // The kubelet says: the first devices went to b, the second to a.
  std::map<std::string, std::pair<std::string, std::string>> owner;
  owner["GPU-0::vc0"] = {"default/b", "cuda"};
  owner["GPU-1::vc0"] = {"default/a", "cuda"};
  ASSERT_TRUE(assigner_->Correct(owner).ok());
  for (const auto& g : assigner_->grants()) {
    if (g.pod == "b") EXPECT_EQ(g.gpus[0], gpu_given_first);
    if (g.pod == "a") EXPECT_EQ(g.gpus[0], gpu_given_second);
  }
  json b;
  ASSERT_TRUE(api_.GetPod("default", "b", &b));
  EXPECT_EQ(b["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"], gpu_given_first);
}

// The kubelet admitted the later-bound of two like pods first, and no grant of the other exists
// yet (found by cluster.nodes: a burst's pod ran on another GPU than its annotation named). The
// grant moves to the pod the kubelet admitted, with its soft limit and annotations; the other
// pod is unserved again and takes over the GPU the extender had set aside for the first, so that
// its own Allocate finds room (60 + 60 cores do not fit on one GPU).
TEST_F(NodeTest, CorrectionMovesAGrantToThePodTheKubeletAdmittedFirst) {
  api_.CreatePod(PodObj("a", 60, 8, 1, "GPU-0"));
  json b = PodObj("b", 60, 8, 2, "GPU-1");
  b["metadata"]["annotations"]["tencent.com/vcuda-core-limit"] = "70";
  api_.CreatePod(b);
  auto first = AllocPair(*assigner_, "GPU-0", 60, 8);  // b's devices; we think: a (bound first)
  ASSERT_EQ(PodOf(first), "default/a/cuda");
  ASSERT_EQ(first.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-0");
  std::string dir = assigner_->grants()[0].accounting_dir;
  std::map<std::string, std::pair<std::string, std::string>> owner;
  owner["GPU-0::vc0"] = {"default/b", "cuda"};
  ASSERT_TRUE(assigner_->Correct(owner).ok());
  ASSERT_EQ(assigner_->grants().size(), 1u);
  Grant g = assigner_->grants()[0];
  EXPECT_EQ(g.pod, "b");
  EXPECT_EQ(g.gpus, std::vector<std::string>{"GPU-0"});  // where b's container runs
  EXPECT_EQ(g.ceiling, 70);
  EXPECT_EQ(g.accounting_dir, dir);  // the folder its mounts name
  auto limits = ReadFileToString(dir + "/limits");
  ASSERT_TRUE(limits.ok());
  EXPECT_THAT(*limits, HasSubstr("GPULET_VGPU_CORE_CEILING=70\n"));  // b's, before it starts
  auto named = ReadFileToString(std::filesystem::path(dir).parent_path().string() + "/pod");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(*named, "default/b\n");
  json got;
  ASSERT_TRUE(api_.GetPod("default", "b", &got));
  EXPECT_EQ(got["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"], "GPU-0");
  EXPECT_EQ(got["metadata"]["annotations"]["gpulet.io/vgpu-assigned"], "true");
  ASSERT_TRUE(api_.GetPod("default", "a", &got));
  EXPECT_EQ(got["metadata"]["annotations"]["gpulet.io/vgpu-assigned"], "false");
  EXPECT_EQ(got["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"], "GPU-1");  // b's reservation
  // The kubelet now admits a (its device IDs where a's old annotation was): a is the one waiting,
  // and gets the GPU handed over to it.
  auto second = AllocPair(*assigner_, "GPU-0", 60, 8, false, 60);
  EXPECT_EQ(PodOf(second), "default/a/cuda");
  EXPECT_EQ(second.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");
  owner["GPU-0::vc60"] = {"default/a", "cuda"};
  ASSERT_TRUE(assigner_->Correct(owner).ok());
  std::map<std::string, std::string> on;
  for (const auto& x : assigner_->grants()) on[x.pod] = x.gpus[0];
  EXPECT_EQ(on, (std::map<std::string, std::string>{{"a", "GPU-1"}, {"b", "GPU-0"}}));
}

// cluster.nodes: an agent granted a's guess for b's container and stopped before correcting it;
// by the time the next agent looked, the kubelet had started b. The grant still moves to b (a
// Running pod without a grant, whose container holds the devices), and a waits again.
TEST_F(NodeTest, CorrectionMovesAGrantToAPodTheKubeletAlreadyStarted) {
  api_.CreatePod(PodObj("a", 30, 8, 1, "GPU-0"));
  api_.CreatePod(PodObj("b", 30, 8, 2, "GPU-1"));
  ASSERT_EQ(PodOf(AllocPair(*assigner_, "GPU-0", 30, 8)), "default/a/cuda");  // b's devices
  ASSERT_TRUE(api_.SetPodPhase("default", "b", "Running"));
  std::map<std::string, std::pair<std::string, std::string>> owner;
  owner["GPU-0::vc0"] = {"default/b", "cuda"};
  ASSERT_TRUE(assigner_->Correct(owner).ok());
  ASSERT_EQ(assigner_->grants().size(), 1u);
  EXPECT_EQ(assigner_->grants()[0].pod, "b");
  EXPECT_EQ(assigner_->grants()[0].gpus, std::vector<std::string>{"GPU-0"});
  json got;
  ASSERT_TRUE(api_.GetPod("default", "b", &got));
  EXPECT_EQ(got["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"], "GPU-0");
  ASSERT_TRUE(api_.GetPod("default", "a", &got));
  EXPECT_EQ(got["metadata"]["annotations"]["gpulet.io/vgpu-assigned"], "false");
  // An ended pod is no one's: a Failed pod's record never takes a grant.
  api_.CreatePod(PodObj("c", 30, 8, 3, "GPU-1"));
  ASSERT_EQ(PodOf(AllocPair(*assigner_, "GPU-0", 30, 8, false, 30)), "default/a/cuda");
  ASSERT_TRUE(api_.SetPodPhase("default", "c", "Failed"));
  owner["GPU-0::vc30"] = {"default/c", "cuda"};
  ASSERT_TRUE(assigner_->Correct(owner).ok());
  std::map<std::string, std::string> on;
  for (const auto& g : assigner_->grants()) on[g.pod] = g.gpus[0];
  // a's grant follows its reservation (b's, handed over), not the Failed pod's record.
  EXPECT_EQ(on, (std::map<std::string, std::string>{{"a", "GPU-1"}, {"b", "GPU-0"}}));
}

// Three like pods in a chain (cluster.nodes, a burst on a restarted agent): the kubelet admits k
// (bound last), taken for x; then x, taken for z. The kubelet's record says k and x; one pass moves
// the first grant to k and frees x, the next gives the second grant to x, and z waits with the
// reservation x held. Every pod's annotation names where its container runs.
TEST_F(NodeTest, CorrectionFollowsAChainOfLikePods) {
  api_.CreatePod(PodObj("x", 30, 8, 1, "GPU-0"));
  api_.CreatePod(PodObj("z", 30, 8, 2, "GPU-1"));
  api_.CreatePod(PodObj("k", 30, 8, 3, "GPU-0"));
  ASSERT_EQ(PodOf(AllocPair(*assigner_, "GPU-0", 30, 8)), "default/x/cuda");  // k's devices
  ASSERT_EQ(PodOf(AllocPair(*assigner_, "GPU-0", 30, 8, false, 30)), "default/z/cuda");  // x's
  std::map<std::string, std::pair<std::string, std::string>> owner;
  owner["GPU-0::vc0"] = {"default/k", "cuda"};
  owner["GPU-0::vc30"] = {"default/x", "cuda"};
  ASSERT_TRUE(assigner_->Correct(owner).ok());
  std::map<std::string, std::string> on;
  for (const auto& g : assigner_->grants()) on[g.pod] = g.gpus[0];
  EXPECT_EQ(on, (std::map<std::string, std::string>{{"k", "GPU-0"}, {"x", "GPU-1"}}));
  auto ann = [&](const char* pod, const char* key) {
    json p;
    return api_.GetPod("default", pod, &p) ? p["metadata"]["annotations"].value(key, "") : "";
  };
  EXPECT_EQ(ann("k", "gpulet.io/vgpu-gpus-0"), "GPU-0");
  EXPECT_EQ(ann("x", "gpulet.io/vgpu-gpus-0"), "GPU-1");
  EXPECT_EQ(ann("z", "gpulet.io/vgpu-gpus-0"), "GPU-0");  // the reservation x held
  EXPECT_EQ(ann("z", "gpulet.io/vgpu-assigned"), "false");
  EXPECT_EQ(PodOf(AllocPair(*assigner_, "GPU-0", 30, 8, false, 60)), "default/z/cuda");
}

// An agent stopped between checkpointing a grant and annotating its pod: the next one, as it
// starts, rewrites the annotation from the checkpoint; a pod already right is not patched.
TEST_F(NodeTest, ReannotateRewritesWhatAStoppedAgentDidNotWrite) {
  api_.CreatePod(PodObj("p", 30, 8, 1, "GPU-0"));
  api_.CreatePod(PodObj("q", 30, 8, 2, "GPU-1"));
  AllocPair(*assigner_, "GPU-0", 30, 8);
  AllocPair(*assigner_, "GPU-1", 30, 8, false, 30);
  ASSERT_TRUE(
      client_
          ->PatchPod("default", "p", k8s::PatchType::kMerge,
                     {{"metadata", {{"annotations", {{"gpulet.io/vgpu-gpus-0", "GPU-1"}}}}}})
          .ok());
  auto restarted = Make();
  int64_t patches = api_.request_count("PATCH");
  ASSERT_TRUE(restarted->Reannotate().ok());
  EXPECT_EQ(api_.request_count("PATCH"), patches + 1);  // p only
  json p;
  ASSERT_TRUE(api_.GetPod("default", "p", &p));
  EXPECT_EQ(p["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"], "GPU-0");
  EXPECT_EQ(p["metadata"]["annotations"]["gpulet.io/vgpu-assigned"], "true");
}

// After two grants were swapped, each lives in the folder named for the other pod: releasing one
// pod keeps the folder of the other's running container, and the last release leaves none.
TEST_F(NodeTest, ReleaseAfterASwapKeepsTheOtherContainersFolder) {
  api_.CreatePod(PodObj("a", 30, 8, 1, "GPU-0"));
  api_.CreatePod(PodObj("b", 30, 8, 2, "GPU-1"));
  AllocPair(*assigner_, "GPU-0", 30, 8);  // we think: a
  AllocPair(*assigner_, "GPU-1", 30, 8);  // we think: b
  std::map<std::string, std::pair<std::string, std::string>> owner;
  owner["GPU-0::vc0"] = {"default/b", "cuda"};
  owner["GPU-1::vc0"] = {"default/a", "cuda"};
  ASSERT_TRUE(assigner_->Correct(owner).ok());
  std::string a_dir;
  for (const auto& g : assigner_->grants())
    if (g.pod == "a") a_dir = g.accounting_dir;
  ASSERT_FALSE(a_dir.empty());
  ASSERT_TRUE(api_.DeletePod("default", "b"));
  ASSERT_TRUE(assigner_->ReleaseGoneFromApi().ok());
  ASSERT_EQ(assigner_->grants().size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(a_dir + "/accounting")) << "a's running container lost it";
  ASSERT_TRUE(api_.DeletePod("default", "a"));
  ASSERT_TRUE(assigner_->ReleaseGoneFromApi().ok());
  EXPECT_TRUE(assigner_->grants().empty());
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(opts_.state_dir))
    if (e.is_directory()) left.push_back(e.path().filename().string());
  EXPECT_TRUE(left.empty()) << left[0];
}

// The kubelet resources: 100 core devices per GPU and one memory device per unit; health
// follows the GPU; Preferred keeps a container on one GPU (the predicted one when known).
TEST_F(NodeTest, KubeletResources) {
  auto res = MakeVcudaResources(assigner_, [](const std::string& uuid) { return uuid != "GPU-1"; });
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0]->name(), "tencent.com/vcuda-core");
  EXPECT_EQ(res[1]->name(), "tencent.com/vcuda-memory");
  auto cores = res[0]->Devices();
  auto mem = res[1]->Devices();
  EXPECT_EQ(cores.size(), 200u);
  EXPECT_EQ(mem.size(), 2u * kUnits);
  EXPECT_TRUE(cores.front().healthy);
  EXPECT_FALSE(cores.back().healthy);
  api_.CreatePod(PodObj("p", 30, 20, 1, "GPU-1"));
  std::vector<std::string> avail = Ids("GPU-0", "::vc", 100);
  auto more = Ids("GPU-1", "::vc", 100);
  avail.insert(avail.end(), more.begin(), more.end());
  auto pref = res[0]->Preferred(avail, {}, 30);
  ASSERT_TRUE(pref.ok());
  ASSERT_EQ(pref->size(), 30u);
  for (const auto& id : *pref) EXPECT_EQ(id.rfind("GPU-1::", 0), 0u) << id;
  EXPECT_FALSE(res[0]->Allocate({"GPU-0::vm1"}).ok());
}

// Without an API server (bare simulated node) the kubelet's counts place the container by the
// same policy; identity is filled in later from the kubelet's record.
TEST_F(NodeTest, WithoutApiServer) {
  NodeAssigner a(opts_, pool_, nullptr);
  ASSERT_TRUE(a.Load().ok());
  auto r = AllocPair(a, "GPU-0", 30, 20);
  EXPECT_EQ(r.envs().at("GPULET_VGPU_CORE_LIMIT"), "30");
  EXPECT_EQ(r.envs().at("GPULET_VGPU_MEMORY_LIMIT"), std::to_string(20ull << 28));
  auto w = a.Allocate(true, Ids("GPU-1", "::vc", 100));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE(w->envs().at("NVIDIA_VISIBLE_DEVICES"), r.envs().at("NVIDIA_VISIBLE_DEVICES"));
  EXPECT_EQ(a.grants().size(), 2u);
}

// Without extender annotations (no API server, or a pod the extender did not place) whole GPUs are
// the ones whose units the kubelet booked: two vcuda-core 100 pods booked on GPU-1 then GPU-0 get
// exactly those (issue 22: they used to be swapped by the node's own policy).
TEST_F(NodeTest, WholeGpusFollowTheKubeletsBooking) {
  NodeAssigner a(opts_, pool_, nullptr);
  ASSERT_TRUE(a.Load().ok());
  auto first = a.Allocate(true, Ids("GPU-1", "::vc", 100));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");
  auto second = a.Allocate(true, Ids("GPU-0", "::vc", 100));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-0");
  // With an API server and no extender annotation, the same.
  api_.CreatePod(PodObj("w", 100, 0, 1));
  auto w = assigner_->Allocate(true, Ids("GPU-1", "::vc", 100));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");
}

// What the rules refuse is refused by Allocate too, naming the rule, even without a pod to parse:
// vcuda-core 150 (used to run on an unbooked GPU with no limits); a whole GPU booked across two
// GPUs and a share booked across two GPUs are refused rather than moved elsewhere.
TEST_F(NodeTest, RefusesWhatTheRulesRefuse) {
  NodeAssigner a(opts_, pool_, nullptr);
  ASSERT_TRUE(a.Load().ok());
  auto ids = Ids("GPU-0", "::vc", 100);
  auto more = Ids("GPU-1", "::vc", 50);
  ids.insert(ids.end(), more.begin(), more.end());
  auto r = a.Allocate(true, ids);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      r.status().message(),
      HasSubstr("tencent.com/vcuda-core 150 is more than one GPU but not a multiple of 100"));
  EXPECT_THAT(r.status().message(), HasSubstr("GPU-0: 100 core, GPU-1: 50 core"));
  auto split = Ids("GPU-0", "::vc", 50);
  more = Ids("GPU-1", "::vc", 50);
  split.insert(split.end(), more.begin(), more.end());
  r = a.Allocate(true, split);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("a whole GPU needs all 100"));
  ASSERT_TRUE(a.Allocate(true, Ids("GPU-0", "::vc", 30)).ok());  // pending for its memory
  r = a.Allocate(false, Ids("GPU-1", "::vm", 4));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("a share must lie on one GPU"));
  EXPECT_TRUE(a.grants().empty());
}

// The second resource of a pair is preferred on the GPU of the first (pending) one, so the
// kubelet books a share's cores and memory on one GPU even where another GPU has more units free.
TEST_F(NodeTest, PreferredFollowsThePendingHalf) {
  NodeAssigner a(opts_, pool_, nullptr);
  ASSERT_TRUE(a.Load().ok());
  auto res = MakeVcudaResources(std::shared_ptr<NodeAssigner>(&a, [](NodeAssigner*) {}));
  ASSERT_TRUE(a.Allocate(false, Ids("GPU-1", "::vm", 8)).ok());  // memory first, on GPU-1
  std::vector<std::string> avail = Ids("GPU-0", "::vc", 100);
  auto more = Ids("GPU-1", "::vc", 80, 20);  // GPU-1 has fewer core units free
  avail.insert(avail.end(), more.begin(), more.end());
  auto pref = res[0]->Preferred(avail, {}, 30);
  ASSERT_TRUE(pref.ok());
  ASSERT_EQ(pref->size(), 30u);
  for (const auto& id : *pref) EXPECT_EQ(id.rfind("GPU-1::", 0), 0u) << id;
  auto r = a.Allocate(true, *pref);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");
}

// The accounting file is the container's only: owned by the pod's runAsUser/runAsGroup with mode
// 0660 when the pod names them (0666 only when its user is unknown), under directories only the
// agent may enter (0700), so no host user and no other container's user can open it.
TEST_F(NodeTest, AccountingFileBelongsToTheContainer) {
  if (geteuid() != 0) GTEST_SKIP() << "chown needs root";
  json pod = PodObj("owned", 20, 4, 1);
  pod["spec"]["securityContext"] = {{"runAsUser", 1000}, {"runAsGroup", 2000}};
  api_.CreatePod(pod);
  auto r = AllocPair(*assigner_, "GPU-0", 20, 4);
  std::string file = r.mounts(0).host_path();
  struct stat st;
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  EXPECT_EQ(st.st_gid, 2000u);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  std::string dir = std::filesystem::path(file).parent_path();
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(stat(std::filesystem::path(dir).parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  api_.CreatePod(PodObj("anyone", 20, 4, 2));
  auto a = AllocPair(*assigner_, "GPU-0", 20, 4, false, 20);
  ASSERT_EQ(stat(a.mounts(0).host_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0666u);
}

// With an API server the pool is published on the node (what the extender and webhook read):
// UUIDs, indexes, memory units and health; a missing node is an error, not a crash.
TEST_F(NodeTest, PublishPool) {
  EXPECT_FALSE(assigner_->PublishPool({}).ok());
  api_.CreateNode({{"metadata", {{"name", "node-1"}}}});
  ASSERT_TRUE(assigner_->PublishPool([](const std::string& u) { return u != "GPU-1"; }).ok());
  json node;
  ASSERT_TRUE(api_.GetNode("node-1", &node));
  json list =
      json::parse(node["metadata"]["annotations"]["gpulet.io/vgpu-gpus"].get<std::string>());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]["uuid"], "GPU-0");
  EXPECT_EQ(list[0]["memoryUnits"], kUnits);
  EXPECT_EQ(list[0]["healthy"], true);
  EXPECT_EQ(list[1]["index"], 1);
  EXPECT_EQ(list[1]["healthy"], false);
}

// Without an API server, grants the kubelet no longer holds are released after the grace period,
// with their accounting directories; held ones stay. The grace runs on the assigner's clock.
TEST_F(NodeTest, ReleaseNotHeld) {
  testing::FakeClock clock;
  NodeAssigner a(opts_, pool_, nullptr, &clock);
  ASSERT_TRUE(a.Load().ok());
  AllocPair(a, "GPU-0", 30, 2);
  AllocPair(a, "GPU-1", 40, 2);
  ASSERT_EQ(a.grants().size(), 2u);
  std::string gone_dir = a.grants()[1].accounting_dir;
  ASSERT_TRUE(std::filesystem::exists(gone_dir));
  clock.Advance(std::chrono::minutes(59));
  ASSERT_TRUE(a.ReleaseNotHeld({"GPU-0::vc0"}, std::chrono::hours(1)).ok());
  EXPECT_EQ(a.grants().size(), 2u);  // within the grace period nothing goes
  clock.Advance(std::chrono::minutes(2));
  ASSERT_TRUE(a.ReleaseNotHeld({"GPU-0::vc0"}, std::chrono::hours(1)).ok());
  ASSERT_EQ(a.grants().size(), 1u);
  EXPECT_EQ(a.grants()[0].gpus[0], "GPU-0");
  EXPECT_FALSE(std::filesystem::exists(gone_dir));
}

// Pool selection: all non-MIG GPUs, chosen indexes or UUIDs; unknown and MIG GPUs are errors;
// memory units from NVML's total (318 on an H100) or nominal (320).
TEST(PoolGpus, Selection) {
  gpu::Inventory inv;
  for (uint32_t i = 0; i < 3; ++i) {
    gpu::Device d;
    d.index = i;
    d.uuid = "GPU-" + std::to_string(i);
    d.memory_bytes = 81559ull << 20;
    d.mig_enabled = i == 2;
    inv.devices.push_back(d);
  }
  EXPECT_TRUE(PoolGpus(inv, "")->empty());
  auto all = PoolGpus(inv, "all");
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].memory_units, 318);
  EXPECT_EQ((*PoolGpus(inv, "all", true))[0].memory_units, 320);
  auto some = PoolGpus(inv, "1, GPU-0");
  ASSERT_TRUE(some.ok());
  EXPECT_EQ((*some)[0].uuid, "GPU-1");
  EXPECT_THAT(PoolGpus(inv, "7").status().message(), HasSubstr("\"7\" is not on this node"));
  EXPECT_THAT(PoolGpus(inv, "2").status().message(), HasSubstr("MIG"));
}

}  // namespace
}  // namespace gpulet::vgpu
