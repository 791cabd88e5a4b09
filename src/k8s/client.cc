#include "k8s/client.h"

#include <malloc.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "common/status.h"
#include "http/tls.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace gpulet::k8s {

// Parsed client certificate, owned here for the life of the Client (httplib's SSLClient only
// borrows them).
struct Client::Tls {
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  ~Tls() {
    if (cert) X509_free(cert);
    if (key) EVP_PKEY_free(key);
  }
};

namespace {

absl::StatusOr<Endpoint> ParseServer(const std::string& server) {
  Endpoint e;
  std::string rest = server;
  if (absl::StartsWith(rest, "https://")) {
    rest = rest.substr(8);
  } else if (absl::StartsWith(rest, "http://")) {
    rest = rest.substr(7);
    e.https = false;
    e.port = 80;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("API server \"", server, "\" must start with https:// or http://"));
  }
  if (auto slash = rest.find('/'); slash != std::string::npos) rest.resize(slash);
  std::string port;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    size_t close = rest.find(']');
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("API server \"", server, "\": bad host"));
    }
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
    rest = rest.substr(1, close - 1);
  } else if (size_t colon = rest.rfind(':'); colon != std::string::npos) {
    port = rest.substr(colon + 1);
    rest.resize(colon);
  }
  if (!port.empty() && (!absl::SimpleAtoi(port, &e.port) || e.port <= 0 || e.port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("API server \"", server, "\": bad port"));
  }
  if (rest.empty())
    return absl::InvalidArgumentError(absl::StrCat("API server \"", server, "\": no host"));
  e.host = rest;
  return e;
}

X509_STORE* StoreFromPem(const std::string& pem) {
  X509_STORE* store = X509_STORE_new();
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, cert);
    X509_free(cert);
  }
  BIO_free(bio);
  return store;
}

absl::Status StatusFromHttp(int code, const std::string& body, const std::string& what) {
  std::string message = body.substr(0, 300);
  std::string reason;
  if (auto j = json::parse(body, nullptr, false); j.is_object()) {
    message = j.value("message", message);
    reason = j.value("reason", "");
  }
  std::string text =
      absl::StrCat(what, ": HTTP ", code, reason.empty() ? "" : " ", reason, ": ", message);
  switch (code) {
    case 400:
    case 422:
      return absl::InvalidArgumentError(text);
    case 401:
      return absl::UnauthenticatedError(text);
    case 403:
      return absl::PermissionDeniedError(text);
    case 404:
      return absl::NotFoundError(text);
    case 409:
      return reason == "AlreadyExists" ? absl::AlreadyExistsError(text) : absl::AbortedError(text);
    case 410:
      return absl::FailedPreconditionError(text);
    case 429:
      return absl::ResourceExhaustedError(text);
    default:
      if (code >= 500) return absl::UnavailableError(text);
      return absl::UnknownError(text);
  }
}

const char* ContentType(PatchType t) {
  switch (t) {
    case PatchType::kMerge:
      return "application/merge-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
    case PatchType::kJson:
      return "application/json-patch+json";
  }
  return "application/merge-patch+json";
}

// Percent-encodes everything but RFC 3986's unreserved characters: used for query values and
// for every name put into an API path, so that no name ("../", "x?y", "a/b") changes the path.
std::string Encode(const std::string& in) {
  std::string out;
  for (unsigned char c : in) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

std::unique_ptr<httplib::ClientImpl> MakeHttp(const Config& c, const Endpoint& e, X509* cert,
                                              EVP_PKEY* key) {
  std::unique_ptr<httplib::ClientImpl> cli;
  if (e.https) {
    auto ssl = cert && key ? std::make_unique<httplib::SSLClient>(e.host, e.port, cert, key)
                           : std::make_unique<httplib::SSLClient>(e.host, e.port);
    if (!c.ca_pem.empty()) ssl->set_ca_cert_store(StoreFromPem(c.ca_pem));
    ssl->enable_server_certificate_verification(!c.insecure_skip_verify);
    cli = std::move(ssl);
  } else {
    cli = std::make_unique<httplib::ClientImpl>(e.host, e.port);
  }
  cli->set_connection_timeout(c.timeout);
  cli->set_read_timeout(c.timeout);
  cli->set_write_timeout(c.timeout);
  if (!c.token.empty()) cli->set_bearer_token_auth(c.token);
  return cli;
}

}  // namespace

