#include "metrics/render.h"

#include <cmath>
#include <set>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace gpulet::metrics {
namespace {

using Getter = std::optional<double> (*)(const DeviceSample&);

// One per-GPU metric family. The whole list of device families lives in kDeviceFamilies below;
// the families that are not one value per GPU (info, XID per code, containers, vGPU, the
// exporter's own) are written by the functions after it, still one declaration each.
struct DeviceFamily {
  unsigned set;
  const char* name;
  MetricType type;
  const char* help;
  Getter get;
  // DCGM only: on a MIG-enabled GPU the series is repeated per GPU instance (GPU_I_* labels, the
  // instance's pods), as dcgm-exporter does; otherwise it stays one GPU-level series (NVML cannot
  // measure utilisation or framebuffer use per MIG instance).
  bool per_mig_instance = false;
  // Per-instance value of a per_mig_instance family on a MIG-enabled GPU, when NVML measures it
  // per GPU instance (GPM); without it the GPU's value is repeated on each instance.
  std::optional<double> (*get_mig)(const DeviceSample&, const gpu::MigDevice&) = nullptr;
};

template <typename T>
std::optional<double> Tel(const DeviceSample& d, std::optional<T> gpu::Telemetry::*field,
                          double scale) {
  if (!d.telemetry) return std::nullopt;
  const std::optional<T>& v = (*d.telemetry).*field;
  if (!v) return std::nullopt;
  return static_cast<double>(*v) * scale;
}
std::optional<double> Mib(std::optional<double> bytes) {
  if (!bytes) return bytes;
  return std::floor(*bytes / 1048576.0);  // DCGM reports whole MiB
}

// A static fact of the GPU (read once at initialisation), scaled.
template <typename T>
std::optional<double> Fact(const DeviceSample& d, std::optional<T> gpu::DeviceFacts::*field,
                           double scale) {
  const std::optional<T>& v = d.device.facts.*field;
  if (!v) return std::nullopt;
  return static_cast<double>(*v) * scale;
}
std::optional<double> Flag(const std::optional<bool>& v) {
  if (!v) return std::nullopt;
  return *v ? 1 : 0;
}
// One clock event reason of the current bitmask, as nvidia-smi reports it: Active 1, else 0.
std::optional<double> ReasonBit(const DeviceSample& d, uint64_t bit) {
  if (!d.telemetry || !d.telemetry->throttle_reasons) return std::nullopt;
  return (*d.telemetry->throttle_reasons & bit) ? 1 : 0;
}
// A number nvidia-smi prints as text and nvidia_gpu_exporter parses (serial, InfoROM versions).
std::optional<double> Numeric(const std::string& v) {
  double out = 0;
  if (v.empty() || !absl::SimpleAtod(v, &out)) return std::nullopt;
  return out;
}
// DCGM's profiling ratios: NVML GPM's percentages / 100.
std::optional<double> GpmRatio(const gpu::GpmMetrics* g,
                               std::optional<double> gpu::GpmMetrics::*f) {
  if (!g || !(g->*f)) return std::nullopt;
  return *(g->*f) / 100.0;
}
std::optional<double> GpmGpu(const DeviceSample& d, std::optional<double> gpu::GpmMetrics::*f) {
  if (!d.telemetry || !d.telemetry->gpm) return std::nullopt;
  return GpmRatio(&*d.telemetry->gpm, f);
}
std::optional<double> GpmInstance(const DeviceSample& d, const gpu::MigDevice& m,
                                  std::optional<double> gpu::GpmMetrics::*f) {
  if (!d.telemetry) return std::nullopt;
  auto it = d.telemetry->gpm_instances.find(m.gpu_instance_id);
  return it == d.telemetry->gpm_instances.end() ? std::nullopt : GpmRatio(&it->second, f);
}

#define FACT(field, scale) \
  +[](const DeviceSample& d) { return Fact(d, &gpu::DeviceFacts::field, scale); }
#define FLAG(field)                                               \
  +[](const DeviceSample& d) -> std::optional<double> {           \
    return d.telemetry ? Flag(d.telemetry->field) : std::nullopt; \
  }
#define REASON(bit) +[](const DeviceSample& d) { return ReasonBit(d, bit); }
#define ARRAY(field, i, j)                                              \
  +[](const DeviceSample& d) -> std::optional<double> {                 \
    if (!d.telemetry || !d.telemetry->field[i][j]) return std::nullopt; \
    return static_cast<double>(*d.telemetry->field[i][j]);              \
  }
#define HISTOGRAM(i)                                                           \
  +[](const DeviceSample& d) -> std::optional<double> {                        \
    if (!d.telemetry || !d.telemetry->remap_histogram[i]) return std::nullopt; \
    return *d.telemetry->remap_histogram[i];                                   \
  }
// GPU-level value, and the per-GPU-instance one on MIG-enabled GPUs.
#define GPM(field)                                                                 \
  +[](const DeviceSample& d) { return GpmGpu(d, &gpu::GpmMetrics::field); }, true, \
      +[](const DeviceSample& d, const gpu::MigDevice& m) {                        \
        return GpmInstance(d, m, &gpu::GpmMetrics::field);                         \
      }

#define TEL(field, scale) \
  +[](const DeviceSample& d) { return Tel(d, &gpu::Telemetry::field, scale); }
#define TEL_MIB(field) \
  +[](const DeviceSample& d) { return Mib(Tel(d, &gpu::Telemetry::field, 1.0)); }

constexpr MetricType G = MetricType::kGauge;
constexpr MetricType C = MetricType::kCounter;
constexpr unsigned OWN = kGpuletFamilies, DCGM = kDcgmFamilies, SMI = kNvidiaSmiFamilies;

const DeviceFamily kDeviceFamilies[] = {
    // --- gpulet's own names: base units, _total counters, snake_case labels {gpu, uuid} ---
    {OWN, "gpulet_gpu_temperature_celsius", G, "GPU core temperature.", TEL(gpu_temp_c, 1)},
    {OWN, "gpulet_gpu_memory_temperature_celsius", G, "GPU memory (HBM) temperature.",
     TEL(memory_temp_c, 1)},
    {OWN, "gpulet_gpu_sm_clock_hertz", G, "SM clock frequency.", TEL(sm_clock_mhz, 1e6)},
    {OWN, "gpulet_gpu_memory_clock_hertz", G, "Memory clock frequency.",
     TEL(memory_clock_mhz, 1e6)},
    {OWN, "gpulet_gpu_graphics_clock_hertz", G, "Graphics clock frequency.",
     TEL(graphics_clock_mhz, 1e6)},
    {OWN, "gpulet_gpu_video_clock_hertz", G, "Video clock frequency.", TEL(video_clock_mhz, 1e6)},
    {OWN, "gpulet_gpu_power_usage_watts", G, "Power draw.", TEL(power_usage_mw, 1e-3)},
    {OWN, "gpulet_gpu_power_limit_watts", G, "Enforced power limit.", TEL(power_limit_mw, 1e-3)},
    {OWN, "gpulet_gpu_energy_consumption_joules_total", C,
     "Energy consumed since the driver was loaded.", TEL(total_energy_mj, 1e-3)},
    {OWN, "gpulet_gpu_utilization_ratio", G,
     "Fraction of the last sample period during which a kernel ran on the GPU.",
     TEL(gpu_util_pct, 0.01)},
    {OWN, "gpulet_gpu_memory_utilization_ratio", G,
     "Fraction of the last sample period during which device memory was read or written.",
     TEL(memory_util_pct, 0.01)},
    {OWN, "gpulet_gpu_encoder_utilization_ratio", G, "Video encoder utilization.",
     TEL(encoder_util_pct, 0.01)},
    {OWN, "gpulet_gpu_decoder_utilization_ratio", G, "Video decoder utilization.",
     TEL(decoder_util_pct, 0.01)},
    {OWN, "gpulet_gpu_memory_total_bytes", G, "Framebuffer memory size.", TEL(fb_total_bytes, 1)},
    {OWN, "gpulet_gpu_memory_used_bytes", G, "Framebuffer memory in use.", TEL(fb_used_bytes, 1)},
    {OWN, "gpulet_gpu_memory_free_bytes", G, "Framebuffer memory free.", TEL(fb_free_bytes, 1)},
    {OWN, "gpulet_gpu_memory_reserved_bytes", G, "Framebuffer memory reserved by the driver.",
     TEL(fb_reserved_bytes, 1)},
    {OWN, "gpulet_gpu_ecc_corrected_volatile_errors_total", C,
     "Single-bit (corrected) ECC errors since the last driver load.", TEL(ecc_sbe_volatile, 1)},
    {OWN, "gpulet_gpu_ecc_uncorrected_volatile_errors_total", C,
     "Double-bit (uncorrected) ECC errors since the last driver load.", TEL(ecc_dbe_volatile, 1)},
    {OWN, "gpulet_gpu_ecc_corrected_aggregate_errors_total", C,
     "Single-bit (corrected) ECC errors over the GPU's lifetime.", TEL(ecc_sbe_aggregate, 1)},
    {OWN, "gpulet_gpu_ecc_uncorrected_aggregate_errors_total", C,
     "Double-bit (uncorrected) ECC errors over the GPU's lifetime.", TEL(ecc_dbe_aggregate, 1)},
    {OWN, "gpulet_gpu_clock_event_reasons", G,
     "Bitmask of active clock event (throttle) reasons, NVML nvmlClocksEventReason* bits.",
     TEL(throttle_reasons, 1)},
    {OWN, "gpulet_gpu_pcie_replays_total", C, "PCIe replay (retry) events.",
     TEL(pcie_replay_count, 1)},
    {OWN, "gpulet_gpu_pcie_transmit_bytes_per_second", G, "PCIe transmit throughput.",
     TEL(pcie_tx_kbps, 1024)},
    {OWN, "gpulet_gpu_pcie_receive_bytes_per_second", G, "PCIe receive throughput.",
     TEL(pcie_rx_kbps, 1024)},
    {OWN, "gpulet_gpu_nvlink_transmit_bytes_total", C,
     "NVLink data payload transmitted since the driver was loaded, all links.",
     TEL(nvlink_tx_kib, 1024)},
    {OWN, "gpulet_gpu_nvlink_receive_bytes_total", C,
     "NVLink data payload received since the driver was loaded, all links.",
     TEL(nvlink_rx_kib, 1024)},
    {OWN, "gpulet_gpu_fan_speed_ratio", G, "Fan speed as a fraction of its maximum.",
     TEL(fan_speed_pct, 0.01)},
    {OWN, "gpulet_gpu_performance_state", G, "Performance state (0 = P0, fastest, to 15).",
     TEL(pstate, 1)},
    {OWN, "gpulet_gpu_compute_processes", G, "Compute processes running on the GPU.",
     +[](const DeviceSample& d) -> std::optional<double> {
       if (!d.telemetry) return std::nullopt;
       return static_cast<double>(d.telemetry->processes.size());
     }},
    {OWN, "gpulet_gpu_healthy", G,
     "1 when the GPU answered this sampling cycle and the device plugin offers it; 0 when it is "
     "lost, NVML failed for it, or the plugin withdrew it (a fatal XID, manual isolation).",
     +[](const DeviceSample& d) -> std::optional<double> { return d.healthy ? 1 : 0; }},
    {OWN, "gpulet_gpu_xid_errors_total", C, "XID events since the exporter started.",
     +[](const DeviceSample& d) -> std::optional<double> {
       double n = 0;
       for (const auto& [code, count] : d.xid_counts) n += static_cast<double>(count);
       return n;
     }},
    {OWN, "gpulet_gpu_xid_last_code", G, "Code of the most recent XID event; 0 when none.",
     +[](const DeviceSample& d) -> std::optional<double> { return d.xid_last; }},

    // NVML GPM (Hopper and newer; GPU level, so absent on MIG-enabled GPUs): what DCGM's
    // profiling fields measure, under gpulet's names.
    {OWN, "gpulet_gpu_graphics_engine_active_ratio", G,
     "Fraction of the last sampling interval a context was active on the graphics/compute engine "
     "(NVML GPM).",
     +[](const DeviceSample& d) { return GpmGpu(d, &gpu::GpmMetrics::graphics_util); }},
    {OWN, "gpulet_gpu_sm_active_ratio", G,
     "Fraction of cycles an SM had at least one warp resident, averaged over SMs (NVML GPM).",
     +[](const DeviceSample& d) { return GpmGpu(d, &gpu::GpmMetrics::sm_util); }},
    {OWN, "gpulet_gpu_sm_occupancy_ratio", G,
     "Resident warps as a fraction of the SMs' maximum (NVML GPM).",
     +[](const DeviceSample& d) { return GpmGpu(d, &gpu::GpmMetrics::sm_occupancy); }},
    {OWN, "gpulet_gpu_tensor_active_ratio", G,
     "Fraction of cycles a tensor pipe was active (NVML GPM).",
     +[](const DeviceSample& d) { return GpmGpu(d, &gpu::GpmMetrics::tensor_util); }},
    {OWN, "gpulet_gpu_dram_active_ratio", G,
     "Device memory bandwidth used as a fraction of the maximum (NVML GPM).",
     +[](const DeviceSample& d) { return GpmGpu(d, &gpu::GpmMetrics::dram_bw_util); }},

    // --- dcgm-exporter's default counters (etc/default-counters.csv) that NVML provides ---
    {DCGM, "DCGM_FI_DEV_SM_CLOCK", G, "SM clock frequency (in MHz).", TEL(sm_clock_mhz, 1), true},
    {DCGM, "DCGM_FI_DEV_MEM_CLOCK", G, "Memory clock frequency (in MHz).", TEL(memory_clock_mhz, 1),
     true},
    {DCGM, "DCGM_FI_DEV_MEMORY_TEMP", G, "Memory temperature (in C).", TEL(memory_temp_c, 1), true},
    {DCGM, "DCGM_FI_DEV_GPU_TEMP", G, "GPU temperature (in C).", TEL(gpu_temp_c, 1), true},
    {DCGM, "DCGM_FI_DEV_POWER_USAGE", G, "Power draw (in W).", TEL(power_usage_mw, 1e-3), true},
    {DCGM, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", C,
     "Total energy consumption since boot (in mJ).", TEL(total_energy_mj, 1), true},
    {DCGM, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", C, "Total number of PCIe retries.",
     TEL(pcie_replay_count, 1), true},
    {DCGM, "DCGM_FI_DEV_GPU_UTIL", G, "GPU utilization (in %).", TEL(gpu_util_pct, 1)},
    {DCGM, "DCGM_FI_DEV_MEM_COPY_UTIL", G, "Memory utilization (in %).", TEL(memory_util_pct, 1)},
    {DCGM, "DCGM_FI_DEV_ENC_UTIL", G, "Encoder utilization (in %).", TEL(encoder_util_pct, 1)},
    {DCGM, "DCGM_FI_DEV_DEC_UTIL", G, "Decoder utilization (in %).", TEL(decoder_util_pct, 1)},
    {DCGM, "DCGM_FI_DEV_XID_ERRORS", G, "Value of the last XID error encountered.",
     +[](const DeviceSample& d) -> std::optional<double> { return d.xid_last; }, true},
    {DCGM, "DCGM_FI_DEV_FB_FREE", G, "Framebuffer memory free (in MiB).", TEL_MIB(fb_free_bytes)},
    {DCGM, "DCGM_FI_DEV_FB_USED", G, "Framebuffer memory used (in MiB).", TEL_MIB(fb_used_bytes)},
    {DCGM, "DCGM_FI_DEV_FB_RESERVED", G, "Framebuffer memory reserved (in MiB).",
     TEL_MIB(fb_reserved_bytes)},
    {DCGM, "DCGM_FI_PROF_PCIE_TX_BYTES", G,
     "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second.",
     TEL(pcie_tx_kbps, 1024), true},
    {DCGM, "DCGM_FI_PROF_PCIE_RX_BYTES", G,
     "The rate of data received over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second.",
     TEL(pcie_rx_kbps, 1024), true},
    // dcgm-exporter declares it a counter; here it is the NVLink data sent plus received since
    // the driver was loaded, in KiB (NVML's unit for these counters), over all links.
    {DCGM, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", C,
     "Total number of NVLink bandwidth counters for all lanes.",
     +[](const DeviceSample& d) -> std::optional<double> {
       if (!d.telemetry || !d.telemetry->nvlink_tx_kib || !d.telemetry->nvlink_rx_kib) return {};
       return static_cast<double>(*d.telemetry->nvlink_tx_kib + *d.telemetry->nvlink_rx_kib);
     },
     true},
    {DCGM, "DCGM_FI_PROF_NVLINK_TX_BYTES", G,
     "The rate of data transmitted over NVLink, not including protocol headers, in bytes per "
     "second.",
     +[](const DeviceSample& d) { return d.nvlink_tx_bytes_per_second; }, true},
    {DCGM, "DCGM_FI_PROF_NVLINK_RX_BYTES", G,
     "The rate of data received over NVLink, not including protocol headers, in bytes per "
     "second.",
     +[](const DeviceSample& d) { return d.nvlink_rx_bytes_per_second; }, true},

    // dcgm-exporter's profiling (DCP) fields, from NVML GPM where the GPU has it (Hopper and
    // newer): ratios 0..1, per GPU instance on MIG-enabled GPUs; absent without GPM.
    {DCGM, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", G, "Ratio of time the graphics engine is active.",
     GPM(graphics_util)},
    {DCGM, "DCGM_FI_PROF_SM_ACTIVE", G, "The ratio of cycles an SM has at least 1 warp assigned.",
     GPM(sm_util)},
    {DCGM, "DCGM_FI_PROF_SM_OCCUPANCY", G, "The ratio of number of warps resident on an SM.",
     GPM(sm_occupancy)},
    {DCGM, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", G,
     "Ratio of cycles the tensor (HMMA) pipe is active.", GPM(tensor_util)},
    {DCGM, "DCGM_FI_PROF_DRAM_ACTIVE", G,
     "Ratio of cycles the device memory interface is active sending or receiving data.",
     GPM(dram_bw_util)},
    {DCGM, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", G, "Ratio of cycles the fp64 pipes are active.",
     GPM(fp64_util)},
    {DCGM, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", G, "Ratio of cycles the fp32 pipes are active.",
     GPM(fp32_util)},
    {DCGM, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", G, "Ratio of cycles the fp16 pipes are active.",
     GPM(fp16_util)},

    // --- nvidia_gpu_exporter's nvidia_smi_* names: its units (hz, bytes, ratio), label uuid ---
    {SMI, "nvidia_smi_index", G, "index",
     +[](const DeviceSample& d) -> std::optional<double> { return d.device.index; }},
    {SMI, "nvidia_smi_utilization_gpu_ratio", G, "utilization.gpu [%]", TEL(gpu_util_pct, 0.01)},
    {SMI, "nvidia_smi_utilization_memory_ratio", G, "utilization.memory [%]",
     TEL(memory_util_pct, 0.01)},
    {SMI, "nvidia_smi_utilization_encoder_ratio", G, "utilization.encoder [%]",
     TEL(encoder_util_pct, 0.01)},
    {SMI, "nvidia_smi_utilization_decoder_ratio", G, "utilization.decoder [%]",
     TEL(decoder_util_pct, 0.01)},
    {SMI, "nvidia_smi_memory_total_bytes", G, "memory.total [MiB]", TEL(fb_total_bytes, 1)},
    {SMI, "nvidia_smi_memory_used_bytes", G, "memory.used [MiB]", TEL(fb_used_bytes, 1)},
    {SMI, "nvidia_smi_memory_free_bytes", G, "memory.free [MiB]", TEL(fb_free_bytes, 1)},
    {SMI, "nvidia_smi_memory_reserved_bytes", G, "memory.reserved [MiB]",
     TEL(fb_reserved_bytes, 1)},
    {SMI, "nvidia_smi_power_draw_watts", G, "power.draw [W]", TEL(power_usage_mw, 1e-3)},
    {SMI, "nvidia_smi_enforced_power_limit_watts", G, "enforced.power.limit [W]",
     TEL(power_limit_mw, 1e-3)},
    {SMI, "nvidia_smi_temperature_gpu", G, "temperature.gpu", TEL(gpu_temp_c, 1)},
    {SMI, "nvidia_smi_temperature_memory", G, "temperature.memory", TEL(memory_temp_c, 1)},
    {SMI, "nvidia_smi_clocks_current_graphics_clock_hz", G, "clocks.current.graphics [MHz]",
     TEL(graphics_clock_mhz, 1e6)},
    {SMI, "nvidia_smi_clocks_current_sm_clock_hz", G, "clocks.current.sm [MHz]",
     TEL(sm_clock_mhz, 1e6)},
    {SMI, "nvidia_smi_clocks_current_memory_clock_hz", G, "clocks.current.memory [MHz]",
     TEL(memory_clock_mhz, 1e6)},
    {SMI, "nvidia_smi_clocks_current_video_clock_hz", G, "clocks.current.video [MHz]",
     TEL(video_clock_mhz, 1e6)},
    {SMI, "nvidia_smi_clocks_event_reasons_active", G, "clocks_event_reasons.active",
     TEL(throttle_reasons, 1)},
    {SMI, "nvidia_smi_pstate", G, "pstate", TEL(pstate, 1)},
    {SMI, "nvidia_smi_fan_speed_ratio", G, "fan.speed [%]", TEL(fan_speed_pct, 0.01)},
    {SMI, "nvidia_smi_ecc_errors_corrected_volatile_total", G,
     "ecc.errors.corrected.volatile.total", TEL(ecc_sbe_volatile, 1)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_volatile_total", G,
     "ecc.errors.uncorrected.volatile.total", TEL(ecc_dbe_volatile, 1)},
    {SMI, "nvidia_smi_ecc_errors_corrected_aggregate_total", G,
     "ecc.errors.corrected.aggregate.total", TEL(ecc_sbe_aggregate, 1)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_aggregate_total", G,
     "ecc.errors.uncorrected.aggregate.total", TEL(ecc_dbe_aggregate, 1)},
    {SMI, "nvidia_smi_energy_joules_total", C, "Total energy consumption since driver load.",
     TEL(total_energy_mj, 1e-3)},
    {SMI, "nvidia_smi_pcie_throughput_tx_bytes_per_second", G, "PCIe transmit throughput.",
     TEL(pcie_tx_kbps, 1024)},
    {SMI, "nvidia_smi_pcie_throughput_rx_bytes_per_second", G, "PCIe receive throughput.",
     TEL(pcie_rx_kbps, 1024)},
    // The rest of `nvidia-smi --query-gpu` that NVML answers. Help: the query field, as
    // nvidia_gpu_exporter writes it. Static facts come from the inventory (read at start).
    {SMI, "nvidia_smi_compute_cap", G, "compute_cap",
     +[](const DeviceSample& d) -> std::optional<double> {
       if (d.device.cc_major == 0) return std::nullopt;
       return Numeric(absl::StrCat(d.device.cc_major, ".", d.device.cc_minor));
     }},
    {SMI, "nvidia_smi_serial", G, "serial",
     +[](const DeviceSample& d) { return Numeric(d.device.facts.serial); }},
    {SMI, "nvidia_smi_inforom_oem", G, "inforom.oem",
     +[](const DeviceSample& d) { return Numeric(d.device.facts.inforom_oem); }},
    {SMI, "nvidia_smi_inforom_ecc", G, "inforom.ecc",
     +[](const DeviceSample& d) { return Numeric(d.device.facts.inforom_ecc); }},
    {SMI, "nvidia_smi_pci_domain", G, "pci.domain", FACT(pci_domain, 1)},
    {SMI, "nvidia_smi_pci_bus", G, "pci.bus", FACT(pci_bus, 1)},
    {SMI, "nvidia_smi_pci_device", G, "pci.device", FACT(pci_device, 1)},
    {SMI, "nvidia_smi_pci_device_id", G, "pci.device_id",
     +[](const DeviceSample& d) -> std::optional<double> {
       if (d.device.pci_device_id == 0) return std::nullopt;
       return d.device.pci_device_id;
     }},
    {SMI, "nvidia_smi_pci_sub_device_id", G, "pci.sub_device_id", FACT(pci_subsystem_id, 1)},
    {SMI, "nvidia_smi_pci_base_class", G, "pci.baseClass", FACT(pci_base_class, 1)},
    {SMI, "nvidia_smi_pci_sub_class", G, "pci.subClass", FACT(pci_sub_class, 1)},
    {SMI, "nvidia_smi_compute_apps", G, "Number of processes with a compute context on the GPU.",
     +[](const DeviceSample& d) -> std::optional<double> {
       if (!d.telemetry) return std::nullopt;
       return static_cast<double>(d.telemetry->processes.size());
     }},
    {SMI, "nvidia_smi_pcie_link_gen_current", G, "pcie.link.gen.current",
     TEL(pcie_link_gen_current, 1)},
    // nvidia-smi's "gpucurrent" is the GPU side of the same link: NVML has one current generation.
    {SMI, "nvidia_smi_pcie_link_gen_gpucurrent", G, "pcie.link.gen.gpucurrent",
     TEL(pcie_link_gen_current, 1)},
    {SMI, "nvidia_smi_pcie_link_gen_max", G, "pcie.link.gen.max", FACT(pcie_link_gen_max, 1)},
    {SMI, "nvidia_smi_pcie_link_gen_gpumax", G, "pcie.link.gen.gpumax",
     FACT(pcie_link_gen_gpu_max, 1)},
    {SMI, "nvidia_smi_pcie_link_width_current", G, "pcie.link.width.current",
     TEL(pcie_link_width_current, 1)},
    {SMI, "nvidia_smi_pcie_link_width_max", G, "pcie.link.width.max", FACT(pcie_link_width_max, 1)},
    {SMI, "nvidia_smi_display_attached", G, "display_attached", FLAG(display_attached)},
    {SMI, "nvidia_smi_display_active", G, "display_active", FLAG(display_active)},
    {SMI, "nvidia_smi_persistence_mode", G, "persistence_mode", FLAG(persistence_mode)},
    {SMI, "nvidia_smi_accounting_mode", G, "accounting.mode", FLAG(accounting_mode)},
    {SMI, "nvidia_smi_accounting_buffer_size", G, "accounting.buffer_size",
     FACT(accounting_buffer_size, 1)},
    {SMI, "nvidia_smi_compute_mode", G, "compute_mode", TEL(compute_mode, 1)},
    {SMI, "nvidia_smi_mig_mode_current", G, "mig.mode.current",
     +[](const DeviceSample& d) -> std::optional<double> {
       if (!d.device.mig_capable) return std::nullopt;
       return d.device.mig_enabled ? 1 : 0;
     }},
    {SMI, "nvidia_smi_mig_mode_pending", G, "mig.mode.pending", FLAG(mig_mode_pending)},
    {SMI, "nvidia_smi_ecc_mode_current", G, "ecc.mode.current", FLAG(ecc_mode_current)},
    {SMI, "nvidia_smi_ecc_mode_pending", G, "ecc.mode.pending", FLAG(ecc_mode_pending)},
    {SMI, "nvidia_smi_gsp_mode_current", G, "gsp.mode.current",
     +[](const DeviceSample& d) { return Flag(d.device.facts.gsp_firmware_enabled); }},
    {SMI, "nvidia_smi_gsp_mode_default", G, "gsp.mode.default",
     +[](const DeviceSample& d) { return Flag(d.device.facts.gsp_firmware_default); }},
    {SMI, "nvidia_smi_utilization_jpeg_ratio", G, "utilization.jpeg [%]", TEL(jpeg_util_pct, 0.01)},
    {SMI, "nvidia_smi_utilization_ofa_ratio", G, "utilization.ofa [%]", TEL(ofa_util_pct, 0.01)},
    {SMI, "nvidia_smi_encoder_stats_session_count", G, "encoder.stats.sessionCount",
     TEL(encoder_sessions, 1)},
    {SMI, "nvidia_smi_encoder_stats_average_fps", G, "encoder.stats.averageFps",
     TEL(encoder_average_fps, 1)},
    {SMI, "nvidia_smi_encoder_stats_average_latency", G, "encoder.stats.averageLatency",
     TEL(encoder_average_latency_us, 1)},
    {SMI, "nvidia_smi_power_limit_watts", G, "power.limit [W]",
     TEL(power_management_limit_mw, 1e-3)},
    {SMI, "nvidia_smi_power_default_limit_watts", G, "power.default_limit [W]",
     FACT(power_default_limit_mw, 1e-3)},
    {SMI, "nvidia_smi_power_min_limit_watts", G, "power.min_limit [W]",
     FACT(power_min_limit_mw, 1e-3)},
    {SMI, "nvidia_smi_power_max_limit_watts", G, "power.max_limit [W]",
     FACT(power_max_limit_mw, 1e-3)},
    {SMI, "nvidia_smi_power_draw_average_watts", G, "power.draw.average [W]",
     TEL(power_average_mw, 1e-3)},
    {SMI, "nvidia_smi_power_draw_instant_watts", G, "power.draw.instant [W]",
     TEL(power_instant_mw, 1e-3)},
    {SMI, "nvidia_smi_clocks_max_graphics_clock_hz", G, "clocks.max.graphics [MHz]",
     FACT(max_graphics_clock_mhz, 1e6)},
    {SMI, "nvidia_smi_clocks_max_sm_clock_hz", G, "clocks.max.sm [MHz]",
     FACT(max_sm_clock_mhz, 1e6)},
    {SMI, "nvidia_smi_clocks_max_memory_clock_hz", G, "clocks.max.memory [MHz]",
     FACT(max_memory_clock_mhz, 1e6)},
    {SMI, "nvidia_smi_clocks_event_reasons_supported", G, "clocks_event_reasons.supported",
     FACT(supported_clock_event_reasons, 1)},
    // NVML's nvmlClocksEventReason* bits.
    {SMI, "nvidia_smi_clocks_event_reasons_gpu_idle", G, "clocks_event_reasons.gpu_idle",
     REASON(0x1)},
    {SMI, "nvidia_smi_clocks_event_reasons_applications_clocks_setting", G,
     "clocks_event_reasons.applications_clocks_setting", REASON(0x2)},
    {SMI, "nvidia_smi_clocks_event_reasons_sw_power_cap", G, "clocks_event_reasons.sw_power_cap",
     REASON(0x4)},
    {SMI, "nvidia_smi_clocks_event_reasons_hw_slowdown", G, "clocks_event_reasons.hw_slowdown",
     REASON(0x8)},
    {SMI, "nvidia_smi_clocks_event_reasons_sync_boost", G, "clocks_event_reasons.sync_boost",
     REASON(0x10)},
    {SMI, "nvidia_smi_clocks_event_reasons_sw_thermal_slowdown", G,
     "clocks_event_reasons.sw_thermal_slowdown", REASON(0x20)},
    {SMI, "nvidia_smi_clocks_event_reasons_hw_thermal_slowdown", G,
     "clocks_event_reasons.hw_thermal_slowdown", REASON(0x40)},
    {SMI, "nvidia_smi_clocks_event_reasons_hw_power_brake_slowdown", G,
     "clocks_event_reasons.hw_power_brake_slowdown", REASON(0x80)},
    {SMI, "nvidia_smi_clocks_event_reasons_counters_sw_power_cap_seconds", G,
     "clocks_event_reasons_counters.sw_power_cap [us]", TEL(clocks_event_power_cap_ns, 1e-9)},
    {SMI, "nvidia_smi_clocks_event_reasons_counters_sync_boost_seconds", G,
     "clocks_event_reasons_counters.sync_boost [us]", TEL(clocks_event_sync_boost_ns, 1e-9)},
    // ECC by location ([corrected, uncorrected][volatile, aggregate]); device_memory is DRAM.
    {SMI, "nvidia_smi_ecc_errors_corrected_volatile_device_memory", G,
     "ecc.errors.corrected.volatile.device_memory", ARRAY(ecc_dram, 0, 0)},
    {SMI, "nvidia_smi_ecc_errors_corrected_volatile_dram", G, "ecc.errors.corrected.volatile.dram",
     ARRAY(ecc_dram, 0, 0)},
    {SMI, "nvidia_smi_ecc_errors_corrected_volatile_sram", G, "ecc.errors.corrected.volatile.sram",
     ARRAY(ecc_sram, 0, 0)},
    {SMI, "nvidia_smi_ecc_errors_corrected_aggregate_device_memory", G,
     "ecc.errors.corrected.aggregate.device_memory", ARRAY(ecc_dram, 0, 1)},
    {SMI, "nvidia_smi_ecc_errors_corrected_aggregate_dram", G,
     "ecc.errors.corrected.aggregate.dram", ARRAY(ecc_dram, 0, 1)},
    {SMI, "nvidia_smi_ecc_errors_corrected_aggregate_sram", G,
     "ecc.errors.corrected.aggregate.sram", ARRAY(ecc_sram, 0, 1)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_volatile_device_memory", G,
     "ecc.errors.uncorrected.volatile.device_memory", ARRAY(ecc_dram, 1, 0)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_volatile_dram", G,
     "ecc.errors.uncorrected.volatile.dram", ARRAY(ecc_dram, 1, 0)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_volatile_sram", G,
     "ecc.errors.uncorrected.volatile.sram", ARRAY(ecc_sram, 1, 0)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_aggregate_device_memory", G,
     "ecc.errors.uncorrected.aggregate.device_memory", ARRAY(ecc_dram, 1, 1)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_aggregate_dram", G,
     "ecc.errors.uncorrected.aggregate.dram", ARRAY(ecc_dram, 1, 1)},
    {SMI, "nvidia_smi_ecc_errors_uncorrected_aggregate_sram", G,
     "ecc.errors.uncorrected.aggregate.sram", ARRAY(ecc_sram, 1, 1)},
    {SMI, "nvidia_smi_remapped_rows_correctable", G, "remapped_rows.correctable",
     TEL(remapped_rows_correctable, 1)},
    {SMI, "nvidia_smi_remapped_rows_uncorrectable", G, "remapped_rows.uncorrectable",
     TEL(remapped_rows_uncorrectable, 1)},
    {SMI, "nvidia_smi_remapped_rows_pending", G, "remapped_rows.pending",
     FLAG(remapped_rows_pending)},
    {SMI, "nvidia_smi_remapped_rows_failure", G, "remapped_rows.failure",
     FLAG(remapped_rows_failure)},
    {SMI, "nvidia_smi_remapped_rows_histogram_max", G, "remapped_rows.histogram.max", HISTOGRAM(0)},
    {SMI, "nvidia_smi_remapped_rows_histogram_high", G, "remapped_rows.histogram.high",
     HISTOGRAM(1)},
    {SMI, "nvidia_smi_remapped_rows_histogram_partial", G, "remapped_rows.histogram.partial",
     HISTOGRAM(2)},
    {SMI, "nvidia_smi_remapped_rows_histogram_low", G, "remapped_rows.histogram.low", HISTOGRAM(3)},
    {SMI, "nvidia_smi_remapped_rows_histogram_none", G, "remapped_rows.histogram.none",
     HISTOGRAM(4)},
};

#undef TEL
#undef TEL_MIB
#undef FACT
#undef FLAG
#undef REASON
#undef ARRAY
#undef HISTOGRAM
#undef GPM

std::string DeviceName(const gpu::Device& d) { return absl::StrCat("nvidia", d.minor); }

// nvidia_gpu_exporter's uuid label: lower case, without the "GPU-" prefix.
std::string SmiUuid(const gpu::Device& d) {
  return absl::AsciiStrToLower(absl::StripPrefix(d.uuid, "GPU-"));
}

// The label blocks of one GPU for each family set, built once per render.
struct DeviceBlocks {
  std::string own;       // {gpu,uuid}
  std::string smi;       // {uuid}
  std::string dcgm_gpu;  // GPU level (also: not MIG-enabled), one per container
  std::vector<std::string> dcgm_gpu_pods;
  // Per MIG device (its index in mig_devices) x its containers (or one pod-less block).
  std::vector<std::pair<size_t, std::string>> dcgm_mig;
};

std::string DcgmBlock(const Sample& s, const RenderOptions& o, const gpu::Device& d,
                      const gpu::MigDevice* mig, const ContainerDevice* c) {
  std::string gpu = absl::StrCat(d.index), dev = DeviceName(d);
  std::string gi = mig ? absl::StrCat(mig->gpu_instance_id) : "";
  std::vector<Label> l = {{"gpu", gpu},
                          {"UUID", d.uuid},
                          {"pci_bus_id", d.pci_bus_id},
                          {"device", dev},
                          {"modelName", d.name}};
  if (mig) {
    l.push_back({"GPU_I_PROFILE", mig->profile});
    l.push_back({"GPU_I_ID", gi});
  }
  if (o.dcgm_hostname) l.push_back({"Hostname", s.hostname});
  l.push_back({"DCGM_FI_DRIVER_VERSION", s.driver_version});
  // Old dcgm-exporter releases always emitted these three (empty without a pod); dashboards that
  // filter on pod="" keep working, and an empty label is an absent one to PromQL.
  l.push_back({"container", c ? std::string_view(c->container) : ""});
  l.push_back({"namespace", c ? std::string_view(c->namespace_) : ""});
  l.push_back({"pod", c ? std::string_view(c->pod) : ""});
  std::string out;
  for (const auto& [n, v] : l) {
    out.push_back(out.empty() ? '{' : ',');
    out.append(n).append("=\"");
    AppendEscapedLabelValue(&out, v);
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

// Blocks for (device, mig) with one block per distinct container; one pod-less block if none.
std::vector<std::string> DcgmBlocks(const Sample& s, const RenderOptions& o, size_t di, int mig) {
  const gpu::Device& d = s.devices[di].device;
  const gpu::MigDevice* m = mig >= 0 ? &d.mig_devices[mig] : nullptr;
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const ContainerDevice& c : s.containers) {
    if (c.device != di || c.mig != mig) continue;
    std::string b = DcgmBlock(s, o, d, m, &c);
    if (seen.insert(b).second) out.push_back(std::move(b));
  }
  if (out.empty()) out.push_back(DcgmBlock(s, o, d, m, nullptr));
  return out;
}

void RenderDeviceFamilies(const Sample& s, const RenderOptions& o, ExpositionWriter& w) {
  std::vector<DeviceBlocks> blocks(s.devices.size());
  for (size_t i = 0; i < s.devices.size(); ++i) {
    const gpu::Device& d = s.devices[i].device;
    DeviceBlocks& b = blocks[i];
    std::string idx = absl::StrCat(d.index);
    if (o.families & kGpuletFamilies) b.own = LabelBlock({{"gpu", idx}, {"uuid", d.uuid}});
    if (o.families & kNvidiaSmiFamilies) b.smi = LabelBlock({{"uuid", SmiUuid(d)}});
    if (o.families & kDcgmFamilies) {
      b.dcgm_gpu_pods = DcgmBlocks(s, o, i, -1);
      if (d.mig_enabled) {
        for (size_t m = 0; m < d.mig_devices.size(); ++m) {
          for (std::string& x : DcgmBlocks(s, o, i, static_cast<int>(m))) {
            b.dcgm_mig.emplace_back(m, std::move(x));
          }
        }
      }
    }
  }
  for (const DeviceFamily& f : kDeviceFamilies) {
    if (!(o.families & f.set)) continue;
    bool started = false;
    auto emit = [&](std::string_view block, double v) {
      if (!started) w.Family(f.name, f.type, f.help);
      started = true;
      w.SampleWithBlock(block, v);
    };
    for (size_t i = 0; i < s.devices.size(); ++i) {
      const DeviceSample& ds = s.devices[i];
      const DeviceBlocks& b = blocks[i];
      const bool mig_level = f.set == kDcgmFamilies && f.per_mig_instance && !b.dcgm_mig.empty();
      if (mig_level && f.get_mig) {  // measured per GPU instance
        for (const auto& [m, x] : b.dcgm_mig) {
          if (std::optional<double> v = f.get_mig(ds, ds.device.mig_devices[m])) emit(x, *v);
        }
        continue;
      }
      std::optional<double> v = f.get(ds);
      if (!v) continue;
      if (f.set == kGpuletFamilies) {
        emit(b.own, *v);
      } else if (f.set == kNvidiaSmiFamilies) {
        emit(b.smi, *v);
      } else if (mig_level) {
        for (const auto& [m, x] : b.dcgm_mig) emit(x, *v);
      } else {
        for (const std::string& x : b.dcgm_gpu_pods) emit(x, *v);
      }
    }
  }
}

void RenderGpuletExtras(const Sample& s, ExpositionWriter& w) {
  if (!s.devices.empty()) {
    w.Family("gpulet_gpu_info", G, "GPU identity; the value is always 1.");
    std::string cuda = CudaVersionString(s.cuda_driver_version);
    for (const DeviceSample& ds : s.devices) {
      const gpu::Device& d = ds.device;
      std::string idx = absl::StrCat(d.index), minor = absl::StrCat(d.minor),
                  numa = absl::StrCat(d.numa_node), cc = absl::StrCat(d.cc_major, ".", d.cc_minor);
      w.Sample({{"gpu", idx},
                {"uuid", d.uuid},
                {"name", d.name},
                {"brand", d.brand},
                {"architecture", d.architecture},
                {"pci_bus_id", d.pci_bus_id},
                {"minor_number", minor},
                {"numa_node", numa},
                {"compute_capability", cc},
                {"mig_mode", d.mig_enabled ? "enabled" : "disabled"},
                {"driver_version", s.driver_version},
                {"cuda_version", cuda}},
               1);
    }
  }
  bool any_mig = false;
  for (const DeviceSample& ds : s.devices) any_mig |= !ds.device.mig_devices.empty();
  if (any_mig) {
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 0) {
        w.Family("gpulet_mig_device_info", G, "MIG device identity; the value is always 1.");
      } else {
        w.Family("gpulet_mig_device_memory_total_bytes", G, "Memory of the MIG device.");
      }
      for (const DeviceSample& ds : s.devices) {
        std::string idx = absl::StrCat(ds.device.index);
        for (const gpu::MigDevice& m : ds.device.mig_devices) {
          if (pass == 1) {
            w.Sample({{"gpu", idx}, {"uuid", ds.device.uuid}, {"mig_uuid", m.uuid}},
                     static_cast<double>(m.memory_bytes));
            continue;
          }
          std::string gi = absl::StrCat(m.gpu_instance_id),
                      ci = absl::StrCat(m.compute_instance_id);
          w.Sample({{"gpu", idx},
                    {"uuid", ds.device.uuid},
                    {"mig_uuid", m.uuid},
                    {"profile", m.profile},
                    {"gpu_instance_id", gi},
                    {"compute_instance_id", ci}},
                   1);
        }
      }
    }
  }
  if (!s.containers.empty()) {
    w.Family("gpulet_container_gpu_info", G,
             "A container's GPU or MIG device, from the kubelet PodResources API; always 1. Join "
             "on uuid to attribute per-GPU series to pods.");
    std::set<std::string> seen;
    for (const ContainerDevice& c : s.containers) {
      const gpu::Device& d = s.devices[c.device].device;
      std::string idx = absl::StrCat(d.index);
      std::string b = LabelBlock({{"namespace", c.namespace_},
                                  {"pod", c.pod},
                                  {"container", c.container},
                                  {"resource", c.resource},
                                  {"device_id", c.device_id},
                                  {"gpu", idx},
                                  {"uuid", d.uuid},
                                  {"mig_uuid", c.mig >= 0 ? d.mig_devices[c.mig].uuid : ""}});
      if (seen.insert(b).second) w.SampleWithBlock(b, 1);
    }
  }
  if (!s.vgpu.empty()) {
    struct VgpuFamily {
      const char* name;
      const char* help;
      std::optional<double> (*get)(const VgpuUsage&);
    };
    static const VgpuFamily kVgpuFamilies[] = {
        {"gpulet_vgpu_container_memory_used_bytes", "Device memory a vGPU container holds.",
         +[](const VgpuUsage& u) -> std::optional<double> { return u.memory_used_bytes; }},
        {"gpulet_vgpu_container_memory_limit_bytes",
         "Device memory limit of a vGPU container (absent: no limit).",
         +[](const VgpuUsage& u) -> std::optional<double> {
           if (u.memory_limit_bytes == 0) return std::nullopt;
           return u.memory_limit_bytes;
         }},
        {"gpulet_vgpu_container_utilization_ratio",
         "Fraction of the GPU's compute a vGPU container used in the last period.",
         +[](const VgpuUsage& u) { return u.utilization_ratio; }},
        {"gpulet_vgpu_container_core_limit_ratio",
         "Share of the GPU's compute a vGPU container requested (vcuda-core / 100).",
         +[](const VgpuUsage& u) -> std::optional<double> { return u.core_limit_ratio; }},
    };
    std::vector<std::string> blocks;
    std::set<std::string> seen;
    for (const VgpuUsage& u : s.vgpu) {
      const gpu::Device& d = s.devices[u.device].device;
      std::string idx = absl::StrCat(d.index);
      std::string b = LabelBlock({{"namespace", u.namespace_},
                                  {"pod", u.pod},
                                  {"container", u.container},
                                  {"gpu", idx},
                                  {"uuid", d.uuid}});
      blocks.push_back(seen.insert(b).second ? std::move(b) : std::string());
    }
    for (const VgpuFamily& f : kVgpuFamilies) {
      bool started = false;
      for (size_t i = 0; i < s.vgpu.size(); ++i) {
        std::optional<double> v = f.get(s.vgpu[i]);
        if (!v || blocks[i].empty()) continue;
        if (!started) w.Family(f.name, G, f.help);
        started = true;
        w.SampleWithBlock(blocks[i], *v);
      }
    }
  }
}

