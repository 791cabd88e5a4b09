// An in-process fake Kubernetes API server for tests and simulation. It speaks the real REST paths
// and JSON shapes over real HTTP (or HTTPS), so production clients (src/k8s) talk to it exactly as
// to kube-apiserver:
//   /api/v1/pods, /api/v1/namespaces/{ns}/pods[/{name}[/status|/binding]], /api/v1/namespaces/{ns}/
//   bindings, /api/v1/nodes[/{name}[/status]]: GET (list, get, ?watch=true&resourceVersion=N),
//   POST (create), PATCH (merge, strategic-merge as merge, JSON patch), PUT, DELETE.
//   /api/v1/events, /api/v1/namespaces/{ns}/events[/{name}]: POST (create; core/v1 Event kept as
//   given, metadata.generateName honoured) and GET (list, get, watch).
//   /apis/resource.k8s.io/v1/resourceslices[/{name}] and /apis/resource.k8s.io/v1/namespaces/{ns}/
//   resourceclaims[/{name}[/status]] (and the all-namespaces list): GET (list without watch, get),
//   POST, PUT, PATCH, DELETE. /apis/apps/v1/namespaces/{ns}/daemonsets[/{name}]: the same, and
//   watch. /apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]: the same, no watch.
//   Field selectors (the labels kube-apiserver supports for each resource, e.g. spec.nodeName on
//   pods but not on nodes; =, ==, !=) and label selectors (=, ==, !=, in, notin, key, !key).
//   Every change gets a cluster-wide resourceVersion; watches replay from the given version and
//   answer 410 Gone (as an ERROR event) when it is older than the retained history. A stale
//   metadata.resourceVersion in a PATCH/PUT body is a 409 Conflict. Errors are Status objects.
// What kube-apiserver v1.34 does and the fake copies, checked scenario by scenario on the real one
// (tests/k8s/api_probe.py, api_probe.expected; docs/cluster.md): the main resource of pods, nodes
// and resource claims keeps the stored status and /status the stored spec; a pod needs
// containers; DELETE of a pod bound to a node and not finished only sets deletionTimestamp (see
// the route); the messages of conflicts, bindings, unsupported selectors and media types; a
// Binding's annotations set on the pod with its node.
// Test hooks: direct object access, and fault injection (the next N requests fail with a code).
// Thread-safe. Owns its listening thread; the destructor stops it and ends open watches.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace gpulet::testing {

using nlohmann::json;

class FakeApiServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;                     // 0: any free port
    std::string cert_file, key_file;  // both set: HTTPS
    size_t history = 1000;            // watch events retained
  };
  FakeApiServer();
  explicit FakeApiServer(Options options);
  ~FakeApiServer();

  // Starts listening; false (with a log line) when the port cannot be bound.
  bool Start();
  void Stop();
  int port() const { return port_; }
  std::string url() const;  // "http://127.0.0.1:PORT"
  // A kubeconfig whose only context points at this server (for binaries under test).
  std::string Kubeconfig() const {
    return "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
           "contexts:\n- name: t\n  context: {cluster: c}\n"
           "clusters:\n- name: c\n  cluster: {server: \"" +
           url() + "\"}\n";
  }

  // Direct access (as an admin would through kubectl). Objects get uid, resourceVersion,
  // creationTimestamp; pods default status.phase to Pending.
  json CreatePod(json pod);
  json CreateNode(json node);
  // Removes the pod at once (a forced delete, or its kubelet confirming a graceful one).
  bool DeletePod(const std::string& ns, const std::string& name);
  bool GetPod(const std::string& ns, const std::string& name, json* out) const;
  bool GetNode(const std::string& name, json* out) const;
  std::vector<json> Pods() const;
  // Events created so far (any namespace), in creation order.
  std::vector<json> Events() const;
  // Sets status fields of a pod (e.g. phase Running) as the kubelet would.
  bool SetPodPhase(const std::string& ns, const std::string& name, const std::string& phase);

  // resource.k8s.io/v1 objects by plural ("resourceslices", "resourceclaims"); cluster-scoped
  // ones have ns "". Update replaces the object as a controller would (stamped, recorded).
  json CreateObject(const std::string& kind, json obj);
  bool GetObject(const std::string& kind, const std::string& ns, const std::string& name,
                 json* out) const;
  std::vector<json> Objects(const std::string& kind) const;
  bool UpdateObject(const std::string& kind, json obj);

  // The next `count` requests (of `method`, or any when empty) fail with HTTP `code`.
  void InjectFailures(int count, int code, const std::string& method = "");
  // Requests served so far, by method.
  int64_t request_count(const std::string& method) const;
  // TCP connections that have carried a request so far (distinct client address and port).
  size_t connection_count() const;

 private:
  struct Event {
    int64_t rv;
    std::string type;
    std::string kind;  // "pods" | "nodes" | "events" | a kind of ResourceRoutes
    json object;
  };
  using ModifyFn = std::function<void(json&, const std::string&, const httplib::Request&,
                                      httplib::Response&, bool)>;
  void Routes();
  // Lists or watches a collection: (kind, namespace or "" for all, request, response).
  using ListFn = std::function<void(const std::string&, const std::string&, const httplib::Request&,
                                    httplib::Response&)>;
  void ResourceRoutes(const ModifyFn& modify, const ListFn& watch);
  std::map<std::string, json>& Store(const std::string& kind);  // REQUIRES: mu_ held
  json Stamp(json obj, const std::string& kind);  // sets rv (and uid, timestamps when new)
  void Record(const std::string& type, const std::string& kind, const json& obj);

  Options options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;
  int64_t rv_ = 1;
  std::map<std::string, json> pods_;    // "ns/name"
  std::map<std::string, json> nodes_;   // name
  std::map<std::string, json> events_;  // "ns/name"
  std::vector<std::string> event_order_;
  std::map<std::string, std::map<std::string, json>> objects_;  // kind -> "ns/name"
  std::deque<Event> history_;
  int fail_count_ = 0;
  int fail_code_ = 500;
  std::string fail_method_;
  std::map<std::string, int64_t> requests_;
  std::set<std::pair<std::string, int>> peers_;  // remote address and port of each connection
};

}  // namespace gpulet::testing
