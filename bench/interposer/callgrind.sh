#!/bin/sh
# Instructions added by libgpulet-vcuda.so per intercepted call, counted by callgrind (stable,
# unlike wall time). Method: run vcuda_probe's alloc-loop (cuMemAlloc_v2 + cuMemFree_v2 of 4 KiB)
# and launch-loop (cuLaunchKernel, no core limit) with N and 2N iterations, with and without the
# preload; per-call cost = ((pre(2N) - pre(N)) - (direct(2N) - direct(N))) / N, which cancels
# start-up, the one-time initialisation and the fake driver's own work.
# usage: bench/interposer/callgrind.sh [BUILD_DIR] [N]
set -eu
build=${1:-build}
n=${2:-20000}
probe=$build/tests/vcuda_probe
shim=$(pwd)/$build/lib/libgpulet-vcuda.so
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ir() {  # ir MODE COUNT PRELOAD -> total instructions
  out=$tmp/cg.$$
  env ${3:+LD_PRELOAD=$3} GPULET_VGPU_ACCOUNTING=$tmp/acct GPULET_VGPU_MEMORY_LIMIT=1099511627776 \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$probe" "$1" "$2" >/dev/null 2>&1
  sed -n 's/^summary: //p' "$out"
}
for mode in alloc-loop launch-loop; do
  d1=$(ir $mode $n ""); d2=$(ir $mode $((2 * n)) "")
  p1=$(ir $mode $n "$shim"); p2=$(ir $mode $((2 * n)) "$shim")
  echo "$mode: $(( (p2 - p1 - (d2 - d1)) / n )) instructions added per call (N=$n; driver alone $(( (d2 - d1) / n )))"
done
