#!/usr/bin/env python3
"""PyTorch side of `make gpu-check` (run with the interposer LD_PRELOADed, or without for a baseline).

  torch_probe.py mem              what CUDA reports as total/free, allocate 64 MiB tensors until
                                  torch raises OutOfMemoryError, then nvidia-smi's used memory of
                                  this process. Prints `total_mib T`, `held_mib H`, `oom yes|no`,
                                  `smi_used_mib U`.
  torch_probe.py matmul N SECONDS bf16 NxNxN products back to back for about SECONDS after a
                                  warm-up. Prints `tflops F`, and `smi UTIL,SM_MHZ,POWER_W` read
                                  by nvidia-smi halfway through (from a thread, while it runs).
  torch_probe.py launch COUNT     COUNT one-element in-place adds (launch-bound kernels), then one
                                  synchronize. Prints `us_per_launch U`.
One `key value` line each, so the check script can read them with awk.
"""
import os
import subprocess
import sys
import threading
import time

import torch


def smi_used_mib(pid):
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return parts[1]
    return "none"


def mem():
    free, total = torch.cuda.mem_get_info()
    print(f"total_mib {total >> 20}")
    print(f"free_mib {free >> 20}")
    held, oom = [], "no"
    try:
        while len(held) < 16384:  # 1 TiB of 64 MiB tensors: no GPU has that, so OOM comes first
            held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        oom = "yes"
    torch.cuda.synchronize()
    print(f"held_mib {len(held) * 64}")
    print(f"oom {oom}")
    print(f"smi_used_mib {smi_used_mib(os.getpid())}")
    sys.stdout.flush()


def matmul(n, seconds):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    smi = []
    def sample():
        smi.append(subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu,clocks.sm,power.draw",
             "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, check=False).stdout.strip().replace(" ", ""))
    timer = threading.Timer(seconds / 2, sample)
    timer.start()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            a @ b
        count += 4
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    timer.join()
    print(f"tflops {2 * n ** 3 * count / elapsed / 1e12:.1f}")
    print(f"smi {smi[0] if smi and smi[0] else 'none'}")


def launch(count):
    x = torch.zeros(1, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(count):
        x.add_(1)
    torch.cuda.synchronize()
    print(f"us_per_launch {(time.perf_counter() - start) / count * 1e6:.2f}")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "mem":
        mem()
    elif len(sys.argv) == 4 and sys.argv[1] == "matmul":
        matmul(int(sys.argv[2]), float(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "launch":
        launch(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
