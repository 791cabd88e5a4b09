#!/bin/bash
# compat.labels: NVIDIA's gpu-feature-discovery (--oneshot) and `gpulet labels --oneshot` on the
# same simulated node, machine type and sharing config; the label sets must be equal but for what
# docs/compat.md lists ([labels-*]). GFD runs in a mount namespace where /sys/bus/pci/devices is
# the sim root's (it reads the PCI class there for gpu.mode).
# Usage: labels.sh SRC BUILD. Exit 77 without the peer or root.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_peer gpu-feature-discovery
need_root "GFD reads PCI classes from the fixed /sys/bus/pci/devices: a mount namespace"
work=$(mktemp -d /tmp/compat-labels.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
# case | profile | GFD config (YAML) | gpulet flags
cases=(
  "h100|dgx-h100||"
  "h100-timeslicing|dgx-h100|sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}|--sharing-strategy time-slicing --replicas 4"
  "v100|dgx1-v100||"
  "t4|pcie-t4||"
  "a100-mig-none|a100-mig|flags: {migStrategy: none}|--mig-strategy none"
  "a100-mig-mixed|a100-mig|flags: {migStrategy: mixed}|--mig-strategy mixed"
)
for c in "${cases[@]}"; do
  IFS='|' read -r name profile cfg gflags <<<"$c"
  d=$work/$name
  mkdir -p "$d"
  "$BUILD/bin/gpulet" info --simulate "$profile" --sim-root "$d/sim" >/dev/null
  echo "Test Machine 9000" >"$d/product"
  printf 'version: v1\n%s\n' "$cfg" >"$d/config.yaml"
  GPULET_SIM_MACHINE=$profile GPULET_SIM_ROOT=$d/sim LD_LIBRARY_PATH=$BUILD/lib/fake \
    "$SRC/tests/compat/nv-ns" "$d" "$d/sim" "$NVBIN/gpu-feature-discovery" --oneshot --no-timestamp \
    --output-file "$d/nvidia.txt" --machine-type-file "$d/product" --use-node-feature-api=false \
    --config-file "$d/config.yaml" >"$d/nvidia.log" 2>&1 || { echo "FAIL: gpu-feature-discovery ($name)"; tail -5 "$d/nvidia.log"; failed=1; continue; }
  # shellcheck disable=SC2086
  "$BUILD/bin/gpulet" labels --simulate "$profile" --sim-root "$d/sim" --oneshot --no-timestamp \
    --machine-type-file "$d/product" --output "$d/gpulet.txt" $gflags >"$d/gpulet.log" 2>&1 || { echo "FAIL: gpulet labels ($name)"; tail -5 "$d/gpulet.log"; failed=1; continue; }
  python3 - "$d/nvidia.txt" "$d/gpulet.txt" "$name" <<'PY' || failed=1
import sys
def load(p):
    return dict(l.strip().split("=", 1) for l in open(p) if "=" in l)
a, b, case = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
# docs/compat.md, "Labels": gpulet sets gpu.present itself (NVIDIA's operator has an NFD rule for
# it) [labels-present]; it has no NVIDIA vGPU (GRID) guest detection, so no vgpu.present
# [labels-vgpu]; it does not read the PCI class, so no gpu.mode [labels-mode].
deliberate = {"nvidia.com/gpu.present": "gpulet only", "nvidia.com/vgpu.present": "GFD only",
              "nvidia.com/gpu.mode": "GFD only"}
diffs, notes = [], []
for k in sorted(set(a) | set(b)):
    if a.get(k) == b.get(k):
        continue
    if k in deliberate and (k not in a or k not in b):
        notes.append(f"{k}: GFD {a.get(k)} gpulet {b.get(k)}")
    else:
        diffs.append(f"{k}: GFD {a.get(k)} gpulet {b.get(k)}")
print(f"== {case}: {len(a)} GFD labels, {len(b)} gpulet labels, {len(diffs)} difference(s) beyond docs/compat.md")
for n in notes: print("   deliberate:", n)
for d in diffs: print("   DIFF:", d)
sys.exit(1 if diffs else 0)
PY
done
exit $failed
