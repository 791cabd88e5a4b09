#!/bin/bash
# bench/compat/run.sh [BUILD]: gpulet and NVIDIA's own device plugin / GPU feature discovery side
# by side, in one run, on the same simulated nodes and the same machine. Prints a Markdown table
# (the README's Performance section shows its ratios). Needs root (NVIDIA's plugin runs in a mount
# namespace, tests/compat/nv-ns) and the peers of testing/nvidia/build.
#
# Method. Every plugin figure comes from tests/compat/compat_dp_probe, the same client for both:
#  - start -> registered: from fork/exec of the plugin to its first Register call on the kubelet
#    emulator's socket (includes NVML init on the fake and the gRPC server start);
#  - RSS: VmRSS of the plugin process after it served every query (largest process of its group);
#  - Allocate / GetPreferredAllocation: REPEAT calls over a unix socket, one at a time, after the
#    correctness queries; Allocate for one GPU; GetPreferredAllocation for half the GPUs with the
#    last GPU as must-include, from all GPUs available; p50 and p99 of the client-side round trip
#    (the floor of one unary call here is ~0.2 ms);
#  - XID -> Unhealthy: `gpulet sim fault xid --code 79` on GPU 3 (plus `lost`) written to the fake's
#    fault log, until a ListAndWatch update shows a device Unhealthy; recovery: `gpulet sim fault
#    reset`, until all are Healthy again, waited for up to 15 s (gpulet with --health-hold-down 2s:
#    recovery = hold-down + probe; NVIDIA's never recovers without a restart);
#  - labels RSS: GFD and `gpulet labels` as daemons (60 s interval), VmRSS 3 s after start;
#  - agent: `gpulet agent` (plugin + exporter + labels) under the probe vs the sum of NVIDIA's
#    plugin and GFD;
#  - the runtime shims' added time on `create`: tests/compat/oci_runtime.sh --bench (its header:
#    runc alone, runc via nvidia-container-runtime, runc via gpulet-container-runtime on the same
#    1-GPU bundle, CREATES runs each, interleaved; `create` timed as a whole, hooks included).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
nvbin=${GPULET_NVIDIA_BIN:-$build/nvidia/bin}
repeat=${REPEAT:-200}
[ "$(id -u)" = 0 ] || { echo "bench/compat: needs root"; exit 1; }
for b in nvidia-device-plugin gpu-feature-discovery; do
  [ -x "$nvbin/$b" ] || { echo "bench/compat: $nvbin/$b missing (testing/nvidia/build $build)"; exit 1; }
done
work=$(mktemp -d /tmp/bench-compat.XXXXXX)
trap 'rm -rf "$work"' EXIT
probe=$build/tests/compat_dp_probe
gpulet=$build/bin/gpulet
field() { python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))["timing"]
v=d
for k in sys.argv[2].split("."):
    v=v.get(k) if isinstance(v,dict) else None