std::string QueryString(const ListOptions& opts, bool watch) {
  std::vector<std::string> parts;
  if (!opts.label_selector.empty()) parts.push_back("labelSelector=" + Encode(opts.label_selector));
  if (!opts.field_selector.empty()) parts.push_back("fieldSelector=" + Encode(opts.field_selector));
  if (!opts.resource_version.empty()) {
    parts.push_back("resourceVersion=" + Encode(opts.resource_version));
  }
  if (!watch && opts.limit > 0) parts.push_back(absl::StrCat("limit=", opts.limit));
  if (!watch && !opts.continue_token.empty())
    parts.push_back("continue=" + Encode(opts.continue_token));
  if (watch) {
    parts.push_back("watch=true");
    parts.push_back("allowWatchBookmarks=true");
    if (opts.timeout_seconds > 0)
      parts.push_back(absl::StrCat("timeoutSeconds=", opts.timeout_seconds));
  }
  if (parts.empty()) return "";
  std::string q = "?";
  for (size_t i = 0; i < parts.size(); ++i) absl::StrAppend(&q, i ? "&" : "", parts[i]);
  return q;
}

Client::Client(Config config, Clock* clock)
    : config_(std::move(config)), clock_(clock), tls_(std::make_unique<Tls>()) {
  if (auto ep = ParseServer(config_.server); ep.ok()) {
    endpoint_ = std::move(*ep);
  } else {
    endpoint_status_ = ep.status();
  }
  if (!config_.client_cert_pem.empty() && !config_.client_key_pem.empty()) {
    BIO* b = BIO_new_mem_buf(config_.client_cert_pem.data(), -1);
    tls_->cert = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
    BIO_free(b);
    b = BIO_new_mem_buf(config_.client_key_pem.data(), -1);
    tls_->key = PEM_read_bio_PrivateKey(b, nullptr, &http::NoPassphrase, nullptr);
    BIO_free(b);
    if (!tls_->cert || !tls_->key) spdlog::warn("kubeconfig client certificate/key unreadable");
  }
}

Client::~Client() { Cancel(); }

std::unique_ptr<httplib::ClientImpl> Client::Connection(bool* reused) {
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    if (!idle_.empty()) {
      auto cli = std::move(idle_.back());
      idle_.pop_back();
      *reused = true;
      return cli;
    }
  }
  *reused = false;
  auto cli = MakeHttp(config_, endpoint_, tls_->cert, tls_->key);
  cli->set_keep_alive(true);
  return cli;
}

void Client::Release(std::unique_ptr<httplib::ClientImpl> cli) {
  std::lock_guard<std::mutex> l(pool_mu_);
  if (idle_.size() < static_cast<size_t>(std::max(0, config_.max_idle_connections))) {
    idle_.push_back(std::move(cli));
  }
}

