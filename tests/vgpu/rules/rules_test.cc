// The vGPU resource rules (vgpu/rules/rules.h): what is accepted, what is refused and what the
// refusal says.
#include "vgpu/rules/rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "vgpu/rules/node_pool.h"

namespace gpulet::vgpu {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json Pod(json limits, json requests = nullptr) {
  json res = {{"limits", limits}};
  if (!requests.is_null()) res["requests"] = requests;
  return {{"metadata", {{"name", "p"}}},
          {"spec", {{"containers", json::array({{{"name", "main"}, {"resources", res}}})}}}};
}

constexpr int64_t kH100Units = 318;  // floor(81559 MiB / 256 MiB)

// The seed's pod: 30 cores and 20 units is a share of one GPU.
TEST(Rules, SeedPodIsAShare) {
  auto p = ParsePod(Pod({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}}), {},
                    kH100Units);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->containers.size(), 1u);
  EXPECT_TRUE(p->containers[0].fractional());
  EXPECT_EQ(p->containers[0].cores, 30);
  EXPECT_EQ(p->containers[0].memory_units, 20);
}

// Multiples of 100 are whole exclusive GPUs, with or without memory.
TEST(Rules, MultiplesOfHundredAreWholeGpus) {
  for (int cores : {100, 200, 800}) {
    auto p = ParsePod(Pod({{"tencent.com/vcuda-core", cores}}), {}, kH100Units);
    ASSERT_TRUE(p.ok()) << cores << ": " << p.status();
    EXPECT_FALSE(p->containers[0].fractional());
    EXPECT_EQ(p->containers[0].whole_gpus(), cores / 100);
  }
}

// 150 and 250 are refused with a message that says what is allowed.
TEST(Rules, NonMultipleAboveHundredRejected) {
  for (int cores : {150, 250, 101}) {
    auto p = ParsePod(Pod({{"tencent.com/vcuda-core", cores}, {"tencent.com/vcuda-memory", 4}}), {},
                      kH100Units);
    ASSERT_FALSE(p.ok()) << cores;
    EXPECT_THAT(p.status().message(), HasSubstr("not a multiple of 100"));
    EXPECT_THAT(p.status().message(), HasSubstr("allowed: tencent.com/vcuda-core 1-99"));
    EXPECT_THAT(p.status().message(), HasSubstr("container \"main\""));
  }
}

// Memory without cores is refused; a share without memory is refused.
TEST(Rules, MemoryAndCoresGoTogether) {
  auto zero = ParsePod(Pod({{"tencent.com/vcuda-core", 0}, {"tencent.com/vcuda-memory", 8}}), {},
                       kH100Units);
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("without tencent.com/vcuda-core"));
  auto only_mem = ParsePod(Pod({{"tencent.com/vcuda-memory", 8}}), {}, kH100Units);
  EXPECT_FALSE(only_mem.ok());
  auto no_mem = ParsePod(Pod({{"tencent.com/vcuda-core", 30}}), {}, kH100Units);
  ASSERT_FALSE(no_mem.ok());
  EXPECT_THAT(no_mem.status().message(), HasSubstr("needs tencent.com/vcuda-memory >= 1"));
}

// A share must fit one GPU; whole GPUs may not ask for more memory than they hold.
TEST(Rules, MemoryMustFitOneGpu) {
  auto p = ParsePod(Pod({{"tencent.com/vcuda-core", 50}, {"tencent.com/vcuda-memory", 319}}), {},
                    kH100Units);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("larger than one GPU (318 units"));
  EXPECT_TRUE(ParsePod(Pod({{"tencent.com/vcuda-core", 50}, {"tencent.com/vcuda-memory", 318}}), {},
                       kH100Units)
                  .ok());
  EXPECT_FALSE(ParsePod(Pod({{"tencent.com/vcuda-core", 100}, {"tencent.com/vcuda-memory", 400}}),
                        {}, kH100Units)
                   .ok());
  // Unknown GPU size (0): the bound is not applied.
  EXPECT_TRUE(
      ParsePod(Pod({{"tencent.com/vcuda-core", 50}, {"tencent.com/vcuda-memory", 999}}), {}, 0)
          .ok());
}

// Requests, if given, must equal limits; a request without a limit is refused.
TEST(Rules, RequestsMustEqualLimits) {
  auto p = ParsePod(Pod({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}},
                        {{"tencent.com/vcuda-core", "20"}, {"tencent.com/vcuda-memory", "20"}}),
                    {}, kH100Units);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("request 20 differs from limit 30"));
  auto only_req = ParsePod(Pod(json::object(), {{"tencent.com/vcuda-core", "30"}}), {}, 0);
  ASSERT_FALSE(only_req.ok());
  EXPECT_THAT(only_req.status().message(), HasSubstr("not in limits"));
  EXPECT_TRUE(ParsePod(Pod({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}},
                           {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}}),
                       {}, kH100Units)
                  .ok());
}

