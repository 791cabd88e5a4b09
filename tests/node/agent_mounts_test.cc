// The node DaemonSet's agent reads the host under --host-root=/host through read-only mounts of
// only what it reads (docs/security.md). These tests tie that list to the code that reads: every
// path the driver discovery reads must be mounted, under the host's root and under a driver
// container's root, or validation and the DRA driver fail on that host layout while every test
// with the whole host root passes.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "runtime/cdi.h"
#include "runtime/driver.h"
#include "yaml-cpp/yaml.h"

namespace gpulet::node {
namespace {

struct HostMount {
  std::string host;  // host path
  std::string at;    // path in the container
  bool read_only = false;
  std::string propagation;
};

// The agent container's hostPath mounts in the base DaemonSet (kustomize; the chart renders the
// same, tests/helm's drift check).
std::vector<HostMount> AgentHostMounts() {
  YAML::Node ds =
      YAML::LoadFile(std::string(GPULET_SOURCE_DIR) + "/deploy/base/node-daemonset.yaml");
  YAML::Node spec = ds["spec"]["template"]["spec"];
  YAML::Node agent;
  for (YAML::Node c : spec["containers"])
    if (c["name"].as<std::string>() == "agent") agent = c;
  EXPECT_TRUE(agent) << "no container named agent";
  std::vector<HostMount> out;
  if (!agent) return out;
  for (YAML::Node m : agent["volumeMounts"]) {
    for (YAML::Node v : spec["volumes"]) {
      if (v["name"].as<std::string>() != m["name"].as<std::string>() || !v["hostPath"]) continue;
      out.push_back({v["hostPath"]["path"].as<std::string>(), m["mountPath"].as<std::string>(),
                     m["readOnly"] && m["readOnly"].as<bool>(),
                     m["mountPropagation"] ? m["mountPropagation"].as<std::string>() : ""});
    }
  }
  return out;
}

// The mount that shows host path `p` at /host<p>, if any.
const HostMount* Covering(const std::vector<HostMount>& mounts, const std::string& p) {
  for (const auto& m : mounts)
    if ((p == m.host || absl::StartsWith(p, m.host + "/")) && m.at == "/host" + m.host) return &m;
  return nullptr;
}

TEST(AgentMounts, EveryDriverPathOfTheHostIsReadableUnderHost) {
  auto mounts = AgentHostMounts();
  for (const auto& p : runtime::DriverPaths()) {
    const HostMount* m = Covering(mounts, p);
    ASSERT_NE(m, nullptr) << p << " is not mounted at /host" << p;
    EXPECT_TRUE(m->read_only) << m->host;
  }
}

TEST(AgentMounts, ADriverContainersRootIsReadableAndSeesItsLaterMount) {
  auto mounts = AgentHostMounts();
  const std::string root = runtime::CdiGenerateOptions().driver_container_root;
  for (const auto& p : runtime::DriverPaths()) {
    const HostMount* m = Covering(mounts, root + p);
    ASSERT_NE(m, nullptr) << root + p << " is not mounted at /host" << root + p;
    EXPECT_TRUE(m->read_only) << m->host;
    // The driver container mounts its root after the agent may have started.
    EXPECT_EQ(m->propagation, "HostToContainer") << m->host;
  }
}

}  // namespace
}  // namespace gpulet::node