absl::StatusOr<json> Client::Call(const std::string& method, const std::string& path,
                                  const json* body, const std::string& content_type) {
  RETURN_IF_ERROR(endpoint_status_);
  if (method != "GET" && method != "POST" && method != "PATCH" && method != "PUT" &&
      method != "DELETE") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported method ", method));
  }
  std::string payload = body ? body->dump() : "";
  std::string what = absl::StrCat(method, " ", path);
  auto backoff = config_.initial_backoff;
  absl::Status last;
  bool stale_retried = false;
  for (int attempt = 1;; ++attempt) {
    bool reused = false;
    auto cli = Connection(&reused);
    httplib::Result r{nullptr, httplib::Error::Unknown};
    if (method == "GET") {
      r = cli->Get(path);
    } else if (method == "POST") {
      r = cli->Post(path, payload, content_type);
    } else if (method == "PATCH") {
      r = cli->Patch(path, payload, content_type);
    } else if (method == "PUT") {
      r = cli->Put(path, payload, content_type);
    } else {
      r = cli->Delete(path);
    }
    if (!r) {
      // A kept-alive connection that the server closed while it sat idle says nothing about the
      // server: the call is retried at once on a new connection, once per call, outside the
      // attempt count (any other transport error is retried with backoff, as before).
      if (reused && !stale_retried) {
        stale_retried = true;
        --attempt;
        continue;
      }
      last = absl::UnavailableError(absl::StrCat(what, ": cannot reach API server ", config_.server,
                                                 ": ", httplib::to_string(r.error())));
      if (attempt >= config_.max_attempts || cancelled_) return last;
      clock_->SleepFor(std::min(backoff, config_.max_backoff));
      backoff = std::min(backoff * 2, config_.max_backoff);
      continue;
    }
    int status = r->status;
    std::string response_body = std::move(r->body);
    std::string retry_after = r->get_header_value("Retry-After");
    Release(std::move(cli));
    if (status >= 200 && status < 300) {
      if (response_body.empty()) return json::object();
      json j = json::parse(response_body, nullptr, false);
      if (j.is_discarded()) {
        return absl::DataLossError(absl::StrCat(what, ": API server sent invalid JSON"));
      }
      return j;
    }
    last = StatusFromHttp(status, response_body, what);
    bool retry = status == 429 || status >= 500 || absl::IsAborted(last);
    std::chrono::milliseconds wait = backoff;
    int secs = 0;
    if (status == 429 && absl::SimpleAtoi(retry_after, &secs)) {
      wait = std::max(wait, std::chrono::milliseconds(secs * 1000));
    }
    if (!retry || attempt >= config_.max_attempts || cancelled_) return last;
    clock_->SleepFor(std::min(wait, config_.max_backoff));
    backoff = std::min(backoff * 2, config_.max_backoff);
  }
}

absl::StatusOr<json> Client::GetPod(const std::string& ns, const std::string& name) {
  return Call("GET", absl::StrCat("/api/v1/namespaces/", Encode(ns), "/pods/", Encode(name)));
}

absl::StatusOr<json> Client::ListPods(const std::string& ns, const ListOptions& opts) {
  std::string base =
      ns.empty() ? "/api/v1/pods" : absl::StrCat("/api/v1/namespaces/", Encode(ns), "/pods");
  return Call("GET", base + QueryString(opts, false));
}

absl::StatusOr<json> Client::PatchPod(const std::string& ns, const std::string& name,
                                      PatchType type, const json& patch) {
  return Call("PATCH", absl::StrCat("/api/v1/namespaces/", Encode(ns), "/pods/", Encode(name)),
              &patch, ContentType(type));
}

