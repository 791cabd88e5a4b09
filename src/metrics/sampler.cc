#include "metrics/sampler.h"

#include <algorithm>
#include <tuple>

#include "abi/vgpu_accounting_read.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

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
  if (!grants_) return absl::FailedPreconditionError("vGPU usage: no grant record to check it by");
  ASSIGN_OR_RETURN(std::vector<VgpuGrantRecord> grants, grants_());
  std::vector<VgpuContainerUsage> out;
  std::map<std::string, std::pair<uint64_t, Clock::TimePoint>> seen;
  Clock::TimePoint now = clock_->Now();
  for (const VgpuGrantRecord& g : grants) {
    // Two plain path components below the root: never "..", never absolute.
    std::vector<absl::string_view> parts = absl::StrSplit(g.dir, '/');
    if (parts.size() != 2 || std::any_of(parts.begin(), parts.end(), [](absl::string_view p) {
          return p.empty() || p == "." || p == "..";
        })) {
      continue;
    }
    std::string path = absl::StrCat(root_, "/", g.dir, "/accounting");
    // Never mapped: the file is the container's to truncate (see
    // abi/vgpu_accounting_read.h).
    bool cut = false;
    absl::StatusOr<vgpu::AccountingSnapshot> read = vgpu::ReadAccountingFile(path, &cut);
    if (cut) spdlog::warn("vGPU: {} had grown past its region; cut back", path);
    if (!read.ok()) {
      if (!absl::IsNotFound(read.status()))
        spdlog::debug("vGPU: {}", std::string(read.status().message()));
      continue;
    }
    const vgpu::AccountingSnapshot& a = *read;
    if (a.device_uuid[0] != 0 && g.gpu_uuid != a.device_uuid) {
      spdlog::debug("vGPU: {} names GPU {}, granted {}: reported under the grant's", path,
                    a.device_uuid, g.gpu_uuid);
    }
    VgpuContainerUsage u;
    u.namespace_ = g.ns;
    u.pod = g.pod.empty() ? std::string(parts[0]) : g.pod;
    u.container = g.container;
    u.gpu_uuid = g.gpu_uuid;
    u.memory_limit_bytes = g.memory_limit_bytes;
    u.memory_used_bytes = std::min(a.memory_used, g.memory_limit_bytes);
    u.core_limit_ratio = g.core_limit_ratio;
    if (auto it = last_busy_.find(path); it != last_busy_.end() && a.busy_ns >= it->second.first) {
      double wall = std::chrono::duration<double, std::nano>(now - it->second.second).count();
      if (wall > 0) u.utilization_ratio = std::min(1.0, (a.busy_ns - it->second.first) / wall);
    }
    seen[path] = {a.busy_ns, now};
    out.push_back(std::move(u));
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
  health_.reset();        // its subscription and thread go before the layer they read
  subscription_.reset();  // no event callbacks into a dying sampler
}

std::shared_ptr<const Snapshot> Sampler::snapshot() const {
  absl::MutexLock l(&snap_mu_);
  return snapshot_;
}

std::shared_ptr<const Snapshot> Sampler::ScrapeSnapshot() {
  std::shared_ptr<const Snapshot> snap = snapshot();
  if (!pods_ || !snap->sample) return snap;
  // One List per gap for all scrapers together: the first scrape of a gap claims it.
  const int64_t now = SteadyMs(), gap = options_.scrape_list_gap.count();
  int64_t last = scrape_list_ms_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < gap) return snap;
  if (!scrape_list_ms_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return snap;
  if (!pods_->state().up) return snap;
  pods_->RefreshNow();
  if (pods_->state().generation == snap->pods_generation) return snap;
  if (cycle_mu_.TryLock()) {
    snap = snapshot();  // a cycle may have published since: attribute the newest readings
    Sample s = *snap->sample;
    uint64_t generation = Attribute(s);
    if (generation != snap->pods_generation) {
      Publish(std::move(s), generation, snap->taken);  // `taken` stays: /health sees a stall
    }
    cycle_mu_.Unlock();
  }
  return snapshot();
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
      spdlog::warn("metrics: GPU layer unavailable: {}", std::string(opened.status().message()));
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
      if (!health_ && options_.device_health) health_ = options_.device_health(layer, *inv);
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
          // Answering is not enough: a GPU the device plugin withdrew (a fatal XID, isolation)
          // is unhealthy here too.
          ds.healthy = !health_ || health_->Reason(ds.device).empty();
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

uint64_t Sampler::Attribute(Sample& s) {
  s.containers.clear();
  if (!pods_) return 0;
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
  return ps.generation;
}

void Sampler::SampleOnce() {
  absl::MutexLock cycle(&cycle_mu_);
  Clock::TimePoint start = clock_->Now();
  Sample s = Collect();
  uint64_t generation = Attribute(s);
  stats_.cycles += 1;
  stats_.collect_seconds = std::chrono::duration<double>(clock_->Now() - start).count();
  stats_.collect_unix_ms = clock_->UnixSeconds() * 1000;
  if (options_.bare_pods_reported) stats_.bare_pods_reported = options_.bare_pods_reported();
  Publish(std::move(s), generation, clock_->Now());
}

void Sampler::Publish(Sample s, uint64_t pods_generation, Clock::TimePoint taken) {
  auto snap = std::make_shared<Snapshot>();
  s.self = stats_;
  snap->self = stats_;
  snap->taken = taken;
  snap->pods_generation = pods_generation;
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
