// A small Kubernetes API client: the REST calls gpulet needs (pods, nodes, bindings, watch), over
// cpp-httplib with OpenSSL, JSON as nlohmann::json. The API server is an outside world; tests point
// this same client at the in-repo fake (testing/apiserver/) over real HTTP(S).
//
// Errors map HTTP codes onto absl codes (404 NotFound, 409 AlreadyExists/Aborted, 400/422
// InvalidArgument, 401 Unauthenticated, 403 PermissionDenied, 410 FailedPrecondition "expired",
// 429 ResourceExhausted, 5xx/transport Unavailable); the message carries the server's
// Status.message. Calls are retried with exponential backoff on 409 Conflict (not AlreadyExists),
// 429 (honouring Retry-After) and 5xx / transport errors.
//
// Connections: plain calls reuse kept-alive connections, at most `max_idle_connections` of them
// parked between calls (a call in flight takes one; more calls at once open more, and those
// beyond the cap are closed when done). A thousand agents each paying a TCP connect, a TLS
// handshake and a CA parse per request is what the API server would otherwise see. Watches use
// a connection of their own each.
//
// Thread-safety: Client is thread-safe (a call holds its connection alone). Watch runs on the
// caller's thread until the handler returns false, the server ends it, or Cancel() is called.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "nlohmann/json.hpp"

namespace httplib {
class ClientImpl;
}

namespace gpulet::k8s {

using nlohmann::json;

// Where Config::server points.
struct Endpoint {
  bool https = true;
  std::string host;
  int port = 443;
};

struct Config {
  std::string server;           // "https://10.0.0.1:443" or "http://127.0.0.1:8080"
  std::string token;            // bearer token (empty: none)
  std::string ca_pem;           // CA bundle to verify the server (empty: system default)
  std::string client_cert_pem;  // client certificate auth (kubeconfig), with client_key_pem
  std::string client_key_pem;
  bool insecure_skip_verify = false;
  int max_attempts = 5;                            // per call, including the first
  std::chrono::milliseconds initial_backoff{100};  // doubles per retry
  std::chrono::milliseconds max_backoff{5000};
  std::chrono::seconds timeout{30};  // connect/read for plain calls
  int max_idle_connections = 4;      // kept-alive connections parked between calls
};

// In-cluster config: KUBERNETES_SERVICE_HOST/PORT and the service-account token and CA under
// `sa_dir` (default /var/run/secrets/kubernetes.io/serviceaccount).
absl::StatusOr<Config> InClusterConfig(
    const std::string& sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount");
// A kubeconfig file: the current (or named) context's cluster and user (token, token-file,
// client-certificate(-data)/client-key(-data), certificate-authority(-data), insecure-skip-tls-
// verify). Errors name the file and, for YAML errors, the line.
absl::StatusOr<Config> LoadKubeconfig(const std::string& path, const std::string& context = "");
// The usual order: explicit kubeconfig path, $KUBECONFIG, in-cluster, ~/.kube/config.
absl::StatusOr<Config> ResolveConfig(const std::string& kubeconfig_flag);

enum class PatchType { kMerge, kStrategicMerge, kJson };

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  std::string resource_version;  // for watch: start after this version
  int timeout_seconds = 0;       // watch: server-side end (0 = server default)
  int limit = 0;                 // list: at most this many items a page (0 = all at once)
  std::string continue_token;    // list: the page after the one whose metadata.continue this is
};

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
  json object;
};

class Client {
 public:
  explicit Client(Config config, Clock* clock = RealClock());
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Generic call: `path` is absolute ("/api/v1/nodes?x=y"); body and response are JSON.
  absl::StatusOr<json> Call(const std::string& method, const std::string& path,
                            const json* body = nullptr,
                            const std::string& content_type = "application/json");

  absl::StatusOr<json> GetPod(const std::string& ns, const std::string& name);
  // `ns` empty: all namespaces. Returns the PodList (items, metadata.resourceVersion).
  absl::StatusOr<json> ListPods(const std::string& ns, const ListOptions& opts = {});
  absl::StatusOr<json> PatchPod(const std::string& ns, const std::string& name, PatchType type,
                                const json& patch);
  // POST pods/<name>/binding. `uid` (may be empty) guards against binding a re-created pod. The
  // API server sets `annotations` (an object of strings) on the pod in the same write as its
  // node: a pod is never seen bound without them, nor annotated but unbound.
  absl::Status CreateBinding(const std::string& ns, const std::string& name, const std::string& uid,
                             const std::string& node, const json& annotations = json::object());
  absl::StatusOr<json> GetNode(const std::string& name);
  absl::StatusOr<json> ListNodes(const ListOptions& opts = {});
  absl::StatusOr<json> PatchNode(const std::string& name, PatchType type, const json& patch);
  absl::StatusOr<json> PatchNodeStatus(const std::string& name, PatchType type, const json& patch);
  // POST a core/v1 Event into `ns` (an event about a cluster-scoped object such as a Node goes
  // to "default", as kubectl shows it). Returns the created object. Build it with MakeEvent().
  absl::StatusOr<json> CreateEvent(const std::string& ns, const json& event);

