#include "labels/labels.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace gpulet::labels {
namespace {

constexpr char P[] = "nvidia.com/";

// gpu-feature-discovery's architecture family by compute capability.
std::string Family(int major, int minor) {
  switch (major) {
    case 1:
      return "tesla";
    case 2:
      return "fermi";
    case 3:
      return "kepler";
    case 5:
      return "maxwell";
    case 6:
      return "pascal";
    case 7:
      return minor < 5 ? "volta" : "turing";
    case 8:
      return minor < 9 ? "ampere" : "ada-lovelace";
    case 9:
      return "hopper";
    case 10:
    case 12:
      return "blackwell";
    case 13:
      return "rubin";
    default:
      return "undefined";
  }
}

uint64_t Mib(uint64_t bytes) { return bytes / (1024 * 1024); }

// Label keys may not hold '+': GFD and the device plugin name "1g.5gb+me" resources "1g.5gb.me".
std::string ProfileKey(const std::string& profile) {
  return absl::StrReplaceAll(profile, {{"+", "."}});
}

// GFD's MIG attribute labels, under `prefix` ("gpu." for single, "mig-<profile>." for mixed).
void MigLabels(Labels& l, const std::string& prefix, const gpu::MigDevice& m) {
  auto set = [&](const std::string& key, uint64_t v) { l[P + prefix + key] = absl::StrCat(v); };
  set("memory", Mib(m.memory_bytes));
  set("multiprocessors", m.sm_count);
  set("slices.gi", m.gi_slices);
  set("slices.ci", m.ci_slices);
  set("engines.copy", m.copy_engines);
  set("engines.decoder", m.decoders);
  set("engines.encoder", m.encoders);
  set("engines.jpeg", m.jpeg_engines);
  set("engines.ofa", m.ofa_engines);
}

void DeviceLabels(Labels& l, const std::string& product, const gpu::Device& d, size_t count) {
  l[absl::StrCat(P, "gpu.product")] = product;
  l[absl::StrCat(P, "gpu.memory")] = absl::StrCat(Mib(d.memory_bytes));
  l[absl::StrCat(P, "gpu.count")] = absl::StrCat(count);
}

}  // namespace

std::string SanitizeLabelValue(const std::string& s) {
  auto alnum = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  };
  std::string out;
  for (char c : s) {
    if (c == ' ') {
      out.push_back('-');
    } else if (alnum(c) || c == '-' || c == '_' || c == '.') {
      out.push_back(c);
    }
  }
  // Kubernetes refuses a label value over 63 characters, or one that does not begin and end with
  // an alphanumeric: a whole node's labels would be refused for one bad value (a binary
  // --machine-type-file gave 179 characters).
  if (out.size() > kMaxLabelValue) out.resize(kMaxLabelValue);
  size_t b = 0, e = out.size();
  while (b < e && !alnum(out[b])) ++b;
  while (e > b && !alnum(out[e - 1])) --e;
  return out.substr(b, e - b);
}

absl::Status ValidateOptions(const LabelOptions& o) {
  if (o.mig_strategy != "none" && o.mig_strategy != "single" && o.mig_strategy != "mixed") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mig-strategy '", o.mig_strategy, "': expected none, single or mixed"));
  }
  if (o.sharing_strategy != "none" && o.sharing_strategy != "time-slicing" &&
      o.sharing_strategy != "mps") {
    return absl::InvalidArgumentError(absl::StrCat("--sharing-strategy '", o.sharing_strategy,
                                                   "': expected none, time-slicing or mps"));
  }
  if (o.replicas < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--replicas ", o.replicas, ": must be >= 0"));
  }
  if (o.replicas > 1 && o.sharing_strategy == "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas ", o.replicas, " needs --sharing-strategy time-slicing or mps"));
  }
  return absl::OkStatus();
}

