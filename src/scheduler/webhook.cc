#include "scheduler/webhook.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "http/guarded_server.h"
#include "httplib.h"
#include "scheduler/extender.h"
#include "spdlog/spdlog.h"

namespace gpulet::scheduler {
namespace {

const json& Member(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

std::string StringMember(const json& obj, const char* key) {
  const json& v = Member(obj, key);
  return v.is_string() ? v.get<std::string>() : "";
}

// The parts of an AdmissionReview request we need, checked.
absl::StatusOr<std::pair<std::string, const json*>> Request(const json& review) {
  if (!review.is_object() || StringMember(review, "kind") != "AdmissionReview") {
    return absl::InvalidArgumentError("body is not an AdmissionReview");
  }
  const json& req = Member(review, "request");
  if (!req.is_object() || !Member(req, "uid").is_string()) {
    return absl::InvalidArgumentError("AdmissionReview has no request.uid");
  }
  const json& obj = Member(req, "object");
  return std::make_pair(req["uid"].get<std::string>(), obj.is_object() ? &obj : nullptr);
}

json Response(const json& review, const std::string& uid) {
  std::string version = StringMember(review, "apiVersion");
  return {{"apiVersion", version.empty() ? "admission.k8s.io/v1" : version},
          {"kind", "AdmissionReview"},
          {"response", {{"uid", uid}, {"allowed", true}}}};
}

void Deny(json& out, const std::string& message) {
  out["response"]["allowed"] = false;
  out["response"]["status"] = {{"code", 422}, {"reason", "Invalid"}, {"message", message}};
}

// Pod annotations only gpulet's own components write (the extender at bind, the agent after
// Allocate): a pod created with them could pick its GPUs or its core ceiling.
std::string TrustedAnnotationIn(const json& annotations) {
  if (!annotations.is_object()) return "";
  for (const auto& [key, value] : annotations.items()) {
    if (key == vgpu::kAnnotationNode || key == vgpu::kAnnotationBindTime ||
        key == vgpu::kAnnotationAssigned || key == vgpu::kAnnotationCoreLimit ||
        key.starts_with(vgpu::kAnnotationGpusPrefix)) {
      return key;
    }
  }
  return "";
}

// Where `pod` asks to switch the vGPU limits off: the annotation, or on a fractional container an
// env variable of the interposer's contract (any value and any valueFrom: the webhook cannot see
// what it resolves to). The kubelet puts the pod's env after the device plugin's, so the pod's
// GPULET_VGPU_MEMORY_LIMIT, GPULET_VGPU_UUID, ... or LD_PRELOAD would replace what the agent set.
std::string DisableRequestIn(const json& pod, const vgpu::PodUnits& req) {
  const json& annotations = Member(Member(pod, "metadata"), "annotations");
  if (!Member(annotations, kAnnotationVgpuDisable).is_null()) {
    return absl::StrCat("annotation ", kAnnotationVgpuDisable);
  }
  const json& containers = Member(Member(pod, "spec"), "containers");
  for (const auto& c : req.containers) {
    if (!c.fractional() || !containers.is_array() ||
        c.index >= static_cast<int>(containers.size())) {
      continue;
    }
    const json& env = Member(containers[c.index], "env");
    if (!env.is_array()) continue;
    for (const json& e : env) {
      const std::string name = StringMember(e, "name");
      if (absl::StartsWith(name, vgpu::kVarPrefix) || name == vgpu::kVarPreload) {
        return absl::StrCat("env ", name, " of container \"", c.name, "\"");
      }
    }
  }
  return "";
}

}  // namespace

int64_t NodeMaxGpuUnits(const json& node, const vgpu::ResourceNames& names) {
  int64_t best = 0;
  const json& inv =
      Member(Member(Member(node, "metadata"), "annotations"), vgpu::kAnnotationNodeGpus);
  if (inv.is_string()) {
    auto gpus = vgpu::DecodeNodePool(inv.get_ref<const std::string&>());
    if (gpus.ok()) {
      for (const vgpu::PoolGpu& g : *gpus) best = std::max(best, g.memory_units);
      if (best > 0) return best;
    }
  }
  const json& st = Member(node, "status");
  const json* alloc = &Member(st, "allocatable");
  if (!alloc->is_object()) alloc = &Member(st, "capacity");
  if (!alloc->is_object()) return 0;
  int64_t gpus = std::clamp<int64_t>(vgpu::QuantityIn(*alloc, names.core) / vgpu::kCoresPerGpu, 0,
                                     kMaxNodeGpus);
  if (gpus == 0) return 0;
  return std::clamp<int64_t>(vgpu::QuantityIn(*alloc, names.memory) / gpus, 0,
                             vgpu::kMaxMemoryUnitsPerGpu);
}

AdmissionWebhook::AdmissionWebhook(WebhookOptions options, k8s::Client* api)
    : options_(std::move(options)), api_(api) {}

bool AdmissionWebhook::NamespaceAllowsDisable(const std::string& ns) {
  if (!api_ || !IsDns1123Label(ns)) return false;
  auto obj = api_->Call("GET", "/api/v1/namespaces/" + ns);
  if (!obj.ok()) {
    spdlog::warn("webhook: cannot read namespace {} for {}: {}", ns, kLabelAllowVgpuDisable,
                 std::string(obj.status().message()));
    return false;
  }
  return StringMember(Member(Member(*obj, "metadata"), "labels"), kLabelAllowVgpuDisable) == "true";
}

int64_t AdmissionWebhook::MaxMemoryUnits() {
  if (options_.max_memory_units > 0 || !api_) return options_.max_memory_units;
  absl::MutexLock l(&mu_);
  const Clock::TimePoint now = options_.clock->Now();
  if (cached_units_ > 0 && now - cached_at_ < std::chrono::seconds(30)) return cached_units_;
  auto nodes = api_->ListNodes();
  if (!nodes.ok()) {
    spdlog::warn("webhook: cannot list nodes for the GPU memory bound: {}",
                 std::string(nodes.status().message()));
    return cached_units_;
  }
  int64_t best = 0;
  for (const auto& n : (*nodes)["items"]) best = std::max(best, NodeMaxGpuUnits(n, options_.names));
  cached_units_ = best;
  cached_at_ = now;
  return best;
}

absl::StatusOr<json> AdmissionWebhook::Validate(const json& review) {
  ASSIGN_OR_RETURN(auto req, Request(review));
  json out = Response(review, req.first);
  if (!req.second) return out;  // e.g. DELETE: nothing to judge
  const json& pod_json = *req.second;
  const json& md = Member(pod_json, "metadata");
  std::string who = StringMember(md, "name");
  if (who.empty()) who = StringMember(md, "generateName");
  const std::string prefix = absl::StrCat("gpulet vGPU: pod \"", who, "\": ");
  const json& request = Member(review, "request");
  if (StringMember(request, "operation") == "CREATE") {
    if (std::string key = TrustedAnnotationIn(Member(md, "annotations")); !key.empty()) {
      Deny(out, absl::StrCat(prefix, "annotation ", key,
                             " is written by gpulet (scheduler extender or node agent) and may "
                             "not be set by the pod's author; remove it"));
      return out;
    }
  }
  auto pod = vgpu::ParsePod(pod_json, options_.names, MaxMemoryUnits());
  if (!pod.ok()) {
    Deny(out, absl::StrCat(prefix, pod.status().message()));
    return out;
  }
  if (std::any_of(pod->containers.begin(), pod->containers.end(),
                  [](const vgpu::ContainerUnits& c) { return c.fractional(); })) {
    if (std::string where = DisableRequestIn(pod_json, *pod); !where.empty()) {
      std::string ns = StringMember(request, "namespace");
      if (ns.empty()) ns = StringMember(md, "namespace");
      if (!NamespaceAllowsDisable(ns)) {
        Deny(out, absl::StrCat(prefix, where,
                               " would switch off the vGPU limits of a pod that shares a GPU; "
                               "only namespaces an administrator labels ",
                               kLabelAllowVgpuDisable, "=true may do that"));
      }
    }
  }
  return out;
}

absl::StatusOr<json> AdmissionWebhook::Mutate(const json& review) {
  ASSIGN_OR_RETURN(auto req, Request(review));
  json out = Response(review, req.first);
  if (!req.second || options_.scheduler_name.empty()) return out;
  auto pod = vgpu::ParsePod(*req.second, options_.names, 0);
  if (!pod.ok() || pod->empty()) return out;  // invalid pods are the validator's to deny
  json patch = json::array(
      {{{"op", "add"}, {"path", "/spec/schedulerName"}, {"value", options_.scheduler_name}}});
  out["response"]["patchType"] = "JSONPatch";
  out["response"]["patch"] = absl::Base64Escape(patch.dump());
  return out;
}

void AdmissionWebhook::Register(httplib::Server& server) {
  // Headers and body go out in separate writes: without TCP_NODELAY the body waits for the API
  // server's delayed ACK (~40 ms on every pod creation).
  server.set_tcp_nodelay(true);
  auto route = [&server](const std::string& path,
                         std::function<absl::StatusOr<json>(const json&)> fn) {
    server.Post(path, [fn](const httplib::Request& req, httplib::Response& res) {
      // Every failure is an HTTP error, which the API server treats per failurePolicy (Fail in
      // deploy/: the pod is refused), never an accidental "allowed".
      auto review = http::ParseUntrustedJson(req.body);
      if (!review.ok()) {
        res.status = absl::IsResourceExhausted(review.status()) ? 503 : 400;
        res.set_content(absl::StrCat("request body: ", review.status().message()), "text/plain");
        return;
      }
      try {
        auto out = fn(review->value);
        if (!out.ok()) {
          res.status = 400;
          res.set_content(std::string(out.status().message()), "text/plain");
          return;
        }
        res.set_content(out->dump(), "application/json");
      } catch (const std::exception& e) {
        spdlog::error("webhook {}: {}", req.path, e.what());
        res.status = 500;
        res.set_content("internal error", "text/plain");
      }
    });
  };
  route("/validate", [this](const json& r) { return Validate(r); });
  route("/mutate", [this](const json& r) { return Mutate(r); });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
}

}  // namespace gpulet::scheduler
