#include "node/readiness.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace gpulet::node {
namespace {

using k8s::json;

const json& Field(const json& j, std::initializer_list<std::string_view> path) {
  static const json kNull;
  const json* cur = &j;
  for (std::string_view p : path) {
    if (!cur->is_object()) return kNull;
    auto it = cur->find(std::string(p));
    if (it == cur->end()) return kNull;
    cur = &*it;
  }
  return *cur;
}

std::string StringField(const json& j, std::initializer_list<std::string_view> path) {
  const json& v = Field(j, path);
  return v.is_string() ? v.get<std::string>() : "";
}

// kube-apiserver's resourceVersions are etcd revisions, so a later write has a larger one. The API
// calls them opaque; the only use here is "has the watch caught up with our own write", and a
// version that is not a number (0) makes the controller GET instead, which is always correct.
uint64_t Version(const json& node) {
  std::string rv = StringField(node, {"metadata", "resourceVersion"});
  uint64_t v = 0;
  for (char ch : rv) {
    if (ch < '0' || ch > '9' || v > UINT64_MAX / 10) return 0;
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  return v;
}

}  // namespace

ReadinessController::ReadinessController(k8s::Client* client, Validator validate,
                                         ReadinessOptions options, Clock* clock)
    : client_(client),
      validate_(std::move(validate)),
      options_(std::move(options)),
      clock_(clock) {}

ReadinessController::~ReadinessController() { Stop(); }

bool ReadinessController::HasTaint(const json& node) const {
  const json& taints = Field(node, {"spec", "taints"});
  if (!taints.is_array()) return false;
  return std::any_of(taints.begin(), taints.end(),
                     [&](const json& t) { return StringField(t, {"key"}) == options_.taint_key; });
}

absl::StatusOr<json> ReadinessController::ReadNode() {
  {
    absl::MutexLock l(&node_mu_);
    if (!watched_.is_null() && watched_version_ != 0 && watched_version_ >= awaited_version_)
      return watched_;
  }
  return client_->GetNode(options_.node_name);
}

void ReadinessController::Wrote(const absl::StatusOr<json>& node) {
  absl::MutexLock l(&node_mu_);
  // Unknown (failed, or no number): GET until the watch shows a version past everything seen.
  uint64_t v = node.ok() ? Version(*node) : 0;
  awaited_version_ = v != 0 ? v : std::max(awaited_version_, watched_version_) + 1;
}

void ReadinessController::Watched(json node) {
  bool ours;
  {
    absl::MutexLock l(&node_mu_);
    watched_version_ = node.is_null() ? 0 : Version(node);
    ours = watched_version_ != 0 && watched_version_ == awaited_version_;
    watched_ = std::move(node);
  }
  if (ours) return;  // our own write: the pass that made it already acted on it
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

bool ReadinessController::WatchNode(std::chrono::milliseconds timeout) {
  if (!node_watch_) {
    node_watch_ = std::make_unique<k8s::Reflector>(
        client_, "/api/v1/nodes",
        k8s::ListOptions{.field_selector = "metadata.name=" + options_.node_name},
        [this](const std::vector<json>& items) { Watched(items.empty() ? json() : items.front()); },
        [this](const k8s::WatchEvent& ev) {
          if (ev.type == "ADDED" || ev.type == "MODIFIED") Watched(ev.object);
          if (ev.type == "DELETED") Watched(json());
        });
    node_watch_->Start();
  }
  return node_watch_->WaitSynced(timeout);
}

// Taints are a list the API merges as a whole, so read-modify-write guarded by resourceVersion;
// a concurrent writer (kubelet, another controller) makes us re-read rather than clobber it.
absl::Status ReadinessController::SetTaint(bool present) {
  absl::Status last;
  for (int attempt = 0; attempt < 5; ++attempt) {
    ASSIGN_OR_RETURN(json node, client_->GetNode(options_.node_name));
    if (HasTaint(node) == present) return absl::OkStatus();
    json taints = json::array();
    for (const json& t :
         Field(node, {"spec", "taints"}).is_array() ? node["spec"]["taints"] : json::array())
      if (StringField(t, {"key"}) != options_.taint_key) taints.push_back(t);
    if (present) {
      taints.push_back(
          {{"key", options_.taint_key}, {"value", "validating"}, {"effect", "NoSchedule"}});
    }
    json patch = {
        {"metadata", {{"resourceVersion", StringField(node, {"metadata", "resourceVersion"})}}},
        {"spec", {{"taints", taints}}}};
    auto r = client_->PatchNode(options_.node_name, k8s::PatchType::kMerge, patch);
    Wrote(r);
    if (r.ok()) {
      spdlog::info("node {}: taint {} {}", options_.node_name, options_.taint_key,
                   present ? "added" : "removed");
      return absl::OkStatus();
    }
    last = r.status();
    if (last.code() != absl::StatusCode::kAborted &&
        last.code() != absl::StatusCode::kAlreadyExists)
      return last;
  }
  return last;
}

absl::Status ReadinessController::MarkValidated(const std::string& boot_id) {
  json patch = {{"metadata",
                 {{"labels", {{options_.ready_label, "ready"}}},
                  {"annotations", {{options_.boot_annotation, boot_id}}}}}};
  auto r = client_->PatchNode(options_.node_name, k8s::PatchType::kMerge, patch);
  Wrote(r);
  return r.status();
}

absl::Status ReadinessController::ClearReadyLabel() {
  json patch = {{"metadata", {{"labels", {{options_.ready_label, nullptr}}}}}};
  auto r = client_->PatchNode(options_.node_name, k8s::PatchType::kMerge, patch);
  Wrote(r);
  return r.status();
}

bool ReadinessController::RequestsOurResources(const json& pod) const {
  const json& containers = Field(pod, {"spec", "containers"});
  if (!containers.is_array()) return false;
  for (const json& c : containers) {
    const json& limits = Field(c, {"resources", "limits"});
    if (!limits.is_object()) continue;
    for (auto it = limits.begin(); it != limits.end(); ++it)
      for (const auto& prefix : options_.resource_prefixes)
        if (absl::StartsWith(it.key(), prefix)) return true;
  }
  return false;
}

void ReadinessController::StartRemediation(const std::string& boot_id) {
  remediated_boot_ = boot_id;
  remediate_until_ = clock_->Now() + options_.remediate_window;
  next_remediation_ = {};
  reported_bare_.clear();
}

absl::Status ReadinessController::RemediateIfDue() {
  Clock::TimePoint now = clock_->Now();
  if (now >= remediate_until_ || now < next_remediation_) return absl::OkStatus();
  next_remediation_ = now + options_.remediate_every;
  return RemediateRejectedPods();
}

std::chrono::milliseconds ReadinessController::NextWait() const {
  if (!ready_) return options_.interval;
  return clock_->Now() < remediate_until_ ? options_.remediate_every : options_.steady_interval;
}

absl::Status ReadinessController::RemediateRejectedPods() {
  k8s::ListOptions opts;
  opts.field_selector = "spec.nodeName=" + options_.node_name;
  ASSIGN_OR_RETURN(json list, client_->ListPods("", opts));
  for (const json& pod : Field(list, {"items"}).is_array() ? list["items"] : json::array()) {
    // The kubelet's two wordings for "the plugin was not there yet": UnexpectedAdmissionError when
    // it knows the resource from its checkpoint, OutOf<resource> when it does not know it at all.
    std::string reason = StringField(pod, {"status", "reason"});
    bool rejected = reason == "UnexpectedAdmissionError" || absl::StartsWith(reason, "OutOf");
    if (StringField(pod, {"status", "phase"}) != "Failed" || !rejected ||
        !RequestsOurResources(pod)) {
      continue;
    }
    std::string ns = StringField(pod, {"metadata", "namespace"});
    std::string name = StringField(pod, {"metadata", "name"});
    bool controlled = false;
    const json& owners = Field(pod, {"metadata", "ownerReferences"});
    if (owners.is_array())
      for (const json& o : owners) controlled |= o.value("controller", false);
    if (controlled) {
      auto r = client_->Call("DELETE", absl::StrCat("/api/v1/namespaces/", ns, "/pods/", name));
      if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) return r.status();
      ++deleted_pods_;
      spdlog::info(
          "deleted pod {}/{} rejected before the GPU stack was ready; its controller "
          "recreates it",
          ns, name);
    } else {
      if (!reported_bare_.insert(ns + "/" + name).second) continue;  // one event per pod and boot
      ++reported_bare_pods_;
      spdlog::warn(
          "pod {}/{} was rejected before the GPU stack was ready and has no controller; "
          "delete and recreate it to run it",
          ns, name);
      // List items carry no kind; the event must say what it is about.
      json involved = {{"kind", "Pod"}, {"apiVersion", "v1"}, {"metadata", pod["metadata"]}};
      json event = k8s::MakeEvent(
          involved, "Warning", "GPUStackNotReadyAtAdmission",
          "rejected by the kubelet before the node's GPU stack was ready; this bare pod is not "
          "recreated automatically: delete and recreate it",
          "gpulet-agent", options_.node_name, clock_);
      auto r = client_->CreateEvent(ns, event);
      if (!r.ok())
        spdlog::warn("cannot record event for pod {}/{}: {}", ns, name,
                     std::string(r.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<NodeStackState> ReadinessController::ReconcileOnce() {
  ASSIGN_OR_RETURN(json node, ReadNode());
  std::string boot_id = StringField(node, {"status", "nodeInfo", "bootID"});
  std::string validated = StringField(node, {"metadata", "annotations", options_.boot_annotation});
  bool labelled = StringField(node, {"metadata", "labels", options_.ready_label}) == "ready";

  if (validated == boot_id && !boot_id.empty() && labelled) {
    if (options_.settings_check && recheck_settings_.exchange(false)) {
      if (absl::Status st = options_.settings_check(); !st.ok()) {
        // Back to "not validated": the next passes validate the whole stack, as after a boot.
        last_report_ = ValidationReport{{{"settings", false, std::string(st.message())}}};
        spdlog::warn(
            "node {}: the GPU stack no longer validates with the current settings ({}); "
            "tainted until it does",
            options_.node_name, last_report_.FirstFailure());
        last_failure_logged_ = last_report_.FirstFailure();
        absl::Status taint = SetTaint(true);
        if (taint.ok()) taint = ClearReadyLabel();
        if (!taint.ok()) recheck_settings_ = true;  // not done: the next pass tries again
        ready_ = false;
        RETURN_IF_ERROR(taint);
        return NodeStackState::kNotReady;
      }
    }
    // E.g. a previous run died between label and untaint; checked on the Node read above, so a
    // pass at rest is this one GET.
    if (HasTaint(node)) RETURN_IF_ERROR(SetTaint(false));
    if (remediated_boot_ != boot_id) StartRemediation(boot_id);
    RETURN_IF_ERROR(RemediateIfDue());
    ready_ = true;
    return NodeStackState::kReady;
  }

  // This boot is not validated yet: keep new GPU pods off the node first.
  ready_ = false;
  if (!HasTaint(node)) RETURN_IF_ERROR(SetTaint(true));
  if (labelled) RETURN_IF_ERROR(ClearReadyLabel());
  recheck_settings_ = false;  // the whole stack is validated with the settings of now
  last_report_ = validate_();
  if (!last_report_.ok()) {
    std::string failure = last_report_.FirstFailure();
    if (failure != last_failure_logged_) {
      spdlog::info("node {}: GPU stack not ready yet ({})", options_.node_name, failure);
      last_failure_logged_ = failure;
    }
    return NodeStackState::kNotReady;
  }
  // Order matters: label first (our pods and users can see why), then admit new pods, then heal.
  RETURN_IF_ERROR(MarkValidated(boot_id));
  RETURN_IF_ERROR(SetTaint(false));
  // The window opens once per boot and process: validated again within it (settings fixed), the
  // pods rejected at admission were already being looked for.
  if (remediated_boot_ != boot_id) StartRemediation(boot_id);
  next_remediation_ = clock_->Now() + options_.remediate_every;
  RETURN_IF_ERROR(RemediateRejectedPods());
  ready_ = true;
  last_failure_logged_.clear();
  spdlog::info("node {}: GPU stack validated for boot {} ({})", options_.node_name, boot_id,
               last_report_.Summary());
  return NodeStackState::kReady;
}

void ReadinessController::Start() {
  // Not waited for: until it has listed, passes GET the Node as before.
  WatchNode(std::chrono::milliseconds(0));
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      auto r = ReconcileOnce();
      if (!r.ok()) spdlog::warn("gpu-stack readiness: {}", std::string(r.status().message()));
      lock.lock();
      cv_.wait_for(lock, NextWait(), [this] { return stop_ || wake_; });
      wake_ = false;
    }
  });
}

void ReadinessController::SettingsChanged() {
  recheck_settings_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void ReadinessController::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (node_watch_) node_watch_->Stop();
}

}  // namespace gpulet::node