Labels GenerateLabels(const gpu::Inventory& inv, const LabelOptions& o, int64_t unix_now) {
  Labels l;
  auto set = [&](const std::string& key, const std::string& value) { l[P + key] = value; };
  set("gpu.present", inv.devices.empty() ? "false" : "true");

  // Driver and the CUDA version the driver supports.
  std::vector<std::string> v = absl::StrSplit(inv.driver_version, '.');
  if (!inv.driver_version.empty()) {
    set("cuda.driver-version.full", inv.driver_version);
    set("cuda.driver-version.major", v[0]);
    set("cuda.driver.major", v[0]);
    if (v.size() > 1) {
      set("cuda.driver-version.minor", v[1]);
      set("cuda.driver.minor", v[1]);
    }
    if (v.size() > 2) {
      set("cuda.driver-version.revision", v[2]);
      set("cuda.driver.rev", v[2]);
    }
  }
  if (inv.cuda_driver_version > 0) {
    std::string major = absl::StrCat(inv.cuda_driver_version / 1000);
    std::string minor = absl::StrCat((inv.cuda_driver_version % 1000) / 10);
    set("cuda.runtime-version.major", major);
    set("cuda.runtime-version.minor", minor);
    set("cuda.runtime-version.full", absl::StrCat(major, ".", minor));
    set("cuda.runtime.major", major);
    set("cuda.runtime.minor", minor);
  }
  if (o.timestamp) set("gfd.timestamp", absl::StrCat(unix_now));
  if (!o.machine_type.empty()) set("gpu.machine", SanitizeLabelValue(o.machine_type));
  // A GPU NVML could not read (lost) has no name or UUID to label: GFD does not see it either.
  auto readable = std::find_if(inv.devices.begin(), inv.devices.end(),
                               [](const gpu::Device& d) { return d.Readable(); });
  if (readable == inv.devices.end()) {
    set("gpu.count", "0");
    return l;
  }

  // GFD assumes a homogeneous node and describes it by its first GPU.
  const gpu::Device& first = *readable;
  set("gpu.compute.major", absl::StrCat(first.cc_major));
  set("gpu.compute.minor", absl::StrCat(first.cc_minor));
  set("gpu.family", Family(first.cc_major, first.cc_minor));
  bool mig_capable = false;
  for (const gpu::Device& d : inv.devices) mig_capable |= d.mig_capable;
  set("mig.capable", mig_capable ? "true" : "false");
  if (o.mig_strategy != "none") set("mig.strategy", o.mig_strategy);
  set("gpu.replicas", absl::StrCat(o.replicas));
  set("gpu.sharing-strategy", o.sharing_strategy);
  // GFD's: true only under MPS sharing and with no MIG-enabled GPU (MPS does not run on MIG).
  bool mig_on = false;
  for (const gpu::Device& d : inv.devices) mig_on |= d.mig_enabled;
  set("mps.capable", o.sharing_strategy == "mps" && !mig_on ? "true" : "false");

  std::string product = SanitizeLabelValue(first.name);
  std::string shared = o.replicas > 1 ? "-SHARED" : "";

  std::vector<const gpu::Device*> full;
  std::vector<const gpu::MigDevice*> migs;
  for (const gpu::Device& d : inv.devices) {
    if (!d.Readable()) continue;
    if (d.mig_enabled && o.mig_strategy != "none") {
      for (const gpu::MigDevice& m : d.mig_devices) migs.push_back(&m);
    } else {
      full.push_back(&d);
    }
  }

  if (o.mig_strategy == "single" && !migs.empty()) {
    // Single strategy: every GPU must be MIG-enabled with one profile; the node then offers those
    // MIG devices as nvidia.com/gpu.
    std::set<std::string> profiles;
    for (const gpu::MigDevice* m : migs) profiles.insert(m->profile);
    if (!full.empty() || profiles.size() != 1) {
      set("gpu.product", product + "-MIG-INVALID");
      set("gpu.count", "0");
      set("gpu.memory", "0");
      set("gpu.replicas", "0");
      return l;
    }
    const gpu::MigDevice& m = *migs.front();
    set("gpu.product", absl::StrCat(product, "-MIG-", m.profile, shared));
    set("gpu.count", absl::StrCat(migs.size()));
    MigLabels(l, "gpu.", m);
    return l;
  }

  // gpu.count is every GPU of the product, MIG-enabled ones included (GFD's count under mixed:
  // the physical GPUs, not the nvidia.com/gpu devices, which MIG-enabled GPUs are not).
  size_t gpus = full.size();
  if (o.mig_strategy == "mixed")
    for (const gpu::Device& d : inv.devices) gpus += d.Readable() && d.mig_enabled;
  DeviceLabels(l, product + shared, full.empty() ? first : *full.front(), gpus);
  if (o.mig_strategy == "mixed") {
    std::map<std::string, std::vector<const gpu::MigDevice*>> by_profile;
    for (const gpu::MigDevice* m : migs) by_profile[m->profile].push_back(m);
    for (const auto& [profile, list] : by_profile) {
      std::string k = absl::StrCat("mig-", ProfileKey(profile), ".");
      const gpu::MigDevice& m = *list.front();
      set(k + "count", absl::StrCat(list.size()));
      MigLabels(l, k, m);
      set(k + "product", absl::StrCat(product, "-MIG-", ProfileKey(profile)));
      // --replicas and --sharing-strategy are nvidia.com/gpu's: MIG resources are not shared.
      set(k + "replicas", "1");
      set(k + "sharing-strategy", "none");
    }
  }
  return l;
}

