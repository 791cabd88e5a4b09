#include "testing/apiserver/fake_apiserver.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace gpulet::testing {
namespace {

json StatusObject(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},
          {"apiVersion", "v1"},
          {"metadata", json::object()},
          {"status", code < 300 ? "Success" : "Failure"},
          {"message", message},
          {"reason", reason},
          {"code", code}};
}

void Reply(httplib::Response& res, int code, const json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void Fail(httplib::Response& res, int code, const std::string& reason, const std::string& msg) {
  Reply(res, code, StatusObject(code, reason, msg));
}

std::string Field(const json& obj, const std::string& path) {
  const json* cur = &obj;
  for (auto part : absl::StrSplit(path, '.')) {
    if (!cur->is_object()) return "";
    auto it = cur->find(std::string(part));
    if (it == cur->end()) return "";
    cur = &*it;
  }
  return cur->is_string() ? cur->get<std::string>() : (cur->is_null() ? "" : cur->dump());
}

// A parsed selector: conjunction of terms. Field selectors use only =, ==, !=.
struct Term {
  std::string key;
  enum Op { kEq, kNe, kIn, kNotIn, kExists, kNotExists } op = kEq;
  std::vector<std::string> values;
};

// The field labels kube-apiserver v1.34 accepts per resource (others: 400 "field label not
// supported: X", as tests/k8s/api_probe.py saw on the real server).
bool FieldSupported(const std::string& kind, const std::string& key) {
  static const std::map<std::string, std::vector<std::string>> kFields = {
      {"pods",
       {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
        "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
        "status.podIP", "status.podIPs", "status.nominatedNodeName"}},
      {"nodes", {"metadata.name", "spec.unschedulable"}},
      {"events",
       {"metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
        "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
        "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
        "reportingComponent", "source", "type"}},
      {"resourceslices", {"metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"}},
      {"resourceclaims", {"metadata.name", "metadata.namespace"}},
  };
  auto it = kFields.find(kind);
  if (it == kFields.end()) return key == "metadata.name" || key == "metadata.namespace";
  return std::find(it->second.begin(), it->second.end(), key) != it->second.end();
}

// `kind` is the resource's plural; empty for a label selector.
bool ParseSelector(const std::string& s, const std::string& kind, std::vector<Term>* out,
                   std::string* err) {
  const bool labels = kind.empty();
  std::vector<std::string> parts;
  int depth = 0;
  std::string cur;
  for (char c : s) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  for (std::string p : parts) {
    p = std::string(absl::StripAsciiWhitespace(p));
    if (p.empty()) continue;
    Term t;
    size_t pos;
    if ((pos = p.find("!=")) != std::string::npos) {
      t.op = Term::kNe;
      t.key = p.substr(0, pos);
      t.values = {p.substr(pos + 2)};
    } else if ((pos = p.find("==")) != std::string::npos) {
      t.key = p.substr(0, pos);
      t.values = {p.substr(pos + 2)};
    } else if ((pos = p.find('=')) != std::string::npos) {
      t.key = p.substr(0, pos);
      t.values = {p.substr(pos + 1)};
    } else if (labels && (pos = p.find(" notin ")) != std::string::npos) {
      t.op = Term::kNotIn;
      t.key = p.substr(0, pos);
      std::string v(absl::StripAsciiWhitespace(p.substr(pos + 7)));
      if (v.size() < 2 || v.front() != '(' || v.back() != ')')
        return *err = "bad set in " + p, false;
      for (auto x : absl::StrSplit(v.substr(1, v.size() - 2), ','))
        t.values.emplace_back(absl::StripAsciiWhitespace(x));
    } else if (labels && (pos = p.find(" in ")) != std::string::npos) {
      t.op = Term::kIn;
      t.key = p.substr(0, pos);
      std::string v(absl::StripAsciiWhitespace(p.substr(pos + 4)));
      if (v.size() < 2 || v.front() != '(' || v.back() != ')')
        return *err = "bad set in " + p, false;
      for (auto x : absl::StrSplit(v.substr(1, v.size() - 2), ','))
        t.values.emplace_back(absl::StripAsciiWhitespace(x));
    } else if (labels) {
      t.op = p[0] == '!' ? Term::kNotExists : Term::kExists;
      t.key = p[0] == '!' ? p.substr(1) : p;
    } else {
      return *err = "invalid selector: '" + s + "'; can't understand '" + p + "'", false;
    }
    t.key = std::string(absl::StripAsciiWhitespace(t.key));
    for (auto& v : t.values) v = std::string(absl::StripAsciiWhitespace(v));
    if (!labels && !FieldSupported(kind, t.key)) {
      return *err = "field label not supported: " + t.key, false;
    }
    out->push_back(std::move(t));
  }
  return true;
}

bool Matches(const json& obj, const std::vector<Term>& fields, const std::vector<Term>& labels) {
  for (const Term& t : fields) {
    bool eq = Field(obj, t.key) == t.values[0];
    if (eq != (t.op == Term::kEq)) return false;
  }
  const json* lab = nullptr;
  if (obj.contains("metadata") && obj["metadata"].contains("labels"))
    lab = &obj["metadata"]["labels"];
  for (const Term& t : labels) {
    bool has = lab && lab->contains(t.key);
    std::string v = has && (*lab)[t.key].is_string() ? (*lab)[t.key].get<std::string>() : "";
    bool in = has && std::find(t.values.begin(), t.values.end(), v) != t.values.end();
    switch (t.op) {
      case Term::kEq:
      case Term::kIn:
        if (!in) return false;
        break;
      case Term::kNe:
      case Term::kNotIn:
        if (in) return false;
        break;
      case Term::kExists:
        if (!has) return false;
        break;
      case Term::kNotExists:
        if (has) return false;
        break;
    }
  }
  return true;
}

// How kube-apiserver names a resource in messages: core resources by plural, others qualified by
// their group.
std::string Qualified(const std::string& kind) {
  if (kind == "resourceclaims" || kind == "resourceslices") return kind + ".resource.k8s.io";
  if (kind == "leases") return "leases.coordination.k8s.io";
  return kind;
}

std::string NewUid() {
  static std::atomic<uint64_t> n{0};
  static const uint64_t seed = std::random_device{}();
  uint64_t a = seed ^ (++n * 0x9E3779B97F4A7C15ull);
  char buf[40];
  snprintf(buf, sizeof buf, "%08x-%04x-4%03x-8%03x-%012llx", static_cast<unsigned>(a >> 32),
           static_cast<unsigned>(a >> 16) & 0xffff, static_cast<unsigned>(a) & 0xfff,
           static_cast<unsigned>(n.load()) & 0xfff,
           static_cast<unsigned long long>(a * 31 + n.load()) & 0xffffffffffffull);
  return buf;
}

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

}  // namespace

