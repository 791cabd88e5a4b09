// The subset of the CUDA driver API and NVML ABI that the interposer and the fake driver use,
// declared from NVIDIA's published driver API reference (names, signatures, struct layouts and
// enum values are ABI facts). We never include NVIDIA's cuda.h/nvml.h: a Debian machine has
// neither, and the interposer must build without them (DESIGN.md "Headers for NVML and CUDA").
// NVML types come from the GPU layer's ABI header. Plain C types only, so both the extern "C" shims
// and the fake can share it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi/nvml_api.h"  // the project's NVML ABI subset (types only)

extern "C" {

typedef int CUresult;
enum : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;  // _v2 (64-bit) device pointer
typedef unsigned int CUdeviceptr_v1;     // the pre-3.2 32-bit entry points
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUfunc_st* CUfunction;
typedef struct CUmod_st* CUmodule;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUarray_st* CUarray;
typedef struct CUmipmappedArray_st* CUmipmappedArray;
typedef struct CUmemPoolHandle_st* CUmemoryPool;

typedef struct CUuuid_st {
  char bytes[16];
} CUuuid;

// cuGetProcAddress flags and the _v2 query result.
enum : unsigned long long {
  CU_GET_PROC_ADDRESS_DEFAULT = 0,
  CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef int CUdriverProcAddressQueryResult;
enum : int {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
};

enum : unsigned int { CU_EVENT_DEFAULT = 0, CU_EVENT_DISABLE_TIMING = 2 };
enum : int { CU_MEM_LOCATION_TYPE_DEVICE = 1 };

typedef struct CUmemLocation_st {
  int type;  // CUmemLocationType
  int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
  int type;                  // CUmemAllocationType
  int requestedHandleTypes;  // CUmemAllocationHandleType
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned int numAttrs;
} CUlaunchConfig;

// CUarray_format values that fix an element size; others are sized conservatively (see core).
enum : int {
  CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
  CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
  CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
  CU_AD_FORMAT_SIGNED_INT8 = 0x08,
  CU_AD_FORMAT_SIGNED_INT16 = 0x09,
  CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
  CU_AD_FORMAT_HALF = 0x10,
  CU_AD_FORMAT_FLOAT = 0x20,
};
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  int Format;  // CUarray_format
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  size_t Depth;
  int Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

// The pre-3.2 (32-bit size) descriptors taken by the unsuffixed cuArrayCreate/cuArray3DCreate.
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
  unsigned int Width, Height;
  int Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
  unsigned int Width, Height, Depth;
  int Format;
  unsigned int NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

// nvmlDeviceGetProcessUtilization's record: per process, the percent of the sample period its
// kernels ran (smUtil), stamped in microseconds.
typedef struct {
  unsigned int pid;
  unsigned long long timeStamp;
  unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

}  // extern "C"

// Function-pointer types of the real driver entry points the interposer calls or wraps.
namespace gpulet::cuda {
using cuGetProcAddress_t = CUresult (*)(const char*, void**, int, cuuint64_t);
using cuGetProcAddress_v2_t = CUresult (*)(const char*, void**, int, cuuint64_t,
                                           CUdriverProcAddressQueryResult*);
using cuMemAlloc_t = CUresult (*)(CUdeviceptr*, size_t);
using cuMemAlloc_v1_t = CUresult (*)(CUdeviceptr_v1*, unsigned int);
using cuMemAllocPitch_t = CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
using cuMemAllocPitch_v1_t = CUresult (*)(CUdeviceptr_v1*, unsigned int*, unsigned int,
                                          unsigned int, unsigned int);
using cuMemAllocManaged_t = CUresult (*)(CUdeviceptr*, size_t, unsigned int);
using cuMemAllocAsync_t = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using cuMemAllocFromPoolAsync_t = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
using cuMemCreate_t = CUresult (*)(CUmemGenericAllocationHandle*, size_t,
                                   const CUmemAllocationProp*, unsigned long long);
using cuMemRelease_t = CUresult (*)(CUmemGenericAllocationHandle);
using cuMemMap_t = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                unsigned long long);
using cuMemUnmap_t = CUresult (*)(CUdeviceptr, size_t);
using cuArrayCreate_t = CUresult (*)(CUarray*, const CUDA_ARRAY_DESCRIPTOR*);
using cuArray3DCreate_t = CUresult (*)(CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*);
using cuArrayCreate_v1_t = CUresult (*)(CUarray*, const CUDA_ARRAY_DESCRIPTOR_v1*);
using cuArray3DCreate_v1_t = CUresult (*)(CUarray*, const CUDA_ARRAY3D_DESCRIPTOR_v1*);
using cuMipmappedArrayCreate_t = CUresult (*)(CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*,
                                              unsigned int);
using cuArrayDestroy_t = CUresult (*)(CUarray);
using cuMipmappedArrayDestroy_t = CUresult (*)(CUmipmappedArray);
using cuMemFree_t = CUresult (*)(CUdeviceptr);
using cuMemFree_v1_t = CUresult (*)(CUdeviceptr_v1);
using cuMemFreeAsync_t = CUresult (*)(CUdeviceptr, CUstream);
using cuMemGetInfo_t = CUresult (*)(size_t*, size_t*);
using cuMemGetInfo_v1_t = CUresult (*)(unsigned int*, unsigned int*);
using cuDeviceTotalMem_t = CUresult (*)(size_t*, CUdevice);
using cuDeviceTotalMem_v1_t = CUresult (*)(unsigned int*, CUdevice);
using cuCtxCreate_t = CUresult (*)(CUcontext*, unsigned int, CUdevice);
using cuCtxCreate_v3_t = CUresult (*)(CUcontext*, void*, int, unsigned int, CUdevice);
using cuCtxCreate_v4_t = CUresult (*)(CUcontext*, void*, unsigned int, CUdevice);
using cuCtxDestroy_t = CUresult (*)(CUcontext);
using cuDevicePrimaryCtxRetain_t = CUresult (*)(CUcontext*, CUdevice);
using cuDevicePrimaryCtxRelease_t = CUresult (*)(CUdevice);
using cuLaunchKernel_t = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, CUstream, void**, void**);
using cuLaunchCooperativeKernel_t = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                                 unsigned, unsigned, unsigned, CUstream, void**);
using cuLaunchKernelEx_t = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using cuGraphLaunch_t = CUresult (*)(CUgraphExec, CUstream);
using cuLaunch_t = CUresult (*)(CUfunction);
using cuLaunchGrid_t = CUresult (*)(CUfunction, int, int);
using cuLaunchGridAsync_t = CUresult (*)(CUfunction, int, int, CUstream);
// Helpers the core calls on the real driver (never hooked).
using cuDeviceGetCount_t = CUresult (*)(int*);
using cuDeviceGet_t = CUresult (*)(CUdevice*, int);
using cuDeviceGetUuid_t = CUresult (*)(CUuuid*, CUdevice);
using cuCtxGetDevice_t = CUresult (*)(CUdevice*);
using cuCtxGetCurrent_t = CUresult (*)(CUcontext*);
using cuEventCreate_t = CUresult (*)(CUevent*, unsigned int);
using cuEventDestroy_t = CUresult (*)(CUevent);
using cuEventRecord_t = CUresult (*)(CUevent, CUstream);
using cuEventQuery_t = CUresult (*)(CUevent);
using cuEventSynchronize_t = CUresult (*)(CUevent);
using cuEventElapsedTime_t = CUresult (*)(float*, CUevent, CUevent);
using nvmlDeviceGetMemoryInfo_t = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using nvmlDeviceGetMemoryInfo_v2_t = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*);
using nvmlDeviceGetUUID_t = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using nvmlDeviceGetProcessUtilization_t = nvmlReturn_t (*)(nvmlDevice_t,
                                                           nvmlProcessUtilizationSample_t*,
                                                           unsigned int*, unsigned long long);
}  // namespace gpulet::cuda
