// The admission webhook through its HTTPS endpoint (AdmissionReview v1 over TLS with a self-issued
// certificate): the rule violations are denied with clear messages, valid pods are allowed.
#include "scheduler/webhook.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>

#include <thread>

#include "absl/strings/escaping.h"
#include "http/guarded_server.h"
#include "http/tls.h"
#include "httplib.h"
#include "testing/apiserver/fake_apiserver.h"

namespace gpulet::scheduler {
namespace {

using ::testing::HasSubstr;

json Review(json limits, json requests = nullptr) {
  json res = {{"limits", limits}};
  if (!requests.is_null()) res["requests"] = requests;
  json pod = {{"metadata", {{"name", "train"}, {"namespace", "default"}}},
              {"spec", {{"containers", json::array({{{"name", "cuda"}, {"resources", res}}})}}}};
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"operation", "CREATE"},
            {"object", pod}}}};
}

class WebhookHttps : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pem = http::SelfIssuedCertificate({"localhost", "127.0.0.1"});
    ASSERT_TRUE(pem.ok()) << pem.status();
    ca_ = pem->ca_pem;
    // The server `gpulet scheduler` runs the webhook on.
    auto ctx = http::ServerTlsContext(pem->cert_pem, pem->key_pem);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    server_ = std::make_unique<http::GuardedServer>(http::ServerLimits{}, *ctx);
    ASSERT_TRUE(api_.Start());
    // One H100 node as the agent annotates it: 318 memory units per GPU.
    api_.CreateNode(
        {{"metadata",
          {{"name", "gpu-node"},
           {"annotations",
            {{"gpulet.io/vgpu-gpus", R"([{"uuid":"GPU-a","index":0,"memoryUnits":318}])"}}}}}});
    k8s::Config c;
    c.server = api_.url();
    client_ = std::make_unique<k8s::Client>(c);
    webhook_ = std::make_unique<AdmissionWebhook>(WebhookOptions{{}, 0, "gpulet-scheduler"},
                                                  client_.get());
    webhook_->Register(*server_);
    port_ = server_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  // POSTs over verified TLS (the self-issued certificate is the CA).
  json Post(const std::string& path, const json& review, int* status = nullptr) {
    httplib::SSLClient cli("127.0.0.1", port_);
    BIO* b = BIO_new_mem_buf(ca_.data(), -1);
    X509_STORE* store = X509_STORE_new();
    X509* ca = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
    X509_STORE_add_cert(store, ca);
    X509_free(ca);
    BIO_free(b);
    cli.set_ca_cert_store(store);
    cli.enable_server_certificate_verification(true);
    auto r = cli.Post(path, review.dump(), "application/json");
    EXPECT_TRUE(r) << httplib::to_string(r.error());
    if (!r) return json();
    if (status) *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
  std::string Denial(const json& review) {
    json out = Post("/validate", review);
    EXPECT_EQ(out["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    EXPECT_FALSE(out["response"]["allowed"].get<bool>()) << out.dump();
    EXPECT_EQ(out["response"]["status"]["code"], 422);
    return out["response"]["status"].value("message", "");
  }

  // POSTs raw bytes; returns the HTTP status (0: no answer).
  int PostRaw(const std::string& path, const std::string& body, std::string* out = nullptr) {
    httplib::SSLClient cli("127.0.0.1", port_);
    cli.enable_server_certificate_verification(false);
    auto r = cli.Post(path, body, "application/json");
    if (!r) return 0;
    if (out) *out = r->body;
    return r->status;
  }

  std::string ca_;
  std::unique_ptr<http::GuardedServer> server_;
  std::thread thread_;
  int port_ = 0;
  testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<AdmissionWebhook> webhook_;
};

// The seed's pod (30 cores, 20 units) is allowed.
TEST_F(WebhookHttps, AllowsSeedPod) {
  json out = Post("/validate",
                  Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}}));
  EXPECT_EQ(out["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(out["kind"], "AdmissionReview");
  EXPECT_TRUE(out["response"]["allowed"].get<bool>()) << out.dump();
}

// 150 cores: denied, saying multiples of 100 or 1-99 are allowed.
TEST_F(WebhookHttps, Denies150Cores) {
  std::string m =
      Denial(Review({{"tencent.com/vcuda-core", "150"}, {"tencent.com/vcuda-memory", "20"}}));
  EXPECT_THAT(m, HasSubstr("pod \"train\""));
  EXPECT_THAT(m, HasSubstr("container \"cuda\""));
  EXPECT_THAT(m, HasSubstr("150 is more than one GPU but not a multiple of 100"));
  EXPECT_THAT(m, HasSubstr("allowed:"));
}

// 0 cores with memory: denied.
TEST_F(WebhookHttps, DeniesZeroCoresWithMemory) {
  std::string m =
      Denial(Review({{"tencent.com/vcuda-core", "0"}, {"tencent.com/vcuda-memory", "20"}}));
  EXPECT_THAT(m, HasSubstr("tencent.com/vcuda-memory 20 without tencent.com/vcuda-core"));
}

// Memory larger than the cluster's largest GPU (learned from the node annotation): denied.
TEST_F(WebhookHttps, DeniesMemoryLargerThanAGpu) {
  std::string m =
      Denial(Review({{"tencent.com/vcuda-core", "50"}, {"tencent.com/vcuda-memory", "400"}}));
  EXPECT_THAT(m, HasSubstr("400 (102400 MiB) is larger than one GPU (318 units"));
}

// requests != limits: denied.
TEST_F(WebhookHttps, DeniesRequestsNotEqualLimits) {
  std::string m =
      Denial(Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}},
                    {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "10"}}));
  EXPECT_THAT(m, HasSubstr("request 10 differs from limit 20"));
}

