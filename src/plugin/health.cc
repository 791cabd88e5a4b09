#include "plugin/health.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/json.h"

namespace gpulet::plugin {
namespace {

// Resolution buckets of the XIDs NVIDIA's catalogue lists for data-centre GPUs. XIDs not listed are
// kUnknown and treated as critical, as NVIDIA's plugin treats every XID it does not skip.
struct XidEntry {
  uint64_t xid;
  XidBucket bucket;
};
constexpr XidEntry kXids[] = {
    {13, XidBucket::kRestartApp},       // graphics engine exception
    {31, XidBucket::kRestartApp},       // GPU memory page fault
    {32, XidBucket::kRestartApp},       // invalid or corrupted push buffer stream
    {43, XidBucket::kRestartApp},       // GPU stopped processing (the channel, not the GPU)
    {45, XidBucket::kIgnore},           // preemptive cleanup after a process ended
    {48, XidBucket::kResetGpu},         // double-bit ECC error
    {61, XidBucket::kResetGpu},         // internal micro-controller breakpoint
    {62, XidBucket::kResetGpu},         // internal micro-controller halt
    {63, XidBucket::kIgnore},           // row remapping / page retirement recorded
    {64, XidBucket::kResetGpu},         // row remapping / page retirement failed
    {68, XidBucket::kRestartApp},       // video processor exception
    {69, XidBucket::kRestartApp},       // graphics engine class error
    {74, XidBucket::kResetGpu},         // NVLink error
    {79, XidBucket::kRestartBm},        // GPU has fallen off the bus
    {92, XidBucket::kIgnore},           // high single-bit ECC rate (corrected)
    {94, XidBucket::kRestartApp},       // contained ECC error: only the faulting context dies
    {95, XidBucket::kResetGpu},         // uncontained ECC error
    {109, XidBucket::kResetGpu},        // context switch timeout: the catalogue says reset, while
                                        // NVIDIA's plugin ignores it (its issue #1974)
    {119, XidBucket::kResetGpu},        // GSP RPC timeout
    {120, XidBucket::kResetGpu},        // GSP error
    {121, XidBucket::kResetGpu},        // C2C link error
    {140, XidBucket::kContactSupport},  // unrecovered ECC error
};

}  // namespace

const char* XidBucketName(XidBucket b) {
  switch (b) {
    case XidBucket::kIgnore:
      return "IGNORE";
    case XidBucket::kRestartApp:
      return "RESTART_APP";
    case XidBucket::kResetGpu:
      return "RESET_GPU";
    case XidBucket::kRestartBm:
      return "RESTART_BM";
    case XidBucket::kContactSupport:
      return "CONTACT_SUPPORT";
    default:
      return "UNKNOWN";
  }
}

XidBucket ClassifyXid(uint64_t xid) {
  for (const auto& e : kXids)
    if (e.xid == xid) return e.bucket;
  return XidBucket::kUnknown;
}

bool IsCriticalXid(uint64_t xid, const HealthConfig& cfg) {
  if (cfg.enabled_xids.count(xid)) return true;
  if (cfg.disabled || cfg.xids_disabled || cfg.disabled_xids.count(xid)) return false;
  XidBucket b = ClassifyXid(xid);
  return b != XidBucket::kIgnore && b != XidBucket::kRestartApp;
}

absl::StatusOr<Isolation> ParseIsolation(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i, ++col)
      if (text[i] == '\n') ++line, col = 0;
    return absl::InvalidArgumentError(absl::StrCat(where, ":", line, ":", col, ": not valid JSON"));
  } catch (const nlohmann::json::exception& e) {
    // Valid syntax the library still refuses, e.g. a number too large for a double (1e999 is
    // out_of_range, not parse_error): an error like any other, never an abort of the agent.
    return absl::InvalidArgumentError(JsonErrorText(where, e.what(), "not usable JSON"));
  }
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(where,
                                                   ": must be an object {\"index\": [...], "
                                                   "\"uuid\": [...]}"));
  Isolation out;
  for (const auto& [key, value] : j.items()) {
    if (key != "index" && key != "uuid")
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown key \"", key, "\" (want index, uuid)"));
    if (!value.is_array())
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be a list"));
    for (const auto& v : value) {
      if (key == "index" && v.is_number_unsigned()) {
        out.indices.insert(std::to_string(v.get<uint64_t>()));
      } else if (v.is_string() && !v.get<std::string>().empty()) {
        (key == "index" ? out.indices : out.uuids).insert(v.get<std::string>());
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"", key, "\": bad entry ", v.dump()));
      }
    }
  }
  return out;
}

HealthMonitor::HealthMonitor(gpu::GpuLayer* gpu, const gpu::Inventory& inv, HealthConfig cfg,
                             Clock* clock)
    : gpu_(gpu), clock_(clock), cfg_(std::move(cfg)) {
  for (const auto& d : inv.devices) {
    GpuState s;
    s.uuid = d.uuid;
    for (const auto& m : d.mig_devices) {
      s.mig_uuids.push_back(m.uuid);
      s.mig_ids.emplace_back(m.gpu_instance_id, m.compute_instance_id);
    }
    gpus_.push_back(std::move(s));
  }
  absl::MutexLock l(&mu_);
  CheckIsolationFile();
}

