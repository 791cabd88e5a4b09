#!/usr/bin/env bash
# The host facts gpulet's fakes and fake roots must match (printed before the gpu-check table when
# asked: `check.sh` does not need them). One "== topic" block each; read-only.
echo "== os"; sed -n 's/^PRETTY_NAME=//p' /etc/os-release; uname -r
echo "== nvidia-smi"; ls -la "$(command -v nvidia-smi)"; head -c 400 "$(command -v nvidia-smi)" | grep -a -v $'\x7fELF' | head -8
echo "== ldconfig"; ls -la /sbin/ldconfig* /usr/sbin/ldconfig* 2>/dev/null
echo "== driver dirs"; for d in /usr/local/nvidia/bin /usr/local/nvidia/lib64 /usr/local/nvidia/lib /run/nvidia/driver /usr/lib/x86_64-linux-gnu; do
  printf '%s: ' "$d"; ls "$d" 2>/dev/null | grep -i -E 'nvidia|cuda' | head -40 | tr '\n' ' '; echo; done
echo "== ld cache (nvidia/cuda)"; ldconfig -p | grep -E 'libcuda|libnvidia-ml' | head
echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
echo "== devices"; ls -la /dev/nvidia* /dev/nvidia-caps 2>/dev/null | head -20
echo "== cgroups"; mount | grep -E 'cgroup' | head; echo "runc: $(command -v runc)"
echo "== nvml (pynvml)"
python3 - <<'PY' 2>&1 | head -30
import os, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
print("driver", n.nvmlSystemGetDriverVersion(), "cuda", n.nvmlSystemGetCudaDriverVersion_v2())
try:
    print("gpm_supported", n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
except Exception as e:
    print("gpm_query_error", e)
for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses"):
    print(name, hasattr(n, name))
m = n.nvmlDeviceGetMemoryInfo(h); print("mem total", m.total >> 20, "used", m.used >> 20, "free", m.free >> 20)
try:
    m2 = n.nvmlDeviceGetMemoryInfo_v2(h); print("mem_v2 reserved", m2.reserved >> 20, "used", m2.used >> 20)
except Exception as e:
    print("mem_v2 error", e)
PY
echo "== cuda context cost (driver API via ctypes) and NVML's view of this pid"
python3 - <<'PY' 2>&1 | head -20
import ctypes, os, subprocess, pynvml as n
cu = ctypes.CDLL("libcuda.so.1")
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
before = n.nvmlDeviceGetMemoryInfo(h).used
assert cu.cuInit(0) == 0
ctx = ctypes.c_void_p(); dev = ctypes.c_int(0)
print("retain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "setcurrent", cu.cuCtxSetCurrent(ctx))
free = ctypes.c_size_t(); total = ctypes.c_size_t()
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
after = n.nvmlDeviceGetMemoryInfo(h).used
print("context: nvml used delta MiB", (after - before) >> 20, "cuMemGetInfo free", free.value >> 20, "total", total.value >> 20)
procs = n.nvmlDeviceGetComputeRunningProcesses(h)
print("pid", os.getpid(), "nvml procs", [(p.pid, (p.usedGpuMemory or 0) >> 20) for p in procs])
p = ctypes.c_uint64()
print("alloc 256MiB", cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(256 << 20)))
procs = n.nvmlDeviceGetComputeRunningProcesses(h)
print("after alloc nvml procs", [(p.pid, (p.usedGpuMemory or 0) >> 20) for p in procs])
print(subprocess.run(["unshare", "-p", "-f", "--mount-proc", "sh", "-c", "echo ns-pid $$; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader"], capture_output=True, text=True).stdout)
PY
