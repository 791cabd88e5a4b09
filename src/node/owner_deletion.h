// Whether the DaemonSet that owns this pod is being deleted: what the node agent's
// `uninstall-on-delete` container asks when it gets SIGTERM (`gpulet uninstall --on-owner-delete`).
// A DaemonSet being deleted (helm uninstall, kubectl delete -k) means gpulet leaves the node, so
// the engine configuration is restored; a pod stopped while its DaemonSet stays (a rolling update
// of the pod template, kubectl delete pod, eviction, node shutdown) means it comes back, so
// nothing is touched.
//
// The question cannot wait for SIGTERM alone: the release's RBAC and ServiceAccount are deleted in
// the same pass as the DaemonSet, so a GET at termination may be refused. So the owner (name and
// uid, from the pod's ownerReferences) is learnt at start and watched from then on; an open watch
// keeps delivering after the RBAC is gone, and the DaemonSet's DELETED event (background deletion)
// or its deletionTimestamp (foreground) arrives before the garbage collector deletes the pods. At
// termination, when the watch has not said so, one GET decides; an error there keeps the
// configuration (the safe side: a node keeps working with gpulet's runtime registered).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "k8s/client.h"

namespace gpulet::node {

class OwnerDeletion {
 public:
  struct Verdict {
    bool deleting = false;
    std::string reason;  // one line for the log
  };

  // `client` must outlive this object. The pod is `ns`/`pod`.
  OwnerDeletion(k8s::Client* client, std::string ns, std::string pod);
  ~OwnerDeletion();
  OwnerDeletion(const OwnerDeletion&) = delete;
  OwnerDeletion& operator=(const OwnerDeletion&) = delete;

  // In the background: learn the owner (retried every `retry` until it works), then list and
  // watch it.
  void Start(std::chrono::milliseconds retry = std::chrono::seconds(2));
  void Stop();

  // At termination: the watch's answer if it has one (waiting up to `settle` for an event still
  // on its way), else one GET of the owner now.
  Verdict Decide(std::chrono::milliseconds settle = std::chrono::seconds(1));

  // Owner name once learnt (empty before), and whether the watch has seen the deletion.
  std::string owner() const;
  bool deletion_seen() const;

  // The list and watch feed (public for tests).
  void OnSync(const std::vector<k8s::json>& items);
  void OnEvent(const k8s::WatchEvent& ev);
  // Sets the owner from a Pod object; false with the reason when it names no DaemonSet.
  absl::Status LearnOwner(const k8s::json& pod);

 private:
  void Run(std::chrono::milliseconds retry);
  void MarkDeleting(const std::string& reason);  // REQUIRES: mu_ held
  // One object of the owner's name: is it ours, and is it being deleted?
  void Look(const k8s::json& ds, bool deleted_event);  // REQUIRES: mu_ held

  k8s::Client* client_;
  const std::string ns_, pod_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string name_, uid_;
  bool deleting_ = false;
  std::string reason_;
  std::unique_ptr<k8s::Reflector> reflector_;
  std::thread thread_;
};

}  // namespace gpulet::node