std::string FormatFeatureFile(const Labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) absl::StrAppend(&out, k, "=", v, "\n");
  return out;
}

absl::Status WriteFeatureFile(const RootedFilesystem& fs, const std::string& path,
                              const Labels& labels) {
  if (path == "-") {  // standard output, as every Unix tool takes it (it wrote a file named "-")
    std::string text = FormatFeatureFile(labels);
    if (fwrite(text.data(), 1, text.size(), stdout) != text.size() || fflush(stdout) != 0)
      return absl::UnavailableError("cannot write to standard output");
    return absl::OkStatus();
  }
  size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    absl::Status st = fs.MakeDirs(path.substr(0, slash));
    if (!st.ok()) return st;
  }
  return fs.WriteFileAtomic(path, FormatFeatureFile(labels), 0644);
}

LabelRefresher::LabelRefresher(gpu::GpuLayer* gpu, const RootedFilesystem* fs, std::string path,
                               LabelOptions options, std::chrono::milliseconds interval,
                               Clock* clock)
    : gpu_(gpu),
      fs_(fs),
      path_(std::move(path)),
      options_(std::move(options)),
      interval_(interval),
      clock_(clock ? clock : RealClock()) {}

LabelRefresher::~LabelRefresher() { Stop(); }

absl::Status LabelRefresher::WriteOnce() {
  absl::StatusOr<gpu::Inventory> inv = gpu_->GetInventory();
  if (!inv.ok()) {
    // Keep the previous file: NFD would otherwise drop every GPU label on a transient failure.
    return absl::UnavailableError(
        absl::StrCat("GPU inventory unavailable for the labels: ", inv.status().message()));
  }
  LabelOptions options;
  {
    absl::MutexLock l(&mu_);
    options = options_;
  }
  absl::Status st =
      WriteFeatureFile(*fs_, path_, GenerateLabels(*inv, options, clock_->UnixSeconds()));
  if (!st.ok())
    return absl::Status(st.code(), absl::StrCat("feature file ", path_, ": ", st.message()));
  return absl::OkStatus();
}

void LabelRefresher::SetOptions(LabelOptions options) {
  absl::MutexLock l(&mu_);
  options_ = std::move(options);
}

void LabelRefresher::Start() {
  {
    absl::MutexLock l(&mu_);
    if (thread_.joinable()) return;
    stop_ = false;
  }
  thread_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock l(&mu_);
        auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&stop), absl::FromChrono(interval_))) return;
      }
      (void)WriteOnce();  // a failure keeps the last good file; retried next interval
    }
  });
}

void LabelRefresher::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpulet::labels
