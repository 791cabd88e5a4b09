// The Kubernetes API client (src/k8s) against the in-repo fake API server over real HTTP(S):
// CRUD, selectors, patch types, bindings, watch with resourceVersion, retries, configuration.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "http/tls.h"
#include "k8s/client.h"
#include "testing/apiserver/fake_apiserver.h"

namespace gpulet::k8s {
namespace {

using ::testing::HasSubstr;

json Pod(const std::string& name, const std::string& node = "", json labels = json::object()) {
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"labels", labels}}},
          {"spec", {{"nodeName", node}, {"containers", json::array({{{"name", "c"}}})}}}};
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start());
    Config c;
    c.server = server_.url();
    c.initial_backoff = std::chrono::milliseconds(1);
    c.max_backoff = std::chrono::milliseconds(4);
    client_ = std::make_unique<Client>(c);
  }
  testing::FakeApiServer server_;
  std::unique_ptr<Client> client_;
};

// Pods listed with field and label selectors return exactly the matching ones.
TEST_F(ClientTest, ListWithSelectors) {
  server_.CreatePod(Pod("a", "n1", {{"app", "x"}}));
  server_.CreatePod(Pod("b", "n2", {{"app", "y"}}));
  server_.CreatePod(Pod("c", "", {{"app", "x"}, {"tier", "gpu"}}));
  auto names = [](const json& list) {
    std::vector<std::string> out;
    for (const auto& p : list["items"]) out.push_back(p["metadata"]["name"]);
    return out;
  };
  auto on_n1 = client_->ListPods("default", {.field_selector = "spec.nodeName=n1"});
  ASSERT_TRUE(on_n1.ok()) << on_n1.status();
  EXPECT_THAT(names(*on_n1), ::testing::ElementsAre("a"));
  auto unbound = client_->ListPods("", {.field_selector = "spec.nodeName="});
  EXPECT_THAT(names(*unbound), ::testing::ElementsAre("c"));
  auto x = client_->ListPods("", {.label_selector = "app=x,tier"});
  EXPECT_THAT(names(*x), ::testing::ElementsAre("c"));
  auto notin = client_->ListPods("", {.label_selector = "app notin (x)"});
  EXPECT_THAT(names(*notin), ::testing::ElementsAre("b"));
  auto bad = client_->ListPods("", {.field_selector = "spec.bogus=1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
}

// Merge, strategic-merge and JSON patches change the pod; a stale resourceVersion conflicts.
TEST_F(ClientTest, PatchTypesAndConflict) {
  json created = server_.CreatePod(Pod("p"));
  auto m = client_->PatchPod("default", "p", PatchType::kMerge,
                             {{"metadata", {{"annotations", {{"a", "1"}}}}}});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)["metadata"]["annotations"]["a"], "1");
  auto j = client_->PatchPod(
      "default", "p", PatchType::kJson,
      json::array({{{"op", "add"}, {"path", "/metadata/annotations/b"}, {"value", "2"}}}));
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["metadata"]["annotations"]["a"], "1");
  EXPECT_EQ((*j)["metadata"]["annotations"]["b"], "2");
  auto s = client_->PatchPod("default", "p", PatchType::kStrategicMerge,
                             {{"metadata", {{"labels", {{"l", "v"}}}}}});
  ASSERT_TRUE(s.ok());
  auto stale = client_->PatchPod(
      "default", "p", PatchType::kMerge,
      {{"metadata", {{"resourceVersion", created["metadata"]["resourceVersion"]}}}});
  ASSERT_FALSE(stale.ok());
  EXPECT_TRUE(absl::IsAborted(stale.status())) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("the object has been modified"));
  auto missing = client_->GetPod("default", "nope");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
}

