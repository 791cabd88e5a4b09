#!/usr/bin/env bash
# sharing.mps on a real GPU host: `gpulet device-plugin` with an MPS config (4 replicas on every
# GPU) starts the real nvidia-cuda-mps-control; this checks what the daemon was told, the compute
# mode, that a CUDA client through the pipe directory runs as an MPS client (nvidia-smi type M+C)
# under the limits, that a killed daemon comes back, and that stopping the plugin quits the daemon
# and restores the compute mode. Prints one line per check (check | result | detail).
# usage (root: compute mode and the /dev/shm bind): testing/gpu_check/mps_check.sh [BUILD_DIR]
# Exit status: 0 when no check FAILed; "skipped: ..." and 0 without a GPU, MPS tools or root.
set -u
B=$(cd "${1:-build}" 2>/dev/null && pwd) || B=${1:-build}
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 ||
  { echo "skipped: no NVIDIA GPU"; exit 0; }
command -v nvidia-cuda-mps-control >/dev/null || { echo "skipped: no nvidia-cuda-mps-control"; exit 0; }
[[ $(id -u) == 0 ]] || { echo "skipped: needs root (compute mode, /dev/shm bind)"; exit 0; }
[[ -d $B/lib/deps ]] && export LD_LIBRARY_PATH=$B/lib/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$(mktemp -d /tmp/gpulet-mps-check.XXXXXX)
fail=0
row() { printf '%-28s | %-4s | %s\n' "$1" "$2" "$3"; [[ $2 == FAIL ]] && fail=1; return 0; }
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

mkdir -p "$T/dp"
cat >"$T/config.yaml" <<EOF
version: v1
flags: {mpsRoot: $T/mps}
gpulet:
  health: {unhealthyDevicesFile: ""}
sharing:
  mps:
    resources:
    - {name: nvidia.com/gpu, replicas: 4}
EOF
"$B/bin/gpulet" device-plugin --config-file "$T/config.yaml" --device-plugin-dir "$T/dp" \
  --kubelet-socket '' >"$T/log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q 'control daemon ready' "$T/log" && break; sleep 0.1; done
if ! grep -q 'control daemon ready' "$T/log"; then
  row "daemon start" FAIL "$(tail -3 "$T/log" | tr '\n' ' ')"
  exit 1
fi
row "daemon start" ok "$(grep -o 'control daemon ready.*' "$T/log")"
pipe=$T/mps/nvidia.com/gpu/pipe
ctl() { echo "$1" | CUDA_MPS_PIPE_DIRECTORY=$pipe CUDA_MPS_LOG_DIRECTORY=$T/mps/nvidia.com/gpu/log nvidia-cuda-mps-control; }
pct=$(ctl get_default_active_thread_percentage)
[[ $pct == 25* ]] && row "active thread percentage" ok "$pct" ||
  row "active thread percentage" FAIL "want 25, got '$pct'"
modes=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | sort -u | tr '\n' ' ')
[[ $modes == "Exclusive_Process " ]] && row "compute mode" ok "$modes" ||
  row "compute mode" FAIL "$modes"
grep -q 'set_default_device_pinned_mem_limit' "$T/mps/nvidia.com/gpu/log/control.log" 2>/dev/null &&
  row "pinned memory limit" ok "$(grep -o 'set_default_device_pinned_mem_limit.*' "$T/mps/nvidia.com/gpu/log/control.log" | head -1)" ||
  row "pinned memory limit" SKIP "control.log does not echo commands on this driver"

# A client as a container sees it: the pipe directory in its environment, <root>/shm as /dev/shm.
PY=$(command -v python3 || true)
if [[ -n $PY ]] && timeout 60 "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  unshare -m sh -c "mount --bind '$T/mps/shm' /dev/shm && CUDA_MPS_PIPE_DIRECTORY='$pipe' \
    '$PY' -c '
import torch, subprocess, os
free, total = torch.cuda.mem_get_info()
x = torch.ones(1 << 20, device=\"cuda\")
t = subprocess.run([\"nvidia-smi\", \"--query-compute-apps=pid,process_name\", \"--format=csv,noheader\"], capture_output=True, text=True).stdout
print(f\"total={total >> 20}MiB free={free >> 20}MiB apps={t.strip()!r}\")
try:
    y = torch.empty(int(total * 0.5), dtype=torch.uint8, device=\"cuda\")
    print(\"half_of_total=allocated\")
except RuntimeError as e:
    print(\"half_of_total=refused\")
'" >"$T/client" 2>&1
  if grep -q 'total=' "$T/client"; then
    row "MPS client" ok "$(tr '\n' ' ' <"$T/client")"
  else
    row "MPS client" FAIL "$(tail -3 "$T/client" | tr '\n' ' ')"
  fi
  nvidia-smi -q -d PIDS | grep -q 'M+C\|MPS' && row "client type" ok "nvidia-smi shows an MPS client" ||
    row "client type" SKIP "client gone before nvidia-smi -q ran"
else
  row "MPS client" SKIP "no python3 with CUDA torch"
fi

# The daemon dies: the plugin starts it again (probe every 2 s).
dpid=$(cat "$pipe/nvidia-cuda-mps-control.pid" 2>/dev/null || pgrep -n -f 'nvidia-cuda-mps-control -d')
kill -9 "$dpid" 2>/dev/null
for _ in $(seq 100); do grep -q 'starting it again' "$T/log" && [[ $(ctl get_default_active_thread_percentage 2>/dev/null) == 25* ]] && break; sleep 0.1; done
[[ $(ctl get_default_active_thread_percentage 2>/dev/null) == 25* ]] &&
  row "restart after kill" ok "daemon $dpid killed, answers again with 25" ||
  row "restart after kill" FAIL "$(tail -3 "$T/log" | tr '\n' ' ')"

kill -TERM "$pid"; wait "$pid"; pid=
modes=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | sort -u | tr '\n' ' ')
ctl get_default_active_thread_percentage >/dev/null 2>&1 && row "stop" FAIL "daemon still answers" ||
  { [[ $modes == "Default " ]] && row "stop" ok "daemon quit, compute mode $modes" ||
      row "stop" FAIL "compute mode $modes"; }
exit $fail