HealthMonitor::~HealthMonitor() { Stop(); }

void HealthMonitor::Start() {
  if (thread_.joinable()) return;
  sub_ = gpu_->Subscribe([this](const gpu::Event& e) { OnEvent(e); });
  thread_ = std::thread([this] {
    for (;;) {
      CheckOnce();
      absl::MutexLock l(&mu_);
      // 50 ms slices: the isolation file is noticed quickly; probes run at probe_interval.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50));
      if (stopping_) return;
    }
  });
}

void HealthMonitor::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  sub_.reset();  // after this no callback runs
}

void HealthMonitor::SetConfig(HealthConfig cfg) {
  absl::MutexLock l(&mu_);
  bool path_changed = cfg.unhealthy_devices_file != cfg_.unhealthy_devices_file;
  cfg_ = std::move(cfg);
  if (path_changed) isolation_read_ = false, isolation_text_.clear();
  CheckIsolationFile();
  changes_.Notify();
}

std::string HealthMonitor::Reason(uint32_t index, int mig) const {
  absl::MutexLock l(&mu_);
  if (nvml_down_) return "NVML not answering: " + nvml_reason_;
  if (index >= gpus_.size()) return "unknown device";
  const GpuState& g = gpus_[index];
  if (!g.xid_reason.empty()) return g.xid_reason;
  if (!g.probe_reason.empty()) return g.probe_reason;
  if (mig >= 0) {
    if (auto it = g.mig_xid.find(mig); it != g.mig_xid.end()) return it->second;
  }
  const std::string idx = std::to_string(index);
  if (isolation_.indices.count(idx) || isolation_.uuids.count(g.uuid))
    return "isolated by " + cfg_.unhealthy_devices_file;
  if (mig >= 0 &&
      (isolation_.indices.count(absl::StrCat(idx, ":", mig)) ||
       (mig < static_cast<int>(g.mig_uuids.size()) && isolation_.uuids.count(g.mig_uuids[mig]))))
    return "isolated by " + cfg_.unhealthy_devices_file;
  return "";
}

bool HealthMonitor::Healthy(uint32_t index, int mig) const { return Reason(index, mig).empty(); }

bool HealthMonitor::nvml_down() const {
  absl::MutexLock l(&mu_);
  return nvml_down_;
}

std::vector<std::string> HealthMonitor::isolation_unmatched() const {
  absl::MutexLock l(&mu_);
  return UnmatchedIsolationEntries();
}

absl::Status HealthMonitor::isolation_status() const {
  absl::MutexLock l(&mu_);
  return isolation_status_;
}

void HealthMonitor::OnEvent(const gpu::Event& e) {
  if (e.type != gpu::Event::Type::kXid) return;  // ECC counts are metrics, the XID decides
  absl::MutexLock l(&mu_);
  if (cfg_.disabled) return;
  if (!IsCriticalXid(e.data, cfg_)) {
    spdlog::info("GPU {}: XID {} ({}) does not affect health", e.device_index, e.data,
                 XidBucketName(ClassifyXid(e.data)));
    return;
  }
  if (e.device_index >= gpus_.size()) return;
  GpuState& g = gpus_[e.device_index];
  std::string reason = absl::StrCat("XID ", e.data, " (", XidBucketName(ClassifyXid(e.data)), ")");
  int mig = -1;
  if (e.gpu_instance_id != gpu::Event::kAllInstances)
    for (size_t m = 0; m < g.mig_ids.size(); ++m)
      if (g.mig_ids[m].first == e.gpu_instance_id &&
          (e.compute_instance_id == gpu::Event::kAllInstances ||
           g.mig_ids[m].second == e.compute_instance_id))
        mig = static_cast<int>(m);
  if (mig >= 0) {
    g.mig_xid[mig] = reason;
  } else {
    g.xid_reason = reason;
  }
  g.ok_since.reset();  // the hold-down starts over
  spdlog::warn("GPU {}{}: {} -> Unhealthy", e.device_index, mig >= 0 ? absl::StrCat(":", mig) : "",
               reason);
  changes_.Notify();
}

std::vector<std::string> HealthMonitor::UnmatchedIsolationEntries() const {
  std::vector<std::string> out;
  for (const std::string& e : isolation_.indices) {
    std::pair<std::string, std::string> parts = absl::StrSplit(e, absl::MaxSplits(':', 1));
    uint32_t gpu = 0, mig = 0;
    bool ok = absl::SimpleAtoi(parts.first, &gpu) && gpu < gpus_.size();
    if (ok && e.find(':') != std::string::npos)
      ok = absl::SimpleAtoi(parts.second, &mig) && mig < gpus_[gpu].mig_uuids.size();
    if (!ok) out.push_back("index " + e);
  }
  for (const std::string& u : isolation_.uuids) {
    bool ok = std::any_of(gpus_.begin(), gpus_.end(), [&](const GpuState& g) {
      return g.uuid == u ||
             std::find(g.mig_uuids.begin(), g.mig_uuids.end(), u) != g.mig_uuids.end();
    });
    if (!ok) out.push_back("uuid " + u);
  }
  return out;
}