void RenderSmiExtras(const Sample& s, ExpositionWriter& w) {
  if (!s.devices.empty()) {
    w.Family("nvidia_smi_gpu_info", G,
             "A metric with a constant '1' value labeled by gpu uuid, name, driver_version, "
             "vbios_version, pci_bus_id, serial, compute_cap, pci_sub_device_id, index, "
             "cuda_version.");
    std::string cuda = CudaVersionString(s.cuda_driver_version);
    for (const DeviceSample& ds : s.devices) {
      const gpu::Device& d = ds.device;
      std::string uuid = SmiUuid(d), idx = absl::StrCat(d.index),
                  cc = absl::StrCat(d.cc_major, ".", d.cc_minor);
      // nvidia-smi prints the subsystem id as 0x%08X.
      std::string sub = d.facts.pci_subsystem_id
                            ? absl::StrFormat("0x%08X", *d.facts.pci_subsystem_id)
                            : std::string();
      // Labels NVML cannot fill are left out (an empty label is an absent one).
      w.BeginSample();
      for (auto [n, v] : {Label{"compute_cap", cc}, Label{"cuda_version", cuda},
                          Label{"driver_version", s.driver_version}, Label{"index", idx},
                          Label{"name", d.name}, Label{"pci_bus_id", d.pci_bus_id},
                          Label{"pci_sub_device_id", sub}, Label{"serial", d.facts.serial},
                          Label{"uuid", uuid}, Label{"vbios_version", d.facts.vbios_version}}) {
        if (!v.empty()) w.AddLabel(n, v);
      }
      w.EndSample(1);
    }
    // nvidia_gpu_exporter's count: the number of GPUs, repeated on each GPU's series.
    w.Family("nvidia_smi_count", G, "count");
    for (const DeviceSample& ds : s.devices) {
      w.Sample({{"uuid", SmiUuid(ds.device)}}, static_cast<double>(s.devices.size()));
    }
  }
  bool any_xid = false;
  for (const DeviceSample& ds : s.devices) any_xid |= !ds.xid_counts.empty();
  if (any_xid) {
    w.Family("nvidia_smi_xid_errors_total", C, "XID errors by code.");
    for (const DeviceSample& ds : s.devices) {
      std::string uuid = SmiUuid(ds.device);
      for (const auto& [code, n] : ds.xid_counts) {
        std::string x = absl::StrCat(code);
        w.Sample({{"uuid", uuid}, {"xid", x}}, static_cast<double>(n));
      }
    }
  }
  w.Family("nvidia_smi_last_collect_success", G, "Whether the last collection succeeded.");
  w.Sample({}, s.self.nvml_up ? 1 : 0);
  w.Family("nvidia_smi_last_collect_duration_seconds", G, "Duration of the last collection.");
  w.Sample({}, s.self.collect_seconds);
  w.Family("nvidia_smi_failed_scrapes_total", C, "Number of failed collections.");
  w.Sample({}, static_cast<double>(s.self.nvml_errors));
}