print("-" if v is None else (f"{v:.0f}" if isinstance(v,float) and v>=100 else f"{v:.2f}" if isinstance(v,float) else v))' "$1" "$2"; }
rss_after() {  # seconds command... -> VmRSS KiB of the largest process of the group
  local s=$1; shift
  setsid "$@" >/dev/null 2>&1 &
  local pid=$!
  sleep "$s"
  local best=0
  for p in $(pgrep -g "$pid" 2>/dev/null || echo "$pid"); do
    r=$(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    [ "${r:-0}" -gt "$best" ] && best=$r
  done
  kill -TERM -- -"$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "$best"
}

echo "| figure | node | NVIDIA v0.19.3 | gpulet | ratio (NVIDIA / gpulet) |"
echo "|---|---|---|---|---|"
row() { python3 -c 'import sys
a,b=sys.argv[4],sys.argv[5]
try: r=f"{float(a)/float(b):.1f}x"
except (ValueError, ZeroDivisionError): r="-"
print(f"| {sys.argv[1]} | {sys.argv[2]} | {a} {sys.argv[3]} | {b} {sys.argv[3]} | {r} |")' "$@"; }

for profile in dgx-h100 dgx1-v100 dgx2-v100; do
  d=$work/$profile
  mkdir -p "$d/nv" "$d/gp"
  "$gpulet" info --simulate "$profile" --sim-root "$d/sim" >/dev/null
  inject="" recover=""
  if [ $profile = dgx-h100 ]; then
    inject="$gpulet sim fault xid --sim-root $d/sim --gpu 3 --code 79 && $gpulet sim fault lost --sim-root $d/sim --gpu 3"
    recover="$gpulet sim fault reset --sim-root $d/sim --gpu 3"
  fi
  GPULET_SIM_MACHINE=$profile GPULET_SIM_ROOT=$d/sim LD_LIBRARY_PATH=$build/lib/fake \
    "$probe" --dir "$d/nv" --settle-ms 800 --timeout-s 60 --repeat "$repeat" \
    ${inject:+--inject "$inject" --recover "$recover" --recover-wait-s 15} -- \
    "$src/tests/compat/nv-ns" "$d/nv" "$d/sim" "$nvbin/nvidia-device-plugin" --kubelet-socket "$d/nv/kubelet.sock" \
    >"$d/nvidia.json" 2>"$d/nvidia.log" || { echo "NVIDIA's plugin failed on $profile:"; tail -5 "$d/nvidia.log"; exit 1; }
  [ -z "$inject" ] || "$gpulet" sim fault reset --sim-root "$d/sim" --gpu 3 >/dev/null 2>&1 || true
  "$probe" --dir "$d/gp" --settle-ms 800 --timeout-s 60 --repeat "$repeat" \
    ${inject:+--inject "$inject" --recover "$recover" --recover-wait-s 15} -- \
    "$gpulet" device-plugin --simulate "$profile" --sim-root "$d/sim" --device-plugin-dir "$d/gp" \
    --health-hold-down 2s --health-probe-interval 100ms \
    >"$d/gpulet.json" 2>"$d/gpulet.log" || { echo "gpulet's plugin failed on $profile:"; tail -5 "$d/gpulet.log"; exit 1; }
  n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' <("$gpulet" info --simulate "$profile" --sim-root "$d/sim" --json))
  node="$profile ($n GPUs)"
  row "start -> registered" "$node" ms "$(field "$d/nvidia.json" start_to_registered_ms)" "$(field "$d/gpulet.json" start_to_registered_ms)"
  row "GetPreferredAllocation p50 ($((n / 2)) of $n)" "$node" us "$(field "$d/nvidia.json" preferred_us.p50)" "$(field "$d/gpulet.json" preferred_us.p50)"
  row "GetPreferredAllocation p99" "$node" us "$(field "$d/nvidia.json" preferred_us.p99)" "$(field "$d/gpulet.json" preferred_us.p99)"
  row "Allocate p50 (1 GPU)" "$node" us "$(field "$d/nvidia.json" allocate_us.p50)" "$(field "$d/gpulet.json" allocate_us.p50)"
  row "Allocate p99" "$node" us "$(field "$d/nvidia.json" allocate_us.p99)" "$(field "$d/gpulet.json" allocate_us.p99)"
  row "device plugin RSS" "$node" KiB "$(field "$d/nvidia.json" rss_kib)" "$(field "$d/gpulet.json" rss_kib)"
  if [ -n "$inject" ]; then
    row "XID 79 -> Unhealthy in ListAndWatch" "$node" ms "$(field "$d/nvidia.json" inject_to_unhealthy_ms)" "$(field "$d/gpulet.json" inject_to_unhealthy_ms)"
    echo "| GPU reset -> Healthy again | $node | $(field "$d/nvidia.json" recover_to_healthy_ms | sed 's/^-$/never (restart needed)/') | $(field "$d/gpulet.json" recover_to_healthy_ms) ms (hold-down 2 s) | - |"
    nv_plugin_rss=$(field "$d/nvidia.json" rss_kib)
  fi
done

# Labels daemons and the agent, on dgx-h100.
d=$work/labels
mkdir -p "$d/dp"
"$gpulet" info --simulate dgx-h100 --sim-root "$d/sim" >/dev/null
echo "DGX H100" >"$d/product"
gfd=$(GPULET_SIM_MACHINE=dgx-h100 GPULET_SIM_ROOT=$d/sim LD_LIBRARY_PATH=$build/lib/fake rss_after 3 \
  "$nvbin/gpu-feature-discovery" --no-timestamp --output-file "$d/gfd.txt" --machine-type-file "$d/product" \
  --use-node-feature-api=false --sleep-interval 60s)
gl=$(rss_after 3 "$gpulet" labels --simulate dgx-h100 --sim-root "$d/sim" --output "$d/gpulet.txt" \
  --machine-type-file "$d/product" --interval 60s)
row "labels daemon RSS" "dgx-h100" KiB "$gfd" "$gl"
"$probe" --dir "$d/dp" --settle-ms 800 --timeout-s 60 -- "$gpulet" agent --simulate dgx-h100 --sim-root "$d/sim" \
  --device-plugin-dir "$d/dp" --metrics-address 127.0.0.1:0 --labels-output "$d/agent-labels.txt" \
  --labels-machine-type-file "$d/product" --pod-resources-socket "$d/pr.sock" >"$d/agent.json" 2>"$d/agent.log" \
  || { echo "gpulet agent failed:"; tail -5 "$d/agent.log"; exit 1; }
row "plugin + labels (NVIDIA) vs gpulet agent (plugin + exporter + labels) RSS" "dgx-h100" KiB \
  "$((nv_plugin_rss + gfd))" "$(field "$d/agent.json" rss_kib)"
echo
if [ -x "$nvbin/nvidia-container-runtime" ] && command -v runc >/dev/null && [ -x /bin/busybox ]; then
  "$src/tests/compat/oci_runtime.sh" "$src" "$build" --bench "${CREATES:-30}"
else
  echo "(runtime shims: skipped, needs nvidia-container-runtime, runc and busybox-static)"
fi
echo
echo "Machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $repeat calls per latency figure; $(date -u +%FT%TZ)."
