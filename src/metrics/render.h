// What one sampling cycle saw (Sample) and how it becomes an exposition (Render). Every metric
// family is declared once, in the table in render.cc, with the family set it belongs to; Render
// walks the table. Pure functions of their input: no I/O, no clocks, no locks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpu/gpu.h"
#include "metrics/exposition.h"

namespace gpulet::metrics {

// Switchable groups of families. Default: gpulet's own names plus DCGM-compatible names.
enum FamilySet : unsigned {
  kGpuletFamilies = 1u << 0,      // gpulet_*: Prometheus naming rules, promtool-clean
  kDcgmFamilies = 1u << 1,        // DCGM_FI_*: dcgm-exporter's names, types and labels
  kNvidiaSmiFamilies = 1u << 2,   // nvidia_smi_*: nvidia_gpu_exporter's names, units, uuid label
  kGpuManagerFamilies = 1u << 3,  // container_gpu_* / container_request_gpu_*: GPU Manager /metric
};
inline constexpr unsigned kDefaultFamilies = kGpuletFamilies | kDcgmFamilies;

struct DeviceSample {
  gpu::Device device;
  std::optional<gpu::Telemetry> telemetry;  // nullopt: this cycle's read failed
  bool healthy = false;                     // telemetry read and liveness probe succeeded
  std::map<uint32_t, uint64_t> xid_counts;  // XID code -> events since the exporter started
  uint32_t xid_last = 0;                    // code of the most recent XID; 0 = none yet
  // NVLink data rates over the last sampling period (from the growth of the NVLink counters
  // between two cycles); unset on the first cycle, without NVLink, or after a counter reset.
  std::optional<double> nvlink_tx_bytes_per_second, nvlink_rx_bytes_per_second;
};

// One container's share of one physical GPU or MIG device, from PodResources.
struct ContainerDevice {
  std::string namespace_, pod, container, resource, device_id;
  size_t device = 0;  // index into Sample::devices
  int mig = -1;       // index into that device's mig_devices; -1 = the whole GPU
};

// One vGPU container's usage, from the vGPU accounting shared with the interposer.
struct VgpuUsage {
  std::string namespace_, pod, container;
  size_t device = 0;  // index into Sample::devices
  uint64_t memory_used_bytes = 0;
  uint64_t memory_limit_bytes = 0;          // 0 = no limit (the whole device)
  std::optional<double> utilization_ratio;  // 0..1 of the whole GPU, when measured
  double core_limit_ratio = 0;              // requested share of the GPU (vcuda-core / 100)
};

// The exporter's own state, exported so that a missing source is visible, not silent.
struct SelfStats {
  bool nvml_up = false;
  bool kubelet_enabled = false, kubelet_up = false;
  bool vgpu_enabled = false, vgpu_up = false;
  uint64_t nvml_errors = 0, kubelet_errors = 0, vgpu_errors = 0;
  double collect_seconds = 0;   // wall time of the cycle that produced this sample
  int64_t collect_unix_ms = 0;  // when it finished
  uint64_t cycles = 0;
  // Bare pods the reboot readiness controller reported (they had no controller to recreate them);
  // -1 when no controller runs in this process, and then the family is left out.
  int64_t bare_pods_reported = -1;
};

struct Sample {
  std::string hostname;
  std::string driver_version;
  int cuda_driver_version = 0;  // NVML encoding: 12040 = 12.4
  std::vector<DeviceSample> devices;
  std::vector<ContainerDevice> containers;
  std::vector<VgpuUsage> vgpu;
  SelfStats self;
};

struct RenderOptions {
  unsigned families = kDefaultFamilies;
  bool dcgm_hostname = true;  // dcgm-exporter's -n/--no-hostname turns the Hostname label off
};

// Appends the exposition of `sample` (without OpenMetrics' `# EOF`; the caller finishes it, so
// that per-scrape lines can follow a pre-rendered body).
void Render(const Sample& sample, const RenderOptions& options, Format format, std::string* out);

// GPU Manager's four families only, as its `/metric` endpoint served them (text format).
void RenderGpuManager(const Sample& sample, Format format, std::string* out);

// "1.2" style version from NVML's CUDA driver version encoding (12040 -> "12.4").
std::string CudaVersionString(int nvml_cuda_version);

}  // namespace gpulet::metrics
