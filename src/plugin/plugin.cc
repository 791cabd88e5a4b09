#include "plugin/plugin.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/signals.h"
#include "common/status.h"
#include "gpu/selection.h"
#include "placement/vgpu_policy.h"
#include "plugin/resources.h"
#include "vgpu/node/node.h"

namespace gpulet::plugin {
namespace {

// An NVIDIA resource without the GPUs of the vGPU pool: a pool GPU is offered only as vcuda
// units, so the kubelet can never book it whole and fractionally at once. `hidden` holds the pool
// GPUs' UUIDs and indexes (the two checkpoint ID forms); replica IDs "<id>::<n>" follow their GPU.
class WithoutPool final : public kubelet::Resource {
 public:
  WithoutPool(std::shared_ptr<kubelet::Resource> inner, std::set<std::string> hidden,
              std::string owner = "the vGPU pool")
      : inner_(std::move(inner)), hidden_(std::move(hidden)), owner_(std::move(owner)) {}
  bool Hidden(const std::string& id) const { return hidden_.count(id.substr(0, id.find("::"))); }
  const std::string& name() const override { return inner_->name(); }
  std::vector<kubelet::DeviceState> Devices() const override {
    std::vector<kubelet::DeviceState> out;
    for (auto& d : inner_->Devices())
      if (!Hidden(d.id)) out.push_back(std::move(d));
    return out;
  }
  const kubelet::ChangeNotifier* changes() const override { return inner_->changes(); }
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& ids) override {
    for (const auto& id : ids)
      if (Hidden(id))
        return absl::InvalidArgumentError(
            absl::StrCat("device ID \"", id, "\" of ", name(), " belongs to ", owner_));
    return inner_->Allocate(ids);
  }
  absl::StatusOr<std::vector<std::string>> Preferred(const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must_include,
                                                     int size) override {
    std::vector<std::string> avail;
    for (const auto& id : available)
      if (!Hidden(id)) avail.push_back(id);
    return inner_->Preferred(avail, must_include, size);
  }
  bool pre_start_required() const override { return inner_->pre_start_required(); }
  absl::Status PreStart(const std::vector<std::string>& ids) override {
    return inner_->PreStart(ids);
  }

 private:
  std::shared_ptr<kubelet::Resource> inner_;
  std::set<std::string> hidden_;
  std::string owner_;
};

// A resource shared through MPS: its devices are Unhealthy while the control daemon does not
// answer (the daemon's health changes move the HealthMonitor's notifier, which this reports).
class MpsGated final : public kubelet::Resource {
 public:
  MpsGated(std::shared_ptr<kubelet::Resource> inner, std::shared_ptr<MpsDaemon> daemon)
      : inner_(std::move(inner)), daemon_(std::move(daemon)) {}
  const std::string& name() const override { return inner_->name(); }
  std::vector<kubelet::DeviceState> Devices() const override {
    auto out = inner_->Devices();
    if (!daemon_->healthy())
      for (auto& d : out) d.healthy = false;
    return out;
  }
  const kubelet::ChangeNotifier* changes() const override { return inner_->changes(); }
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& ids) override {
    if (!daemon_->healthy())
      return absl::UnavailableError(absl::StrCat("the MPS control daemon of ", name(),
                                                 " does not answer; it is being restarted"));
    return inner_->Allocate(ids);
  }
  absl::StatusOr<std::vector<std::string>> Preferred(const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must_include,
                                                     int size) override {
    return inner_->Preferred(available, must_include, size);
  }

 private:
  std::shared_ptr<kubelet::Resource> inner_;
  std::shared_ptr<MpsDaemon> daemon_;
};