void RenderSelf(const Sample& s, ExpositionWriter& w) {
  const SelfStats& st = s.self;
  w.Family("gpulet_exporter_nvml_up", G, "1 when NVML answered the last sampling cycle.");
  w.Sample({}, st.nvml_up ? 1 : 0);
  if (st.kubelet_enabled) {
    w.Family("gpulet_exporter_kubelet_up", G,
             "1 when the last kubelet PodResources List succeeded (pod attribution is current).");
    w.Sample({}, st.kubelet_up ? 1 : 0);
  }
  if (st.vgpu_enabled) {
    w.Family("gpulet_exporter_vgpu_accounting_up", G,
             "1 when the vGPU accounting was read in the last sampling cycle.");
    w.Sample({}, st.vgpu_up ? 1 : 0);
  }
  w.Family("gpulet_exporter_sampling_errors_total", C,
           "Failed reads of a source (nvml, kubelet, vgpu) since the exporter started.");
  w.Sample({{"source", "nvml"}}, static_cast<double>(st.nvml_errors));
  if (st.kubelet_enabled) w.Sample({{"source", "kubelet"}}, static_cast<double>(st.kubelet_errors));
  if (st.vgpu_enabled) w.Sample({{"source", "vgpu"}}, static_cast<double>(st.vgpu_errors));
  w.Family("gpulet_exporter_collect_duration_seconds", G,
           "Wall time of the sampling cycle that produced this snapshot.");
  w.Sample({}, st.collect_seconds);
  w.Family("gpulet_exporter_last_collect_timestamp_seconds", G,
           "When the snapshot being served was taken (Unix time).");
  w.Sample({}, static_cast<double>(st.collect_unix_ms) / 1000.0);
  if (st.bare_pods_reported >= 0) {
    w.Family("gpulet_node_bare_pods_rejected_total", C,
             "Pods without a controller that the kubelet rejected for GPU resources while the GPU "
             "stack was not ready after a boot; each also got a Warning event.");
    w.Sample({}, static_cast<double>(st.bare_pods_reported));
  }
}

}  // namespace

