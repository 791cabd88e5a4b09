#!/usr/bin/env bash
# Packs what `make gpu-check` runs into one directory that can travel to a GPU host that lacks this
# build's shared libraries (a stock Ubuntu host has no Debian libgrpc, yaml-cpp, abseil, ...):
#   OUT/bin     gpulet, the runtime shim and hook, gpulet-kubelet-check, nvml_rss, runc, busybox
#   OUT/lib     libgpulet-vcuda.so;  OUT/lib/deps  the shared libraries those binaries load, except
#               the C and C++ runtimes (every host has newer compatible ones)
#   OUT/tests   the interposer's probe programs, the GPU layer's conformance suite on the real NVML,
#               and alloc-glibc2.31, a driver-API program built against Debian 11's glibc 2.31
#               (tests/vgpu/interposer/old_glibc/alloc.c), whose loader and C libraries are in
#               OUT/lib/glibc-2.31 (an Ubuntu 20.04-era image's userland; skipped when
#               testing/glibc/get cannot fetch it)
# The fake libcuda / libnvidia-ml are never copied: on the GPU host the real driver must answer.
# usage: testing/gpu_check/bundle.sh BUILD_DIR OUT_DIR
set -euo pipefail
B=$1 OUT=$2
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib/deps" "$OUT/tests"
bins=()
for f in gpulet gpulet-container-runtime gpulet-container-hook gpulet-kubelet-check nvml_rss; do
  [[ -x $B/bin/$f ]] && cp "$B/bin/$f" "$OUT/bin/" && bins+=("$OUT/bin/$f")
done
for f in vcuda_probe vcuda_procaddr gpu_real_nvml_test; do
  [[ -x $B/tests/$f ]] && cp "$B/tests/$f" "$OUT/tests/" && bins+=("$OUT/tests/$f")
done
cp "$B/lib/libgpulet-vcuda.so" "$OUT/lib/"
for tool in runc busybox; do
  p=$(command -v $tool) && cp "$p" "$OUT/bin/" && bins+=("$OUT/bin/$tool")
done
keep='^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64|linux-vdso|libcuda|libnvidia-ml)\.'
for b in "${bins[@]}"; do
  # A static binary (busybox) makes ldd fail; it has nothing to copy.
  { ldd "$b" 2>/dev/null || true; } | awk '$3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ $name =~ $keep ]] || cp -L "$path" "$OUT/lib/deps/$name"
done
src=$(cd "$(dirname "$0")/../.." && pwd)
if old=$("$src/testing/glibc/get" "$B" 2>/dev/null); then
  mkdir -p "$OUT/lib/glibc-2.31"
  for l in ld-linux-x86-64.so.2 libc.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libm.so.6; do
    cp -L "$old/lib/x86_64-linux-gnu/$l" "$OUT/lib/glibc-2.31/"
  done
  cc --sysroot="$old" -B"$old/usr/lib/x86_64-linux-gnu/" -o "$OUT/tests/alloc-glibc2.31" \
    "$src/tests/vgpu/interposer/old_glibc/alloc.c" -ldl
else
  echo "bundle: no glibc 2.31 (testing/glibc/get failed): the old-glibc row will be skipped" >&2
fi
strip --strip-unneeded "$OUT"/bin/gpulet* "$OUT"/lib/deps/*.so* 2>/dev/null || true
du -sh "$OUT" | awk '{ print "bundle: " $1 " in " $2 }'
