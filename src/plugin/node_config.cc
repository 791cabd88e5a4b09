#include "plugin/node_config.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "k8s/client.h"

namespace gpulet::plugin {
namespace {

std::string Base(const std::string& path) {
  return path.empty() ? "" : std::filesystem::path(path).filename().string();
}

}  // namespace

std::vector<std::string> ConfigNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("..", 0) == 0) continue;  // the ConfigMap volume's timestamped dirs and ..data
    std::error_code ec2;
    if (std::filesystem::is_regular_file(e.path(), ec2)) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

NodeConfigWatcher::NodeConfigWatcher(NodeConfigOptions options, ApplyFn apply)
    : options_(std::move(options)), apply_(std::move(apply)) {}

NodeConfigWatcher::~NodeConfigWatcher() { Stop(); }

std::string NodeConfigWatcher::Wanted(std::string* label) const {
  label->clear();
  if (node_.is_object()) {
    const auto& labels = node_["metadata"].value("labels", nlohmann::json::object());
    if (labels.is_object() && labels.contains(options_.node_label) &&
        labels[options_.node_label].is_string())
      *label = labels[options_.node_label].get<std::string>();
  }
  if (!label->empty()) return *label;
  if (!options_.default_name.empty()) return options_.default_name;
  // NVIDIA's "single" fallback: the only config there is.
  std::vector<std::string> names = ConfigNames(options_.dir);
  return names.size() == 1 ? names.front() : "";
}

void NodeConfigWatcher::Report(const std::string& type, const std::string& reason,
                               const std::string& message) {
  if (type == "Warning")
    spdlog::error("config: {}", message);
  else
    spdlog::info("config: {}", message);
  if (!options_.api || !node_.is_object()) return;
  auto ev = options_.api->CreateEvent(
      "default",
      k8s::MakeEvent(node_, type, reason, message, options_.component, options_.node_name));
  if (!ev.ok())
    spdlog::warn("config: cannot create the Event: {}", std::string(ev.status().message()));
}

absl::StatusOr<std::string> NodeConfigWatcher::Initial() {
  if (options_.api && !options_.node_name.empty()) {
    auto node = options_.api->GetNode(options_.node_name);
    absl::MutexLock l(&mu_);
    if (node.ok())
      node_ = *node;
    else
      spdlog::warn("config: cannot read Node {} ({}); using the default config", options_.node_name,
                   std::string(node.status().message()));
  }
  absl::MutexLock l(&mu_);
  std::string label;
  std::string name = Wanted(&label);
  std::vector<std::string> names = ConfigNames(options_.dir);
  auto known = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  if (!name.empty() && !known(name)) {
    std::string msg = absl::StrCat(
        label.empty() ? "the default config \"" : "node label " + options_.node_label + "=\"", name,
        "\" names no config in ", options_.dir, " (have: ", absl::StrJoin(names, ", "), ")");
    if (!label.empty() && (options_.default_name.empty() || known(options_.default_name))) {
      Report("Warning", "UnknownDevicePluginConfig", msg + "; starting with the default");
      failed_key_ = "unknown\n" + name;
      name = options_.default_name;
      if (name.empty() && names.size() == 1) name = names.front();
    } else {
      return absl::NotFoundError(msg);
    }
  }
  return name.empty() ? std::string() : options_.dir + "/" + name;
}

void NodeConfigWatcher::Start(const std::string& applied_path) {
  {
    absl::MutexLock l(&mu_);
    current_name_ = Base(applied_path);
    auto text =
        applied_path.empty() ? absl::StatusOr<std::string>("") : ReadFileToString(applied_path);
    applied_key_ = current_name_ + "\n" + (text.ok() ? *text : "");
    stopping_ = false;
  }
  if (options_.api && !options_.node_name.empty()) {
    k8s::ListOptions lo;
    lo.field_selector = "metadata.name=" + options_.node_name;
    reflector_ = std::make_unique<k8s::Reflector>(
        options_.api, "/api/v1/nodes", lo,
        [this](const std::vector<nlohmann::json>& items) {
          if (!items.empty()) OnNode(items.front());
        },
        [this](const k8s::WatchEvent& ev) {
          if (ev.type == "ADDED" || ev.type == "MODIFIED") OnNode(ev.object);
        });
    reflector_->Start();
  }
  dir_thread_ = std::thread([this] { WatchDir(); });
}