std::string CudaVersionString(int v) {
  if (v <= 0) return "";
  return absl::StrCat(v / 1000, ".", (v % 1000) / 10);
}

void Render(const Sample& s, const RenderOptions& o, Format format, std::string* out) {
  ExpositionWriter w(format, out);
  if (o.families & kGpuletFamilies) RenderGpuletExtras(s, w);
  RenderDeviceFamilies(s, o, w);
  if (o.families & kNvidiaSmiFamilies) RenderSmiExtras(s, w);
  if (o.families & kGpuManagerFamilies) RenderGpuManager(s, format, out);
  RenderSelf(s, w);
}

void RenderGpuManager(const Sample& s, Format format, std::string* out) {
  // GPU Manager (tkestack) served four families per container: what it used (per GPU index and
  // "total") and what it requested. Here: vGPU containers from the accounting, and containers
  // that hold a whole GPU alone (no replica suffix), whose usage is the device's.
  struct Row {
    std::string block;  // pod_name, namespace, node, container_name
    std::map<uint32_t, std::pair<std::optional<double>, std::optional<double>>> used;  // %, MiB
    double req_util = 0, req_mem_mib = 0;
  };
  std::map<std::string, Row> rows;
  auto row = [&](const std::string& ns, const std::string& pod, const std::string& c) -> Row& {
    std::string b = absl::StrCat("pod_name=\"");
    AppendEscapedLabelValue(&b, pod);
    b.append("\",namespace=\"");
    AppendEscapedLabelValue(&b, ns);
    b.append("\",node=\"");
    AppendEscapedLabelValue(&b, s.hostname);
    b.append("\",container_name=\"");
    AppendEscapedLabelValue(&b, c);
    b.append("\"");
    Row& r = rows[b];
    r.block = b;
    return r;
  };
  std::map<size_t, int> holders;  // device -> containers holding it whole
  for (const ContainerDevice& c : s.containers) {
    if (c.mig < 0) holders[c.device] += 1;
  }
  for (const ContainerDevice& c : s.containers) {
    if (c.mig >= 0 || holders[c.device] != 1 || c.device_id.find("::") != std::string::npos) {
      continue;
    }
    const DeviceSample& d = s.devices[c.device];
    Row& r = row(c.namespace_, c.pod, c.container);
    auto util = Tel(d, &gpu::Telemetry::gpu_util_pct, 1);
    auto mem = Mib(Tel(d, &gpu::Telemetry::fb_used_bytes, 1));
    r.used[d.device.index] = {util, mem};
    r.req_util += 1;
    r.req_mem_mib += std::floor(static_cast<double>(d.device.memory_bytes) / 1048576.0);
  }
  for (const VgpuUsage& u : s.vgpu) {
    const gpu::Device& d = s.devices[u.device].device;
    Row& r = row(u.namespace_, u.pod, u.container);
    std::optional<double> util;
    if (u.utilization_ratio) util = *u.utilization_ratio * 100;
    r.used[d.index] = {util, std::floor(static_cast<double>(u.memory_used_bytes) / 1048576.0)};
    r.req_util += u.core_limit_ratio;
    uint64_t limit = u.memory_limit_bytes ? u.memory_limit_bytes : d.memory_bytes;
    r.req_mem_mib += std::floor(static_cast<double>(limit) / 1048576.0);
  }
  if (rows.empty()) return;
  ExpositionWriter w(format, out);
  struct F {
    const char* name;
    const char* help;
    const char* per_label;
    int which;
  };
  const F fs[] = {
      {"container_gpu_utilization", "gpu utilization", "gpu", 0},
      {"container_gpu_memory_total", "gpu memory usage in MiB", "gpu_memory", 1},
      {"container_request_gpu_utilization", "request of gpu utilization", "req_of_gpu", 2},
      {"container_request_gpu_memory", "request of gpu memory in MiB", "req_of_gpu_memory", 3},
  };
  for (const F& f : fs) {
    w.Family(f.name, G, f.help);
    for (const auto& [key, r] : rows) {
      // An init-capture: clang 14 (make lint) cannot capture structured bindings.
      auto emit = [&, &r = r](std::string_view per, double v) {
        std::string b = absl::StrCat("{", r.block, ",", f.per_label, "=\"");
        b.append(per).append("\"}");
        w.SampleWithBlock(b, v);
      };
      if (f.which >= 2) {
        emit("total", f.which == 2 ? r.req_util : r.req_mem_mib);
        continue;
      }
      double total = 0;
      bool any = false;
      for (const auto& [gpu_index, used] : r.used) {
        const std::optional<double>& v = f.which == 0 ? used.first : used.second;
        if (!v) continue;
        emit(absl::StrCat(gpu_index), *v);
        total += *v;
        any = true;
      }
      if (any) emit("total", total);
    }
  }
}

}  // namespace gpulet::metrics
