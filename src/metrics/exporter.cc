#include "metrics/exporter.h"

#include <malloc.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace gpulet::metrics {

absl::StatusOr<unsigned> ParseFamilies(const std::string& list) {
  unsigned out = 0;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (part == "gpulet") {
      out |= kGpuletFamilies;
    } else if (part == "dcgm") {
      out |= kDcgmFamilies;
    } else if (part == "nvidia-smi") {
      out |= kNvidiaSmiFamilies;
    } else if (part == "gpu-manager") {
      out |= kGpuManagerFamilies;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--families: unknown family set '", part,
                                                     "' (known: gpulet, dcgm, nvidia-smi, "
                                                     "gpu-manager)"));
    }
  }
  if (out == 0) return absl::InvalidArgumentError("--families: empty list");
  return out;
}

int ConfigureMalloc() {
  // Each cycle allocates and frees MiB-sized bodies: a fixed mmap threshold keeps them out of the
  // heap (glibc otherwise raises the threshold after the first free and the freed bodies stay
  // resident).
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) return 0;  // the operator's choice wins
  constexpr int kArenas = 2;
  return mallopt(M_ARENA_MAX, kArenas) == 1 ? kArenas : 0;
}

std::string DefaultHostname() {
  if (const char* n = std::getenv("NODE_NAME"); n != nullptr && *n != 0) return n;
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

// Calls `on_change` whenever the file at `path` is rewritten (closed after writing, or renamed
// into place as the kubelet's checkpoint manager does). Watches the directory with inotify, so the
// file may be replaced or appear later; a directory that does not exist yet (kubelet not started)
// is looked for again every second. Owns its thread; the destructor joins it.
class CheckpointWatcher {
 public:
  CheckpointWatcher(const std::string& path, std::function<void()> on_change)
      : on_change_(std::move(on_change)) {
    size_t slash = path.rfind('/');
    dir_ = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
    name_ = slash == std::string::npos ? path : path.substr(slash + 1);
    inotify_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    stop_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (inotify_ < 0 || stop_ < 0) {
      spdlog::warn("metrics: cannot watch {} (inotify): attribution follows the timer only", path);
      return;
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~CheckpointWatcher() {
    if (thread_.joinable()) {
      uint64_t one = 1;
      (void)!write(stop_, &one, sizeof one);
      thread_.join();
    }
    if (inotify_ >= 0) close(inotify_);
    if (stop_ >= 0) close(stop_);
  }

 private:
  void Loop() {
    int wd = -1;
    bool watched_before = false;
    alignas(inotify_event) char buf[4096];
    while (true) {
      if (wd < 0) {
        wd = inotify_add_watch(inotify_, dir_.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO);
        // Re-watching after the directory came back: the file may have changed meanwhile.
        if (wd >= 0 && watched_before) on_change_();
        if (wd >= 0) watched_before = true;
      }
      pollfd fds[2] = {{inotify_, POLLIN, 0}, {stop_, POLLIN, 0}};
      if (poll(fds, 2, wd < 0 ? 1000 : -1) < 0 && errno != EINTR) return;
      if (fds[1].revents) return;
      if (!(fds[0].revents & POLLIN)) continue;
      bool changed = false;
      ssize_t n;
      while ((n = read(inotify_, buf, sizeof buf)) > 0) {
        for (char* p = buf; p < buf + n;) {
          auto* ev = reinterpret_cast<inotify_event*>(p);
          if (ev->mask & IN_IGNORED) wd = -1;  // directory removed: watch it again when back
          if (ev->len > 0 && name_ == ev->name) changed = true;
          p += sizeof(inotify_event) + ev->len;
        }
      }
      if (changed) on_change_();
    }
  }

  std::string dir_, name_;
  std::function<void()> on_change_;
  int inotify_ = -1, stop_ = -1;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<Exporter>> Exporter::Start(ExporterOptions o, gpu::GpuLayer* gpu,
                                                          Sampler::GpuOpener opener) {
  std::unique_ptr<Exporter> e(new Exporter());
  // Again here for embedders whose main does not call it (idempotent); main calls it first, before
  // the agent's NVML and gRPC threads exist.
  ConfigureMalloc();
  if (!o.pod_resources_socket.empty()) {
    kubelet::PodResourcesOptions po;
    po.socket = o.pod_resources_socket;
    po.extra_resources = o.extra_resources;
    e->pods_ = std::make_unique<kubelet::PodResourcesCache>(
        std::make_unique<kubelet::GrpcPodResourcesLister>(po), o.pod_resources_interval);
    // First answer before the first sample, so the first scrape already has pod labels.
    e->pods_->RefreshNow();
    e->pods_->Start();
  }
  if (!o.vgpu_accounting_dir.empty()) {
    e->vgpu_ =
        std::make_unique<AccountingDirUsageSource>(o.vgpu_accounting_dir, std::move(o.vgpu_grants));
  }
  e->sampler_ = std::make_unique<Sampler>(gpu, std::move(opener), e->pods_.get(), e->vgpu_.get(),
                                          nullptr, o.sampler);
  e->sampler_->Start();
  if (e->pods_ && !o.kubelet_checkpoint.empty()) {
    Sampler* sampler = e->sampler_.get();
    e->checkpoint_watcher_ =
        std::make_unique<CheckpointWatcher>(o.kubelet_checkpoint, [sampler] { sampler->Poke(); });
  }
  e->server_ = std::make_unique<MetricsServer>(e->sampler_.get(), o.server);
  if (absl::Status st = e->server_->Start(); !st.ok()) return st;
  return e;
}

Exporter::~Exporter() { Stop(); }

void Exporter::Stop() {
  checkpoint_watcher_.reset();  // no pokes into a stopping sampler
  if (server_) server_->Stop();
  if (sampler_) sampler_->Stop();
  if (pods_) pods_->Stop();
}

void Exporter::RefreshPods() {
  if (pods_ && sampler_) sampler_->Poke();
}

}  // namespace gpulet::metrics
