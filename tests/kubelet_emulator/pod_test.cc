// Pod YAML parsing: the fields the emulator uses, and bad input named with file:line.
#include "testing/kubelet/pod.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpulet::emu {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kGood[] = R"(apiVersion: v1
kind: Pod
metadata:
  name: cuda-vectoradd
  namespace: ml
  uid: 11111111-2222-3333-4444-555555555555
  annotations:
    sim.gpulet.io/run-time: 1500ms
  ownerReferences:
  - apiVersion: batch/v1
    kind: Job
    name: vec
    uid: abc
    controller: true
spec:
  nodeName: sim-node
  containers:
  - name: main
    image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0
    env:
    - name: A
      value: "1"
    resources:
      limits:
        nvidia.com/gpu: 2
        memory: 1Gi
      requests:
        nvidia.com/gpu: "2"
---
apiVersion: v1
kind: Pod
metadata:
  name: second
spec:
  containers:
  - name: c
    image: busybox
)";

// Every field the emulator reads comes through, for each document of a multi-document file.
TEST(PodTest, ParsesFields) {
  auto pods = ParsePods(kGood, "good.yaml");
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 2u);
  const PodSpec& p = (*pods)[0];
  EXPECT_EQ(p.Key(), "ml/cuda-vectoradd");
  EXPECT_EQ(p.uid, "11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(p.run_time_ms, 1500);
  EXPECT_EQ(p.node_name, "sim-node");
  ASSERT_EQ(p.owner_references.size(), 1u);
  EXPECT_EQ(p.owner_references[0].kind, "Job");
  EXPECT_TRUE(p.owner_references[0].controller);
  ASSERT_EQ(p.containers.size(), 1u);
  EXPECT_EQ(p.containers[0].image, "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0");
  EXPECT_EQ(p.containers[0].env.at(0), (std::pair<std::string, std::string>{"A", "1"}));
  EXPECT_EQ(ExtendedRequest(p.containers[0], "nvidia.com/gpu"), 2);
  EXPECT_EQ(p.source, "good.yaml:1");
  const PodSpec& q = (*pods)[1];
  EXPECT_EQ(q.namespace_, "default");
  EXPECT_EQ(q.source, "good.yaml:30");
  EXPECT_EQ(q.uid.size(), 36u);  // generated, UUID-shaped
  EXPECT_NE(q.uid, p.uid);
}

// Extended resource names as the kubelet and the API server define them.
TEST(PodTest, ExtendedResourceNames) {
  EXPECT_TRUE(IsExtendedResourceName("nvidia.com/gpu"));
  EXPECT_TRUE(IsExtendedResourceName("nvidia.com/mig-1g.10gb"));
  EXPECT_TRUE(IsExtendedResourceName("tencent.com/vcuda-core"));
  EXPECT_FALSE(IsExtendedResourceName("cpu"));
  EXPECT_FALSE(IsExtendedResourceName("hugepages-2Mi"));
  EXPECT_FALSE(IsExtendedResourceName("kubernetes.io/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("requests.nvidia.com/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/"));
  EXPECT_FALSE(IsExtendedResourceName("a/b/c"));
}

struct BadCase {
  const char* yaml;
  const char* where;  // expected "file:line"
  const char* what;
};

// Each bad input is one error naming file:line and the problem.
TEST(PodTest, BadInputNamesFileAndLine) {
  const BadCase cases[] = {
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: x\n", "bad.yaml:4", "YAML syntax error"},
      {"apiVersion: v1\nkind: Deployment\nmetadata: {name: x}\n", "bad.yaml:2", "only kind: Pod"},
      {"apiVersion: v1\nkind: Pod\nmetadata:\n  namespace: x\nspec: {}\n", "bad.yaml:4",
       "metadata.name: Required value"},
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  nodeName: n\n", "bad.yaml:5",
       "spec.containers: Required value"},
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n",
       "bad.yaml:6", "spec.containers[0].image: Required value"},
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n"
       "    image: i\n    resources:\n      limits:\n        nvidia.com/gpu: 0.5\n",
       "bad.yaml:10", "limits[nvidia.com/gpu]: Invalid value: \"0.5\": must be an integer"},
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n"
       "    image: i\n    resources:\n      requests:\n        nvidia.com/gpu: 1\n",
       "bad.yaml:10", "Limit must be set for non overcommitable resources"},
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n"
       "    image: i\n    resources:\n      limits: {nvidia.com/gpu: 1}\n"
       "      requests:\n        nvidia.com/gpu: 2\n",
       "bad.yaml:11",
       "requests[nvidia.com/gpu]: Invalid value: \"2\": must be equal to nvidia.com/gpu limit of "
       "1"},
      {"apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  annotations:\n"
       "    sim.gpulet.io/run-time: soon\nspec: {containers: [{name: c, image: i}]}\n",
       "bad.yaml:6", "\"soon\": expected a duration like 10s, 500ms or 720h"},
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name}\nspec: {containers: [{name: c, "
       "image: i}]}\n",
       "bad.yaml:3", "RFC 1123"},
      {"", "bad.yaml", "no Pod in file"},
  };
  for (const auto& c : cases) {
    auto pods = ParsePods(c.yaml, "bad.yaml");
    ASSERT_FALSE(pods.ok()) << c.yaml;
    EXPECT_EQ(pods.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(pods.status().message()), StartsWith(std::string(c.where) + ":"))
        << c.yaml;
    EXPECT_THAT(std::string(pods.status().message()), HasSubstr(c.what)) << c.yaml;
  }
}

// A missing file is an error naming the path.
TEST(PodTest, MissingFile) {
  auto pods = LoadPodFile("/nonexistent/pod.yaml");
  ASSERT_FALSE(pods.ok());
  EXPECT_THAT(std::string(pods.status().message()),
              HasSubstr("/nonexistent/pod.yaml: cannot read pod file"));
}

// The shipped examples parse (the demo depends on them).
TEST(PodTest, ExamplesParse) {
  for (const char* f : {"01-vectoradd.yaml", "02-training.yaml", "03-inference.yaml",
                        "04-notebook.yaml", "05-vgpu.yaml"}) {
    auto pods = LoadPodFile(std::string(GPULET_SOURCE_DIR) + "/examples/" + f);
    EXPECT_TRUE(pods.ok()) << f << ": " << pods.status();
  }
}

}  // namespace
}  // namespace gpulet::emu
