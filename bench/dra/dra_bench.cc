// NodePrepareResources latency of gpulet's DRA driver.
//
//   build/bench/dra_bench [N]      (default 500 claims per mode)
//
// Method: an 8-GPU inventory (the dgx-h100 shape, all NVLinked) behind the fake API server
// (testing/apiserver: real HTTP on loopback) and a stand-in driver root (stand-in ELF libraries and
// an ld cache, as the runtime tests make). Each claim is created allocated (one GPU, round robin),
// then prepared once and unprepared once; steady_clock times each call. Modes:
//   inproc   Driver::Prepare (API read of the claim + CDI spec write + checkpoint write, fsync'd
//            by rename only), as the gRPC handler runs it;
//   grpc     the kubelet's NodePrepareResources v1 over the plugin's unix socket (one claim per
//   call); repeat   a second prepare of an already prepared claim (idempotent path: no API call).
// p50 / p99 / max in milliseconds. Device status writes are off (they run on the sync thread, not
// in the call); the checkpoint grows with the prepared claims, so prepares run with N/2 claims held
// on average.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dra/driver.h"
#include "grpcpp/grpcpp.h"
#include "k8s/dra/v1/api.grpc.pb.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/runtime/fixtures.h"

using namespace gpulet;
using nlohmann::json;
namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;

namespace {

void Report(const char* mode, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[std::min(ms.size() - 1, static_cast<size_t>(q * ms.size()))];
  };
  std::printf("%-8s n=%zu  p50 %.3f ms  p99 %.3f ms  max %.3f ms\n", mode, ms.size(), at(0.5),
              at(0.99), ms.back());
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 500;
  std::string dir = runtime::testing::MakeTempDir("dra-bench");
  std::string why;
  if (!runtime::testing::MakeDriverRoot(dir + "/driver", 8, &why)) {
    std::fprintf(stderr, "dra_bench: %s\n", why.c_str());
    return 1;
  }
  testing::FakeApiServer api;
  if (!api.Start()) return 1;
  api.CreateNode({{"metadata", {{"name", "node-1"}}}});
  gpulet::k8s::Config cfg;
  cfg.server = api.url();
  gpulet::k8s::Client client(cfg);
  std::vector<std::vector<int>> links(8, std::vector<int>(8, 18));
  gpulet::testing::FakeGpuLayer layer(gpulet::testing::MakeInventory(8, links));
  dra::DriverOptions o;
  o.node_name = "node-1";
  o.kubelet_dir = dir + "/kubelet";
  o.cdi_dir = dir + "/cdi";
  o.state_dir = dir + "/state";
  o.cdi.driver_root = dir + "/driver";
  o.cdi.hook_path = "";
  o.write_device_status = false;
  dra::Driver driver(&layer, &client, nullptr, nullptr, o);
  if (absl::Status s = driver.Start(); !s.ok()) {
    std::fprintf(stderr, "dra_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  auto claim = [&](const std::string& name, int gpu) {
    return api.CreateObject(
        "resourceclaims",
        {{"metadata", {{"name", name}, {"namespace", "bench"}}},
         {"status",
          {{"allocation",
            {{"devices",
              {{"results", json::array({{{"request", "gpu"},
                                         {"driver", dra::kDriverName},
                                         {"pool", "node-1"},
                                         {"device", absl::StrCat("gpu-", gpu)}}})}}}}}}}});
  };
  using clk = std::chrono::steady_clock;
  auto ms = [](clk::time_point a) {
    return std::chrono::duration<double, std::milli>(clk::now() - a).count();
  };
  std::vector<json> claims;
  for (int i = 0; i < n; ++i) claims.push_back(claim(absl::StrCat("c", i), i % 8));

  std::vector<double> inproc, repeat, unprep;
  for (const auto& c : claims) {
    auto t = clk::now();
    auto p = driver.Prepare("bench", c["metadata"]["name"], c["metadata"]["uid"]);
    inproc.push_back(ms(t));
    if (!p.ok()) {
      std::fprintf(stderr, "prepare: %s\n", p.status().ToString().c_str());
      return 1;
    }
    t = clk::now();
    (void)driver.Prepare("bench", c["metadata"]["name"], c["metadata"]["uid"]);
    repeat.push_back(ms(t));
  }
  for (const auto& c : claims) {
    auto t = clk::now();
    (void)driver.Unprepare(c["metadata"]["uid"]);
    unprep.push_back(ms(t));
  }
  auto stub = drav1::DRAPlugin::NewStub(
      grpc::CreateChannel("unix:" + driver.service_socket(), grpc::InsecureChannelCredentials()));
  std::vector<double> over_grpc;
  for (const auto& c : claims) {
    drav1::NodePrepareResourcesRequest req;
    auto* rc = req.add_claims();
    rc->set_namespace_("bench");
    rc->set_name(c["metadata"]["name"].get<std::string>());
    rc->set_uid(c["metadata"]["uid"].get<std::string>());
    drav1::NodePrepareResourcesResponse resp;
    grpc::ClientContext ctx;
    auto t = clk::now();
    grpc::Status s = stub->NodePrepareResources(&ctx, req, &resp);
    over_grpc.push_back(ms(t));
    if (!s.ok() || !resp.claims().begin()->second.error().empty()) {
      std::fprintf(stderr, "grpc prepare failed\n");
      return 1;
    }
  }
  Report("inproc", inproc);
  Report("grpc", over_grpc);
  Report("repeat", repeat);
  Report("unprep", unprep);
  driver.Stop();
  std::filesystem::remove_all(dir);
  return 0;
}
