#!/bin/bash
# On the real one-node cluster, what the real kubelet makes of gpulet's device plugin:
# - an XID 79 on a fake GPU (with the GPU then lost, as a GPU that fell off the bus is) takes it out
#   of the Node's allocatable nvidia.com/gpu; it stays out while lost, however long; `sim fault
#   reset` brings it back once it has answered normally for the health hold-down (3 s here). An XID
#   alone (the GPU still answering) comes back after the hold-down with no reset: there is no reset
#   event in NVML, so the hold-down is the recovery (docs/device-plugin.md).
# - time-slicing (replicas: 4): nvidia.com/gpu 32; a pod asking for 1 runs with one GPU.
# - MIG mixed on a100-mig: nvidia.com/gpu 1, mig-1g.5gb 8, mig-2g.10gb 1, mig-3g.20gb 3; a pod
#   asking for a mig-1g.5gb runs with one MIG UUID.
# The timings come from a `kubectl get node --watch` stream, stamped as each update arrives.
# Leaves the plugin as the cluster started it (dgx-h100, 8 GPUs).
# Usage: health_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
default_sa
SIM=${GPULET_SIM:-$(dirname "$GPULET")/gpulet-sim}
[ -x "$SIM" ] || { echo "FAIL: $SIM missing (build the gpulet-sim target)"; exit 1; }
fault() { "$SIM" fault "$@" --sim-root "$D/sim" >/dev/null; }
HOLD=3

# The Node's allocatable nvidia.com/gpu as the API server streams it: "<arrival time> <count>".
watch_log=$(mktemp)
{ "$K/kubectl" --kubeconfig "$D/admin.kubeconfig" get node "$NODE" --watch -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}{"\n"}' 2>/dev/null &
  echo $! > "$watch_log.pid"; wait; } | while read -r n; do echo "$(now) $n"; done > "$watch_log" &
for _ in $(seq 50); do [ -s "$watch_log.pid" ] && break; sleep 0.05; done
# Stopping kubectl ends the reading loop too (end of file).
trap 'kill "$(cat "$watch_log.pid")" 2>/dev/null; rm -f "$watch_log" "$watch_log.pid"' EXIT
# seen_after T N: the first arrival time after T at which the count was N ("" if none yet).
seen_after() { awk -v t="$1" -v n="$2" '$1 > t && $2 == n {print $1; exit}' "$watch_log"; }
arrived() { [ -n "$(seen_after "$1" "$2")" ]; }

restart_plugin dgx-h100 --health-hold-down ${HOLD}s --health-probe-interval 250ms
check "plugin restarted: 8 allocatable" wait_until 30 bash -c '[ "$('"$K"'/kubectl --kubeconfig '"$D"'/admin.kubeconfig get node '"$NODE"' -o "jsonpath={.status.allocatable.nvidia\.com/gpu}")" = 8 ]'
sleep 1

# --- XID 79 + lost: out at once, out while lost, back after reset + hold-down ----------------------
t0=$(now)
fault xid --gpu 3 --code 79
fault lost --gpu 3
wait_until 10 arrived "$t0" 7
t_out=$(seen_after "$t0" 7)
check "XID 79 on GPU 3: the Node's allocatable nvidia.com/gpu drops to 7" [ -n "$t_out" ]
[ -z "$t_out" ] || echo "figure: XID injected -> Node allocatable 7: $(elapsed "$t0" "$t_out") s"
sleep $((HOLD + 2))
check "GPU 3 lost: still out after the hold-down + 2 s (allocatable $(allocatable nvidia.com/gpu))" \
  [ "$(allocatable nvidia.com/gpu)" = 7 ]
t1=$(now)
fault reset --gpu 3
wait_until $((HOLD + 10)) arrived "$t1" 8
t_back=$(seen_after "$t1" 8)
check "reset of GPU 3: allocatable back to 8" [ -n "$t_back" ]
[ -z "$t_back" ] || echo "figure: reset -> Node allocatable 8: $(elapsed "$t1" "$t_back") s (hold-down ${HOLD} s)"
check "reset: back no sooner than the hold-down" \
  bash -c '[ -n "$1" ] && awk "BEGIN{exit !($1 - $2 >= $3)}"' _ "$t_back" "$t1" "$HOLD"

# --- an XID alone: back after the hold-down, no reset needed --------------------------------------
t2=$(now)
fault xid --gpu 5 --code 79
wait_until 10 arrived "$t2" 7
t_out2=$(seen_after "$t2" 7)
check "XID 79 on GPU 5 (still answering): allocatable drops to 7" [ -n "$t_out2" ]
wait_until $((HOLD + 10)) arrived "$t2" 8
t_back2=$(seen_after "$t2" 8)
check "XID alone: back to 8 without a reset" [ -n "$t_back2" ]
[ -z "$t_out2" ] || [ -z "$t_back2" ] ||
  echo "figure: XID alone -> out $(elapsed "$t2" "$t_out2") s, back without reset $(elapsed "$t2" "$t_back2") s"

# --- time-slicing: 4 replicas per GPU --------------------------------------------------------------
cat > "$D/time-slicing.yaml" <<'YAML'
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
YAML
restart_plugin dgx-h100 --config-file "$D/time-slicing.yaml"
is() { [ "$(allocatable "$1")" = "$2" ]; }
wait_until 30 is nvidia.com/gpu 32
check "time-slicing replicas 4: nvidia.com/gpu 32 allocatable ($(allocatable nvidia.com/gpu))" is nvidia.com/gpu 32
check "time-slicing: capacity 32 ($(capacity nvidia.com/gpu))" [ "$(capacity nvidia.com/gpu)" = 32 ]
clean_pods ts-1
pod ts-1 nvidia.com/gpu 1 | kc apply -f - >/dev/null
wait_until 60 running ts-1
check "time-slicing: a pod asking for 1 replica is Running" running ts-1
v=$(kc exec ts-1 -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES' 2>&1)
check "time-slicing: the pod sees one GPU UUID ($v)" bash -c '[[ "$1" == GPU-* && "$1" != *,* ]]' _ "$v"
delete_pods ts-1

# --- MIG mixed on a100-mig -----------------------------------------------------------------------
restart_plugin a100-mig --mig-strategy mixed
mig_ready() { is nvidia.com/mig-1g.5gb 8 && is nvidia.com/gpu 1; }
wait_until 30 mig_ready
for r in gpu:1 mig-1g.5gb:8 mig-2g.10gb:1 mig-3g.20gb:3; do
  check "MIG mixed: nvidia.com/${r%%:*} ${r#*:} allocatable ($(allocatable "nvidia.com/${r%%:*}"))" \
    is "nvidia.com/${r%%:*}" "${r#*:}"
done
clean_pods mig-1
pod mig-1 nvidia.com/mig-1g.5gb 1 | kc apply -f - >/dev/null
wait_until 60 running mig-1
check "MIG mixed: a pod asking for nvidia.com/mig-1g.5gb: 1 is Running ($(phase mig-1))" running mig-1
running mig-1 || kc describe pod mig-1 | tail -n 6
v=$(kc exec mig-1 -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES' 2>&1)
check "MIG mixed: the pod sees one MIG UUID ($v)" bash -c '[[ "$1" == MIG-* && "$1" != *,* ]]' _ "$v"
clean_pods mig-1

# --- back to the cluster's own plugin ------------------------------------------------------------
restart_plugin
wait_until 30 is nvidia.com/gpu 8
check "plugin as the cluster started it: nvidia.com/gpu 8 again" is nvidia.com/gpu 8
finish
