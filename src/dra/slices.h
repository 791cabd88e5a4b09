// Publishes this node's pool as ResourceSlices (resource.k8s.io/v1) through the API server: one
// slice named "<node>-<driver>" holding every healthy device, pool name = node name,
// resourceSliceCount 1. A change of the device list rewrites the slice with the pool generation
// one higher (the scheduler then ignores any older slice of the pool); an unchanged list writes
// nothing. Slices of this driver on this node under another name (an older layout) are deleted.
// The slice is owned by the Node object, so it goes away with the Node.
// Thread-compatible: one caller at a time (the driver's sync thread).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "k8s/client.h"

namespace gpulet::dra {

inline constexpr char kResourceApi[] = "/apis/resource.k8s.io/v1";

// The ResourceSlices of `driver` on `node` (the list's "items"; an empty array when it has none).
absl::StatusOr<nlohmann::json> ListNodeSlices(k8s::Client* api, const std::string& node,
                                              const std::string& driver);

class SlicePublisher {
 public:
  SlicePublisher(k8s::Client* api, std::string node, std::string driver);

  // Makes the published slice hold exactly `devices` (spec.devices). Retries a conflicting write
  // once after re-reading (another writer, e.g. a restarted agent).
  absl::Status Publish(const nlohmann::json& devices);
  // Deletes this node's slices of the driver (uninstall; not on a plain restart).
  absl::Status Remove();

  std::string slice_name() const { return name_; }
  int64_t generation() const { return generation_; }

 private:
  absl::Status PublishOnce(const nlohmann::json& devices);
  k8s::Client* api_;
  std::string node_, driver_, name_;
  std::string node_uid_;
  int64_t generation_ = 0;
  nlohmann::json published_;  // the devices last written (null: unknown)
  bool cleaned_ = false;      // other-named slices removed once
};

}  // namespace gpulet::dra
