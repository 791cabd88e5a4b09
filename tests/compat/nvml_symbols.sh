#!/bin/bash
# compat.nvml_symbols: every NVML entry point that NVIDIA's peers can call is exported by the fake
# libnvidia-ml.so.1. go-nvml (inside each peer) binds its functions lazily through cgo, so they are
# the binary's undefined dynamic symbols; it also looks versioned names up with dlsym, which are
# string literals in go-nvml's lib.go (read from the Go module cache the build used).
# Usage: nvml_symbols.sh SRC BUILD. Exit 77 when the peers are not built.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
peers="nvidia-device-plugin gpu-feature-discovery nvidia-ctk nvidia-container-runtime nvidia-cdi-hook"
need_peer $peers
fake=$BUILD/lib/fake/libnvidia-ml.so.1
[ -f "$fake" ] || { echo "FAIL: $fake is not built (target gpulet_fake_nvml)"; exit 1; }
work=$(mktemp -d /tmp/compat-nvml.XXXXXX)
trap 'rm -rf "$work"' EXIT
nm -D --defined-only "$fake" | awk '{print $3}' | sort -u >"$work/fake"
missing=0
for p in $peers; do
  nm -D --undefined-only "$NVBIN/$p" | awk '{print $2}' | { grep '^nvml' || true; } | sort -u >"$work/$p"
  n=$(wc -l <"$work/$p")
  [ "$n" -gt 100 ] || { echo "FAIL: $p imports only $n NVML symbols: is it still built with go-nvml's cgo bindings?"; exit 1; }
  lacks=$(comm -23 "$work/$p" "$work/fake")
  echo "$p: imports $n NVML symbols, fake lacks $(echo -n "$lacks" | grep -c . || true)"
  if [ -n "$lacks" ]; then echo "$lacks" | sed 's/^/  missing: /'; missing=1; fi
done
# The names go-nvml looks up with dlsym (versioned symbols), from the go-nvml sources in the module
# cache that testing/nvidia/build used (it records it in BUILD/nvidia/go-caches).
record=$(dirname "$NVBIN")/go-caches
[ -f "$record" ] || { echo "FAIL: $record is missing: the peers in $NVBIN were not built by testing/nvidia/build into this build tree, so the module cache holding go-nvml's sources is unknown (rerun testing/nvidia/build $BUILD)"; exit 1; }
modcache=$(sed -n 's/^GOMODCACHE=//p' "$record")
libs=()
for d in "$modcache/github.com/!n!v!i!d!i!a"/go-nvml@*; do
  [ -f "$d/pkg/nvml/lib.go" ] && libs+=("$d/pkg/nvml/lib.go")
done
[ ${#libs[@]} -gt 0 ] || { echo "FAIL: no go-nvml source (pkg/nvml/lib.go) in the module cache $modcache named by $record"; exit 1; }
lookups=$(grep -ho 'Lookup("nvml[A-Za-z0-9_]*")' "${libs[@]}" | sed 's/Lookup("\(.*\)")/\1/' | sort -u || true)
[ -n "$lookups" ] || { echo "FAIL: no Lookup(\"nvml...\") in ${libs[*]}: has go-nvml changed how it binds versioned symbols?"; exit 1; }
lacks=$(comm -23 <(echo "$lookups") "$work/fake")
echo "go-nvml dlsym lookups ($modcache): $(echo "$lookups" | wc -l), fake lacks $(echo -n "$lacks" | grep -c . || true)"
# A dlsym'd name the fake lacks is fine only when go-nvml falls back from it (it checks first).
[ -z "$lacks" ] || echo "$lacks" | sed 's/^/  not exported (go-nvml checks with dlsym and falls back): /'
# HAMi-core's calls (issue 16): answered with the profile's facts, not stubs (checked by name here,
# by behaviour in FakeNvml.* unit tests).
for s in nvmlDeviceGetHandleByIndex nvmlDeviceGetComputeRunningProcesses_v2 nvmlDeviceGetProcessUtilization nvmlErrorString; do
  grep -qx "$s" "$work/fake" || { echo "  missing HAMi-core's $s"; missing=1; }
done
if [ $missing -eq 0 ]; then
  echo "every NVML symbol the peers import is exported by the fake"
else
  echo "FAIL: the fake libnvidia-ml.so.1 lacks the symbols listed above"
fi
exit $missing