// Who holds each vcuda device, by the kubelet's record (PodResources): device ID ->
// ("namespace/pod", container).
absl::StatusOr<std::map<std::string, std::pair<std::string, std::string>>> KubeletOwners(
    kubelet::PodResourcesLister& lister, const vgpu::ResourceNames& names) {
  ASSIGN_OR_RETURN(auto devices, lister.List());
  std::map<std::string, std::pair<std::string, std::string>> owner_of;
  for (const auto& d : devices)
    if (d.resource == names.core || d.resource == names.memory)
      owner_of[d.device_id] = {d.namespace_ + "/" + d.pod, d.container};
  return owner_of;
}

}  // namespace

void BlockSignals() { BlockStopSignals(/*with_reload=*/true); }

DevicePlugin::DevicePlugin(gpu::GpuLayer* gpu, Options options, Config config)
    : gpu_(gpu),
      options_(std::move(options)),
      sources_(options_.sources),
      config_(std::move(config)) {}

DevicePlugin::~DevicePlugin() { Stop(); }

absl::Status DevicePlugin::Start() {
  ASSIGN_OR_RETURN(inventory_, gpu_->GetInventory());
  absl::MutexLock l(&mu_);
  health_ = std::make_unique<HealthMonitor>(gpu_, inventory_, config_.health);
  manager_ = std::make_unique<kubelet::PluginManager>(options_.manager);
  RETURN_IF_ERROR(Apply(config_));
  health_->Start();
  if (vgpu_ && options_.pod_resources) {
    // Grants of the checkpoint are checked against the kubelet's record at once, not a reconcile
    // interval later: an agent stopped between a grant and its correction left that guess there.
    absl::MutexLock w(&wake_mu_);
    granted_ = true;
  }
  reconciler_ = std::thread([this] {
    // The inventory at once, not a reconcile interval after the vGPU resources were registered:
    // until it is on the Node, the extender knows the node's GPUs only by made-up names.
    if (std::shared_ptr<vgpu::NodeAssigner> a = vgpu(); a && options_.api) {
      if (absl::Status s = PublishVgpuPool(*a); !s.ok())
        spdlog::warn("vGPU: {}", std::string(s.message()));
      if (absl::Status s = a->Reannotate(); !s.ok())
        spdlog::warn("vGPU: {}", std::string(s.message()));
    }
    absl::Time next = absl::Now() + config().vgpu.reconcile_interval;
    for (;;) {
      bool granted = false, stop = false;
      {
        absl::MutexLock l(&wake_mu_);
        auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(wake_mu_) {
          return reconciler_stop_ || granted_;
        };
        wake_mu_.AwaitWithDeadline(absl::Condition(&woken), next);
        stop = reconciler_stop_;
        granted = std::exchange(granted_, false);
      }
      if (granted)  // when stopping, one last look at the kubelet's record (Stop())
        if (absl::Status s = CorrectVgpuSoon(); !s.ok())
          spdlog::warn("vGPU: after a grant: {}", std::string(s.message()));
      if (stop) return;
      if (absl::Now() < next) continue;  // a burst of grants does not hold off the housekeeping
      if (absl::Status s = ReconcileVgpu(); !s.ok())
        spdlog::warn("vGPU: {}", std::string(s.message()));
      next = absl::Now() + config().vgpu.reconcile_interval;
    }
  });
  if (inventory_.devices.empty()) spdlog::warn("no GPUs found; serving nothing until a reload");
  return absl::OkStatus();
}

