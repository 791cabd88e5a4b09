#include "metrics/exporter.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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
      return absl::InvalidArgumentError(absl::StrCat(
          "--families: unknown family set '", part, "' (known: gpulet, dcgm, nvidia-smi, "
          "gpu-manager)"));
    }
  }
  if (out == 0) return absl::InvalidArgumentError("--families: empty list");
  return out;
}

std::string DefaultHostname() {
  if (const char* n = std::getenv("NODE_NAME"); n != nullptr && *n != 0) return n;
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

absl::StatusOr<std::unique_ptr<Exporter>> Exporter::Start(ExporterOptions o, gpu::GpuLayer* gpu,
                                                          Sampler::GpuOpener opener) {
  std::unique_ptr<Exporter> e(new Exporter());
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
    e->vgpu_ = std::make_unique<AccountingDirUsageSource>(o.vgpu_accounting_dir);
  }
  e->sampler_ = std::make_unique<Sampler>(gpu, std::move(opener), e->pods_.get(), e->vgpu_.get(),
                                          nullptr, o.sampler);
  e->sampler_->Start();
  e->server_ = std::make_unique<MetricsServer>(e->sampler_.get(), o.server);
  if (absl::Status st = e->server_->Start(); !st.ok()) return st;
  return e;
}

Exporter::~Exporter() { Stop(); }

void Exporter::Stop() {
  if (server_) server_->Stop();
  if (sampler_) sampler_->Stop();
  if (pods_) pods_->Stop();
}

void Exporter::RefreshPods() {
  if (pods_) pods_->RequestRefresh();
}

}  // namespace gpulet::metrics
