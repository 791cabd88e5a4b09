#include "dra/slices.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace gpulet::dra {

using nlohmann::json;

absl::StatusOr<json> ListNodeSlices(k8s::Client* api, const std::string& node,
                                    const std::string& driver) {
  auto list =
      api->Call("GET", absl::StrCat(kResourceApi, "/resourceslices?fieldSelector=spec.nodeName%3D",
                                    node, "%2Cspec.driver%3D", driver));
  if (!list.ok()) return list.status();
  json items = list->value("items", json::array());
  return items.is_array() ? items : json::array();
}

SlicePublisher::SlicePublisher(k8s::Client* api, std::string node, std::string driver)
    : api_(api),
      node_(std::move(node)),
      driver_(std::move(driver)),
      name_(absl::StrCat(node_, "-", driver_)) {}

absl::Status SlicePublisher::Publish(const json& devices) {
  absl::Status s = PublishOnce(devices);
  if (s.code() == absl::StatusCode::kAborted || s.code() == absl::StatusCode::kAlreadyExists) {
    published_ = json();  // someone else wrote: read again
    s = PublishOnce(devices);
  }
  return s;
}

absl::Status SlicePublisher::PublishOnce(const json& devices) {
  if (!published_.is_null() && published_ == devices) return absl::OkStatus();
  std::string base = absl::StrCat(kResourceApi, "/resourceslices");
  if (!cleaned_) {
    // Slices of ours on this node under another name: an older layout or a renamed pool.
    auto slices = ListNodeSlices(api_, node_, driver_);
    if (!slices.ok()) return slices.status();
    for (const json& s : *slices) {
      std::string n = s["metadata"].value("name", "");
      if (n == name_ || n.empty()) continue;
      auto del = api_->Call("DELETE", absl::StrCat(base, "/", n));
      if (!del.ok() && del.status().code() != absl::StatusCode::kNotFound) return del.status();
      spdlog::info("DRA: deleted ResourceSlice {} (not this agent's layout)", n);
    }
    cleaned_ = true;
  }
  if (node_uid_.empty()) {
    auto node = api_->GetNode(node_);
    if (node.ok()) node_uid_ = (*node)["metadata"].value("uid", "");
  }
  auto current = api_->Call("GET", absl::StrCat(base, "/", name_));
  json slice;
  bool exists = current.ok();
  if (exists) {
    slice = *current;
    const json& spec = slice["spec"];
    generation_ = spec.contains("pool") ? spec["pool"].value("generation", int64_t{0}) : 0;
    if (spec.value("devices", json::array()) == devices && spec.value("nodeName", "") == node_) {
      published_ = devices;  // a restart that finds its own slice current writes nothing
      return absl::OkStatus();
    }
  } else if (current.status().code() != absl::StatusCode::kNotFound) {
    return current.status();
  }
  json next = exists ? slice : json::object();
  next["apiVersion"] = "resource.k8s.io/v1";
  next["kind"] = "ResourceSlice";
  next["metadata"]["name"] = name_;
  if (!node_uid_.empty())
    next["metadata"]["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                                        {"kind", "Node"},
                                                        {"name", node_},
                                                        {"uid", node_uid_},
                                                        {"controller", true}}});
  // A new list is a new generation of the pool: the scheduler uses only the slices of the
  // highest generation it sees, so a device that left is never allocated from a stale slice.
  next["spec"] = {
      {"driver", driver_},
      {"nodeName", node_},
      {"pool",
       {{"name", node_}, {"generation", exists ? generation_ + 1 : 1}, {"resourceSliceCount", 1}}},
      {"devices", devices}};
  absl::StatusOr<json> written = exists ? api_->Call("PUT", absl::StrCat(base, "/", name_), &next)
                                        : api_->Call("POST", base, &next);
  if (!written.ok()) return written.status();
  generation_ = (*written)["spec"]["pool"].value("generation", int64_t{0});
  published_ = devices;
  spdlog::info("DRA: ResourceSlice {} generation {}: {} devices", name_, generation_,
               devices.size());
  return absl::OkStatus();
}

absl::Status SlicePublisher::Remove() {
  std::string base = absl::StrCat(kResourceApi, "/resourceslices");
  auto slices = ListNodeSlices(api_, node_, driver_);
  if (!slices.ok()) return slices.status();
  for (const json& s : *slices) {
    auto del = api_->Call("DELETE", absl::StrCat(base, "/", s["metadata"].value("name", "")));
    if (!del.ok() && del.status().code() != absl::StatusCode::kNotFound) return del.status();
  }
  published_ = json();
  return absl::OkStatus();
}

}  // namespace gpulet::dra