// A Binding sets spec.nodeName (and its annotations) once; binding again, or with the wrong UID,
// is refused.
TEST_F(ClientTest, Binding) {
  json p = server_.CreatePod(Pod("p"));
  std::string uid = p["metadata"]["uid"];
  EXPECT_FALSE(client_->CreateBinding("default", "p", "wrong-uid", "n1").ok());
  ASSERT_TRUE(client_->CreateBinding("default", "p", uid, "n1", {{"gpulet.io/x", "1"}}).ok());
  json got;
  ASSERT_TRUE(server_.GetPod("default", "p", &got));
  EXPECT_EQ(got["spec"]["nodeName"], "n1");
  EXPECT_EQ(got["metadata"]["annotations"]["gpulet.io/x"], "1");  // in the same write
  absl::Status again = client_->CreateBinding("default", "p", uid, "n2");
  EXPECT_THAT(again.message(), HasSubstr("already assigned to node"));
}

// An Event about a pod is created as given and found again by involvedObject.name; a bad one
// (no involved object) is refused with the reason.
TEST_F(ClientTest, CreateAndListEvents) {
  json pod = server_.CreatePod(Pod("p"));
  json node = server_.CreateNode({{"metadata", {{"name", "n1"}}}});
  json ev = MakeEvent(pod, "Warning", "UnexpectedAdmissionError", "GPU lost", "gpulet-agent", "n1");
  auto created = client_->CreateEvent("default", ev);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)["metadata"]["name"], ev["metadata"]["name"]);
  EXPECT_TRUE((*created)["metadata"].contains("resourceVersion"));
  ASSERT_TRUE(
      client_
          ->CreateEvent("default", MakeEvent(node, "Normal", "GPUsReady", "8 GPUs", "gpulet-agent"))
          .ok());
  auto about_p = client_->Call("GET", "/api/v1/namespaces/default/events?fieldSelector=" +
                                          std::string("involvedObject.name%3Dp"));
  ASSERT_TRUE(about_p.ok()) << about_p.status();
  ASSERT_EQ((*about_p)["items"].size(), 1u);
  const json& got = (*about_p)["items"][0];
  EXPECT_EQ(got["involvedObject"]["kind"], "Pod");
  EXPECT_EQ(got["involvedObject"]["uid"], pod["metadata"]["uid"]);
  EXPECT_EQ(got["reason"], "UnexpectedAdmissionError");
  EXPECT_EQ(got["message"], "GPU lost");
  EXPECT_EQ(got["type"], "Warning");
  EXPECT_EQ(got["source"]["component"], "gpulet-agent");
  ASSERT_EQ(server_.Events().size(), 2u);
  EXPECT_EQ(server_.Events()[1]["involvedObject"]["kind"], "Node");
  json bad = ev;
  bad.erase("involvedObject");
  bad["metadata"]["name"] = "other";
  auto refused = client_->CreateEvent("default", bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("involvedObject.name"));
  EXPECT_TRUE(absl::IsAlreadyExists(client_->CreateEvent("default", ev).status()));
}

// 5xx and 429 are retried with backoff until they pass; a persistent failure is returned.
TEST_F(ClientTest, RetriesOnServerErrorsAndThrottling) {
  server_.CreatePod(Pod("p"));
  int64_t before = server_.request_count("GET");
  server_.InjectFailures(2, 503);
  ASSERT_TRUE(client_->GetPod("default", "p").ok());
  EXPECT_EQ(server_.request_count("GET") - before, 3);
  server_.InjectFailures(1, 429);
  ASSERT_TRUE(client_->GetPod("default", "p").ok());
  server_.InjectFailures(100, 500);
  auto r = client_->GetPod("default", "p");
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  server_.InjectFailures(0, 500);
  // 404 is not retried.
  before = server_.request_count("GET");
  EXPECT_FALSE(client_->GetPod("default", "absent").ok());
  EXPECT_EQ(server_.request_count("GET") - before, 1);
}