FakeApiServer::FakeApiServer() : FakeApiServer(Options{}) {}
FakeApiServer::FakeApiServer(Options options) : options_(std::move(options)) {}
FakeApiServer::~FakeApiServer() { Stop(); }

std::string FakeApiServer::url() const {
  return absl::StrCat(options_.cert_file.empty() ? "http" : "https", "://", options_.host, ":",
                      port_);
}

bool FakeApiServer::Start() {
  if (!options_.cert_file.empty()) {
    server_ =
        std::make_unique<httplib::SSLServer>(options_.cert_file.c_str(), options_.key_file.c_str());
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  if (!server_->is_valid()) {
    spdlog::error("fake apiserver: invalid TLS certificate/key");
    return false;
  }
  // Headers and body are separate writes: without TCP_NODELAY each answer can wait ~40 ms for
  // the client's delayed ACK.
  server_->set_tcp_nodelay(true);
  // Watches hold a worker each for their whole life.
  server_->new_task_queue = [] { return new httplib::ThreadPool(64); };
  Routes();
  port_ = options_.port == 0
              ? server_->bind_to_any_port(options_.host)
              : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ <= 0) {
    spdlog::error("fake apiserver: cannot bind {}:{}", options_.host, options_.port);
    return false;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return true;
}

void FakeApiServer::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

json FakeApiServer::Stamp(json obj, const std::string& kind) {
  json& md = obj["metadata"];
  if (!md.contains("uid")) md["uid"] = NewUid();
  if (!md.contains("creationTimestamp")) md["creationTimestamp"] = Now();
  md["resourceVersion"] = std::to_string(++rv_);
  if (kind == "daemonsets") {
    obj["apiVersion"] = "apps/v1";
    obj["kind"] = "DaemonSet";
    return obj;
  }
  if (kind == "leases") {
    obj["apiVersion"] = "coordination.k8s.io/v1";
    obj["kind"] = "Lease";
    return obj;
  }
  if (kind == "resourceslices" || kind == "resourceclaims") {
    obj["apiVersion"] = "resource.k8s.io/v1";
    obj["kind"] = kind == "resourceslices" ? "ResourceSlice" : "ResourceClaim";
    return obj;
  }
  obj["apiVersion"] = "v1";
  obj["kind"] = kind == "pods" ? "Pod" : kind == "events" ? "Event" : "Node";
  return obj;
}

void FakeApiServer::Record(const std::string& type, const std::string& kind, const json& obj) {
  history_.push_back(Event{rv_, type, kind, obj});
  while (history_.size() > options_.history) history_.pop_front();
  changed_.notify_all();
}

json FakeApiServer::CreatePod(json pod) {
  std::lock_guard<std::mutex> l(mu_);
  if (!pod["metadata"].contains("namespace")) pod["metadata"]["namespace"] = "default";
  if (!pod["status"].contains("phase")) pod["status"]["phase"] = "Pending";
  pod = Stamp(std::move(pod), "pods");
  std::string key = Field(pod, "metadata.namespace") + "/" + Field(pod, "metadata.name");
  pods_[key] = pod;
  Record("ADDED", "pods", pod);
  return pod;
}

json FakeApiServer::CreateNode(json node) {
  std::lock_guard<std::mutex> l(mu_);
  node = Stamp(std::move(node), "nodes");
  nodes_[Field(node, "metadata.name")] = node;
  Record("ADDED", "nodes", node);
  return node;
}

bool FakeApiServer::DeletePod(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pods_.find(ns + "/" + name);
  if (it == pods_.end()) return false;
  json obj = it->second;
  pods_.erase(it);
  obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
  Record("DELETED", "pods", obj);
  return true;
}

bool FakeApiServer::GetPod(const std::string& ns, const std::string& name, json* out) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pods_.find(ns + "/" + name);
  if (it == pods_.end()) return false;
  *out = it->second;
  return true;
}