absl::Status Client::CreateBinding(const std::string& ns, const std::string& name,
                                   const std::string& uid, const std::string& node,
                                   const json& annotations) {
  json b = {{"apiVersion", "v1"},
            {"kind", "Binding"},
            {"metadata", {{"name", name}, {"namespace", ns}}},
            {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!uid.empty()) b["metadata"]["uid"] = uid;
  if (annotations.is_object() && !annotations.empty()) b["metadata"]["annotations"] = annotations;
  return Call("POST",
              absl::StrCat("/api/v1/namespaces/", Encode(ns), "/pods/", Encode(name), "/binding"),
              &b)
      .status();
}

absl::StatusOr<json> Client::GetNode(const std::string& name) {
  return Call("GET", "/api/v1/nodes/" + Encode(name));
}

absl::StatusOr<json> Client::ListNodes(const ListOptions& opts) {
  return Call("GET", "/api/v1/nodes" + QueryString(opts, false));
}

absl::StatusOr<json> Client::PatchNode(const std::string& name, PatchType type, const json& patch) {
  return Call("PATCH", "/api/v1/nodes/" + Encode(name), &patch, ContentType(type));
}

absl::StatusOr<json> Client::PatchNodeStatus(const std::string& name, PatchType type,
                                             const json& patch) {
  return Call("PATCH", "/api/v1/nodes/" + Encode(name) + "/status", &patch, ContentType(type));
}

absl::StatusOr<json> Client::CreateEvent(const std::string& ns, const json& event) {
  return Call("POST", absl::StrCat("/api/v1/namespaces/", Encode(ns), "/events"), &event);
}

json MakeEvent(const json& involved, const std::string& type, const std::string& reason,
               const std::string& message, const std::string& component, const std::string& host,
               Clock* clock) {
  const json md = involved.value("metadata", json::object());
  std::string kind = involved.value("kind", "");
  std::string name = md.value("name", "");
  std::string ns = md.value("namespace", "");
  std::string ts = absl::FormatTime(
      "%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(clock->UnixSeconds()), absl::UTCTimeZone());
  // The suffix only has to be unique per involved object: real nanoseconds since the epoch in hex
  // (not the injected clock, which tests may freeze) plus a per-process counter.
  static std::atomic<uint32_t> seq{0};
  std::string suffix =
      absl::StrCat(absl::Hex(absl::ToUnixNanos(absl::Now())), absl::Hex(seq++ & 0xfff));
  json ref = {{"kind", kind}, {"name", name}, {"apiVersion", involved.value("apiVersion", "v1")}};
  if (!ns.empty()) ref["namespace"] = ns;
  if (md.contains("uid")) ref["uid"] = md["uid"];
  json source = {{"component", component}};
  if (!host.empty()) source["host"] = host;
  return {{"apiVersion", "v1"},
          {"kind", "Event"},
          {"metadata",
           {{"name", absl::StrCat(name, ".", suffix)}, {"namespace", ns.empty() ? "default" : ns}}},
          {"involvedObject", ref},
          {"type", type},
          {"reason", reason},
          {"message", message},
          {"source", source},
          {"reportingComponent", component},
          {"reportingInstance", host},
          {"firstTimestamp", ts},
          {"lastTimestamp", ts},
          {"count", 1}};
}

absl::Status Client::Watch(const std::string& collection_path, const ListOptions& opts,
                           const std::function<bool(const WatchEvent&)>& handler) {
  RETURN_IF_ERROR(endpoint_status_);
  if (cancelled_) return absl::CancelledError("watch cancelled");
  auto cli = MakeHttp(config_, endpoint_, tls_->cert, tls_->key);
  // A watch is quiet for long stretches; the server ends it after timeoutSeconds.
  cli->set_read_timeout(
      std::chrono::seconds(opts.timeout_seconds > 0 ? opts.timeout_seconds + 30 : 3600));
  {
    std::lock_guard<std::mutex> l(watches_mu_);
    watches_.push_back(cli.get());
  }
  int status = 0;
  std::string buf;
  absl::Status result;
  bool stopped_by_handler = false;
  auto r = cli->Get(
      collection_path + QueryString(opts, true), httplib::Headers{},
      [&](const httplib::Response& resp) {
        status = resp.status;
        return true;
      },
      [&](const char* data, size_t len) {
        buf.append(data, len);
        if (status != 200) return true;
        size_t nl;
        while ((nl = buf.find('\n')) != std::string::npos) {
          std::string line = buf.substr(0, nl);
          buf.erase(0, nl + 1);
          if (line.empty()) continue;
          json j = json::parse(line, nullptr, false);
          if (j.is_discarded() || !j.is_object()) {
            result = absl::DataLossError("watch: invalid event line");
            return false;
          }
          WatchEvent ev{j.value("type", ""), j.value("object", json::object())};
          if (ev.type == "ERROR") {
            result = StatusFromHttp(ev.object.value("code", 500), ev.object.dump(), "watch");
            return false;
          }
          if (!handler(ev)) {
            stopped_by_handler = true;
            return false;
          }
        }
        return !cancelled_.load();
      });
  {
    std::lock_guard<std::mutex> l(watches_mu_);
    std::erase(watches_, static_cast<void*>(cli.get()));
  }
  if (!result.ok()) return result;
  if (stopped_by_handler) return absl::OkStatus();
  if (cancelled_) return absl::CancelledError("watch cancelled");
  if (status != 0 && status != 200) {
    return StatusFromHttp(status, buf, absl::StrCat("watch ", collection_path));
  }
  if (!r) {
    return absl::UnavailableError(
        absl::StrCat("watch ", collection_path, ": ", httplib::to_string(r.error())));
  }
  return absl::OkStatus();
}

void Client::Cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> l(watches_mu_);
  for (void* w : watches_) static_cast<httplib::ClientImpl*>(w)->stop();
}

// ---- configuration ----

absl::StatusOr<Config> InClusterConfig(const std::string& sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host || !port || !*port) {
    return absl::FailedPreconditionError(
        "not in a cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set");
  }
  Config c;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  c.server = absl::StrCat("https://", h, ":", port);
  ASSIGN_OR_RETURN(std::string token, ReadFileToString(sa_dir + "/token"));
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  c.token = token;
  ASSIGN_OR_RETURN(c.ca_pem, ReadFileToString(sa_dir + "/ca.crt"));
  return c;
}

