// The GPU layer: what the rest of gpulet knows about the node's GPUs. It knows nothing of
// Kubernetes, gRPC or HTTP; everything above it (device plugin, metrics, labels, runtime, vGPU)
// sees only this interface. The production backend (gpu/nvml/) loads libnvidia-ml.so.1 with dlopen;
// a simulated node loads the fake NVML library (testing/fake_nvml/) through that same path.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"

namespace gpulet::gpu {

// How two GPUs reach each other when they have no NVLink, best first. Values follow NVML's
// nvmlGpuTopologyLevel_t order; the names are those of `nvidia-smi topo -m`.
enum class PcieRelation {
  kSameBoard,     // PIX on one board (NVML_TOPOLOGY_INTERNAL)
  kSingleSwitch,  // PIX: one PCIe switch
  kMultiSwitch,   // PXB: several PCIe switches, no host bridge
  kHostBridge,    // PHB: the same PCIe host bridge
  kSameNuma,      // NODE: host bridges within one NUMA node
  kCrossNuma,     // SYS: across the SMP interconnect between NUMA nodes
  kUnknown,
};
const char* PcieRelationName(PcieRelation r);  // "PIX", "PXB", "PHB", "NODE", "SYS", ...

struct Link {
  int nvlinks = 0;  // active NVLinks between the pair (0 = none)
  PcieRelation pcie = PcieRelation::kUnknown;
};

struct MigDevice {
  uint32_t index = 0;  // position under its parent (NVML MIG device handle index)
  std::string uuid;    // "MIG-..."
  uint32_t gpu_instance_id = 0;
  uint32_t compute_instance_id = 0;
  std::string profile;     // e.g. "1g.5gb", "3g.20gb", "1g.5gb+me"
  uint32_t gi_slices = 0;  // GPU slices of the GPU instance (the "1" of 1g.5gb)
  uint32_t ci_slices = 0;  // compute slices of the compute instance
  uint64_t memory_bytes = 0;
  uint32_t sm_count = 0;
  // Engines of the GPU instance (NVML's nvmlDeviceGetAttributes shared*Count): labelled by
  // feature discovery as mig-<profile>.engines.* (GFD's names).
  uint32_t copy_engines = 0, decoders = 0, encoders = 0, jpeg_engines = 0, ofa_engines = 0;
};

// The index name of a MIG device, "<gpu index>:<mig index>" (NVIDIA's NVIDIA_VISIBLE_DEVICES form,
// our device-plugin IDs with the index strategy, CDI device names). One spelling for every part.
inline std::string MigIndexName(uint32_t gpu_index, uint32_t mig_index) {
  return std::to_string(gpu_index) + ":" + std::to_string(mig_index);
}
// "<gpu>" or "<gpu>:<mig>" (decimal) -> the indexes; nullopt when `name` is neither.
struct IndexName {
  uint32_t gpu = 0;
  std::optional<uint32_t> mig;
};
inline std::optional<IndexName> ParseIndexName(std::string_view name) {
  IndexName out;
  std::string_view gpu_part = name, mig_part;
  if (size_t p = name.find(':'); p != std::string_view::npos) {
    gpu_part = name.substr(0, p);
    mig_part = name.substr(p + 1);
  }
  // absl::string_view is not std::string_view in Debian's absl build.
  if (!absl::SimpleAtoi(absl::string_view(gpu_part.data(), gpu_part.size()), &out.gpu)) {
    return std::nullopt;
  }
  if (!mig_part.empty()) {
    uint32_t mig = 0;
    if (!absl::SimpleAtoi(absl::string_view(mig_part.data(), mig_part.size()), &mig)) {
      return std::nullopt;
    }
    out.mig = mig;
  }
  return out;
}

// Facts about a GPU that do not change while the driver is loaded, read once at (re)initialisation
// (the nvidia-smi set: `nvidia-smi --query-gpu` fields). Unset: NVML cannot tell on this GPU.
struct DeviceFacts {
  std::string serial, vbios_version;     // empty when NVML cannot tell
  std::string inforom_oem, inforom_ecc;  // InfoROM object versions, e.g. "2.1", "7.16"
  std::optional<uint32_t> pci_domain, pci_bus, pci_device, pci_subsystem_id;
  std::optional<uint32_t> pci_base_class, pci_sub_class;  // from sysfs `class` (0x030200: 3, 2)
  std::optional<uint32_t> max_graphics_clock_mhz, max_sm_clock_mhz, max_memory_clock_mhz;
  std::optional<uint64_t> supported_clock_event_reasons;  // NVML bitmask
  std::optional<uint32_t> pcie_link_gen_max;              // of the link (GPU and slot)
  std::optional<uint32_t> pcie_link_gen_gpu_max;          // of the GPU alone
  std::optional<uint32_t> pcie_link_width_max;
  std::optional<uint32_t> power_default_limit_mw, power_min_limit_mw, power_max_limit_mw;
  std::optional<uint32_t> accounting_buffer_size;
  std::optional<bool> gsp_firmware_enabled, gsp_firmware_default;
};

struct Device {
  uint32_t index = 0;  // NVML index
  // Why NVML could not read this GPU when the inventory was first read (e.g. "GPU is lost"); only
  // `index` is then set. Such a GPU keeps its place so positions stay NVML indices, and consumers
  // skip it (Readable()): nothing can be offered, mounted or labelled without its UUID and minor.
  std::string error;
  std::string uuid;            // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string name;            // e.g. "NVIDIA H100 80GB HBM3"
  std::string brand;           // e.g. "Tesla", "NVIDIA"
  std::string architecture;    // e.g. "Hopper", "Ampere", "Volta", "Turing"
  uint32_t minor = 0;          // /dev/nvidia<minor>
  std::string pci_bus_id;      // "00000000:18:00.0" (NVML's 16-hex-digit-domain form)
  uint32_t pci_device_id = 0;  // PCI device id << 16 | vendor id, as NVML reports
  uint64_t memory_bytes = 0;
  int numa_node = -1;        // from sysfs; -1 when unknown
  std::string cpu_affinity;  // sysfs local_cpulist, e.g. "0-55,112-167"; empty when unknown
  int cc_major = 0, cc_minor = 0;
  uint32_t sm_count = 0;  // 0 when NVML cannot say
  uint32_t power_limit_mw = 0;
  bool mig_capable = false;
  bool mig_enabled = false;  // current MIG mode
  std::vector<MigDevice> mig_devices;
  // GPM (nvmlGpmQueryDeviceSupport: Hopper and newer): Telemetry::gpm can be measured.
  bool gpm_supported = false;
  DeviceFacts facts;