// The mutating endpoint points vGPU pods at the configured scheduler with a JSON patch.
TEST_F(WebhookHttps, MutateSetsSchedulerName) {
  json out = Post("/mutate",
                  Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}}));
  ASSERT_EQ(out["response"]["patchType"], "JSONPatch");
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(out["response"]["patch"].get<std::string>(), &patch));
  json p = json::parse(patch);
  EXPECT_EQ(p[0]["path"], "/spec/schedulerName");
  EXPECT_EQ(p[0]["value"], "gpulet-scheduler");
  json plain = Post("/mutate", Review({{"cpu", "1"}}));
  EXPECT_FALSE(plain["response"].contains("patch"));
}

// A body that is not an AdmissionReview is a 400, not a crash.
TEST_F(WebhookHttps, MalformedReviewIs400) {
  int status = 0;
  Post("/validate", json{{"kind", "Pod"}}, &status);
  EXPECT_EQ(status, 400);
}

// Wrong-typed fields anywhere in a review are a 400 or a judgement, never a 500 (which the API
// server treats per failurePolicy) and never a crash: value() on a wrong type used to throw.
TEST_F(WebhookHttps, WrongTypedReviewsAreNeverServerErrors) {
  json good = Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}});
  std::vector<json> bodies = {json{{"kind", 5}}, json{{"kind", "AdmissionReview"}, {"request", 5}},
                              json{{"kind", "AdmissionReview"}, {"request", {{"uid", 5}}}},
                              json::array(), json("x")};
  for (auto mutate : std::vector<std::function<void(json&)>>{
           [](json& r) { r["apiVersion"] = 7; },
           [](json& r) { r["request"]["operation"] = json::array(); },
           [](json& r) { r["request"]["namespace"] = 3; },
           [](json& r) { r["request"]["object"]["metadata"] = "m"; },
           [](json& r) { r["request"]["object"]["metadata"]["name"] = 5; },
           [](json& r) { r["request"]["object"]["metadata"]["annotations"] = json::array(); },
           [](json& r) {
             r["request"]["object"]["spec"]["containers"] = {1, "x", nullptr};
           },
           [](json& r) { r["request"]["object"]["spec"]["containers"][0]["name"] = 5; },
           [](json& r) {
             r["request"]["object"]["spec"]["initContainers"] = {1, {{"name", 2}}};
           },
           [](json& r) {
             r["request"]["object"]["spec"]["containers"][0]["env"] = {1, {{"name", 2}}};
           },
           [](json& r) { r["request"]["object"]["spec"]["containers"][0]["resources"] = "x"; }}) {
    json r = good;
    mutate(r);
    bodies.push_back(r);
  }
  for (const json& body : bodies) {
    std::string out;
    int status = PostRaw("/validate", body.dump(), &out);
    EXPECT_TRUE(status == 200 || status == 400) << status << " for " << body.dump() << ": " << out;
  }
}

// A malformed node annotation (someone with node patch rights, or a bug) does not turn the
// memory bound into an exception: the review is judged as usual.
TEST_F(WebhookHttps, MalformedNodeAnnotationDoesNotBreakValidation) {
  api_.CreateNode({{"metadata",
                    {{"name", "odd-node"},
                     {"annotations", {{"gpulet.io/vgpu-gpus", R"([1, {"memoryUnits": "9"}])"}}}}}});
  std::string m =
      Denial(Review({{"tencent.com/vcuda-core", "50"}, {"tencent.com/vcuda-memory", "400"}}));
  EXPECT_THAT(m, HasSubstr("larger than one GPU (318 units"));
}

// 100000 nested arrays: refused on sight (no DOM built, no recursive dump), server still up.
TEST_F(WebhookHttps, DeepJsonIs400) {
  std::string out;
  EXPECT_EQ(PostRaw("/validate", std::string(100000, '['), &out), 400);
  EXPECT_THAT(out, HasSubstr("deeper than 64"));
  // Over the body limit: 413 (or the connection closed while the client was still sending).
  int big = PostRaw("/validate", std::string(3 << 20, '['));
  EXPECT_TRUE(big == 413 || big == 0) << big;
  EXPECT_TRUE(Post("/validate", Review({{"cpu", "1"}}))["response"]["allowed"].get<bool>());
}

