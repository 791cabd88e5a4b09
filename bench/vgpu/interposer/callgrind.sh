#!/bin/sh
# Instructions added by libgpulet-vcuda.so per intercepted call, counted by callgrind (stable,
# unlike wall time). Method: run vcuda_probe's alloc-loop (cuMemAlloc_v2 + cuMemFree_v2 of 4 KiB)
# and launch-loop (cuLaunchKernel, no core limit) with N and 2N iterations, with and without the
# preload; per-call cost = ((pre(2N) - pre(N)) - (direct(2N) - direct(N))) / N, which cancels
# start-up, the one-time initialisation and the fake driver's own work.
# "alloc-loop (one GPU)" is the container's usual configuration: NVIDIA_VISIBLE_DEVICES names the
# limited GPU by UUID and the process sees only it (CUDA_VISIBLE_DEVICES=0 on the fake).
# usage: bench/vgpu/interposer/callgrind.sh [BUILD_DIR] [N]
set -eu
build=${1:-build}
n=${2:-20000}
probe=$build/tests/vcuda_probe
shim=$(pwd)/$build/lib/libgpulet-vcuda.so
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ir() {  # ir MODE COUNT PRELOAD [ENV...] -> total instructions
  out=$tmp/cg.$$
  mode=$1 count=$2 pre=$3
  shift 3
  env "$@" LD_LIBRARY_PATH="$build/lib/fake_cuda" ${pre:+LD_PRELOAD=$pre} GPULET_VGPU_ACCOUNTING=$tmp/acct GPULET_VGPU_MEMORY_LIMIT=1099511627776 \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$probe" "$mode" "$count" >/dev/null 2>&1
  sed -n 's/^summary: //p' "$out"
}
for mode in alloc-loop launch-loop; do
  d1=$(ir $mode $n ""); d2=$(ir $mode $((2 * n)) "")
  p1=$(ir $mode $n "$shim"); p2=$(ir $mode $((2 * n)) "$shim")
  # One iteration of alloc-loop is an alloc+free pair; of launch-loop, one launch.
  unit=$([ $mode = alloc-loop ] && echo "alloc+free pair" || echo launch)
  echo "$mode: $(( (p2 - p1 - (d2 - d1)) / n )) instructions added per $unit (N=$n; driver alone $(( (d2 - d1) / n )))"
done
one="NVIDIA_VISIBLE_DEVICES=GPU-face0000-0000-0000-0000-000000000000 CUDA_VISIBLE_DEVICES=0"
d1=$(ir alloc-loop $n "" $one); d2=$(ir alloc-loop $((2 * n)) "" $one)
p1=$(ir alloc-loop $n "$shim" $one); p2=$(ir alloc-loop $((2 * n)) "$shim" $one)
echo "alloc-loop (one GPU): $(( (p2 - p1 - (d2 - d1)) / n )) instructions added per alloc+free pair (N=$n)"