absl::Status DevicePlugin::Apply(const Config& cfg) {
  for (const std::string& n : cfg.notes) spdlog::warn("{}", n);
  std::vector<MpsShare> shares;
  ASSIGN_OR_RETURN(auto resources,
                   BuildResources(inventory_, cfg, health_.get(), options_.host_root, &shares));
  auto pool = vgpu::PoolGpus(inventory_, cfg.vgpu.gpus, cfg.vgpu.nominal_memory);
  if (!pool.ok())
    return absl::InvalidArgumentError(absl::StrCat("gpulet.vgpu.gpus: ", pool.status().message()));
  if (!cfg.dra.gpus.empty()) {
    // The DRA driver serves these GPUs and their MIG devices (agent, src/dra): the kubelet must
    // never also book them through the device plugin.
    auto dra_ids = gpu::DevicePluginIds(inventory_, cfg.dra.gpus);
    if (!dra_ids.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("gpulet.dra.gpus: ", dra_ids.status().message()));
    for (const auto& g : *pool)
      if (dra_ids->count(g.uuid))
        return absl::InvalidArgumentError(
            absl::StrCat("gpulet.dra.gpus and gpulet.vgpu.gpus both name GPU ", g.index, " (",
                         g.uuid, "); a GPU is served one way"));
    for (auto& r : resources) r = std::make_shared<WithoutPool>(std::move(r), *dra_ids, "DRA");
    std::erase_if(resources, [](const auto& r) { return r->Devices().empty(); });
  }
  std::shared_ptr<vgpu::NodeAssigner> assigner;
  std::string key;
  if (!pool->empty()) {
    if (auto p = vgpu::MakeVgpuPolicy(cfg.vgpu.policy); !p.ok())
      return absl::InvalidArgumentError(absl::StrCat("gpulet.vgpu.policy: ", p.status().message()));
    std::set<std::string> hidden;
    for (const auto& g : *pool) hidden.insert({g.uuid, std::to_string(g.index)});
    for (auto& r : resources) r = std::make_shared<WithoutPool>(std::move(r), hidden);
    std::erase_if(resources, [](const auto& r) { return r->Devices().empty(); });
    vgpu::NodeOptions no;
    no.node_name = options_.node_name;
    no.state_dir = cfg.vgpu.state_dir;
    no.library_host_path = cfg.vgpu.library;
    no.accounting_tmpfs = cfg.vgpu.accounting_tmpfs;
    no.policy = cfg.vgpu.policy;
    no.nominal_memory = cfg.vgpu.nominal_memory;
    // The same settings keep the assigner (and a container's half-done Allocate pair); the
    // delivery settings are among them, so a kept assigner's delivery is still right.
    key = absl::StrCat(cfg.vgpu.gpus, "|", cfg.vgpu.nominal_memory, "|", cfg.vgpu.state_dir, "|",
                       cfg.vgpu.library, "|", cfg.vgpu.accounting_tmpfs, "|", cfg.vgpu.policy, "|",
                       cfg.list.envvar, cfg.list.volume_mounts, cfg.list.cdi_annotations,
                       cfg.list.cdi_cri, cfg.pass_device_specs, "|", cfg.DevRoot(), "|",
                       cfg.cdi_annotation_prefix, "|", cfg.id_strategy == IdStrategy::kIndex);
    if (vgpu_ && key == vgpu_key_) {
      assigner = vgpu_;
    } else {
      ASSIGN_OR_RETURN(no.deliver,
                       MakeGpuDelivery(inventory_, cfg, options_.host_root, no.names.core));
      if (options_.pod_resources) {
        no.granted = [this] {
          absl::MutexLock l(&wake_mu_);
          granted_ = true;
        };
      }
      assigner = std::make_shared<vgpu::NodeAssigner>(no, *pool, options_.api);
      RETURN_IF_ERROR(assigner->Load());
      assigner->StartWatching();  // with an API server: ended pods freed from their watch event
      if (!options_.api)
        spdlog::info(
            "vGPU: no API server (agent --node-name not set): containers are placed "
            "from the kubelet's counts by policy {}; pods are named from PodResources",
            cfg.vgpu.policy);
    }
    std::map<std::string, uint32_t> position;
    for (size_t i = 0; i < inventory_.devices.size(); ++i)
      position[inventory_.devices[i].uuid] = static_cast<uint32_t>(i);
    HealthMonitor* health = health_.get();
    auto vcuda = vgpu::MakeVcudaResources(
        assigner,
        [health, position](const std::string& uuid) {
          auto it = position.find(uuid);
          return it != position.end() && health->Healthy(it->second);
        },
        health->changes());
    resources.insert(resources.end(), vcuda.begin(), vcuda.end());
  }
  // MPS control daemons: one per shared resource, ready before the resource is served (as
  // NVIDIA's plugin waits for its daemon). An unchanged share keeps its running daemon; a changed
  // one is replaced (the pipe directory is the resource's, so the old one stops first).
  std::map<std::string, std::shared_ptr<MpsDaemon>> next;
  std::vector<std::shared_ptr<MpsDaemon>> replaced, fresh;
  auto undo = [&] {
    for (auto& d : fresh) d->Stop();
    for (auto& d : replaced)
      if (absl::Status s = d->Start(); !s.ok()) spdlog::error("MPS: {}", std::string(s.message()));
  };
  for (MpsShare& share : shares) {
    MpsOptions mo;
    mo.root = cfg.mps_root;
    mo.bin_dir = cfg.mps_bin_dir;
    if (mo.bin_dir.empty()) {
      mo.bin_dir = options_.mps_bin_dir;
      mo.env = options_.mps_env;
    }
    mo.probe_interval = options_.mps_probe_interval;
    HealthMonitor* health = health_.get();
    mo.on_health_change = [health] { health->NotifyChanged(); };
    auto it = mps_.find(share.resource);
    if (it != mps_.end() && it->second->share() == share && it->second->options().root == mo.root &&
        it->second->options().bin_dir == mo.bin_dir) {
      next[share.resource] = it->second;
      continue;
    }
    if (it != mps_.end()) {
      it->second->Stop();
      replaced.push_back(it->second);
    }
    auto d = std::make_shared<MpsDaemon>(share, mo);
    if (absl::Status s = d->Start(); !s.ok()) {
      undo();
      return s;
    }
    fresh.push_back(d);
    next[share.resource] = d;
  }
  for (auto& r : resources)
    if (auto it = next.find(r->name()); it != next.end())
      r = std::make_shared<MpsGated>(std::move(r), it->second);
  for (const auto& r : resources)
    spdlog::info("resource {}: {} devices", r->name(), r->Devices().size());
  if (absl::Status s = manager_->SetResources(std::move(resources)); !s.ok()) {
    undo();
    return s;
  }
  for (auto& [name, d] : mps_)
    if (!next.count(name)) d->Stop();
  mps_ = std::move(next);
  health_->SetConfig(cfg.health);
  vgpu_ = std::move(assigner);
  vgpu_key_ = key;
  if (on_applied_) on_applied_(cfg);
  return absl::OkStatus();
}