  bool Readable() const { return error.empty(); }
};

// Driver-wide facts and the devices, as found at the last (re)initialisation.
struct Inventory {
  std::string driver_version;   // "550.54.15"
  int cuda_driver_version = 0;  // NVML's encoding: 12040 = 12.4
  std::string nvml_version;
  std::vector<Device> devices;  // ordered by index
  // topology[i][j] for device indices i != j; the diagonal is unused.
  std::vector<std::vector<Link>> topology;
};

// One sample of a device's telemetry. A field NVML cannot provide on this device stays nullopt;
// callers export what is there and never invent a value.
struct ProcessInfo {
  uint32_t pid = 0;
  uint64_t used_memory_bytes = 0;
};
// NVML GPM metrics, percent 0..100 (NVIDIA's GPM ids in parentheses).
struct GpmMetrics {
  std::optional<double> graphics_util;  // GRAPHICS_UTIL: a context was bound and busy
  std::optional<double> sm_util;        // SM_UTIL: SMs with at least one warp
  std::optional<double> sm_occupancy;   // SM_OCCUPANCY: resident warps vs the maximum
  std::optional<double> tensor_util;    // ANY_TENSOR_UTIL
  std::optional<double> dram_bw_util;   // DRAM_BW_UTIL: DRAM bandwidth vs the maximum
  std::optional<double> fp64_util, fp32_util, fp16_util;  // non-tensor FP pipes
};
struct Telemetry {
  std::optional<uint32_t> gpu_temp_c, memory_temp_c;
  std::optional<uint32_t> sm_clock_mhz, memory_clock_mhz, graphics_clock_mhz, video_clock_mhz;
  std::optional<uint32_t> power_usage_mw, power_limit_mw;
  std::optional<uint64_t> total_energy_mj;  // since driver load
  std::optional<uint32_t> gpu_util_pct, memory_util_pct, encoder_util_pct, decoder_util_pct;
  std::optional<uint64_t> fb_total_bytes, fb_used_bytes, fb_free_bytes, fb_reserved_bytes;
  std::optional<uint64_t> ecc_sbe_volatile, ecc_dbe_volatile, ecc_sbe_aggregate, ecc_dbe_aggregate;
  std::optional<uint64_t> throttle_reasons;  // NVML clocks-event-reason bitmask
  std::optional<uint32_t> pcie_replay_count;
  std::optional<uint32_t> pcie_tx_kbps, pcie_rx_kbps;
  // NVLink data payload sent / received since driver load, summed over all links (KiB; NVML's
  // NVLINK_THROUGHPUT_DATA fields). Unset on GPUs without NVLink.
  std::optional<uint64_t> nvlink_tx_kib, nvlink_rx_kib;
  std::optional<uint32_t> fan_speed_pct;
  std::optional<uint32_t> pstate;
  std::vector<ProcessInfo> processes;  // running compute processes

