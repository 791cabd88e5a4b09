#include "metrics/sampler.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "spdlog/spdlog.h"
#include "vgpu/interposer/accounting_read.h"

namespace gpulet::metrics {
namespace {
// Real time on purpose: gzip bookkeeping follows actual scrapes, not a test's manual clock.
int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

absl::StatusOr<std::vector<VgpuContainerUsage>> AccountingDirUsageSource::Read() {
  RootedFilesystem fs("/");
  absl::StatusOr<std::vector<std::string>> pods = fs.ListDir(root_);
  if (!pods.ok()) {
    // No vGPU container has started on this node yet: nothing to report, not an error.
    if (absl::IsNotFound(pods.status())) return std::vector<VgpuContainerUsage>{};
    return pods.status();
  }
  std::vector<VgpuContainerUsage> out;
  std::map<std::string, std::pair<uint64_t, Clock::TimePoint>> seen;
  Clock::TimePoint now = clock_->Now();
  for (const std::string& uid : *pods) {
    std::string pod_dir = absl::StrCat(root_, "/", uid);
    absl::StatusOr<std::vector<std::string>> containers = fs.ListDir(pod_dir);
    if (!containers.ok()) continue;  // a plain file, or removed meanwhile
    std::string ns, pod = uid;
    if (absl::StatusOr<std::string> meta = fs.ReadFile(pod_dir + "/pod"); meta.ok()) {
      std::string m(absl::StripAsciiWhitespace(*meta));
      if (size_t slash = m.find('/'); slash != std::string::npos) {
        ns = m.substr(0, slash);
        pod = m.substr(slash + 1);
      }
    }
    for (const std::string& c : *containers) {
      std::string path = absl::StrCat(pod_dir, "/", c, "/accounting");
      // Never mapped: the file is the container's to truncate (see
      // vgpu/interposer/accounting_read.h).
      bool cut = false;
      absl::StatusOr<vgpu::AccountingSnapshot> read = vgpu::ReadAccountingFile(path, &cut);
      if (cut) spdlog::warn("vGPU: {} had grown past its region; cut back", path);
      if (!read.ok()) {
        if (!absl::IsNotFound(read.status())) spdlog::debug("vGPU: {}", read.status().ToString());
        continue;
      }
      const vgpu::AccountingSnapshot& a = *read;
      VgpuContainerUsage u;
      u.namespace_ = ns;
      u.pod = pod;
      u.container = c;
      u.gpu_uuid = a.device_uuid;
      u.memory_used_bytes = a.memory_used;
      u.memory_limit_bytes = a.memory_limit;
      u.core_limit_ratio = a.core_limit / 100.0;
      if (auto it = last_busy_.find(path);
          it != last_busy_.end() && a.busy_ns >= it->second.first) {
        double wall = std::chrono::duration<double, std::nano>(now - it->second.second).count();
        if (wall > 0) u.utilization_ratio = std::min(1.0, (a.busy_ns - it->second.first) / wall);
      }
      seen[path] = {a.busy_ns, now};
      out.push_back(std::move(u));
    }
  }
  last_busy_ = std::move(seen);
  return out;
}

Sampler::Sampler(gpu::GpuLayer* gpu, GpuOpener opener, kubelet::PodResourcesCache* pods,
                 VgpuUsageSource* vgpu, Clock* clock, SamplerOptions options)
    : external_gpu_(gpu),
      opener_(std::move(opener)),
      pods_(pods),
      vgpu_(vgpu),
      clock_(clock ? clock : RealClock()),
      options_(std::move(options)),
      snapshot_(std::make_shared<Snapshot>()) {}

Sampler::~Sampler() { Stop(); }

void Sampler::Start() {
  SampleOnce();
  {
    absl::MutexLock l(&stop_mu_);
    if (thread_.joinable()) return;
    stop_ = false;
  }
  thread_ = std::thread([this] {
    while (true) {
      bool poked = false;
      {
        absl::MutexLock l(&stop_mu_);
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stop_mu_) { return stop_ || poked_; };
        stop_mu_.AwaitWithTimeout(absl::Condition(&wake), absl::FromChrono(options_.interval));
        if (stop_) return;
        poked = poked_;
        poked_ = false;
      }
      // Only a poke asks the kubelet here; the timer refresh is the cache's own.
      if (poked && pods_) pods_->RefreshNow();
      SampleOnce();
      if (poked) {
        absl::MutexLock l(&stop_mu_);
        ++pokes_handled_;
      }
    }
  });
}

void Sampler::NoteRequest(Format f, bool gzip) {
  requested_ms_[2 * (f == Format::kOpenMetrics) + gzip].store(SteadyMs(),
                                                              std::memory_order_relaxed);
}

void Sampler::Poke() {
  absl::MutexLock l(&stop_mu_);
  poked_ = true;
}

uint64_t Sampler::pokes_handled() const {
  absl::MutexLock l(&stop_mu_);
  return pokes_handled_;
}

void Sampler::Stop() {
  {
    absl::MutexLock l(&stop_mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock l(&cycle_mu_);
  subscription_.reset();  // no event callbacks into a dying sampler
}

std::shared_ptr<const Snapshot> Sampler::snapshot() const {
  absl::MutexLock l(&snap_mu_);
  return snapshot_;
}

void Sampler::OnEvent(const gpu::Event& e) {
  if (e.type != gpu::Event::Type::kXid) return;
  absl::MutexLock l(&xid_mu_);
  XidState& x = xids_[e.uuid];
  x.counts[static_cast<uint32_t>(e.data)] += 1;
  x.last = static_cast<uint32_t>(e.data);
}

gpu::GpuLayer* Sampler::Layer() {
  gpu::GpuLayer* layer = external_gpu_ ? external_gpu_ : owned_gpu_.get();
  if (!layer && opener_) {
    absl::StatusOr<std::unique_ptr<gpu::GpuLayer>> opened = opener_();
    if (!opened.ok()) {
      spdlog::warn("metrics: GPU layer unavailable: {}", opened.status().ToString());
      return nullptr;
    }
    owned_gpu_ = *std::move(opened);
    layer = owned_gpu_.get();
  }
  if (layer && !subscription_) {
    subscription_ = layer->Subscribe([this](const gpu::Event& e) { OnEvent(e); });
  }
  return layer;
}

// NVML gives NVLink traffic only as counters; DCGM's NVLINK_*_BYTES are rates, so the rate is the
// growth since the previous cycle. A counter that went backwards (driver reload) starts over.
void Sampler::NvlinkRates(DeviceSample& ds, Clock::TimePoint now) {
  const gpu::Telemetry& t = *ds.telemetry;
  if (!t.nvlink_tx_kib || !t.nvlink_rx_kib) {
    nvlink_prev_.erase(ds.device.uuid);
    return;
  }
  auto [it, fresh] = nvlink_prev_.try_emplace(ds.device.uuid);
  NvlinkPrev& p = it->second;
  double secs = std::chrono::duration<double>(now - p.at).count();
  if (!fresh && secs > 0 && *t.nvlink_tx_kib >= p.tx_kib && *t.nvlink_rx_kib >= p.rx_kib) {
    ds.nvlink_tx_bytes_per_second = (*t.nvlink_tx_kib - p.tx_kib) * 1024.0 / secs;
    ds.nvlink_rx_bytes_per_second = (*t.nvlink_rx_kib - p.rx_kib) * 1024.0 / secs;
  }
  p = {*t.nvlink_tx_kib, *t.nvlink_rx_kib, now};
}

Sample Sampler::Collect() {
  Sample s;
  s.hostname = options_.hostname;
  bool nvml_ok = false;
  if (gpu::GpuLayer* layer = Layer()) {
    // A previous cycle found NVML broken: re-initialise before reading (the recovery path when
    // the driver comes back, with no restart of the exporter). A layer shared with the agent is
    // the agent's to re-initialise; here it is only read again.
    if (need_reinit_ && !owned_gpu_) need_reinit_ = false;
    if (need_reinit_) {
      absl::Status st = layer->Reinit();
      if (st.ok()) need_reinit_ = false;
    }
    absl::StatusOr<gpu::Inventory> inv =
        need_reinit_ ? absl::UnavailableError("reinit failed") : layer->GetInventory();
    if (inv.ok()) {
      s.driver_version = inv->driver_version;
      s.cuda_driver_version = inv->cuda_driver_version;
      size_t answered = 0;
      // Only what the enabled family sets render: the nvidia-smi set costs ~30 NVML calls per
      // GPU, GPM one sample per GPU (or GPU instance) and one metrics call.
      gpu::TelemetryRequest what;
      what.extended = options_.render.families & kNvidiaSmiFamilies;
      what.profiling = options_.render.families & (kDcgmFamilies | kGpuletFamilies);
      for (gpu::Device& d : inv->devices) {
        if (!d.Readable()) continue;  // no UUID to label its series with
        DeviceSample ds;
        absl::StatusOr<gpu::Telemetry> t = layer->ReadTelemetry(d.index, what);
        ds.device = std::move(d);
        if (t.ok()) {
          ds.telemetry = *std::move(t);
          ds.healthy = true;
          ++answered;
          NvlinkRates(ds, clock_->Now());
        }
        s.devices.push_back(std::move(ds));
      }
      // NVML is up when at least one GPU answered (one lost GPU is that GPU's problem, reported
      // by gpulet_gpu_healthy); a node with no GPU at all has a working NVML too.
      nvml_ok = answered > 0 || s.devices.empty();
      if (!nvml_ok) need_reinit_ = true;
      absl::MutexLock l(&xid_mu_);
      for (DeviceSample& ds : s.devices) {
        auto it = xids_.find(ds.device.uuid);
        if (it == xids_.end()) continue;
        ds.xid_counts = it->second.counts;
        ds.xid_last = it->second.last;
      }
    } else {
      need_reinit_ = true;
    }
  }
  stats_.nvml_up = nvml_ok;
  if (!nvml_ok) ++stats_.nvml_errors;

  if (pods_) {
    kubelet::PodResourcesCache::State ps = pods_->state();
    stats_.kubelet_enabled = true;
    stats_.kubelet_up = ps.up;
    stats_.kubelet_errors = ps.errors;
    gpu::Inventory view;  // ResolveDeviceId works on an inventory; rebuild a light one
    view.devices.reserve(s.devices.size());
    for (const DeviceSample& ds : s.devices) view.devices.push_back(ds.device);
    for (kubelet::PodDevice& pd : ps.devices) {
      std::optional<kubelet::DeviceRef> ref = kubelet::ResolveDeviceId(view, pd.device_id);
      if (!ref) continue;  // a device this node no longer has, or another vendor's ID
      s.containers.push_back({std::move(pd.namespace_), std::move(pd.pod), std::move(pd.container),
                              std::move(pd.resource), std::move(pd.device_id), ref->device,
                              ref->mig});
    }
    std::sort(s.containers.begin(), s.containers.end(), [](const auto& a, const auto& b) {
      return std::tie(a.device, a.mig, a.namespace_, a.pod, a.container, a.device_id) <
             std::tie(b.device, b.mig, b.namespace_, b.pod, b.container, b.device_id);
    });
  }

  if (vgpu_) {
    stats_.vgpu_enabled = true;
    absl::StatusOr<std::vector<VgpuContainerUsage>> usage = vgpu_->Read();
    stats_.vgpu_up = usage.ok();
    if (!usage.ok()) {
      ++stats_.vgpu_errors;
    } else {
      for (VgpuContainerUsage& u : *usage) {
        auto it = std::find_if(s.devices.begin(), s.devices.end(),
                               [&](const DeviceSample& d) { return d.device.uuid == u.gpu_uuid; });
        if (it == s.devices.end()) continue;
        s.vgpu.push_back({std::move(u.namespace_), std::move(u.pod), std::move(u.container),
                          static_cast<size_t>(it - s.devices.begin()), u.memory_used_bytes,
                          u.memory_limit_bytes, u.utilization_ratio, u.core_limit_ratio});
      }
    }
  }
  return s;
}

void Sampler::SampleOnce() {
  absl::MutexLock cycle(&cycle_mu_);
  Clock::TimePoint start = clock_->Now();
  Sample s = Collect();
  auto snap = std::make_shared<Snapshot>();
  stats_.cycles += 1;
  stats_.collect_seconds = std::chrono::duration<double>(clock_->Now() - start).count();
  stats_.collect_unix_ms = clock_->UnixSeconds() * 1000;
  if (options_.bare_pods_reported) stats_.bare_pods_reported = options_.bare_pods_reported();
  s.self = stats_;
  snap->self = stats_;
  snap->taken = clock_->Now();
  RenderGpuManager(s, Format::kText, &snap->gpu_manager);
  // Variant index 2 * OpenMetrics + gzip, as in requested_ms_.
  const int64_t now_ms = SteadyMs(), keep_ms = std::chrono::milliseconds(kFormatKeep).count();
  int64_t at[4];
  bool any_request = false;
  for (int v = 0; v < 4; ++v) {
    at[v] = requested_ms_[v].load(std::memory_order_relaxed);
    any_request |= at[v] != 0;
  }
  auto wanted = [&](int v) { return at[v] != 0 && now_ms - at[v] < keep_ms; };
  for (Format f : {Format::kText, Format::kOpenMetrics}) {
    const int om = f == Format::kOpenMetrics;
    const bool identity = wanted(2 * om) || !any_request, gzip = wanted(2 * om + 1);
    if (!identity && !gzip) continue;
    std::string& body = om ? snap->openmetrics : snap->text;
    // Reserve what the previous cycle needed: one allocation per body in the steady state.
    body.reserve(body_size_hint_[om] + body_size_hint_[om] / 8);
    Render(s, options_.render, f, &body);
    body_size_hint_[om] = body.size();
    if (gzip) (om ? snap->openmetrics_gz : snap->text_gz) = GzipOpen(body);
    if (!identity) std::string().swap(body);
  }
  snap->sample = std::make_shared<const Sample>(std::move(s));
  absl::MutexLock l(&snap_mu_);
  snapshot_ = std::move(snap);
}

}  // namespace gpulet::metrics
