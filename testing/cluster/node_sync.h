// Joins the kubelet emulator to the fake API server the way a real kubelet joins a cluster, for
// end-to-end scenarios (reboots, controllers): node capacity/allocatable and status.nodeInfo.bootID
// go up to the Node object, pods bound to the node come down into the emulator, and each pod's
// phase/reason/message go back up. Plus a one-replica "ReplicaSet" controller that recreates its
// pod when it is deleted. Test code: SyncOnce() is called by the scenario, no threads.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "k8s/client.h"
#include "testing/kubelet/emulator.h"

namespace gpulet::cluster {

class NodeSync {
 public:
  // Neither pointer is owned; the emulator may be replaced between calls (a "reboot").
  NodeSync(k8s::Client* client, std::string node_name)
      : client_(client), node_(std::move(node_name)) {}
  void set_emulator(emu::KubeletEmulator* e) { emulator_ = e; }
  void set_boot_id(std::string id) { boot_id_ = std::move(id); }

  // One round: node status up, pods down, pod statuses up.
  absl::Status SyncOnce();

 private:
  k8s::Client* client_;
  std::string node_;
  std::string boot_id_ = "boot-0";
  emu::KubeletEmulator* emulator_ = nullptr;
};

// Keeps one pod of `name` (label app=<name>) bound to `node`, asking for `gpus` nvidia.com/gpu,
// owned by a ReplicaSet of that name; creates a new one (name-<n>) whenever none exists.
class ReplicaSetController {
 public:
  ReplicaSetController(k8s::Client* client, std::string name, std::string node, int gpus)
      : client_(client), name_(std::move(name)), node_(std::move(node)), gpus_(gpus) {}
  absl::Status SyncOnce();
  int created() const { return created_; }

 private:
  k8s::Client* client_;
  std::string name_, node_;
  int gpus_;
  int created_ = 0;
};

}  // namespace gpulet::cluster