std::map<std::string, std::shared_ptr<MpsDaemon>> DevicePlugin::mps_daemons() const {
  absl::MutexLock l(&mu_);
  return mps_;
}

void DevicePlugin::OnConfigApplied(std::function<void(const Config&)> fn) {
  absl::MutexLock l(&mu_);
  on_applied_ = std::move(fn);
}

std::shared_ptr<vgpu::NodeAssigner> DevicePlugin::vgpu() const {
  absl::MutexLock l(&mu_);
  return vgpu_;
}

absl::Status DevicePlugin::PublishVgpuPool(vgpu::NodeAssigner& a) {
  HealthMonitor* health = health_.get();
  const gpu::Inventory& inv = inventory_;
  return a.PublishPool([health, &inv](const std::string& uuid) {
    for (size_t i = 0; i < inv.devices.size(); ++i)
      if (inv.devices[i].uuid == uuid) return health->Healthy(static_cast<uint32_t>(i));
    return false;
  });
}

absl::Status DevicePlugin::ReconcileVgpu() {
  std::shared_ptr<vgpu::NodeAssigner> a = vgpu();
  if (!a) return absl::OkStatus();
  absl::Duration interval = config().vgpu.reconcile_interval;
  std::map<std::string, std::pair<std::string, std::string>> owner_of;
  bool listed = false;
  if (options_.pod_resources) {
    auto owners = KubeletOwners(*options_.pod_resources, a->options().names);
    if (owners.ok()) {
      listed = true;
      owner_of = *std::move(owners);
      RETURN_IF_ERROR(a->Correct(owner_of));
    }
  }
  if (options_.api) {
    absl::Status published = PublishVgpuPool(*a);
    absl::Status released = a->ReleaseGoneFromApi();
    return published.ok() ? released : published;
  }
  if (!listed) return absl::OkStatus();  // no view of the pods: keep everything
  std::set<std::string> held;
  for (const auto& [id, owner] : owner_of) held.insert(id);
  // The kubelet records an allocation right after Allocate answers: two passes of grace.
  return a->ReleaseNotHeld(held,
                           absl::ToChronoNanoseconds(std::max(2 * interval, absl::Seconds(1))));
}