// Quantities: integer suffixes accepted, fractions and garbage refused.
TEST(Rules, Quantities) {
  EXPECT_EQ(*ParseIntQuantity("30"), 30);
  EXPECT_EQ(*ParseIntQuantity("2k"), 2000);
  EXPECT_EQ(*ParseIntQuantity("1Ki"), 1024);
  EXPECT_FALSE(ParseIntQuantity("0.5").ok());
  EXPECT_FALSE(ParseIntQuantity("500m").ok());
  EXPECT_FALSE(ParseIntQuantity("").ok());
  EXPECT_FALSE(ParseIntQuantity("99999999999999999999").ok());
  // Every suffix of resource.Quantity (DRA claims write memory as 4Ti; one parser for both).
  EXPECT_EQ(*ParseIntQuantity("4Ti"), int64_t{4} << 40);
  EXPECT_EQ(*ParseIntQuantity("2T"), 2000000000000);
  EXPECT_EQ(*ParseIntQuantity("1Ei"), int64_t{1} << 60);
  EXPECT_FALSE(ParseIntQuantity("8Ei").ok()) << "overflow";
  EXPECT_FALSE(ParseIntQuantity("1Zi").ok());
  auto p = ParsePod(Pod({{"tencent.com/vcuda-core", "0.5"}}), {}, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("resources.limits[tencent.com/vcuda-core]"));
}

// Any quantity in milli-units (CPU and memory requests), rounded up like MilliValue().
TEST(Rules, MilliQuantities) {
  EXPECT_EQ(*ParseMilliQuantity("500m"), 500);
  EXPECT_EQ(*ParseMilliQuantity("2"), 2000);
  EXPECT_EQ(*ParseMilliQuantity("1.5"), 1500);
  EXPECT_EQ(*ParseMilliQuantity("0.0001"), 1) << "rounded up";
  EXPECT_EQ(*ParseMilliQuantity("100u"), 1);
  EXPECT_EQ(*ParseMilliQuantity("1Gi"), int64_t{1000} << 30);
  EXPECT_EQ(*ParseMilliQuantity("0.5Gi"), int64_t{500} << 30);
  EXPECT_EQ(*ParseMilliQuantity("1e3"), 1000000);
  EXPECT_EQ(*ParseMilliQuantity("1E3"), 1000000);
  EXPECT_EQ(*ParseMilliQuantity("+3k"), 3000000);
  EXPECT_EQ(*ParseMilliQuantity("-1"), -1000);
  EXPECT_EQ(*ParseMilliQuantity("4Ti"), int64_t{4000} << 40);
  for (const char* bad : {"", "m", ".", "1.2.3", "1Zi", "1e", "1e99", "1 Gi", "9Ei", "8E",
                          "1.0000000001", "99999999999999999999999"}) {
    EXPECT_FALSE(ParseMilliQuantity(bad).ok()) << bad;
  }
  EXPECT_THAT(ParseMilliQuantity("12parsecs").status().message(), HasSubstr("\"12parsecs\""));
}

// Configured resource names replace TKEStack's; other names are ignored.
TEST(Rules, ConfigurableNames) {
  ResourceNames names{"example.com/core", "example.com/mem"};
  auto p = ParsePod(
      Pod({{"example.com/core", 40}, {"example.com/mem", 2}, {"tencent.com/vcuda-core", 150}}),
      names, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->containers[0].cores, 40);
}

// Init containers may not ask for vGPU resources; pods without them parse empty.
TEST(Rules, InitContainersAndPlainPods) {
  json pod = Pod({{"cpu", "1"}});
  auto plain = ParsePod(pod, {}, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->empty());
  pod["spec"]["initContainers"] = json::array(
      {{{"name", "init"}, {"resources", {{"limits", {{"tencent.com/vcuda-core", 10}}}}}}});
  auto init = ParsePod(pod, {}, 0);
  ASSERT_FALSE(init.ok());
  EXPECT_THAT(init.status().message(), HasSubstr("init container \"init\""));
}

