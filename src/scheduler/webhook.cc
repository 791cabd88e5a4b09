#include "scheduler/webhook.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace gpulet::scheduler {
namespace {

// The parts of an AdmissionReview request we need, checked.
absl::StatusOr<std::pair<std::string, const json*>> Request(const json& review) {
  if (!review.is_object() || review.value("kind", "") != "AdmissionReview") {
    return absl::InvalidArgumentError("body is not an AdmissionReview");
  }
  auto req = review.find("request");
  if (req == review.end() || !req->is_object() || !(*req)["uid"].is_string()) {
    return absl::InvalidArgumentError("AdmissionReview has no request.uid");
  }
  auto obj = req->find("object");
  return std::make_pair((*req)["uid"].get<std::string>(),
                        obj != req->end() && obj->is_object() ? &*obj : nullptr);
}

json Response(const json& review, const std::string& uid) {
  return {{"apiVersion", review.value("apiVersion", "admission.k8s.io/v1")},
          {"kind", "AdmissionReview"},
          {"response", {{"uid", uid}, {"allowed", true}}}};
}

}  // namespace

int64_t NodeMaxGpuUnits(const json& node, const vgpu::ResourceNames& names) {
  int64_t best = 0;
  const json& md = node.contains("metadata") ? node["metadata"] : json::object();
  if (md.contains("annotations") && md["annotations"].contains(vgpu::kAnnotationNodeGpus)) {
    json list = json::parse(md["annotations"][vgpu::kAnnotationNodeGpus].get<std::string>(),
                            nullptr, false);
    if (list.is_array()) {
      for (const auto& g : list) best = std::max(best, g.value("memoryUnits", int64_t{0}));
      if (best > 0) return best;
    }
  }
  const json& st = node.contains("status") ? node["status"] : json::object();
  const json& alloc = st.contains("allocatable") ? st["allocatable"]
                      : st.contains("capacity")  ? st["capacity"]
                                                 : json::object();
  int64_t gpus = vgpu::QuantityIn(alloc, names.core) / vgpu::kCoresPerGpu;
  return gpus > 0 ? vgpu::QuantityIn(alloc, names.memory) / gpus : 0;
}

AdmissionWebhook::AdmissionWebhook(WebhookOptions options, k8s::Client* api)
    : options_(std::move(options)), api_(api) {}

int64_t AdmissionWebhook::MaxMemoryUnits() {
  if (options_.max_memory_units > 0 || !api_) return options_.max_memory_units;
  std::lock_guard<std::mutex> l(mu_);
  auto now = std::chrono::steady_clock::now();
  if (cached_units_ > 0 && now - cached_at_ < std::chrono::seconds(30)) return cached_units_;
  auto nodes = api_->ListNodes();
  if (!nodes.ok()) {
    spdlog::warn("webhook: cannot list nodes for the GPU memory bound: {}",
                 nodes.status().ToString());
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
  auto pod = vgpu::ParsePod(*req.second, options_.names, MaxMemoryUnits());
  if (!pod.ok()) {
    const json& md = (*req.second).contains("metadata") ? (*req.second)["metadata"] : json::object();
    std::string who = md.value("name", md.value("generateName", ""));
    out["response"]["allowed"] = false;
    out["response"]["status"] = {
        {"code", 422},
        {"reason", "Invalid"},
        {"message", absl::StrCat("gpulet vGPU: pod \"", who, "\": ", pod.status().message())}};
  }
  return out;
}

absl::StatusOr<json> AdmissionWebhook::Mutate(const json& review) {
  ASSIGN_OR_RETURN(auto req, Request(review));
  json out = Response(review, req.first);
  if (!req.second || options_.scheduler_name.empty()) return out;
  auto pod = vgpu::ParsePod(*req.second, options_.names, 0);
  if (!pod.ok() || pod->empty()) return out;  // invalid pods are the validator's to deny
  json patch = json::array({{{"op", "add"}, {"path", "/spec/schedulerName"},
                             {"value", options_.scheduler_name}}});
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
      json review = json::parse(req.body, nullptr, false);
      auto out = fn(review);
      if (!out.ok()) {
        res.status = 400;
        res.set_content(std::string(out.status().message()), "text/plain");
        return;
      }
      res.set_content(out->dump(), "application/json");
    });
  };
  route("/validate", [this](const json& r) { return Validate(r); });
  route("/mutate", [this](const json& r) { return Mutate(r); });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
}

}  // namespace gpulet::scheduler