absl::StatusOr<Config> LoadKubeconfig(const std::string& path, const std::string& context) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read kubeconfig"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
  }
  auto find = [&](const char* list, const std::string& name) -> YAML::Node {
    if (root[list] && root[list].IsSequence()) {
      for (const auto& n : root[list]) {
        if (n["name"] && n["name"].as<std::string>("") == name) return n;
      }
    }
    return YAML::Node();
  };
  auto where = [&](const YAML::Node& n) { return absl::StrCat(path, ":", n.Mark().line + 1); };
  try {
    std::string ctx_name = context.empty() ? root["current-context"].as<std::string>("") : context;
    if (ctx_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no current-context"));
    }
    YAML::Node ctx = find("contexts", ctx_name);
    if (!ctx || !ctx["context"]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": context \"", ctx_name, "\" not found"));
    }
    std::string cluster_name = ctx["context"]["cluster"].as<std::string>("");
    std::string user_name = ctx["context"]["user"].as<std::string>("");
    YAML::Node cluster = find("clusters", cluster_name);
    if (!cluster || !cluster["cluster"]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(ctx), ": cluster \"", cluster_name, "\" not found"));
    }
    Config c;
    const YAML::Node cl = cluster["cluster"];
    c.server = cl["server"].as<std::string>("");
    if (c.server.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where(cluster), ": cluster has no server"));
    }
    c.insecure_skip_verify = cl["insecure-skip-tls-verify"].as<bool>(false);
    auto data_or_file = [&](const YAML::Node& n, const char* data_key, const char* file_key,
                            std::string* out) -> absl::Status {
      if (n[data_key]) {
        if (!absl::Base64Unescape(n[data_key].as<std::string>(""), out)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(n[data_key]), ": ", data_key, " is not valid base64"));
        }
      } else if (n[file_key]) {
        auto s = ReadFileToString(n[file_key].as<std::string>(""));
        if (!s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(n[file_key]), ": ", file_key, ": ", s.status().message()));
        }
        *out = *s;
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(
        data_or_file(cl, "certificate-authority-data", "certificate-authority", &c.ca_pem));
    if (YAML::Node user = find("users", user_name); user && user["user"]) {
      const YAML::Node u = user["user"];
      c.token = u["token"].as<std::string>("");
      if (c.token.empty() && u["tokenFile"]) {
        ASSIGN_OR_RETURN(c.token, ReadFileToString(u["tokenFile"].as<std::string>("")));
        while (!c.token.empty() && isspace(static_cast<unsigned char>(c.token.back())))
          c.token.pop_back();
      }
      RETURN_IF_ERROR(
          data_or_file(u, "client-certificate-data", "client-certificate", &c.client_cert_pem));
      RETURN_IF_ERROR(data_or_file(u, "client-key-data", "client-key", &c.client_key_pem));
    }
    return c;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": ", e.msg));
  }
}

absl::StatusOr<Config> ResolveConfig(const std::string& kubeconfig_flag) {
  if (!kubeconfig_flag.empty()) return LoadKubeconfig(kubeconfig_flag);
  if (const char* env = std::getenv("KUBECONFIG"); env && *env) {
    std::string first = env;
    if (auto colon = first.find(':'); colon != std::string::npos) first.resize(colon);
    return LoadKubeconfig(first);
  }
  auto in_cluster = InClusterConfig();
  if (in_cluster.ok()) return in_cluster;
  if (const char* home = std::getenv("HOME"); home && *home) {
    std::string p = absl::StrCat(home, "/.kube/config");
    if (PathExists(p)) return LoadKubeconfig(p);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no Kubernetes API configuration: give --kubeconfig, set KUBECONFIG, or run in a cluster (",
      in_cluster.status().message(), ")"));
}

// ---- Reflector ----

