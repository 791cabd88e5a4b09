#!/bin/bash
# compat.device_plugin: NVIDIA's nvidia-device-plugin and `gpulet device-plugin` on the same
# simulated node and the same config file, each driven by compat_dp_probe (the kubelet emulator):
# ListAndWatch IDs/health/NUMA, GetPreferredAllocation, Allocate compared by compare_dp.py.
# Usage: device_plugin.sh SRC BUILD [CASE...]   (no CASE: all). Exit 77 without the peers or root.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_peer nvidia-device-plugin
need_root "NVIDIA's plugin serves in the fixed /var/lib/kubelet/device-plugins: a mount namespace"
shift 2
work=$(mktemp -d /tmp/compat-dp.XXXXXX)
trap 'rm -rf "$work"' EXIT
probe=$BUILD/tests/compat_dp_probe

# case name | profile | config (flags and sharing, YAML; nvidiaDevRoot is added)
cases=(
  "h100-envvar-uuid|dgx-h100|"
  "h100-envvar-index|dgx-h100|  plugin: {deviceIDStrategy: index}"
  "h100-volume-mounts|dgx-h100|  plugin: {deviceListStrategy: volume-mounts}"
  "h100-envvar-volume-mounts|dgx-h100|  plugin: {deviceListStrategy: [envvar, volume-mounts]}"
  "h100-pass-device-specs|dgx-h100|  plugin: {passDeviceSpecs: true}"
  "h100-cdi-annotations|dgx-h100|  plugin: {deviceListStrategy: cdi-annotations}"
  "h100-cdi-cri-index|dgx-h100|  plugin: {deviceListStrategy: cdi-cri, deviceIDStrategy: index}"
  "h100-timeslicing|dgx-h100|sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}"
  "h100-timeslicing-rename-fail|dgx-h100|sharing: {timeSlicing: {renameByDefault: true, failRequestsGreaterThanOne: true, resources: [{name: nvidia.com/gpu, replicas: 2}]}}"
  "v100-envvar-uuid|dgx1-v100|"
  "v100-index-pass-device-specs|dgx1-v100|  plugin: {deviceIDStrategy: index, passDeviceSpecs: true}"
  "v100-timeslicing|dgx1-v100|sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 3}]}}"
  "t4-envvar|pcie-t4|"
  "t4-volume-mounts-index|pcie-t4|  plugin: {deviceListStrategy: volume-mounts, deviceIDStrategy: index}"
  "a100-mig-none|a100-mig|  migStrategy: none"
  "a100-mig-mixed|a100-mig|  migStrategy: mixed"
  "a100-mig-mixed-index-specs|a100-mig|  migStrategy: mixed\n  plugin: {deviceIDStrategy: index, passDeviceSpecs: true}"
  "a100-mig-single|a100-mig|  migStrategy: single"
)

failed=0
ran=0
for c in "${cases[@]}"; do
  IFS='|' read -r name profile cfg <<<"$c"
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  d=$work/$name
  mkdir -p "$d/sim" "$d/nv" "$d/gp"
  "$BUILD/bin/gpulet" info --simulate "$profile" --sim-root "$d/sim" --json >"$d/topo.json"
  flags=$(printf '%b' "$cfg" | grep -v '^sharing' || true)
  sharing=$(printf '%b' "$cfg" | grep '^sharing' || true)
  # CDI strategies: NVIDIA's plugin writes a CDI spec of the driver root at start, so it needs one
  # (the stand-in of make-driver-root, whose libnvidia-ml is the fake).
  driver_env=()
  {
    echo "version: v1"
    echo "flags:"
    echo "  nvidiaDevRoot: $d/sim"
    if [[ $name == *cdi* ]]; then
      version=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["driverVersion"])' "$d/topo.json")
      "$SRC/tests/compat/make-driver-root" "$d/root" "$version" 0 >/dev/null
      cp "$BUILD/lib/fake/libnvidia-ml.so.1" "$d/root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.$version"
      ldconfig -r "$d/root"
      echo "  nvidiaDriverRoot: $d/root"
      driver_env=(DRIVER_ROOT_CTR_PATH="$d/root")
    fi
    [ -n "$flags" ] && echo "$flags"
    [ -n "$sharing" ] && echo "$sharing"
  } >"$d/config.yaml"
  ran=$((ran + 1))
  nv_rc=0
  env "${driver_env[@]}" GPULET_SIM_MACHINE=$profile GPULET_SIM_ROOT=$d/sim LD_LIBRARY_PATH=$BUILD/lib/fake \
    GPULET_FAKE_NVML_TRACE=$d/nvml-unsupported-calls \
    "$probe" --dir "$d/nv" --settle-ms 800 --timeout-s 30 -- \
    "$SRC/tests/compat/nv-ns" "$d/nv" "$d/sim" "$NVBIN/nvidia-device-plugin" \
    --kubelet-socket "$d/nv/kubelet.sock" --config-file "$d/config.yaml" >"$d/nvidia.json" 2>"$d/nvidia.log" || nv_rc=$?
  gp_rc=0
  "$probe" --dir "$d/gp" --settle-ms 800 --timeout-s 30 -- \
    "$BUILD/bin/gpulet" device-plugin --simulate "$profile" --sim-root "$d/sim" \
    --device-plugin-dir "$d/gp" --config-file "$d/config.yaml" >"$d/gpulet.json" 2>"$d/gpulet.log" || gp_rc=$?
  echo "== $name ($profile)"
  if [ -s "$d/nvml-unsupported-calls" ]; then
    echo "   NVIDIA's plugin called NVML entry points the fake answers NOT_SUPPORTED: $(sort -u "$d/nvml-unsupported-calls" | tr '\n' ' ')"
  fi
  if [ $nv_rc -ne 0 ] || [ $gp_rc -ne 0 ]; then
    # Both refusing the same config is agreement (e.g. single on a mixed MIG layout).
    if [ $nv_rc -eq 3 ] && [ $gp_rc -eq 3 ]; then
      echo "   both refuse the config: NVIDIA: $(grep -m1 '^E[0-9]' "$d/nvidia.log" | cut -c1-300)"
      echo "                           gpulet: $(grep -v compat_dp_probe "$d/gpulet.log" | tail -1 | cut -c1-300)"
      continue
    fi
    echo "   FAIL: probe exit NVIDIA $nv_rc gpulet $gp_rc"
    echo "   --- NVIDIA's log (tail)"; tail -8 "$d/nvidia.log" | sed 's/^/   /'
    echo "   --- gpulet's log (tail)"; tail -8 "$d/gpulet.log" | sed 's/^/   /'
    failed=$((failed + 1))
    continue
  fi
  if ! python3 "$SRC/tests/compat/compare_dp.py" "$d/nvidia.json" "$d/gpulet.json" "$d/topo.json" "$name" | sed 's/^/   /'; then
    failed=$((failed + 1))
  fi
done
echo "device plugin compatibility: $ran case(s), $failed with differences not in docs/compat.md"
[ $failed -eq 0 ]