// Calls reuse kept-alive connections: twenty calls in a row open a handful of connections (the
// fake, like cpp-httplib's server, closes one after five requests), not twenty, and the server's
// closing of a connection never fails a call.
TEST_F(ClientTest, ReusesConnections) {
  server_.CreatePod(Pod("p"));
  size_t before = server_.connection_count();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->GetPod("default", "p").ok()) << i;
  EXPECT_LE(server_.connection_count() - before, 5u);
}

// A parked connection whose server went away (restarted on the same port) is replaced at once:
// the call succeeds even with a single attempt allowed.
TEST(ClientReconnect, ServerRestartedBetweenCalls) {
  auto first = std::make_unique<testing::FakeApiServer>();
  ASSERT_TRUE(first->Start());
  int port = first->port();
  Config c;
  c.server = first->url();
  c.max_attempts = 1;
  Client client(c);
  ASSERT_TRUE(client.ListNodes().ok());
  first.reset();
  testing::FakeApiServer::Options o;
  o.port = port;
  testing::FakeApiServer second(o);
  ASSERT_TRUE(second.Start());
  second.CreateNode({{"metadata", {{"name", "n1"}}}});
  auto nodes = client.ListNodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ((*nodes)["items"].size(), 1u);
}

// A watch the server refuses every time (here: the fake serves no watch of resourceslices, as an
// API server answers a watch that RBAC forbids) backs off instead of re-listing every 50 ms.
TEST_F(ClientTest, ReflectorBacksOffFromARefusedWatch) {
  int64_t before = server_.request_count("GET");
  std::atomic<int> syncs{0};
  Reflector r(
      client_.get(), "/apis/resource.k8s.io/v1/resourceslices", {},
      [&](const std::vector<json>&) { ++syncs; }, [](const WatchEvent&) {});
  r.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  r.Stop();
  int64_t gets = server_.request_count("GET") - before;  // a LIST and a WATCH per round
  EXPECT_GE(syncs.load(), 2);
  // 50, 100, 200, 400, 800 ms between rounds: at most 6 rounds in 1.5 s (before: about 30).
  EXPECT_LE(gets, 12) << gets << " requests in 1.5 s";
}

// A server address the client cannot use fails every call with the same clear error.
TEST(ClientConfigErrors, BadServerAddress) {
  Config c;
  c.server = "ftp://example";
  Client client(c);
  auto r = client.ListNodes();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("must start with https:// or http://"));
  EXPECT_FALSE(client.Watch("/api/v1/pods", {}, [](const WatchEvent&) { return true; }).ok());
}

// An unreachable server is Unavailable with the address in the message, not a hang.
TEST(ClientNoServer, Unreachable) {
  Config c;
  c.server = "http://127.0.0.1:1";
  c.max_attempts = 2;
  c.initial_backoff = std::chrono::milliseconds(1);
  Client client(c);
  auto r = client.ListNodes();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("127.0.0.1:1"));
}

// Watch from a list's resourceVersion sees ADDED, MODIFIED and DELETED in order; a selector
// turns a pod that starts matching into ADDED.
TEST_F(ClientTest, WatchFromResourceVersion) {
  auto list = client_->ListPods("", {});
  ASSERT_TRUE(list.ok());
  std::string rv = (*list)["metadata"]["resourceVersion"];
  std::vector<std::string> seen;
  std::thread t([&] {
    ListOptions o{.resource_version = rv, .timeout_seconds = 10};
    o.field_selector = "spec.nodeName=n1";
    (void)client_->Watch("/api/v1/pods", o, [&](const WatchEvent& ev) {
      seen.push_back(ev.type + ":" + ev.object["metadata"]["name"].get<std::string>());
      return seen.size() < 3;
    });
  });
  server_.CreatePod(Pod("other", "n2"));
  json p = server_.CreatePod(Pod("w"));
  ASSERT_TRUE(client_->CreateBinding("default", "w", "", "n1").ok());
  ASSERT_TRUE(
      client_
          ->PatchPod("default", "w", PatchType::kMerge, {{"metadata", {{"labels", {{"x", "y"}}}}}})
          .ok());
  ASSERT_TRUE(server_.DeletePod("default", "w"));
  t.join();
  EXPECT_THAT(seen, ::testing::ElementsAre("ADDED:w", "MODIFIED:w", "DELETED:w"));
}