absl::Status DevicePlugin::CorrectVgpuSoon() {
  std::shared_ptr<vgpu::NodeAssigner> a = vgpu();
  if (!a || !options_.pod_resources) return absl::OkStatus();
  const int64_t since = absl::ToUnixNanos(absl::Now() - absl::Seconds(10));
  bool stopping = false;
  for (int pass = 0; pass < 40; ++pass) {
    {
      absl::MutexLock l(&wake_mu_);
      auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(wake_mu_) { return reconciler_stop_; };
      // Stopping: serving has ended, so the kubelet has recorded every answer; one pass, now.
      stopping = wake_mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(50));
      granted_ = false;  // this pass reads the record after that grant too
    }
    ASSIGN_OR_RETURN(auto owner_of, KubeletOwners(*options_.pod_resources, a->options().names));
    RETURN_IF_ERROR(a->Correct(owner_of));
    if (stopping) break;
    std::vector<vgpu::Grant> grants = a->grants();
    if (std::all_of(grants.begin(), grants.end(), [&](const vgpu::Grant& g) {
          return g.time_ns < since || g.device_ids.empty() || owner_of.count(g.device_ids[0]);
        }))
      break;
  }
  return absl::OkStatus();
}

absl::Status DevicePlugin::Reload() {
  ConfigSources sources;
  {
    absl::MutexLock l(&mu_);
    sources = sources_;
  }
  return ReloadFrom(sources.file);
}

absl::Status DevicePlugin::ReloadFrom(const std::string& file) {
  absl::Status s = [&]() -> absl::Status {
    ConfigSources sources;
    {
      absl::MutexLock l(&mu_);
      sources = sources_;
    }
    sources.file = file;
    ASSIGN_OR_RETURN(Config cfg, LoadConfig(sources));
    absl::MutexLock l(&mu_);
    if (!manager_) return absl::FailedPreconditionError("not started");
    if (stopping_) return absl::FailedPreconditionError("stopping");
    RETURN_IF_ERROR(Apply(cfg));
    config_ = std::move(cfg);
    sources_.file = file;
    return absl::OkStatus();
  }();
  if (s.ok()) {
    spdlog::info("configuration reloaded");
  } else {
    spdlog::error("reload failed, keeping the previous configuration: {}",
                  std::string(s.message()));
  }
  return s;
}

int DevicePlugin::Run() {
  const sigset_t set = StopSignals(/*with_reload=*/true);
  const std::string file = options_.watch_file ? options_.sources.file : "";
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
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  // Serving stops first: the reconciler corrects grants made until then (it is told to stop
  // after), so this agent does not leave a guess the kubelet contradicts for the next one.
  if (manager_) manager_->Stop();
  {
    absl::MutexLock l(&wake_mu_);
    reconciler_stop_ = true;
  }
  if (reconciler_.joinable()) reconciler_.join();
  std::map<std::string, std::shared_ptr<MpsDaemon>> daemons;
  {
    absl::MutexLock l(&mu_);
    daemons.swap(mps_);
  }
  for (auto& [name, d] : daemons) d->Stop();
  if (health_) health_->Stop();
}

Config DevicePlugin::config() const {
  absl::MutexLock l(&mu_);
  return config_;
}

}  // namespace gpulet::plugin
