#include "plugin/plugin.h"

#include <signal.h>

#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "common/status.h"
#include "plugin/resources.h"

namespace gpulet::plugin {
namespace {

sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGHUP, SIGINT, SIGTERM, SIGQUIT}) sigaddset(&set, s);
  return set;
}

}  // namespace

void BlockSignals() {
  sigset_t set = HandledSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

DevicePlugin::DevicePlugin(gpu::GpuLayer* gpu, Options options, Config config)
    : gpu_(gpu), options_(std::move(options)), config_(std::move(config)) {}

DevicePlugin::~DevicePlugin() { Stop(); }

absl::Status DevicePlugin::Start() {
  ASSIGN_OR_RETURN(inventory_, gpu_->GetInventory());
  absl::MutexLock l(&mu_);
  health_ = std::make_unique<HealthMonitor>(gpu_, inventory_, config_.health);
  manager_ = std::make_unique<kubelet::PluginManager>(options_.manager);
  RETURN_IF_ERROR(Apply(config_));
  health_->Start();
  if (inventory_.devices.empty()) spdlog::warn("no GPUs found; serving nothing until a reload");
  return absl::OkStatus();
}

absl::Status DevicePlugin::Apply(const Config& cfg) {
  ASSIGN_OR_RETURN(auto resources,
                   BuildResources(inventory_, cfg, health_.get(), options_.host_root));
  for (const auto& r : resources)
    spdlog::info("resource {}: {} devices", r->name(), r->Devices().size());
  RETURN_IF_ERROR(manager_->SetResources(std::move(resources)));
  health_->SetConfig(cfg.health);
  return absl::OkStatus();
}

absl::Status DevicePlugin::Reload() {
  absl::Status s = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Config cfg, LoadConfig(options_.sources));
    absl::MutexLock l(&mu_);
    if (!manager_) return absl::FailedPreconditionError("not started");
    RETURN_IF_ERROR(Apply(cfg));
    config_ = std::move(cfg);
    return absl::OkStatus();
  }();
  if (s.ok()) {
    spdlog::info("configuration reloaded");
  } else {
    spdlog::error("reload failed, keeping the previous configuration: {}", std::string(s.message()));
  }
  return s;
}

int DevicePlugin::Run() {
  const sigset_t set = HandledSignals();
  const std::string& file = options_.sources.file;
  auto read = [&] {
    auto t = ReadFileToString(file);
    return t.ok() ? *t : std::string();
  };
  std::string last = file.empty() ? "" : read();
  for (;;) {
    struct timespec ts = {0, 250 * 1000 * 1000};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGHUP) {
      spdlog::info("SIGHUP: reloading");
      (void)Reload();
      if (!file.empty()) last = read();
    } else if (sig > 0) {
      spdlog::info("signal {}: stopping", sig);
      Stop();
      return 0;
    } else if (!file.empty()) {
      // ConfigMaps update by swapping a symlink: compare content, not inode or mtime.
      std::string now = read();
      if (now != last) {
        last = now;
        spdlog::info("{} changed: reloading", file);
        (void)Reload();
      }
    }
  }
}

void DevicePlugin::Stop() {
  if (manager_) manager_->Stop();
  if (health_) health_->Stop();
}

Config DevicePlugin::config() const {
  absl::MutexLock l(&mu_);
  return config_;
}

}  // namespace gpulet::plugin