// A resourceVersion older than the retained history is 410 Gone (FailedPrecondition).
TEST(ClientWatch, TooOldIsGone) {
  testing::FakeApiServer::Options o;
  o.history = 2;
  testing::FakeApiServer server(o);
  ASSERT_TRUE(server.Start());
  for (int i = 0; i < 5; ++i) server.CreatePod(Pod("p" + std::to_string(i)));
  Config c;
  c.server = server.url();
  Client client(c);
  absl::Status s = client.Watch("/api/v1/pods", {.resource_version = "1"},
                                [](const WatchEvent&) { return true; });
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

// Cancel() ends a quiet watch promptly.
TEST_F(ClientTest, CancelEndsWatch) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    (void)client_->Watch("/api/v1/nodes", {.resource_version = "1", .timeout_seconds = 60},
                         [](const WatchEvent&) { return true; });
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  client_->Cancel();
  t.join();
  EXPECT_TRUE(done);
}

// The Reflector lists, then follows changes, and hands both to its callbacks.
TEST_F(ClientTest, ReflectorListsThenWatches) {
  server_.CreateNode({{"metadata", {{"name", "n1"}}}});
  std::mutex mu;
  std::vector<std::string> events;
  Reflector r(
      client_.get(), "/api/v1/nodes", {},
      [&](const std::vector<json>& items) {
        std::lock_guard<std::mutex> l(mu);
        for (const auto& i : items)
          events.push_back("SYNC:" + i["metadata"]["name"].get<std::string>());
      },
      [&](const WatchEvent& ev) {
        std::lock_guard<std::mutex> l(mu);
        events.push_back(ev.type + ":" + ev.object["metadata"]["name"].get<std::string>());
      });
  r.Start();
  ASSERT_TRUE(r.WaitSynced(std::chrono::seconds(5)));
  server_.CreateNode({{"metadata", {{"name", "n2"}}}});
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (events.size() >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.Stop();
  EXPECT_THAT(events, ::testing::ElementsAre("SYNC:n1", "ADDED:n2"));
}

// The Reflector's list comes in pages of kListPage (limit and continue, as client-go's pager
// asks), and `keep` decides which listed objects reach on_sync; watch events all reach on_event.
TEST_F(ClientTest, ReflectorListsInPagesAndKeepsWhatItIsAskedTo) {
  const int n = kListPage * 2 + 7;
  for (int i = 0; i < n; ++i) {
    json labels = i % 3 == 0 ? json{{"gpu", "yes"}} : json::object();
    server_.CreateNode({{"metadata", {{"name", absl::StrCat("n", i)}, {"labels", labels}}}});
  }
  std::mutex mu;
  std::set<std::string> synced;
  std::vector<std::string> events;
  int64_t before = server_.request_count("GET");
  Reflector r(
      client_.get(), "/api/v1/nodes", {},
      [&](const std::vector<json>& items) {
        std::lock_guard<std::mutex> l(mu);
        for (const auto& i : items) synced.insert(i["metadata"]["name"].get<std::string>());
      },
      [&](const WatchEvent& ev) {
        std::lock_guard<std::mutex> l(mu);
        events.push_back(ev.type + ":" + ev.object["metadata"]["name"].get<std::string>());
      },
      [](json& node) { return node["metadata"].value("labels", json::object()).contains("gpu"); });
  r.Start();
  ASSERT_TRUE(r.WaitSynced(std::chrono::seconds(10)));
  server_.CreateNode({{"metadata", {{"name", "plain"}}}});
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!events.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.Stop();
  std::lock_guard<std::mutex> l(mu);
  std::set<std::string> want;
  for (int i = 0; i < n; i += 3) want.insert(absl::StrCat("n", i));
  EXPECT_EQ(synced, want) << "every third node, from all three pages";
  EXPECT_THAT(events, ::testing::ElementsAre("ADDED:plain")) << "events are not filtered";
  // Three list pages, then the watch.
  EXPECT_EQ(server_.request_count("GET") - before, 4);
}

// The fake API server pages as the real one does, and refuses a limit that is no number.
TEST_F(ClientTest, ListPagesWithLimitAndContinue) {
  for (const char* name : {"a", "b", "c"}) server_.CreateNode({{"metadata", {{"name", name}}}});
  ListOptions o;
  o.limit = 2;
  auto first = client_->ListNodes(o);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)["items"].size(), 2u);
  std::string token = (*first)["metadata"].value("continue", "");
  ASSERT_FALSE(token.empty());
  o.continue_token = token;
  auto second = client_->ListNodes(o);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ((*second)["items"].size(), 1u);
  EXPECT_EQ((*second)["items"][0]["metadata"]["name"], "c");
  EXPECT_FALSE((*second)["metadata"].contains("continue"));
  auto bad = client_->Call("GET", "/api/v1/nodes?limit=many");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("invalid limit many"));
}