void HealthMonitor::CheckIsolationFile() {
  const std::string& path = cfg_.unhealthy_devices_file;
  if (path.empty()) return;
  auto text = ReadFileToString(path);
  std::string content = text.ok() ? *text : "";
  if (isolation_read_ && content == isolation_text_) return;
  isolation_read_ = true;
  isolation_text_ = content;
  if (!text.ok() || content.find_first_not_of(" \t\r\n") == std::string::npos) {
    // No file (or an empty one): nothing isolated.
    if (!isolation_.indices.empty() || !isolation_.uuids.empty()) changes_.Notify();
    isolation_ = {};
    isolation_status_ = absl::OkStatus();
    return;
  }
  auto parsed = ParseIsolation(content, path);
  if (!parsed.ok()) {
    // Keep the last good list: a half-edited file must not put isolated GPUs back in service.
    spdlog::error("{} (keeping the previous isolation list)",
                  std::string(parsed.status().message()));
    isolation_status_ = parsed.status();
    return;
  }
  isolation_status_ = absl::OkStatus();
  if (parsed->indices != isolation_.indices || parsed->uuids != isolation_.uuids) {
    isolation_ = std::move(*parsed);
    std::vector<std::string> unmatched = UnmatchedIsolationEntries();
    spdlog::info("{}: {} index and {} uuid entries isolated", path, isolation_.indices.size(),
                 isolation_.uuids.size());
    if (!unmatched.empty()) {
      // Said plainly: an entry naming no device isolates nothing (a typo would otherwise read as
      // "isolated" while the GPU meant stays in service).
      spdlog::warn("{}: {} match no device of this node and isolate nothing", path,
                   absl::StrJoin(unmatched, ", "));
    }
    changes_.Notify();
  }
}

void HealthMonitor::CheckOnce() {
  const Clock::TimePoint now = clock_->Now();
  bool reinit = false, probe = false;
  {
    absl::MutexLock l(&mu_);
    CheckIsolationFile();
    if (cfg_.disabled) return;
    if (nvml_down_) {
      reinit = now >= next_reinit_;
    } else if (now >= next_probe_) {
      probe = true;
      next_probe_ = now + absl::ToChronoNanoseconds(cfg_.probe_interval);
    }
  }
  if (reinit) {
    absl::Status s = gpu_->Reinit();
    absl::MutexLock l(&mu_);
    if (s.ok()) {
      spdlog::info("NVML answers again; devices are back");
      nvml_down_ = false;
      reinit_backoff_ = {};
      next_probe_ = now;  // probe at once: a device may still be lost
      changes_.Notify();
    } else {
      reinit_backoff_ = std::min<Clock::Duration>(
          std::max<Clock::Duration>(reinit_backoff_ * 2, std::chrono::milliseconds(100)),
          std::chrono::seconds(30));
      next_reinit_ = now + reinit_backoff_;
      nvml_reason_ = std::string(s.message());
    }
    return;
  }
  if (!probe) return;
  std::vector<absl::Status> results;
  size_t n;
  {
    absl::MutexLock l(&mu_);
    n = gpus_.size();
  }
  for (size_t i = 0; i < n; ++i) results.push_back(gpu_->ProbeDevice(static_cast<uint32_t>(i)));
  absl::MutexLock l(&mu_);
  size_t failed = 0;
  for (const auto& r : results) failed += !r.ok();
  if (n > 0 && failed == n) {
    // Nothing answers: NVML itself is broken (the "zombie node"). Take everything out of service
    // and re-initialise with backoff rather than keep advertising devices nobody can use.
    nvml_down_ = true;
    nvml_reason_ = std::string(results[0].message());
    next_reinit_ = now;
    reinit_backoff_ = {};
    spdlog::error("NVML fails for every GPU ({}): all devices Unhealthy", nvml_reason_);
    changes_.Notify();
    return;
  }
  const auto hold = absl::ToChronoNanoseconds(cfg_.hold_down);
  for (size_t i = 0; i < n; ++i) {
    GpuState& g = gpus_[i];
    if (!results[i].ok()) {
      std::string reason = absl::StrCat("probe failed: ", results[i].message());
      if (g.probe_reason != reason) {
        spdlog::warn("GPU {}: {} -> Unhealthy", i, reason);
        g.probe_reason = reason;
        changes_.Notify();
      }
      g.ok_since.reset();
      continue;
    }
    if (g.xid_reason.empty() && g.probe_reason.empty() && g.mig_xid.empty()) continue;
    if (!g.ok_since) {
      g.ok_since = now;
    } else if (now - *g.ok_since >= hold) {
      spdlog::info("GPU {}: answered normally for {}; Healthy again", i,
                   absl::FormatDuration(cfg_.hold_down));
      g.xid_reason.clear();
      g.probe_reason.clear();
      g.mig_xid.clear();
      g.ok_since.reset();
      changes_.Notify();
    }
  }
}

}  // namespace gpulet::plugin