void NodeConfigWatcher::OnNode(const nlohmann::json& node) {
  {
    absl::MutexLock l(&mu_);
    node_ = node;
  }
  Evaluate();
}

void NodeConfigWatcher::WatchDir() {
  int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd >= 0 && ::inotify_add_watch(fd, options_.dir.c_str(),
                                     IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE |
                                         IN_CLOSE_WRITE | IN_ATTRIB) < 0)
    spdlog::warn("config: cannot watch {}: re-checking every {}", options_.dir,
                 absl::FormatDuration(options_.recheck));
  const auto recheck = absl::ToChronoNanoseconds(options_.recheck);
  Clock::TimePoint next = options_.clock->Now() + recheck;
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) break;
    }
    bool changed = false;
    if (fd >= 0) {
      struct pollfd p = {fd, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        char buf[4096];
        while (::read(fd, buf, sizeof buf) > 0) changed = true;
      }
    } else {
      ::usleep(100 * 1000);
    }
    // The re-check covers what inotify cannot see (a directory replaced under a bind mount).
    if (changed || options_.clock->Now() >= next) {
      Evaluate();
      next = options_.clock->Now() + recheck;
    }
  }
  if (fd >= 0) ::close(fd);
}

void NodeConfigWatcher::Evaluate() {
  absl::MutexLock e(&eval_mu_);
  std::string label, name, path, content;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    name = Wanted(&label);
  }
  if (!name.empty()) {
    path = options_.dir + "/" + name;
    std::error_code ec;
    auto text = std::filesystem::is_regular_file(path, ec) ? ReadFileToString(path)
                                                           : absl::NotFoundError("absent");
    if (!text.ok()) {
      absl::MutexLock l(&mu_);
      std::string key = "unknown\n" + name;
      if (failed_key_ == key) return;
      failed_key_ = key;
      Report("Warning", "UnknownDevicePluginConfig",
             absl::StrCat(label.empty() ? "the default config \""
                                        : "node label " + options_.node_label + "=\"",
                          name, "\" names no config in ", options_.dir,
                          " (have: ", absl::StrJoin(ConfigNames(options_.dir), ", "),
                          "); keeping config \"", current_name_, "\""));
      return;
    }
    content = *text;
  }
  const std::string key = name + "\n" + content;
  {
    absl::MutexLock l(&mu_);
    if (key == applied_key_ || key == failed_key_) return;
  }
  absl::Status s = apply_(path);
  absl::MutexLock l(&mu_);
  if (s.ok()) {
    std::string previous = current_name_;
    applied_key_ = key;
    current_name_ = name;
    failed_key_.clear();
    Report("Normal", "DevicePluginConfigApplied",
           absl::StrCat("device plugin config \"", name, "\" applied",
                        previous == name ? " (content changed)" : " (was \"" + previous + "\")"));
  } else {
    failed_key_ = key;
    Report("Warning", "InvalidDevicePluginConfig",
           absl::StrCat("device plugin config \"", name, "\" not applied: ", s.message(),
                        "; keeping config \"", current_name_, "\""));
  }
}

std::string NodeConfigWatcher::current() const {
  absl::MutexLock l(&mu_);
  return current_name_;
}

void NodeConfigWatcher::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (reflector_) reflector_->Stop();
  if (dir_thread_.joinable()) dir_thread_.join();
  reflector_.reset();
}

}  // namespace gpulet::plugin
