#!/usr/bin/env bash
# make gpu-check on machines without a usable GPU: it must say so and exit 0 (CI calls it), both
# when there is no nvidia-smi at all and when nvidia-smi exists but finds no GPU (a driver-only
# host, a container without devices).
set -u
check=$1
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$t/empty" "$t/broken"
if PATH=/usr/bin:/bin command -v nvidia-smi >/dev/null; then
  echo "(case 'no nvidia-smi' not run: this machine has /usr/bin/nvidia-smi)"
else
  out=$(PATH=$t/empty:/usr/bin:/bin bash "$check" "$t/nobuild" 2>&1); rc=$?
  [[ $rc == 0 && $out == "skipped: no NVIDIA GPU" ]] || fail "no nvidia-smi: rc $rc, output: $out"
fi
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2\nexit 9\n' >"$t/broken/nvidia-smi"
chmod +x "$t/broken/nvidia-smi"
out=$(PATH=$t/broken:/usr/bin:/bin bash "$check" "$t/nobuild" 2>&1); rc=$?
[[ $rc == 0 && $out == "skipped: no NVIDIA GPU" ]] || fail "failing nvidia-smi: rc $rc, output: $out"
# A GPU but no build: a clear error, not a table of failures.
printf '#!/bin/sh\necho "GPU 0: Test GPU (UUID: GPU-0)"\n' >"$t/broken/nvidia-smi"
out=$(PATH=$t/broken:/usr/bin:/bin bash "$check" "$t/nobuild" 2>&1); rc=$?
[[ $rc == 2 && $out == *"gpulet not found"* ]] || fail "GPU without a build: rc $rc, output: $out"
echo "3 passed, 0 failed"