class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "k8s-test-XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& content) {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << content;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// HTTPS with a kubeconfig carrying the CA and a token: verified TLS to the fake server.
TEST(ClientTls, KubeconfigOverHttps) {
  TempDir dir;
  auto pem = http::SelfIssuedCertificate({"localhost", "127.0.0.1"});
  ASSERT_TRUE(pem.ok()) << pem.status();
  testing::FakeApiServer::Options o;
  o.cert_file = dir.Write("tls.crt", pem->cert_pem);
  o.key_file = dir.Write("tls.key", pem->key_pem);
  testing::FakeApiServer server(o);
  ASSERT_TRUE(server.Start());
  server.CreateNode({{"metadata", {{"name", "n1"}}}});
  std::string kc = dir.Write("config", R"(apiVersion: v1
kind: Config
current-context: test
contexts:
- name: test
  context: {cluster: c, user: u}
clusters:
- name: c
  cluster:
    server: )" + server.url() + R"(
    certificate-authority-data: )" + absl::Base64Escape(pem->ca_pem) +
                                           R"(
users:
- name: u
  user: {token: abc}
)");
  auto cfg = LoadKubeconfig(kc);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->token, "abc");
  Client client(*cfg);
  auto node = client.GetNode("n1");
  ASSERT_TRUE(node.ok()) << node.status();
  // Without the CA the certificate is not trusted.
  Config untrusted = *cfg;
  untrusted.ca_pem.clear();
  untrusted.max_attempts = 1;
  EXPECT_FALSE(Client(untrusted).GetNode("n1").ok());
}

// Kubeconfig errors name the file (and line for YAML errors); in-cluster reads the SA files.
TEST(ClientConfig, ErrorsAndInCluster) {
  TempDir dir;
  auto bad = LoadKubeconfig(dir.Write("bad", "a: [1,\n  b: c\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(dir.path() + "/bad:"));
  auto noctx = LoadKubeconfig(dir.Write("noctx", "current-context: x\ncontexts: []\n"));
  ASSERT_FALSE(noctx.ok());
  EXPECT_THAT(noctx.status().message(), HasSubstr("context \"x\" not found"));
  EXPECT_TRUE(absl::IsNotFound(LoadKubeconfig(dir.path() + "/missing").status()));

  dir.Write("token", "tok\n");
  dir.Write("ca.crt", "PEM");
  setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  auto ic = InClusterConfig(dir.path());
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  ASSERT_TRUE(ic.ok()) << ic.status();
  EXPECT_EQ(ic->server, "https://10.0.0.1:443");
  EXPECT_EQ(ic->token, "tok");
  EXPECT_FALSE(InClusterConfig(dir.path()).ok());
}

}  // namespace
}  // namespace gpulet::k8s
