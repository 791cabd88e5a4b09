#include "node/owner_deletion.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace gpulet::node {

using k8s::json;

namespace {

std::string Str(const json& o, const char* a, const char* b) {
  auto i = o.find(a);
  if (i == o.end() || !i->is_object()) return "";
  auto j = i->find(b);
  return j != i->end() && j->is_string() ? j->get<std::string>() : "";
}

}  // namespace

OwnerDeletion::OwnerDeletion(k8s::Client* client, std::string ns, std::string pod)
    : client_(client), ns_(std::move(ns)), pod_(std::move(pod)) {}

OwnerDeletion::~OwnerDeletion() { Stop(); }

absl::Status OwnerDeletion::LearnOwner(const json& pod) {
  auto refs = pod.contains("metadata") ? pod["metadata"].value("ownerReferences", json::array())
                                       : json::array();
  for (const json& r : refs) {
    if (r.value("kind", "") != "DaemonSet" || r.value("apiVersion", "") != "apps/v1") continue;
    std::lock_guard<std::mutex> l(mu_);
    name_ = r.value("name", "");
    uid_ = r.value("uid", "");
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("pod ", ns_, "/", pod_,
                   " is not owned by a DaemonSet (no apps/v1 DaemonSet in "
                   "metadata.ownerReferences)"));
}

void OwnerDeletion::MarkDeleting(const std::string& reason) {
  if (deleting_) return;
  deleting_ = true;
  reason_ = reason;
  spdlog::info("{}", reason);
  cv_.notify_all();
}

void OwnerDeletion::Look(const json& ds, bool deleted_event) {
  if (Str(ds, "metadata", "name") != name_) return;
  const std::string uid = Str(ds, "metadata", "uid");
  if (uid != uid_) {
    // Another object of the same name: ours was deleted and the name taken again.
    if (!deleted_event) MarkDeleting(absl::StrCat("DaemonSet ", ns_, "/", name_, " was replaced"));
    return;
  }
  if (deleted_event)
    MarkDeleting(absl::StrCat("DaemonSet ", ns_, "/", name_, " was deleted"));
  else if (!Str(ds, "metadata", "deletionTimestamp").empty())
    MarkDeleting(absl::StrCat("DaemonSet ", ns_, "/", name_, " is being deleted"));
}

void OwnerDeletion::OnSync(const std::vector<json>& items) {
  std::lock_guard<std::mutex> l(mu_);
  if (name_.empty()) return;
  bool ours = false;
  for (const json& ds : items) {
    if (Str(ds, "metadata", "name") == name_ && Str(ds, "metadata", "uid") == uid_) ours = true;
    Look(ds, false);
  }
  if (!ours) MarkDeleting(absl::StrCat("DaemonSet ", ns_, "/", name_, " is gone"));
}

void OwnerDeletion::OnEvent(const k8s::WatchEvent& ev) {
  if (ev.type == "ERROR" || ev.type == "BOOKMARK") return;
  std::lock_guard<std::mutex> l(mu_);
  if (name_.empty()) return;
  Look(ev.object, ev.type == "DELETED");
}

std::string OwnerDeletion::owner() const {
  std::lock_guard<std::mutex> l(mu_);
  return name_;
}

bool OwnerDeletion::deletion_seen() const {
  std::lock_guard<std::mutex> l(mu_);
  return deleting_;
}

void OwnerDeletion::Start(std::chrono::milliseconds retry) {
  thread_ = std::thread([this, retry] { Run(retry); });
}

void OwnerDeletion::Run(std::chrono::milliseconds retry) {
  for (;;) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
    }
    auto pod = client_->GetPod(ns_, pod_);
    absl::Status st = pod.ok() ? LearnOwner(*pod) : pod.status();
    if (st.ok()) break;
    spdlog::warn("uninstall-on-delete: {} (retrying)", std::string(st.message()));
    std::unique_lock<std::mutex> l(mu_);
    if (cv_.wait_for(l, retry, [this] { return stop_; })) return;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (stop_) return;
  spdlog::info("uninstall-on-delete: watching DaemonSet {}/{} (uid {})", ns_, name_, uid_);
  k8s::ListOptions opts;
  opts.field_selector = "metadata.name=" + name_;
  reflector_ = std::make_unique<k8s::Reflector>(
      client_, absl::StrCat("/apis/apps/v1/namespaces/", ns_, "/daemonsets"), opts,
      [this](const std::vector<json>& items) { OnSync(items); },
      [this](const k8s::WatchEvent& ev) { OnEvent(ev); });
  reflector_->Start();
}

void OwnerDeletion::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (reflector_) reflector_->Stop();
}

OwnerDeletion::Verdict OwnerDeletion::Decide(std::chrono::milliseconds settle) {
  std::string name, uid;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (!name_.empty()) cv_.wait_for(l, settle, [this] { return deleting_; });
    if (deleting_) return {true, reason_};
    name = name_;
    uid = uid_;
  }
  if (name.empty()) {  // never learnt: ask once now
    auto pod = client_->GetPod(ns_, pod_);
    absl::Status st = pod.ok() ? LearnOwner(*pod) : pod.status();
    if (!st.ok())
      return {false, absl::StrCat("cannot tell whether this pod's DaemonSet is being deleted: ",
                                  st.message())};
    std::lock_guard<std::mutex> l(mu_);
    name = name_;
    uid = uid_;
  }
  auto ds =
      client_->Call("GET", absl::StrCat("/apis/apps/v1/namespaces/", ns_, "/daemonsets/", name));
  const std::string what = absl::StrCat("DaemonSet ", ns_, "/", name);
  if (!ds.ok()) {
    if (absl::IsNotFound(ds.status())) return {true, what + " is gone"};
    return {false, absl::StrCat("cannot tell whether ", what,
                                " is being deleted: ", ds.status().message())};
  }
  if (Str(*ds, "metadata", "uid") != uid) return {true, what + " was replaced"};
  if (!Str(*ds, "metadata", "deletionTimestamp").empty()) return {true, what + " is being deleted"};
  return {false, what + " stays (a rolling update, a deleted or evicted pod, a node shutdown)"};
}

}  // namespace gpulet::node