Reflector::Reflector(Client* client, std::string collection_path, ListOptions opts, SyncFn on_sync,
                     EventFn on_event, KeepFn keep)
    : client_(client),
      path_(std::move(collection_path)),
      opts_(std::move(opts)),
      on_sync_(std::move(on_sync)),
      on_event_(std::move(on_event)),
      keep_(std::move(keep)),
      watch_client_(std::make_unique<Client>(client->config())) {}

Reflector::~Reflector() { Stop(); }

void Reflector::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Reflector::Stop() {
  stop_ = true;
  watch_client_->Cancel();
  if (thread_.joinable()) thread_.join();
}

bool Reflector::WaitSynced(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!synced_) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

absl::StatusOr<Listed> ListPaged(Client& client, const std::string& path, const ListOptions& opts,
                                 const KeepFn& keep, const std::atomic<bool>* stop) {
  ListOptions page{opts.label_selector, opts.field_selector};
  page.limit = kListPage;
  Listed out;
  do {
    if (stop && *stop) return absl::CancelledError(absl::StrCat("list ", path, ": stopped"));
    ASSIGN_OR_RETURN(json list, client.Call("GET", path + QueryString(page, false)));
    if (auto it = list.find("items"); it != list.end() && it->is_array()) {
      for (json& object : *it) {
        bool kept = true;
        try {
          if (keep) kept = keep(object);
        } catch (const std::exception&) {  // an odd object: the caller's own checks say what
        }
        if (kept) out.items.push_back(std::move(object));
      }
    }
    auto text = [&list](const char* key) {
      auto meta = list.find("metadata");
      if (meta == list.end() || !meta->is_object()) return std::string();
      auto v = meta->find(key);
      return v != meta->end() && v->is_string() ? v->get<std::string>() : std::string();
    };
    out.resource_version = text("resourceVersion");
    page.continue_token = text("continue");
  } while (!page.continue_token.empty());
  return out;
}

void Reflector::Run() {
  // Grows while lists fail or watches fail before delivering anything (a watch the API server
  // refuses, say for RBAC, must not turn into a LIST and a WATCH every 50 ms from every node);
  // back to the minimum once a watch has made progress.
  static constexpr std::chrono::milliseconds kMinBackoff{50}, kMaxBackoff{30000};
  std::chrono::milliseconds backoff = kMinBackoff;
  auto grow = [&backoff] { backoff = std::min(backoff * 2, kMaxBackoff); };
  while (!stop_) {
    auto listed = ListPaged(*client_, path_, opts_, keep_, &stop_);
    if (stop_) break;
    if (!listed.ok()) {
      spdlog::warn("list {}: {}", path_, std::string(listed.status().message()));
      std::this_thread::sleep_for(backoff);
      grow();
      continue;
    }
    on_sync_(listed->items);
    listed->items = {};
    // The pages were parsed and dropped one by one; what malloc keeps of them is not needed
    // again until the next list (a cluster's worth of JSON must not stay as RSS).
    malloc_trim(0);
    synced_ = true;
    ListOptions w = opts_;
    w.resource_version = std::move(listed->resource_version);
    if (w.timeout_seconds == 0) w.timeout_seconds = 300;
    // Watch until the server ends the stream; then resume from the last seen version.
    bool progressed = false;  // an event arrived, or the server ended a stream in good order
    absl::Status ended;
    while (!stop_) {
      ended = watch_client_->Watch(path_, w, [&](const WatchEvent& ev) {
        progressed = true;
        if (auto rv = ev.object["metadata"].value("resourceVersion", ""); !rv.empty()) {
          w.resource_version = rv;
        }
        if (ev.type != "BOOKMARK") on_event_(ev);
        return !stop_.load();
      });
      if (!ended.ok()) {
        if (!stop_)
          spdlog::info("watch {} ended: {}; re-listing", path_, std::string(ended.message()));
        break;
      }
      progressed = true;
    }
    // 410 Gone (the version is too old) is answered by the re-list itself: no reason to wait.
    if (progressed || absl::IsFailedPrecondition(ended)) {
      backoff = kMinBackoff;
    } else {
      grow();
    }
    if (!stop_) std::this_thread::sleep_for(backoff);
  }
}

}  // namespace gpulet::k8s
