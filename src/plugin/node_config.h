// Per-node configs, as NVIDIA's config-manager sidecar does them, inside the device plugin: a
// directory (a mounted ConfigMap) holds one file per named config; the Node's label
// (`nvidia.com/device-plugin.config` by default) picks one, else the default name. A label change
// (a watch on this Node) or a content change in the directory (kubelet swaps the `..data` symlink:
// inotify on the directory, plus a 1 s re-check) is applied live through `apply`. An unknown name
// or a config that does not load or apply produces a Warning Event on the Node and keeps the last
// good config; each distinct failure is reported once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "nlohmann/json.hpp"

namespace gpulet::k8s {
class Client;
class Reflector;
}  // namespace gpulet::k8s

namespace gpulet::plugin {

inline constexpr char kDefaultConfigNodeLabel[] = "nvidia.com/device-plugin.config";

struct NodeConfigOptions {
  std::string dir;           // --config-dir
  std::string default_name;  // --config-default; empty: the only file when there is one
  std::string node_label = kDefaultConfigNodeLabel;
  std::string node_name;       // NODE_NAME; empty: no label, no Events
  k8s::Client* api = nullptr;  // not owned; null: no label, no Events
  absl::Duration recheck = absl::Seconds(1);
  Clock* clock = RealClock();                      // whose time `recheck` is counted in; never null
  std::string component = "gpulet-device-plugin";  // Event source
};

// The config names in `dir`: its regular files (links followed), without the ConfigMap
// volume's `..`-prefixed entries, sorted.
std::vector<std::string> ConfigNames(const std::string& dir);

class NodeConfigWatcher {
 public:
  // Loads and applies the config file at the path (empty: no file: defaults, environment, flags).
  using ApplyFn = std::function<absl::Status(const std::string& path)>;

  NodeConfigWatcher(NodeConfigOptions options, ApplyFn apply);
  ~NodeConfigWatcher();  // Stop()s

  // The file the node should start with: the label's config if it exists, else the default
  // (an unknown label name is reported as an Event). Reads the Node once.
  absl::StatusOr<std::string> Initial();
  // Records that `path` (Initial()'s answer) is applied, then watches the Node and the directory.
  void Start(const std::string& applied_path);
  void Stop();

  // One evaluation (the watch threads call it; tests may too).
  void Evaluate();
  // The config name in force ("" when none) and the label value last seen.
  std::string current() const;

 private:
  // The name the label / default asks for; `label` receives the label value ("" when absent).
  std::string Wanted(std::string* label) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Report(const std::string& type, const std::string& reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnNode(const nlohmann::json& node);
  void WatchDir();

  const NodeConfigOptions options_;
  const ApplyFn apply_;
  mutable absl::Mutex eval_mu_;  // one evaluation at a time (apply runs under it)
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(eval_mu_);
  nlohmann::json node_ ABSL_GUARDED_BY(mu_);  // last seen Node object (null: none)
  std::string current_name_ ABSL_GUARDED_BY(mu_);
  std::string applied_key_ ABSL_GUARDED_BY(mu_);  // name + content in force
  std::string failed_key_ ABSL_GUARDED_BY(mu_);   // last failure reported
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<k8s::Reflector> reflector_;
  std::thread dir_thread_;
};

}  // namespace gpulet::plugin
