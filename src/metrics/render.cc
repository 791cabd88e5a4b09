#include "metrics/render.h"

#include <cmath>
#include <set>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
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
     "1 when the GPU answered this sampling cycle, 0 when it is lost or NVML failed for it.",
     +[](const DeviceSample& d) -> std::optional<double> { return d.healthy ? 1 : 0; }},
    {OWN, "gpulet_gpu_xid_errors_total", C, "XID events since the exporter started.",
     +[](const DeviceSample& d) -> std::optional<double> {
       double n = 0;
       for (const auto& [code, count] : d.xid_counts) n += static_cast<double>(count);
       return n;
     }},
    {OWN, "gpulet_gpu_xid_last_code", G, "Code of the most recent XID event; 0 when none.",
     +[](const DeviceSample& d) -> std::optional<double> { return d.xid_last; }},

    // --- dcgm-exporter's default counters (etc/default-counters.csv) that NVML provides ---
    {DCGM, "DCGM_FI_DEV_SM_CLOCK", G, "SM clock frequency (in MHz).", TEL(sm_clock_mhz, 1), true},
    {DCGM, "DCGM_FI_DEV_MEM_CLOCK", G, "Memory clock frequency (in MHz).",
     TEL(memory_clock_mhz, 1), true},
    {DCGM, "DCGM_FI_DEV_MEMORY_TEMP", G, "Memory temperature (in C).", TEL(memory_temp_c, 1),
     true},
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
};

#undef TEL
#undef TEL_MIB

std::string DeviceName(const gpu::Device& d) { return absl::StrCat("nvidia", d.minor); }

// nvidia_gpu_exporter's uuid label: lower case, without the "GPU-" prefix.
std::string SmiUuid(const gpu::Device& d) {
  return absl::AsciiStrToLower(absl::StripPrefix(d.uuid, "GPU-"));
}

// The label blocks of one GPU for each family set, built once per render.
struct DeviceBlocks {
  std::string own;                 // {gpu,uuid}
  std::string smi;                 // {uuid}
  std::string dcgm_gpu;            // GPU level (also: not MIG-enabled), one per container
  std::vector<std::string> dcgm_gpu_pods;
  std::vector<std::string> dcgm_mig;  // per MIG instance x its containers (or one empty)
};

std::string DcgmBlock(const Sample& s, const RenderOptions& o, const gpu::Device& d,
                      const gpu::MigDevice* mig, const ContainerDevice* c) {
  std::string gpu = absl::StrCat(d.index), dev = DeviceName(d);
  std::string gi = mig ? absl::StrCat(mig->gpu_instance_id) : "";
  std::vector<Label> l = {{"gpu", gpu}, {"UUID", d.uuid}, {"pci_bus_id", d.pci_bus_id},
                          {"device", dev}, {"modelName", d.name}};
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
            b.dcgm_mig.push_back(std::move(x));
          }
        }
      }
    }
  }
  for (const DeviceFamily& f : kDeviceFamilies) {
    if (!(o.families & f.set)) continue;
    bool started = false;
    for (size_t i = 0; i < s.devices.size(); ++i) {
      std::optional<double> v = f.get(s.devices[i]);
      if (!v) continue;
      if (!started) w.Family(f.name, f.type, f.help);
      started = true;
      const DeviceBlocks& b = blocks[i];
      if (f.set == kGpuletFamilies) {
        w.SampleWithBlock(b.own, *v);
      } else if (f.set == kNvidiaSmiFamilies) {
        w.SampleWithBlock(b.smi, *v);
      } else {
        bool mig_level = f.per_mig_instance && !b.dcgm_mig.empty();
        for (const std::string& x : mig_level ? b.dcgm_mig : b.dcgm_gpu_pods) {
          w.SampleWithBlock(x, *v);
        }
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
                  numa = absl::StrCat(d.numa_node),
                  cc = absl::StrCat(d.cc_major, ".", d.cc_minor);
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
          std::string gi = absl::StrCat(m.gpu_instance_id), ci = absl::StrCat(m.compute_instance_id);
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
             "pci_bus_id, compute_cap, index, cuda_version.");
    std::string cuda = CudaVersionString(s.cuda_driver_version);
    for (const DeviceSample& ds : s.devices) {
      const gpu::Device& d = ds.device;
      std::string uuid = SmiUuid(d), idx = absl::StrCat(d.index),
                  cc = absl::StrCat(d.cc_major, ".", d.cc_minor);
      w.Sample({{"compute_cap", cc},
                {"cuda_version", cuda},
                {"driver_version", s.driver_version},
                {"index", idx},
                {"name", d.name},
                {"pci_bus_id", d.pci_bus_id},
                {"uuid", uuid}},
               1);
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
      auto emit = [&](std::string_view per, double v) {
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