  // Streams watch events of a collection path ("/api/v1/pods", "/api/v1/nodes", ...) to
  // `handler` until it returns false, the server closes the stream (OK), or Cancel(). A 410 Gone
  // (too old resourceVersion) is FailedPrecondition: re-list and watch again. Not retried.
  absl::Status Watch(const std::string& collection_path, const ListOptions& opts,
                     const std::function<bool(const WatchEvent&)>& handler);
  // Ends every Watch() running on this client, now and later (for shutdown).
  void Cancel();

  const Config& config() const { return config_; }

 private:
  struct Tls;
  // A parked connection, or a new one (`*reused` says which).
  std::unique_ptr<httplib::ClientImpl> Connection(bool* reused);
  // Parks a connection after a call that got an answer, up to the cap.
  void Release(std::unique_ptr<httplib::ClientImpl> cli);
  Config config_;
  Clock* clock_;
  Endpoint endpoint_;
  absl::Status endpoint_status_;  // Config::server unusable: every call answers this
  std::unique_ptr<Tls> tls_;
  std::mutex pool_mu_;
  std::vector<std::unique_ptr<httplib::ClientImpl>> idle_;  // guarded by pool_mu_

  std::atomic<bool> cancelled_{false};
  std::mutex watches_mu_;
  std::vector<void*> watches_;  // httplib clients of running watches, stopped by Cancel()
};

// A core/v1 Event about `involved` (a Pod or Node as read from the API server: its kind, name,
// namespace, uid and apiVersion are referenced). `type` is "Normal" or "Warning"; `reason` is a
// short CamelCase word; `component` names the reporter ("gpulet-agent"). The name is the involved
// object's name plus a unique suffix, as client-go's recorder does; timestamps are `now`.
json MakeEvent(const json& involved, const std::string& type, const std::string& reason,
               const std::string& message, const std::string& component,
               const std::string& host = "", Clock* clock = RealClock());

// Builds "?a=b&c=d" from ListOptions plus extras (URL-encoded).
std::string QueryString(const ListOptions& opts, bool watch);

// Every object of a collection (`path`, with opts' selectors), read in pages of kListPage (limit
// and continue, as client-go's pager asks), with the list's resourceVersion. `keep`, when given,
// decides per object whether it is returned (one that makes it throw is; a keep that trims must
// then leave the object whole) and may trim it in place to the fields the caller reads (as
// client-go's informer transforms do): a caller that serves a part of a large cluster holds only
// that part, never the whole list at once. `stop`, when given and set, ends the paging early with
// Cancelled.
inline constexpr int kListPage = 500;
using KeepFn = std::function<bool(json& object)>;
struct Listed {
  std::vector<json> items;
  std::string resource_version;
};
absl::StatusOr<Listed> ListPaged(Client& client, const std::string& path, const ListOptions& opts,
                                 const KeepFn& keep = nullptr,
                                 const std::atomic<bool>* stop = nullptr);

// A list+watch loop: lists `collection_path` (ListPaged, with `keep`), hands the objects to
// `on_sync` (a full replace), then watches and hands each event to `on_event` (every event: keep
// filters only the list); re-lists after a 410 or a broken stream, with backoff. Runs on its own
// thread from Start() until Stop(). Callbacks run on that thread.
class Reflector {
 public:
  using SyncFn = std::function<void(const std::vector<json>& items)>;
  using EventFn = std::function<void(const WatchEvent& ev)>;
  Reflector(Client* client, std::string collection_path, ListOptions opts, SyncFn on_sync,
            EventFn on_event, KeepFn keep = nullptr);
  ~Reflector();
  void Start();
  void Stop();
  // True once the first list has been delivered.
  bool synced() const { return synced_.load(); }
  // Blocks until synced or `timeout`; false on timeout.
  bool WaitSynced(std::chrono::milliseconds timeout);

 private:
  void Run();
  Client* client_;
  std::string path_;
  ListOptions opts_;
  SyncFn on_sync_;
  EventFn on_event_;
  KeepFn keep_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> synced_{false};
  std::unique_ptr<Client> watch_client_;  // own client so Stop() cancels only our watch
  std::thread thread_;
};

}  // namespace gpulet::k8s