bool FakeApiServer::GetNode(const std::string& name, json* out) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return false;
  *out = it->second;
  return true;
}

std::vector<json> FakeApiServer::Pods() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<json> out;
  for (const auto& [k, v] : pods_) out.push_back(v);
  return out;
}

std::vector<json> FakeApiServer::Events() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<json> out;
  for (const auto& key : event_order_) out.push_back(events_.at(key));
  return out;
}

bool FakeApiServer::SetPodPhase(const std::string& ns, const std::string& name,
                                const std::string& phase) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pods_.find(ns + "/" + name);
  if (it == pods_.end()) return false;
  it->second["status"]["phase"] = phase;
  it->second = Stamp(it->second, "pods");
  Record("MODIFIED", "pods", it->second);
  return true;
}

void FakeApiServer::InjectFailures(int count, int code, const std::string& method) {
  std::lock_guard<std::mutex> l(mu_);
  fail_count_ = count;
  fail_code_ = code;
  fail_method_ = method;
}

int64_t FakeApiServer::request_count(const std::string& method) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = requests_.find(method);
  return it == requests_.end() ? 0 : it->second;
}

size_t FakeApiServer::connection_count() const {
  std::lock_guard<std::mutex> l(mu_);
  return peers_.size();
}

void FakeApiServer::Routes() {
  httplib::Server& s = *server_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> l(mu_);
    ++requests_[req.method];
    peers_.emplace(req.remote_addr, req.remote_port);
    if (fail_count_ > 0 && (fail_method_.empty() || fail_method_ == req.method)) {
      --fail_count_;
      if (fail_code_ == 429) res.set_header("Retry-After", "0");
      // Answered before the body was read: the connection cannot carry another request (the
      // unread body would be parsed as one), so it ends with this answer.
      res.set_header("Connection", "close");
      Fail(res, fail_code_, fail_code_ == 429 ? "TooManyRequests" : "InternalError",
           "injected failure");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // List or watch a collection. `ns` empty = all namespaces.
  auto list = [this](const std::string& kind, const std::string& ns, const httplib::Request& req,
                     httplib::Response& res) {
    std::vector<Term> fields, labels;
    std::string err;
    if (!ParseSelector(req.get_param_value("fieldSelector"), kind, &fields, &err) ||
        !ParseSelector(req.get_param_value("labelSelector"), "", &labels, &err)) {
      return Fail(res, 400, "BadRequest", err);
    }
    auto in_scope = [ns, fields, labels](const json& o) {
      return (ns.empty() || Field(o, "metadata.namespace") == ns) && Matches(o, fields, labels);
    };
    if (req.get_param_value("watch") != "true" && req.get_param_value("watch") != "1") {
      std::lock_guard<std::mutex> l(mu_);
      json items = json::array();
      if (kind == "events") {
        for (const auto& key : event_order_) {
          if (in_scope(events_.at(key))) items.push_back(events_.at(key));
        }
      }
      // Pages as the real server cuts them (limit, then continue from the token it returned);
      // the token here is the last key of the page before, not a snapshot: enough for a fake.
      json meta = {{"resourceVersion", std::to_string(rv_)}};
      if (kind != "events") {
        int64_t limit = 0;
        if (req.has_param("limit") &&
            (!absl::SimpleAtoi(req.get_param_value("limit"), &limit) || limit < 0))
          return Fail(res, 400, "BadRequest", "invalid limit " + req.get_param_value("limit"));
        const std::string after = req.get_param_value("continue");
        auto& store = Store(kind);
        std::string last;
        for (auto it = after.empty() ? store.begin() : store.upper_bound(after); it != store.end();
             ++it) {
          if (!in_scope(it->second)) continue;
          if (limit > 0 && static_cast<int64_t>(items.size()) == limit) {
            meta["continue"] = last;
            break;
          }
          items.push_back(it->second);
          last = it->first;
        }
      }
      return Reply(res, 200,
                   {{"kind", kind == "pods"     ? "PodList"
                             : kind == "events" ? "EventList"
                                                : "NodeList"},
                    {"apiVersion", "v1"},
                    {"metadata", meta},
                    {"items", items}});
    }
    int64_t from = 0;
    std::string rv = req.get_param_value("resourceVersion");
    if (!rv.empty() && !absl::SimpleAtoi(rv, &from)) {
      return Fail(res, 400, "BadRequest", "invalid resourceVersion " + rv);
    }
    int timeout = 300;
    if (req.has_param("timeoutSeconds")) {
      absl::SimpleAtoi(req.get_param_value("timeoutSeconds"), &timeout);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout);
    auto cursor = std::make_shared<int64_t>(from);
    auto initial = std::make_shared<bool>(from == 0);
    res.set_chunked_content_provider(
        "application/json",
        [this, kind, in_scope, deadline, cursor, initial](size_t, httplib::DataSink& sink) {
          std::string out;
          bool done = false;
          {
            std::unique_lock<std::mutex> l(mu_);
            if (*initial) {  // no resourceVersion: synthetic ADDED for what exists, then changes
              *initial = false;
              for (const auto& [k, o] : Store(kind)) {
                if (in_scope(o)) out += json{{"type", "ADDED"}, {"object", o}}.dump() + "\n";
              }
              *cursor = rv_;
            } else if (!history_.empty() && *cursor < history_.front().rv - 1) {
              out = json{{"type", "ERROR"},
                         {"object", StatusObject(410, "Expired",
                                                 absl::StrCat("too old resource version: ", *cursor,
                                                              " (", history_.front().rv - 1, ")"))}}
                        .dump() +
                    "\n";
              done = true;
            } else {
              changed_.wait_until(l, deadline, [&] { return stopping_ || rv_ > *cursor; });
              if (stopping_ || std::chrono::steady_clock::now() >= deadline) done = true;
              // Replay history after the cursor; a change of selector match becomes ADDED or
              // DELETED as kube-apiserver does.
              std::map<std::string, const json*> prev;
              for (const Event& e : history_) {
                if (e.kind != kind) continue;
                std::string key =
                    Field(e.object, "metadata.namespace") + "/" + Field(e.object, "metadata.name");
                const json* before = prev.count(key) ? prev[key] : nullptr;
                prev[key] = e.type == "DELETED" ? nullptr : &e.object;
                if (e.rv <= *cursor) continue;
                bool was = before && in_scope(*before);
                bool is = in_scope(e.object);
                std::string type = e.type;
                if (e.type == "MODIFIED") {
                  if (!was && is)
                    type = "ADDED";
                  else if (was && !is)
                    type = "DELETED";
                  else if (!was && !is)
                    continue;
                } else if (!is) {
                  continue;
                }
                out += json{{"type", type}, {"object", e.object}}.dump() + "\n";
              }
              *cursor = rv_;
            }
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;
          if (done) sink.done();
          return true;
        });
  };

  auto get_pod = [this](const std::string& ns, const std::string& name, json** out,
                        httplib::Response& res) {
    auto it = pods_.find(ns + "/" + name);
    if (it == pods_.end()) {
      Fail(res, 404, "NotFound", absl::StrCat("pods \"", name, "\" not found"));
      return false;
    }
    *out = &it->second;
    return true;
  };

  // PATCH/PUT on one object under the lock. `obj` is replaced on success.
  ModifyFn modify = [this](json& obj, const std::string& kind, const httplib::Request& req,
                           httplib::Response& res, bool status_only) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) return Fail(res, 400, "BadRequest", "request body is not JSON");
    std::string ctype = req.get_header_value("Content-Type");
    json next = obj;
    try {
      if (req.method == "PUT") {
        next = body;
      } else if (absl::StartsWith(ctype, "application/json-patch+json")) {
        next = obj.patch(body);
      } else if (absl::StartsWith(ctype, "application/merge-patch+json") ||
                 absl::StartsWith(ctype, "application/strategic-merge-patch+json")) {
        next.merge_patch(body);
      } else {
        // kube-apiserver's router refuses it before the patch handler: only its generic words.
        return Fail(res, 415, "UnsupportedMediaType", "415: Unsupported Media Type");
      }
    } catch (const json::exception& e) {
      // kube-apiserver's generic 422 (the JSON patch library's reason is only in its details).
      return Fail(res, 422, "Invalid",
                  "the server rejected our request due to an error in our request");
    }
    std::string want = Field(next, "metadata.resourceVersion");
    if (!want.empty() && want != Field(obj, "metadata.resourceVersion")) {
      return Fail(res, 409, "Conflict",
                  absl::StrCat("Operation cannot be fulfilled on ", Qualified(kind), " \"",
                               Field(obj, "metadata.name"),
                               "\": the object has been modified; please apply your changes to "
                               "the latest version and try again"));
    }
    if (Field(next, "metadata.name") != Field(obj, "metadata.name")) {
      return Fail(res, 422, "Invalid", "metadata.name may not change");
    }
    // As kube-apiserver's strategies for resources with a status subresource: the main resource
    // keeps the stored status, /status keeps the stored spec (metadata such as labels may change
    // through either).
    if (status_only) {
      if (obj.contains("spec"))
        next["spec"] = obj["spec"];
      else
        next.erase("spec");
    } else if (kind == "pods" || kind == "nodes" || kind == "resourceclaims") {
      if (obj.contains("status"))
        next["status"] = obj["status"];
      else
        next.erase("status");
    }
    next["metadata"]["uid"] = obj["metadata"]["uid"];
    obj = Stamp(std::move(next), kind);
    Record("MODIFIED", kind, obj);
    Reply(res, 200, obj);
  };

  s.Get("/api/v1/pods",
        [list](const httplib::Request& q, httplib::Response& r) { list("pods", "", q, r); });
  s.Get(R"(/api/v1/namespaces/([^/]+)/pods)",
        [list](const httplib::Request& q, httplib::Response& r) {
          list("pods", q.matches[1], q, r);
        });
  s.Get("/api/v1/nodes",
        [list](const httplib::Request& q, httplib::Response& r) { list("nodes", "", q, r); });
  s.Post(R"(/api/v1/namespaces/([^/]+)/pods)", [this](const httplib::Request& q,
                                                      httplib::Response& r) {
    json pod = json::parse(q.body, nullptr, false);
    if (!pod.is_object() || Field(pod, "metadata.name").empty()) {
      return Fail(r, 422, "Invalid", "pod needs metadata.name");
    }
    // The one validation rule of kube-apiserver's that tests meet: a pod needs containers.
    const json* containers =
        pod.contains("spec") && pod["spec"].is_object() && pod["spec"].contains("containers")
            ? &pod["spec"]["containers"]
            : nullptr;
    if (!containers || !containers->is_array() || containers->empty()) {
      return Fail(r, 422, "Invalid",
                  absl::StrCat("Pod \"", Field(pod, "metadata.name"),
                               "\" is invalid: spec.containers: Required value"));
    }
    pod["metadata"]["namespace"] = std::string(q.matches[1]);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (pods_.count(std::string(q.matches[1]) + "/" + Field(pod, "metadata.name"))) {
        return Fail(r, 409, "AlreadyExists",
                    absl::StrCat("pods \"", Field(pod, "metadata.name"), "\" already exists"));
      }
    }
    Reply(r, 201, CreatePod(pod));
  });
  s.Post("/api/v1/nodes", [this](const httplib::Request& q, httplib::Response& r) {
    json node = json::parse(q.body, nullptr, false);
    if (!node.is_object() || Field(node, "metadata.name").empty()) {
      return Fail(r, 422, "Invalid", "node needs metadata.name");
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (nodes_.count(Field(node, "metadata.name"))) {
        return Fail(r, 409, "AlreadyExists",
                    absl::StrCat("nodes \"", Field(node, "metadata.name"), "\" already exists"));
      }
    }
    Reply(r, 201, CreateNode(node));
  });
  s.Get(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)(/status)?)",
        [this, get_pod](const httplib::Request& q, httplib::Response& r) {
          std::lock_guard<std::mutex> l(mu_);
          json* pod;
          if (get_pod(q.matches[1], q.matches[2], &pod, r)) Reply(r, 200, *pod);
        });
  auto pod_modify = [this, get_pod, modify](const httplib::Request& q, httplib::Response& r) {
    std::lock_guard<std::mutex> l(mu_);
    json* pod;
    if (get_pod(q.matches[1], q.matches[2], &pod, r)) {
      modify(*pod, "pods", q, r, q.matches[3].length() > 0);
    }
  };
  s.Patch(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)(/status)?)", pod_modify);
  s.Put(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)(/status)?)", pod_modify);
  // DELETE as kube-apiserver's pod strategy does it: a pod bound to a node and not finished
  // (phase neither Succeeded nor Failed) is only marked (deletionTimestamp,
  // deletionGracePeriodSeconds: ?gracePeriodSeconds=, else spec.terminationGracePeriodSeconds,
  // else 30) and stays until its kubelet has stopped it; the fake has no kubelet, so it stays until
  // DeletePod() or a DELETE with gracePeriodSeconds=0. Unbound or finished pods go at once.
  s.Delete(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))",
           [this](const httplib::Request& q, httplib::Response& r) {
             std::string ns = q.matches[1], name = q.matches[2];
             int64_t grace = -1;
             if (q.has_param("gracePeriodSeconds") &&
                 !absl::SimpleAtoi(q.get_param_value("gracePeriodSeconds"), &grace))
               return Fail(r, 400, "BadRequest", "invalid gracePeriodSeconds");
             {
               std::lock_guard<std::mutex> l(mu_);
               auto it = pods_.find(ns + "/" + name);
               if (it == pods_.end())
                 return Fail(r, 404, "NotFound", absl::StrCat("pods \"", name, "\" not found"));
               json& pod = it->second;
               std::string phase = Field(pod, "status.phase");
               bool graceful = !Field(pod, "spec.nodeName").empty() && phase != "Succeeded" &&
                               phase != "Failed" && grace != 0;
               if (graceful) {
                 if (grace < 0) {
                   const json& spec = pod["spec"];
                   grace = spec.contains("terminationGracePeriodSeconds") &&
                                   spec["terminationGracePeriodSeconds"].is_number_integer()
                               ? spec["terminationGracePeriodSeconds"].get<int64_t>()
                               : 30;
                 }
                 if (!pod["metadata"].contains("deletionTimestamp")) {
                   pod["metadata"]["deletionTimestamp"] = Now();
                   pod["metadata"]["deletionGracePeriodSeconds"] = grace;
                   pod = Stamp(pod, "pods");
                   Record("MODIFIED", "pods", pod);
                 }
                 return Reply(r, 200, pod);
               }
             }
             json pod;
             if (!GetPod(ns, name, &pod) || !DeletePod(ns, name))
               return Fail(r, 404, "NotFound", absl::StrCat("pods \"", name, "\" not found"));
             Reply(r, 200, pod);
           });
  // Binding, both the pods/<name>/binding subresource and the legacy namespaced bindings.
  auto bind = [this, get_pod](const std::string& ns, const std::string& name,
                              const httplib::Request& q, httplib::Response& r) {
    json b = json::parse(q.body, nullptr, false);
    if (!b.is_object() || Field(b, "target.name").empty()) {
      return Fail(r, 422, "Invalid", "binding needs target.name");
    }
    std::lock_guard<std::mutex> l(mu_);
    json* pod;
    if (!get_pod(ns, name, &pod, r)) return;
    std::string uid = Field(b, "metadata.uid");
    if (!uid.empty() && uid != Field(*pod, "metadata.uid")) {
      return Fail(r, 409, "Conflict",
                  absl::StrCat("Operation cannot be fulfilled on pods \"", name,
                               "\": StorageError: invalid object, Code: 4, Key: /registry/pods/",
                               ns, "/", name,
                               ", ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID "
                               "in precondition: ",
                               uid, ", UID in object meta: ", Field(*pod, "metadata.uid")));
    }
    if (!Field(*pod, "spec.nodeName").empty()) {
      return Fail(
          r, 409, "Conflict",
          absl::StrCat("Operation cannot be fulfilled on pods/binding \"", name, "\": pod ", name,
                       " is already assigned to node \"", Field(*pod, "spec.nodeName"), "\""));
    }
    json next = *pod;
    next["spec"]["nodeName"] = Field(b, "target.name");
    // As kube-apiserver's binding storage does: the Binding's annotations land on the pod in
    // the same write as its node.
    if (auto md = b.find("metadata"); md != b.end() && md->is_object()) {
      if (auto a = md->find("annotations"); a != md->end() && a->is_object()) {
        for (const auto& [k, v] : a->items()) {
          if (v.is_string()) next["metadata"]["annotations"][k] = v;
        }
      }
    }
    next["status"]["conditions"] = json::array(
        {{{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", Now()}}});
    *pod = Stamp(std::move(next), "pods");
    Record("MODIFIED", "pods", *pod);
    Reply(r, 201, StatusObject(201, "", ""));
  };
  s.Post(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding)",
         [bind](const httplib::Request& q, httplib::Response& r) {
           bind(q.matches[1], q.matches[2], q, r);
         });
  s.Post(R"(/api/v1/namespaces/([^/]+)/bindings)",
         [bind](const httplib::Request& q, httplib::Response& r) {
           json b = json::parse(q.body, nullptr, false);
           bind(q.matches[1], b.is_object() ? Field(b, "metadata.name") : "", q, r);
         });
  s.Get(R"(/api/v1/nodes/([^/]+)(/status)?)",
        [this](const httplib::Request& q, httplib::Response& r) {
          json node;
          if (!GetNode(q.matches[1], &node)) {
            return Fail(r, 404, "NotFound",
                        absl::StrCat("nodes \"", std::string(q.matches[1]), "\" not found"));
          }
          Reply(r, 200, node);
        });
  auto node_modify = [this, modify](const httplib::Request& q, httplib::Response& r) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = nodes_.find(q.matches[1]);
    if (it == nodes_.end()) {
      return Fail(r, 404, "NotFound",
                  absl::StrCat("nodes \"", std::string(q.matches[1]), "\" not found"));
    }
    modify(it->second, "nodes", q, r, q.matches[2].length() > 0);
  };
  s.Patch(R"(/api/v1/nodes/([^/]+)(/status)?)", node_modify);
  s.Put(R"(/api/v1/nodes/([^/]+)(/status)?)", node_modify);
  // Events: created as given (core/v1 Event), listed in creation order.
  s.Post(R"(/api/v1/namespaces/([^/]+)/events)", [this](const httplib::Request& q,
                                                        httplib::Response& r) {
    json ev = json::parse(q.body, nullptr, false);
    if (!ev.is_object() || !ev["metadata"].is_object()) {
      return Fail(r, 400, "BadRequest", "event body is not a JSON object with metadata");
    }
    std::string ns = q.matches[1];
    if (std::string body_ns = Field(ev, "metadata.namespace"); !body_ns.empty() && body_ns != ns) {
      return Fail(r, 400, "BadRequest",
                  "the namespace of the provided object does not match the namespace sent on the "
                  "request");
    }
    if (Field(ev, "involvedObject.name").empty()) {
      return Fail(r, 422, "Invalid", "Event is invalid: involvedObject.name: Required value");
    }
    std::lock_guard<std::mutex> l(mu_);
    if (Field(ev, "metadata.name").empty()) {
      std::string prefix = Field(ev, "metadata.generateName");
      if (prefix.empty()) {
        return Fail(r, 422, "Invalid",
                    "Event is invalid: metadata.name: Required value: name or generateName is "
                    "required");
      }
      ev["metadata"]["name"] = absl::StrCat(prefix, absl::Hex(rv_ + 1, absl::kZeroPad5));
    }
    ev["metadata"]["namespace"] = ns;
    std::string key = ns + "/" + Field(ev, "metadata.name");
    if (events_.count(key)) {
      return Fail(r, 409, "AlreadyExists",
                  absl::StrCat("events \"", Field(ev, "metadata.name"), "\" already exists"));
    }
    ev = Stamp(std::move(ev), "events");
    events_[key] = ev;
    event_order_.push_back(key);
    Record("ADDED", "events", ev);
    Reply(r, 201, ev);
  });
  s.Get("/api/v1/events",
        [list](const httplib::Request& q, httplib::Response& r) { list("events", "", q, r); });
  s.Get(R"(/api/v1/namespaces/([^/]+)/events)",
        [list](const httplib::Request& q, httplib::Response& r) {
          list("events", q.matches[1], q, r);
        });
  s.Get(R"(/api/v1/namespaces/([^/]+)/events/([^/]+))",
        [this](const httplib::Request& q, httplib::Response& r) {
          std::lock_guard<std::mutex> l(mu_);
          auto it = events_.find(std::string(q.matches[1]) + "/" + std::string(q.matches[2]));
          if (it == events_.end()) {
            return Fail(r, 404, "NotFound",
                        absl::StrCat("events \"", std::string(q.matches[2]), "\" not found"));
          }
          Reply(r, 200, it->second);
        });
  ResourceRoutes(modify, list);
  s.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
    if (r.body.empty()) {
      Fail(r, r.status, r.status == 404 ? "NotFound" : "BadRequest",
           absl::StrCat("the server could not find the requested resource (", q.method, " ", q.path,
                        ")"));
    }
  });
}

