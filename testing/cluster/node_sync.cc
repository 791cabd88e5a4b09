#include "testing/cluster/node_sync.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace gpulet::cluster {

using k8s::json;

absl::Status NodeSync::SyncOnce() {
  if (emulator_ == nullptr) return absl::FailedPreconditionError("no kubelet emulator");
  // Node status, as the kubelet's node status updater reports it.
  json capacity = json::object(), allocatable = json::object();
  for (const auto& r : emulator_->Resources()) {
    capacity[r.name] = absl::StrCat(r.capacity);
    allocatable[r.name] = absl::StrCat(r.allocatable);
  }
  json status = {{"status",
                  {{"capacity", capacity},
                   {"allocatable", allocatable},
                   {"nodeInfo", {{"bootID", boot_id_}}}}}};
  RETURN_IF_ERROR(client_->PatchNodeStatus(node_, k8s::PatchType::kMerge, status).status());

  // Pods bound to this node: new ones go to the kubelet; gone ones leave it.
  k8s::ListOptions opts;
  opts.field_selector = "spec.nodeName=" + node_;
  ASSIGN_OR_RETURN(json list, client_->ListPods("", opts));
  std::set<std::string> in_api;
  for (const json& pod : list["items"]) {
    std::string key = absl::StrCat(pod["metadata"].value("namespace", "default"), "/",
                                   pod["metadata"].value("name", ""));
    in_api.insert(key);
    std::string ns = pod["metadata"].value("namespace", "default");
    std::string name = pod["metadata"].value("name", "");
    auto known = emulator_->GetPod(ns, name);
    if (!known) {
      std::string phase = pod.contains("status") ? pod["status"].value("phase", "") : "";
      if (phase == "Failed" || phase == "Succeeded") continue;  // terminal: the kubelet is done
      ASSIGN_OR_RETURN(auto specs, emu::ParsePods(pod.dump(), "api:" + key));
      for (const auto& s : specs) {
        auto added = emulator_->AddPod(s);
        if (!added.ok()) return added.status();
      }
      known = emulator_->GetPod(ns, name);
      if (!known) continue;
    }
    json up = {{"status",
                {{"phase", emu::PodPhaseName(known->phase)},
                 {"reason", known->reason},
                 {"message", known->message}}}};
    RETURN_IF_ERROR(client_
                        ->Call("PATCH",
                               absl::StrCat("/api/v1/namespaces/", ns, "/pods/", name, "/status"),
                               &up, "application/merge-patch+json")
                        .status());
  }
  for (const auto& p : emulator_->Pods())
    if (!in_api.count(p.spec.Key())) (void)emulator_->DeletePod(p.spec.namespace_, p.spec.name);
  return absl::OkStatus();
}

absl::Status ReplicaSetController::SyncOnce() {
  k8s::ListOptions opts;
  opts.label_selector = "app=" + name_;
  ASSIGN_OR_RETURN(json list, client_->ListPods("default", opts));
  if (!list["items"].empty()) return absl::OkStatus();
  ++created_;
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", absl::StrCat(name_, "-", created_)},
                {"namespace", "default"},
                {"labels", {{"app", name_}}},
                {"ownerReferences", json::array({{{"apiVersion", "apps/v1"},
                                                  {"kind", "ReplicaSet"},
                                                  {"name", name_},
                                                  {"uid", "rs-" + name_},
                                                  {"controller", true}}})}}},
              {"spec",
               {{"nodeName", node_},
                {"containers",
                 json::array({{{"name", "main"},
                               {"image", "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"},
                               {"resources",
                                {{"limits", {{"nvidia.com/gpu", absl::StrCat(gpus_)}}}}}}})}}}};
  return client_->Call("POST", "/api/v1/namespaces/default/pods", &pod).status();
}

}  // namespace gpulet::cluster
