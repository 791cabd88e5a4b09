#include "runtime/cdi_refresh.h"

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace gpulet::runtime {

CdiRefresher::CdiRefresher(gpu::GpuLayer* gpu, std::string path, CdiGenerateOptions options,
                           std::chrono::milliseconds interval)
    : gpu_(gpu), path_(std::move(path)), options_(std::move(options)), interval_(interval) {}

CdiRefresher::~CdiRefresher() { Stop(); }

absl::StatusOr<bool> CdiRefresher::RefreshOnce() {
  ASSIGN_OR_RETURN(gpu::Inventory inv, gpu_->GetInventory());
  std::vector<std::string> warnings;
  ASSIGN_OR_RETURN(CdiSpec spec, GenerateCdiSpec(inv, options_, &warnings));
  std::string text = absl::EndsWith(path_, ".json") ? CdiSpecToJson(spec) : CdiSpecToYaml(spec);
  auto old = ReadFileToString(path_);
  if (old.ok() && *old == text) return false;
  for (const auto& w : warnings) spdlog::warn("CDI spec {}: {}", path_, w);
  RETURN_IF_ERROR(WriteFileAtomic(path_, text, 0644));
  spdlog::info("CDI spec {} written: {} device names", path_, spec.devices.size());
  return true;
}

void CdiRefresher::Start() {
  absl::MutexLock l(&mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  // Events come before the re-init that changes the inventory; the loop re-reads soon after.
  events_ = gpu_->Subscribe([this](const gpu::Event&) {
    absl::MutexLock l(&mu_);
    wake_ = true;
  });
  thread_ = std::thread([this] { Loop(); });
}

void CdiRefresher::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  events_.reset();  // no callback runs past this point
  if (thread_.joinable()) thread_.join();
}

void CdiRefresher::Loop() {
  // After an event: a few quick re-reads (1 s apart), then the normal interval.
  int quick = 0;
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      absl::Duration wait = quick > 0 ? absl::Seconds(1) : absl::FromChrono(interval_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.AwaitWithTimeout(absl::Condition(&woken), wait);
      if (stop_) return;
      if (wake_) quick = 5;
      wake_ = false;
    }
    if (quick > 0) --quick;
    auto r = RefreshOnce();
    absl::MutexLock l(&mu_);
    std::string err = r.ok() ? "" : std::string(r.status().message());
    if (!err.empty() && err != last_error_) spdlog::warn("CDI spec {}: {}", path_, err);
    last_error_ = err;
  }
}

}  // namespace gpulet::runtime
