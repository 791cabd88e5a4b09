// The subset of NVIDIA's NVML C ABI that gpulet uses, declared from NVIDIA's published API
// reference (no NVIDIA header is needed to build). Shared by the dlopen backend (nvml_layer.cc),
// which resolves these symbols at run time, and by the fake libnvidia-ml.so.1 (testing/fake_nvml),
// which implements them. Only types, constants and function-pointer types live here: nothing is
// linked against NVML.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef int nvmlReturn_t;
enum : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_IN_USE = 19,
  NVML_ERROR_MEMORY = 20,
  NVML_ERROR_NO_DATA = 21,
  NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;

enum : unsigned {
  NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96,
  NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96,
  NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80,
  NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80,
  NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32,
  NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16,
  NVML_NVLINK_MAX_LINKS = 18,
};

typedef struct {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;  // device id << 16 | vendor id
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];  // "00000000:18:00.0"
} nvmlPciInfo_t;

typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
  unsigned int version;  // nvmlMemory_v2 below
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION_OF(type, ver) (unsigned int)(sizeof(type) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION_OF(nvmlMemory_v2_t, 2)

typedef struct {
  unsigned int gpu, memory;  // percent
} nvmlUtilization_t;

// The process record of nvmlDeviceGetComputeRunningProcesses_v3 (and _v2).
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount, sharedJpegCount,
      sharedOfaCount;
  unsigned int gpuInstanceSliceCount, computeInstanceSliceCount;
  unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
  nvmlDevice_t device;  // the physical GPU, also for MIG events
  unsigned long long eventType;
  unsigned long long eventData;  // the XID code for XID events
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

enum : unsigned long long {
  nvmlEventTypeSingleBitEccError = 0x1ULL,
  nvmlEventTypeDoubleBitEccError = 0x2ULL,
  nvmlEventTypePState = 0x4ULL,
  nvmlEventTypeXidCriticalError = 0x8ULL,
  nvmlEventTypeClock = 0x10ULL,
};

// nvmlDeviceGetFieldValues: the memory temperature (HBM boards) and the NVLink data counters
// (KiB since driver load; scopeId = link number, or kNvmlScopeAllLinks for the sum over links).
enum : unsigned {
  NVML_FI_DEV_MEMORY_TEMP = 82,
  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138,
  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139,
};
inline constexpr unsigned kNvmlScopeAllLinks = 0xFFFFFFFFu;
typedef union {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  signed int siVal;
} nvmlValue_t;
typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;  // nvmlValueType_t: 0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong, 5 sint
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;

typedef int nvmlGpuTopologyLevel_t;
enum : int {
  NVML_TOPOLOGY_INTERNAL = 0,
  NVML_TOPOLOGY_SINGLE = 10,
  NVML_TOPOLOGY_MULTIPLE = 20,
  NVML_TOPOLOGY_HOSTBRIDGE = 30,
  NVML_TOPOLOGY_NODE = 40,
  NVML_TOPOLOGY_SYSTEM = 50,
};

typedef int nvmlEnableState_t;
enum : int { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 };

typedef int nvmlIntNvLinkDeviceType_t;
enum : int {
  NVML_NVLINK_DEVICE_TYPE_GPU = 0,
  NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1,
  NVML_NVLINK_DEVICE_TYPE_SWITCH = 2,
  NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF,
};

enum : int { NVML_TEMPERATURE_GPU = 0 };
enum : int { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };
enum : int { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum : int { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
enum : int { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };

// nvmlBrandType_t
enum : int {
  NVML_BRAND_UNKNOWN = 0,
  NVML_BRAND_QUADRO = 1,
  NVML_BRAND_TESLA = 2,
  NVML_BRAND_NVS = 3,
  NVML_BRAND_GRID = 4,
  NVML_BRAND_GEFORCE = 5,
  NVML_BRAND_TITAN = 6,
  NVML_BRAND_NVIDIA_VAPPS = 7,
  NVML_BRAND_NVIDIA_VPC = 8,
  NVML_BRAND_NVIDIA_VCS = 9,
  NVML_BRAND_NVIDIA_VWS = 10,
  NVML_BRAND_NVIDIA_CLOUD_GAMING = 11,
  NVML_BRAND_QUADRO_RTX = 12,
  NVML_BRAND_NVIDIA_RTX = 13,
  NVML_BRAND_NVIDIA = 14,
  NVML_BRAND_GEFORCE_RTX = 15,
  NVML_BRAND_TITAN_RTX = 16,
};
// nvmlDeviceArchitecture_t
enum : unsigned {
  NVML_DEVICE_ARCH_KEPLER = 2,
  NVML_DEVICE_ARCH_MAXWELL = 3,
  NVML_DEVICE_ARCH_PASCAL = 4,
  NVML_DEVICE_ARCH_VOLTA = 5,
  NVML_DEVICE_ARCH_TURING = 6,
  NVML_DEVICE_ARCH_AMPERE = 7,
  NVML_DEVICE_ARCH_ADA = 8,
  NVML_DEVICE_ARCH_HOPPER = 9,
  NVML_DEVICE_ARCH_BLACKWELL = 10,
};

// nvmlDeviceGetFieldValues ids of the nvidia-smi set: power averaged over 1 s and instantaneous
// (mW, scopeId 0 = the GPU alone), and the time clocks were held back by the power cap / sync
// boost (ns since driver load; these two ids are the old NVML_FI_DEV_PERF_POLICY_* numbers, the
// same in every header, unlike the thermal/power-brake counters that moved between releases).
enum : unsigned {
  NVML_FI_DEV_PERF_POLICY_POWER = 74,
  NVML_FI_DEV_PERF_POLICY_SYNC_BOOST = 76,
  NVML_FI_DEV_POWER_AVERAGE = 185,
  NVML_FI_DEV_POWER_INSTANT = 186,
};

enum : int { NVML_INFOROM_OEM = 0, NVML_INFOROM_ECC = 1 };
enum : unsigned {
  NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE = 16,
  NVML_DEVICE_SERIAL_BUFFER_SIZE = 30,
  NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE = 32
};
// nvmlMemoryLocation_t for nvmlDeviceGetMemoryErrorCounter (DRAM and DEVICE_MEMORY share 2).
enum : int { NVML_MEMORY_LOCATION_DRAM = 2, NVML_MEMORY_LOCATION_SRAM = 7 };

// nvmlDeviceGetRowRemapperHistogram: banks by how many spare rows they have left.
typedef struct {
  unsigned int max, high, partial, low, none;
} nvmlRowRemapperHistogramValues_t;

// ---- GPM (GPU Performance Monitoring, Hopper and newer), from NVIDIA's nvml.h ----
// A metric is computed from two samples of the same device (or GPU instance) taken some time
// apart. nvmlGpmSample_t is an opaque handle (nvml.h: typedef struct nvmlGpmSample_st*).
typedef struct nvmlGpmSample_st* nvmlGpmSample_t;
enum : unsigned {
  NVML_GPM_METRIC_GRAPHICS_UTIL = 1,
  NVML_GPM_METRIC_SM_UTIL = 2,
  NVML_GPM_METRIC_SM_OCCUPANCY = 3,
  NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5,
  NVML_GPM_METRIC_DRAM_BW_UTIL = 10,
  NVML_GPM_METRIC_FP64_UTIL = 11,
  NVML_GPM_METRIC_FP32_UTIL = 12,
  NVML_GPM_METRIC_FP16_UTIL = 13,
  NVML_GPM_METRIC_MAX = 98,  // the array size of nvmlGpmMetricsGet_t version 1
};
enum : unsigned { NVML_GPM_METRICS_GET_VERSION = 1, NVML_GPM_SUPPORT_VERSION = 1 };
typedef struct {
  unsigned int metricId;    // IN
  nvmlReturn_t nvmlReturn;  // OUT: this metric's status; value is valid only on NVML_SUCCESS
  double value;             // OUT: percent 0..100 for the *_UTIL / OCCUPANCY metrics
  struct {
    char* shortName;
    char* longName;
    char* unit;
  } metricInfo;  // OUT: may be NULL
} nvmlGpmMetric_t;
typedef struct {
  unsigned int version;     // IN: NVML_GPM_METRICS_GET_VERSION
  unsigned int numMetrics;  // IN: entries used in metrics[]
  nvmlGpmSample_t sample1;  // IN: the earlier sample
  nvmlGpmSample_t sample2;  // IN: the later sample
  nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
typedef struct {
  unsigned int version;            // IN: NVML_GPM_SUPPORT_VERSION
  unsigned int isSupportedDevice;  // OUT
} nvmlGpmSupport_t;
// The layout above is NVIDIA's; a mismatch would corrupt what NVML writes back.
static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t layout");
static_assert(offsetof(nvmlGpmMetricsGet_t, sample1) == 8, "nvmlGpmMetricsGet_t layout");
static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t layout");
static_assert(sizeof(nvmlGpmMetricsGet_t) == 24 + 98 * 40, "nvmlGpmMetricsGet_t layout");

// Function types, one per symbol gpulet resolves (the name follows the symbol's, without "nvml").
typedef nvmlReturn_t (*nvmlInitFn)(void);
typedef nvmlReturn_t (*nvmlShutdownFn)(void);
typedef const char* (*nvmlErrorStringFn)(nvmlReturn_t);
typedef nvmlReturn_t (*nvmlSystemGetStringFn)(char*, unsigned int);
typedef nvmlReturn_t (*nvmlSystemGetCudaDriverVersionFn)(int*);
typedef nvmlReturn_t (*nvmlDeviceGetCountFn)(unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetHandleByIndexFn)(unsigned int, nvmlDevice_t*);
typedef nvmlReturn_t (*nvmlDeviceGetStringFn)(nvmlDevice_t, char*, unsigned int);
typedef nvmlReturn_t (*nvmlDeviceGetUintFn)(nvmlDevice_t, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetUllFn)(nvmlDevice_t, unsigned long long*);
typedef nvmlReturn_t (*nvmlDeviceGetIntFn)(nvmlDevice_t, int*);  // brand, pstate
typedef nvmlReturn_t (*nvmlDeviceGetPciInfoFn)(nvmlDevice_t, nvmlPciInfo_t*);
typedef nvmlReturn_t (*nvmlDeviceGetMemoryInfoFn)(nvmlDevice_t, nvmlMemory_t*);
typedef nvmlReturn_t (*nvmlDeviceGetMemoryInfoV2Fn)(nvmlDevice_t, nvmlMemory_v2_t*);
typedef nvmlReturn_t (*nvmlDeviceGetCudaComputeCapabilityFn)(nvmlDevice_t, int*, int*);
typedef nvmlReturn_t (*nvmlDeviceGetMigModeFn)(nvmlDevice_t, unsigned int*, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetMigDeviceHandleByIndexFn)(nvmlDevice_t, unsigned int,
                                                              nvmlDevice_t*);
typedef nvmlReturn_t (*nvmlDeviceGetAttributesFn)(nvmlDevice_t, nvmlDeviceAttributes_t*);
typedef nvmlReturn_t (*nvmlDeviceGetTopologyCommonAncestorFn)(nvmlDevice_t, nvmlDevice_t,
                                                              nvmlGpuTopologyLevel_t*);
typedef nvmlReturn_t (*nvmlDeviceGetNvLinkStateFn)(nvmlDevice_t, unsigned int, nvmlEnableState_t*);
typedef nvmlReturn_t (*nvmlDeviceGetNvLinkRemotePciInfoFn)(nvmlDevice_t, unsigned int,
                                                           nvmlPciInfo_t*);
typedef nvmlReturn_t (*nvmlDeviceGetNvLinkRemoteDeviceTypeFn)(nvmlDevice_t, unsigned int,
                                                              nvmlIntNvLinkDeviceType_t*);
typedef nvmlReturn_t (*nvmlDeviceGetTemperatureFn)(nvmlDevice_t, int, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetFieldValuesFn)(nvmlDevice_t, int, nvmlFieldValue_t*);
typedef nvmlReturn_t (*nvmlDeviceGetClockInfoFn)(nvmlDevice_t, int, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetUtilizationRatesFn)(nvmlDevice_t, nvmlUtilization_t*);
typedef nvmlReturn_t (*nvmlDeviceGetCodecUtilizationFn)(nvmlDevice_t, unsigned int*, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetTotalEccErrorsFn)(nvmlDevice_t, int, int, unsigned long long*);
typedef nvmlReturn_t (*nvmlDeviceGetPcieThroughputFn)(nvmlDevice_t, int, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetProcessesFn)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*);
typedef nvmlReturn_t (*nvmlEventSetCreateFn)(nvmlEventSet_t*);
typedef nvmlReturn_t (*nvmlEventSetFreeFn)(nvmlEventSet_t);
typedef nvmlReturn_t (*nvmlDeviceRegisterEventsFn)(nvmlDevice_t, unsigned long long,
                                                   nvmlEventSet_t);
typedef nvmlReturn_t (*nvmlEventSetWaitFn)(nvmlEventSet_t, nvmlEventData_t*, unsigned int);
// The nvidia-smi set (answers of several getters share a shape: see the Uint/Ull/Int types above).
typedef nvmlReturn_t (*nvmlDeviceGetEnableStateFn)(nvmlDevice_t, nvmlEnableState_t*);
typedef nvmlReturn_t (*nvmlDeviceGetEccModeFn)(nvmlDevice_t, nvmlEnableState_t*,
                                               nvmlEnableState_t*);
typedef nvmlReturn_t (*nvmlDeviceGetTwoUintFn)(nvmlDevice_t, unsigned int*, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetInforomVersionFn)(nvmlDevice_t, int, char*, unsigned int);
typedef nvmlReturn_t (*nvmlDeviceGetMemoryErrorCounterFn)(nvmlDevice_t, int, int, int,
                                                          unsigned long long*);
typedef nvmlReturn_t (*nvmlDeviceGetRemappedRowsFn)(nvmlDevice_t, unsigned int*, unsigned int*,
                                                    unsigned int*, unsigned int*);
typedef nvmlReturn_t (*nvmlDeviceGetRowRemapperHistogramFn)(nvmlDevice_t,
                                                            nvmlRowRemapperHistogramValues_t*);
typedef nvmlReturn_t (*nvmlDeviceGetEncoderStatsFn)(nvmlDevice_t, unsigned int*, unsigned int*,
                                                    unsigned int*);
// GPM.
typedef nvmlReturn_t (*nvmlGpmQueryDeviceSupportFn)(nvmlDevice_t, nvmlGpmSupport_t*);
typedef nvmlReturn_t (*nvmlGpmSampleAllocFn)(nvmlGpmSample_t*);
typedef nvmlReturn_t (*nvmlGpmSampleFreeFn)(nvmlGpmSample_t);
typedef nvmlReturn_t (*nvmlGpmSampleGetFn)(nvmlDevice_t, nvmlGpmSample_t);
typedef nvmlReturn_t (*nvmlGpmMigSampleGetFn)(nvmlDevice_t, unsigned int, nvmlGpmSample_t);
typedef nvmlReturn_t (*nvmlGpmMetricsGetFn)(nvmlGpmMetricsGet_t*);

}  // extern "C"