  // Read only when asked (TelemetryRequest::extended): the rest of the nvidia-smi set.
  std::optional<uint32_t> power_management_limit_mw;  // power.limit (may differ from enforced)
  std::optional<uint32_t> power_average_mw, power_instant_mw;
  std::optional<uint64_t> clocks_event_power_cap_ns, clocks_event_sync_boost_ns;  // since load
  std::optional<bool> ecc_mode_current, ecc_mode_pending, persistence_mode, display_active,
      display_attached, accounting_mode, mig_mode_pending;
  std::optional<uint32_t> compute_mode;  // nvmlComputeMode_t: 0 default, 2 prohibited, 3 excl.
  std::optional<uint32_t> pcie_link_gen_current, pcie_link_width_current;
  std::optional<uint32_t> jpeg_util_pct, ofa_util_pct;
  std::optional<uint32_t> encoder_sessions, encoder_average_fps, encoder_average_latency_us;
  // ECC errors by memory location: [corrected, uncorrected][volatile, aggregate].
  std::optional<uint64_t> ecc_dram[2][2], ecc_sram[2][2];
  std::optional<uint32_t> remapped_rows_correctable, remapped_rows_uncorrectable;
  std::optional<bool> remapped_rows_pending, remapped_rows_failure;
  // Banks by remaining spare rows (nvmlRowRemapperHistogramValues_t): max, high, partial, low,
  // none.
  std::optional<uint32_t> remap_histogram[5];

  // Read only when asked (TelemetryRequest::profiling), on GPUs with gpm_supported: DCGM's
  // profiling ratios from NVML GPM over the time since the previous profiling read of the same GPU
  // (the first read only takes a sample and leaves these unset).
  std::optional<GpmMetrics> gpm;
  std::map<uint32_t, GpmMetrics> gpm_instances;  // by GPU instance id, MIG-enabled GPUs
};

// What GpuLayer::ReadTelemetry reads beyond the basic set, so a consumer pays only for what it
// uses (the exporter asks for what its enabled family sets render).
struct TelemetryRequest {
  bool extended = false;   // the nvidia-smi set (Telemetry's "read only when asked" fields)
  bool profiling = false;  // GPM
};

struct Event {
  enum class Type { kXid, kSingleBitEcc, kDoubleBitEcc };
  Type type = Type::kXid;
  uint32_t device_index = 0;
  std::string uuid;   // of the physical GPU
  uint64_t data = 0;  // the XID code for kXid
  // For a MIG device, its instance ids; kAllInstances when the event concerns the whole GPU.
  static constexpr uint32_t kAllInstances = 0xFFFFFFFFu;
  uint32_t gpu_instance_id = kAllInstances;
  uint32_t compute_instance_id = kAllInstances;
  std::chrono::system_clock::time_point time;
};

// Thread-safe. Calls may fail at any time (a GPU falls off the bus, the driver goes away): failures
// are Status values, never crashes.
class GpuLayer {
 public:
  virtual ~GpuLayer() = default;

  // The inventory read at the last successful Init()/Reinit(). FailedPrecondition before that.
  virtual absl::StatusOr<Inventory> GetInventory() = 0;

  // One telemetry sample. Unavailable if the GPU is lost; NotFound for an unknown index.
  virtual absl::StatusOr<Telemetry> GetTelemetry(uint32_t index) = 0;
  // The same plus the optional groups of `what`. A layer that has none of them answers the basic
  // sample (the groups' fields stay unset).
  virtual absl::StatusOr<Telemetry> ReadTelemetry(uint32_t index, const TelemetryRequest& what) {
    return GetTelemetry(index);
  }

  // Cheap liveness probe of one GPU (NVML answers for it, and it is not lost). Used by health
  // checking to decide recovery.
  virtual absl::Status ProbeDevice(uint32_t index) = 0;

  // Shuts NVML down and initialises it again, re-reading the inventory. Used to recover from a
  // driver that stopped answering.
  virtual absl::Status Reinit() = 0;

  // Events are delivered on a background thread owned by the layer, in order, to every subscriber.
  // A subscriber must not block for long. Unsubscribe by destroying the returned handle.
  using EventCallback = std::function<void(const Event&)>;
  class Subscription {
   public:
    virtual ~Subscription() = default;
  };
  virtual std::unique_ptr<Subscription> Subscribe(EventCallback cb) = 0;
};

}  // namespace gpulet::gpu