// Annotations gpulet writes (extender: node, GPUs, bind time, assigned; TKEStack's core limit
// the agent honours) may not come with the pod at creation.
TEST_F(WebhookHttps, DeniesGpuletAnnotationsOnCreate) {
  for (const char* key :
       {"gpulet.io/vgpu-node", "gpulet.io/vgpu-gpus-0", "gpulet.io/vgpu-bind-time",
        "gpulet.io/vgpu-assigned", "tencent.com/vcuda-core-limit"}) {
    json r = Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}});
    r["request"]["object"]["metadata"]["annotations"] = {{key, "x"}};
    EXPECT_THAT(Denial(r), HasSubstr(std::string("annotation ") + key + " is written by gpulet"));
  }
  // Other annotations pass.
  json r = Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}});
  r["request"]["object"]["metadata"]["annotations"] = {{"gpulet.io/vgpu-policy", "spread"}};
  EXPECT_TRUE(Post("/validate", r)["response"]["allowed"].get<bool>());
}

// The vGPU opt-out (annotation or env) on a pod that shares a GPU is refused unless its namespace
// carries the administrator's label; whole-GPU pods may use it anywhere.
TEST(WebhookOptOut, FractionalPodsNeedTheNamespaceLabel) {
  httplib::Server fake;  // just the namespaces the webhook reads
  fake.Get(R"(/api/v1/namespaces/([a-z0-9-]+))",
           [](const httplib::Request& req, httplib::Response& res) {
             json ns = {{"metadata", {{"name", req.matches[1].str()}}}};
             if (req.matches[1] == "lab")
               ns["metadata"]["labels"] = {{"gpulet.io/vgpu-disable-allowed", "true"}};
             res.set_content(ns.dump(), "application/json");
           });
  int port = fake.bind_to_any_port("127.0.0.1");
  std::thread t([&] { fake.listen_after_bind(); });
  k8s::Config c;
  c.server = "http://127.0.0.1:" + std::to_string(port);
  c.max_attempts = 1;
  k8s::Client client(c);
  AdmissionWebhook webhook(WebhookOptions{{}, 318, ""}, &client);
  auto judge = [&](json review, const std::string& ns) {
    review["request"]["namespace"] = ns;
    auto out = webhook.Validate(review);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? (*out)["response"] : json();
  };
  json annotated = Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}});
  annotated["request"]["object"]["metadata"]["annotations"] = {{"gpulet.io/vgpu-disable", "true"}};
  json env = Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}});
  env["request"]["object"]["spec"]["containers"][0]["env"] = {
      {{"name", "GPULET_VGPU_DISABLE"}, {"valueFrom", {{"configMapKeyRef", {{"name", "x"}}}}}}};
  json whole = Review({{"tencent.com/vcuda-core", "100"}});
  whole["request"]["object"]["spec"]["containers"][0]["env"] = {
      {{"name", "GPULET_VGPU_DISABLE"}, {"value", "1"}}};
  json r = judge(annotated, "team-a");
  EXPECT_FALSE(r["allowed"].get<bool>());
  EXPECT_THAT(r["status"]["message"].get<std::string>(),
              HasSubstr("annotation gpulet.io/vgpu-disable would switch off the vGPU limits"));
  r = judge(env, "team-a");
  EXPECT_FALSE(r["allowed"].get<bool>());
  EXPECT_THAT(r["status"]["message"].get<std::string>(),
              HasSubstr("env GPULET_VGPU_DISABLE of container \"cuda\""));
  EXPECT_TRUE(judge(annotated, "lab")["allowed"].get<bool>());
  EXPECT_TRUE(judge(env, "lab")["allowed"].get<bool>());
  EXPECT_TRUE(judge(whole, "team-a")["allowed"].get<bool>());
  // The limits themselves, the interposer's GPU and the preload: the pod's env would replace the
  // agent's (the kubelet appends it), so each is the same opt-out. Other variables are the pod's.
  for (const char* name :
       {"GPULET_VGPU_MEMORY_LIMIT", "GPULET_VGPU_CORE_LIMIT", "GPULET_VGPU_UUID", "LD_PRELOAD"}) {
    json set = Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}});
    set["request"]["object"]["spec"]["containers"][0]["env"] = {
        {{"name", "HOME"}, {"value", "/root"}}, {{"name", name}, {"value", "0"}}};
    r = judge(set, "team-a");
    EXPECT_FALSE(r["allowed"].get<bool>()) << name;
    EXPECT_THAT(r["status"]["message"].get<std::string>(),
                HasSubstr(std::string("env ") + name + " of container \"cuda\" would switch off"));
    EXPECT_TRUE(judge(set, "lab")["allowed"].get<bool>()) << name;
  }
  json other = Review({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}});
  other["request"]["object"]["spec"]["containers"][0]["env"] = {
      {{"name", "GPULET_VGPU"}, {"value", "x"}}, {{"name", "PRELOAD"}, {"value", "x"}}};
  EXPECT_TRUE(judge(other, "team-a")["allowed"].get<bool>());
  fake.stop();
  t.join();
}

}  // namespace
}  // namespace gpulet::scheduler