// Huge values are refused before any arithmetic: memory_units * 256 and whole_gpus * units per
// GPU overflowed int64 (UB; caught by UBSan) for values the webhook accepted.
TEST(Rules, HugeValuesAreRefusedWithoutOverflow) {
  ResourceNames names;
  for (auto [cores, mem, max_units] :
       {std::tuple<int64_t, int64_t, int64_t>{50, int64_t{1} << 60, 318},
        {int64_t{100} << 40, int64_t{1} << 62, int64_t{1} << 40},
        {100, int64_t{1} << 58, int64_t{1} << 62}}) {
    ContainerUnits c{0, "c", cores, mem};
    absl::Status s = ValidateContainer(c, max_units, names);
    EXPECT_FALSE(s.ok()) << cores << " " << mem;
    EXPECT_THAT(s.message(), HasSubstr("too large")) << cores << " " << mem;
  }
  // Wrong-typed containers and names are skipped or named, never an exception.
  json pod = Pod({{"tencent.com/vcuda-core", 30}, {"tencent.com/vcuda-memory", 2}});
  pod["spec"]["containers"].push_back(1);
  pod["spec"]["containers"][0]["name"] = 7;
  pod["spec"]["initContainers"] = {1, {{"name", 3}}};
  auto p = ParsePod(pod, names, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->containers.size(), 1u);
  EXPECT_EQ(p->containers[0].name, "#0");
}

// Memory units are floor(bytes / 256 MiB): an H100 as NVML reports it has 318.
TEST(Rules, MemoryUnits) {
  EXPECT_EQ(MemoryUnitsOf(81559ull << 20), 318);
  EXPECT_EQ(MemoryUnitsOf(80ull << 30), 320);
  EXPECT_EQ(MemoryUnitsOf(255ull << 20), 0);
}

// Units -> bytes is exact and the inverse of bytes -> units on whole units; nominal units round
// the memory up to whole GiB first (a 15.6 GiB "16 GB" card counts 64).
TEST(Rules, MemoryUnitsToBytesAndNominalUnits) {
  EXPECT_EQ(MemoryUnitsToBytes(1), int64_t{256} << 20);
  EXPECT_EQ(MemoryUnitsToBytes(16), int64_t{4} << 30);
  for (int64_t u : {0, 1, 318, 1 << 20}) EXPECT_EQ(MemoryUnitsOf(MemoryUnitsToBytes(u)), u);
  EXPECT_EQ(NominalMemoryUnitsOf(int64_t{15974} << 20), 64);
  EXPECT_EQ(NominalMemoryUnitsOf(int64_t{16} << 30), 64);
  EXPECT_EQ(NominalMemoryUnitsOf((int64_t{16} << 30) + 1), 68);
}

// The vGPU -> placement translation: whole GPUs by count, a share in milli-GPU and bytes.
TEST(Rules, PlacementRequestOf) {
  auto whole = PlacementRequestOf({0, "w", 200, 640});
  EXPECT_EQ(whole.whole_gpus, 2);
  EXPECT_EQ(whole.milli, 0);
  EXPECT_EQ(whole.memory_bytes, 0);
  auto share = PlacementRequestOf({0, "s", 30, 16});
  EXPECT_EQ(share.whole_gpus, 0);
  EXPECT_EQ(share.milli, 300);
  EXPECT_EQ(share.memory_bytes, int64_t{4} << 30);
  auto none = PlacementRequestOf({0, "n", 0, 0});
  EXPECT_EQ(none.whole_gpus + none.milli, 0);
}

// The node-pool annotation: what the agent encodes the extender and webhook decode unchanged.
TEST(NodePool, EncodeDecodeRoundTrip) {
  std::vector<PoolGpu> pool = {{"GPU-a", 0, 318, true}, {"GPU-b", 3, 64, false}};
  std::string text = EncodeNodePool(pool);
  EXPECT_EQ(text, R"([{"healthy":true,"index":0,"memoryUnits":318,"uuid":"GPU-a"},)"
                  R"({"healthy":false,"index":3,"memoryUnits":64,"uuid":"GPU-b"}])");
  auto back = DecodeNodePool(text);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].uuid, "GPU-b");
  EXPECT_EQ((*back)[1].index, 3u);
  EXPECT_EQ((*back)[1].memory_units, 64);
  EXPECT_FALSE((*back)[1].healthy);
}

// A bad annotation gets one error naming the annotation, the GPU and the field.
TEST(NodePool, DecodeNamesTheBadField) {
  auto r = DecodeNodePool(R"([{"uuid":"GPU-a","memoryUnits":1},{"memoryUnits":-3}])");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("gpulet.io/vgpu-gpus[1].memoryUnits"));
  EXPECT_FALSE(DecodeNodePool(R"([{"uuid":"a b"}])").ok());
  EXPECT_FALSE(DecodeNodePool(R"([[[[1]]]])").ok());
  EXPECT_FALSE(DecodeNodePool("{}").ok());
}

}  // namespace
}  // namespace gpulet::vgpu
