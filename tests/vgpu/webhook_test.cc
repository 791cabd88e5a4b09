// The admission webhook through its HTTPS endpoint (AdmissionReview v1 over TLS with a self-issued
// certificate): the rule violations are denied with clear messages, valid pods are allowed.
#include "scheduler/webhook.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>

#include <thread>

#include "absl/strings/escaping.h"
#include "httplib.h"
#include "k8s/tls.h"
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
    auto pem = k8s::SelfIssuedCertificate({"localhost", "127.0.0.1"});
    ASSERT_TRUE(pem.ok()) << pem.status();
    ca_ = pem->ca_pem;
    BIO* cb = BIO_new_mem_buf(pem->cert_pem.data(), -1);
    BIO* kb = BIO_new_mem_buf(pem->key_pem.data(), -1);
    X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
    server_ = std::make_unique<httplib::SSLServer>(cert, key);
    X509_free(cert);
    EVP_PKEY_free(key);
    BIO_free(cb);
    BIO_free(kb);
    ASSERT_TRUE(server_->is_valid());
    ASSERT_TRUE(api_.Start());
    // One H100 node as the agent annotates it: 318 memory units per GPU.
    api_.CreateNode({{"metadata",
                      {{"name", "gpu-node"},
                       {"annotations",
                        {{"gpulet.io/vgpu-gpus",
                          R"([{"uuid":"GPU-a","index":0,"memoryUnits":318}])"}}}}}});
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

  std::string ca_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
  testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<AdmissionWebhook> webhook_;
};

// The seed's pod (30 cores, 20 units) is allowed.
TEST_F(WebhookHttps, AllowsSeedPod) {
  json out = Post("/validate", Review({{"tencent.com/vcuda-core", "30"},
                                       {"tencent.com/vcuda-memory", "20"}}));
  EXPECT_EQ(out["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(out["kind"], "AdmissionReview");
  EXPECT_TRUE(out["response"]["allowed"].get<bool>()) << out.dump();
}

// 150 cores: denied, saying multiples of 100 or 1-99 are allowed.
TEST_F(WebhookHttps, Denies150Cores) {
  std::string m = Denial(Review({{"tencent.com/vcuda-core", "150"},
                                 {"tencent.com/vcuda-memory", "20"}}));
  EXPECT_THAT(m, HasSubstr("pod \"train\""));
  EXPECT_THAT(m, HasSubstr("container \"cuda\""));
  EXPECT_THAT(m, HasSubstr("150 is more than one GPU but not a multiple of 100"));
  EXPECT_THAT(m, HasSubstr("allowed:"));
}

// 0 cores with memory: denied.
TEST_F(WebhookHttps, DeniesZeroCoresWithMemory) {
  std::string m = Denial(Review({{"tencent.com/vcuda-core", "0"},
                                 {"tencent.com/vcuda-memory", "20"}}));
  EXPECT_THAT(m, HasSubstr("tencent.com/vcuda-memory 20 without tencent.com/vcuda-core"));
}

// Memory larger than the cluster's largest GPU (learned from the node annotation): denied.
TEST_F(WebhookHttps, DeniesMemoryLargerThanAGpu) {
  std::string m = Denial(Review({{"tencent.com/vcuda-core", "50"},
                                 {"tencent.com/vcuda-memory", "400"}}));
  EXPECT_THAT(m, HasSubstr("400 (102400 MiB) is larger than one GPU (318 units"));
}

// requests != limits: denied.
TEST_F(WebhookHttps, DeniesRequestsNotEqualLimits) {
  std::string m = Denial(Review(
      {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}},
      {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "10"}}));
  EXPECT_THAT(m, HasSubstr("request 10 differs from limit 20"));
}

// The mutating endpoint points vGPU pods at the configured scheduler with a JSON patch.
TEST_F(WebhookHttps, MutateSetsSchedulerName) {
  json out = Post("/mutate", Review({{"tencent.com/vcuda-core", "30"},
                                     {"tencent.com/vcuda-memory", "20"}}));
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

}  // namespace
}  // namespace gpulet::scheduler