json FakeApiServer::CreateObject(const std::string& kind, json obj) {
  std::lock_guard<std::mutex> l(mu_);
  if (kind == "resourceclaims" && !obj["metadata"].contains("namespace"))
    obj["metadata"]["namespace"] = "default";
  obj = Stamp(std::move(obj), kind);
  objects_[kind][Field(obj, "metadata.namespace") + "/" + Field(obj, "metadata.name")] = obj;
  Record("ADDED", kind, obj);
  return obj;
}

bool FakeApiServer::GetObject(const std::string& kind, const std::string& ns,
                              const std::string& name, json* out) const {
  std::lock_guard<std::mutex> l(mu_);
  auto k = objects_.find(kind);
  if (k == objects_.end()) return false;
  auto it = k->second.find(ns + "/" + name);
  if (it == k->second.end()) return false;
  *out = it->second;
  return true;
}

std::vector<json> FakeApiServer::Objects(const std::string& kind) const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<json> out;
  if (auto k = objects_.find(kind); k != objects_.end())
    for (const auto& [key, o] : k->second) out.push_back(o);
  return out;
}

bool FakeApiServer::UpdateObject(const std::string& kind, json obj) {
  std::lock_guard<std::mutex> l(mu_);
  std::string key = Field(obj, "metadata.namespace") + "/" + Field(obj, "metadata.name");
  auto& m = objects_[kind];
  auto it = m.find(key);
  if (it == m.end()) return false;
  obj["metadata"]["uid"] = it->second["metadata"]["uid"];
  it->second = Stamp(std::move(obj), kind);
  Record("MODIFIED", kind, it->second);
  return true;
}

std::map<std::string, json>& FakeApiServer::Store(const std::string& kind) {
  return kind == "pods"     ? pods_
         : kind == "nodes"  ? nodes_
         : kind == "events" ? events_
                            : objects_[kind];
}

// resource.k8s.io/v1: resourceslices (cluster-scoped) and resourceclaims (namespaced, with
// /status): list (no watch), get, create, PUT, PATCH, DELETE, as kube-apiserver answers them.
// apps/v1 daemonsets (namespaced): the same, and watch (`watch` serves it as for pods).
// coordination.k8s.io/v1 leases (namespaced): the same, without watch (leader election).
void FakeApiServer::ResourceRoutes(const ModifyFn& modify, const ListFn& watch) {
  httplib::Server& s = *server_;
  struct Kind {
    std::string plural, singular;
    bool namespaced;
    std::string base, api_version;
  };
  for (const Kind& k :
       {Kind{"resourceslices", "ResourceSlice", false, "/apis/resource.k8s.io/v1",
             "resource.k8s.io/v1"},
        Kind{"resourceclaims", "ResourceClaim", true, "/apis/resource.k8s.io/v1",
             "resource.k8s.io/v1"},
        Kind{"daemonsets", "DaemonSet", true, "/apis/apps/v1", "apps/v1"},
        Kind{"leases", "Lease", true, "/apis/coordination.k8s.io/v1", "coordination.k8s.io/v1"}}) {
    const std::string& base = k.base;
    std::string coll =
        k.namespaced ? base + "/namespaces/([^/]+)/" + k.plural : base + "/" + k.plural;
    auto ns_of = [k](const httplib::Request& q) {
      return k.namespaced ? std::string(q.matches[1]) : std::string();
    };
    auto list = [this, k, ns_of, watch](const httplib::Request& q, httplib::Response& r) {
      std::vector<Term> fields, labels;
      std::string err;
      if (!ParseSelector(q.get_param_value("fieldSelector"), k.plural, &fields, &err) ||
          !ParseSelector(q.get_param_value("labelSelector"), "", &labels, &err))
        return Fail(r, 400, "BadRequest", err);
      std::string ns = q.matches.size() > 1 && k.namespaced ? ns_of(q) : "";
      if (q.get_param_value("watch") == "true" || q.get_param_value("watch") == "1") {
        if (k.plural != "daemonsets")
          return Fail(r, 405, "MethodNotAllowed", "the fake API server does not watch " + k.plural);
        return watch(k.plural, ns, q, r);
      }
      std::lock_guard<std::mutex> l(mu_);
      json items = json::array();
      for (const auto& [key, o] : objects_[k.plural])
        if ((ns.empty() || Field(o, "metadata.namespace") == ns) && Matches(o, fields, labels))
          items.push_back(o);
      Reply(r, 200,
            {{"kind", k.singular + "List"},
             {"apiVersion", k.api_version},
             {"metadata", {{"resourceVersion", std::to_string(rv_)}}},
             {"items", items}});
    };
    s.Get(coll, list);
    if (k.namespaced) s.Get(base + "/" + k.plural, list);
    s.Post(coll, [this, k, ns_of](const httplib::Request& q, httplib::Response& r) {
      json obj = json::parse(q.body, nullptr, false);
      if (!obj.is_object() || Field(obj, "metadata.name").empty())
        return Fail(r, 422, "Invalid", k.singular + " needs metadata.name");
      if (k.namespaced) obj["metadata"]["namespace"] = ns_of(q);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (objects_[k.plural].count(ns_of(q) + "/" + Field(obj, "metadata.name")))
          return Fail(r, 409, "AlreadyExists",
                      absl::StrCat(k.plural, ".", k.api_version.substr(0, k.api_version.find('/')),
                                   " \"", Field(obj, "metadata.name"), "\" already exists"));
      }
      Reply(r, 201, CreateObject(k.plural, obj));
    });
    std::string one = coll + "/([^/]+)";
    auto not_found = [k](httplib::Response& r, const std::string& name) {
      Fail(r, 404, "NotFound",
           absl::StrCat(k.plural, ".", k.api_version.substr(0, k.api_version.find('/')), " \"",
                        name, "\" not found"));
    };
    s.Get(one + "(/status)?",
          [this, k, not_found](const httplib::Request& q, httplib::Response& r) {
            std::string ns = k.namespaced ? std::string(q.matches[1]) : "";
            std::string name = q.matches[k.namespaced ? 2 : 1];
            json obj;
            if (!GetObject(k.plural, ns, name, &obj)) return not_found(r, name);
            Reply(r, 200, obj);
          });
    auto change = [this, k, not_found, modify](const httplib::Request& q, httplib::Response& r) {
      std::string ns = k.namespaced ? std::string(q.matches[1]) : "";
      std::string name = q.matches[k.namespaced ? 2 : 1];
      bool status = q.matches[k.namespaced ? 3 : 2].length() > 0;
      std::lock_guard<std::mutex> l(mu_);
      auto it = objects_[k.plural].find(ns + "/" + name);
      if (it == objects_[k.plural].end()) return not_found(r, name);
      modify(it->second, k.plural, q, r, status);
    };
    s.Put(one + "(/status)?", change);
    s.Patch(one + "(/status)?", change);
    s.Delete(one, [this, k, not_found](const httplib::Request& q, httplib::Response& r) {
      std::string ns = k.namespaced ? std::string(q.matches[1]) : "";
      std::string name = q.matches[k.namespaced ? 2 : 1];
      std::lock_guard<std::mutex> l(mu_);
      auto it = objects_[k.plural].find(ns + "/" + name);
      if (it == objects_[k.plural].end()) return not_found(r, name);
      json obj = it->second;
      objects_[k.plural].erase(it);
      obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
      Record("DELETED", k.plural, obj);
      Reply(r, 200, obj);
    });
  }
}

}  // namespace gpulet::testing
