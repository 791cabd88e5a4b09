#!/bin/bash
# gpulet as a DRA driver on the real cluster: a containerd 2 cluster of its own (the kubelet passes
# CDI device IDs through CRI), where `gpulet dra-driver` replaces the device plugin on the same fake
# GPUs, registers with the real kubelet through plugins_registry and publishes its ResourceSlice;
# the real scheduler allocates ResourceClaims from it and the real kubelet prepares them.
# Scenarios: 1 GPU; 2 GPUs in one NVLink domain (matchAttribute); a CEL selector on memory; one
# claim shared by two pods; a fractional claim (interposer environment and accounting file); an
# unsatisfiable claim stays Pending with the scheduler's reason; XID 79 -> the GPU leaves the slice
# (timed); a driver restart with prepared claims (unprepare still works after it); a MIG device by
# profile on a100-mig.
# Usage: dra_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
STATE=$build/cluster-test-dra
. "$(dirname "$0")/leftovers.sh"
SIM=$(dirname "$GPULET")/gpulet-sim
LIB=$(dirname "$GPULET")/../lib/libgpulet-vcuda.so
for f in "$SIM" "$LIB"; do [ -e "$f" ] || { echo "FAIL: $f not built"; exit 1; }; done
if [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
  echo "skipped: a cluster is running in $D (make cluster-down first; this test needs its own)"; exit 77
fi
rm -rf "$STATE"; mkdir -p "$STATE"
links > "$STATE/links.before"
kube_rules > "$STATE/kube-rules.before"
GPULET_CLUSTER_RUNTIME=containerd2 "$cluster" up "$build" >/dev/null || { echo "FAIL: cluster up (containerd2)"; exit 1; }
holder=$(cat "$D/pids/holder")
trap '"$cluster" down "$build" >/dev/null 2>&1' EXIT
default_sa

stop_pid() {  # stop_pid NAME: TERM the component, wait until it is gone
  local pid; pid=$(cat "$D/pids/$1" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done
  return 1
}
# start_dra PROFILE SIM_ROOT [ARGS...]: gpulet's DRA driver in the cluster's mount namespace.
start_dra() {
  setsid nsenter -t "$holder" -m -- nice -n 19 "$GPULET" dra-driver --simulate "$1" --sim-root "$2" \
    --node-name "$NODE" --kubeconfig "$D/admin.kubeconfig" --dra-cdi-dir "$D/cdi" \
    --dra-state-dir "$D/dra" --cdi-driver-root "$D/driver-root" --cdi-hook-path "" \
    --vgpu-library "$LIB" --health-hold-down 60s --unhealthy-devices-file "" "${@:3}" \
    >> "$D/logs/gpulet-dra.log" 2>&1 &
  echo $! > "$D/pids/gpulet-dra"
}
slice_devices() { kc get resourceslices -o json | python3 -c 'import json,sys
print(" ".join(sorted(d["name"] for s in json.load(sys.stdin)["items"] if s["spec"]["driver"] == "gpu.gpulet.io" for d in s["spec"].get("devices", []))))'; }
slice_count() { [ "$(slice_devices | wc -w)" = "$1" ]; }
registered() { grep -q "the kubelet registered driver gpu.gpulet.io" "$D/logs/gpulet-dra.log"; }

check "the device plugin stops" stop_pid gpulet-device-plugin
start_dra dgx-h100 "$D/sim"
check "the kubelet registers gpu.gpulet.io (plugins_registry)" wait_until 30 registered
check "ResourceSlice with 8 GPUs published" wait_until 30 slice_count 8
kc apply -f "$src/deploy/components/dra/deviceclasses.yaml" >/dev/null
check "DeviceClasses gpu.gpulet.io and mig.gpulet.io exist" kc get deviceclass gpu.gpulet.io mig.gpulet.io

# template NAME REQUEST_YAML...: a ResourceClaimTemplate; podc NAME [claim-source] : a pod using it.
template() {
  printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: %s, namespace: default}\nspec:\n  spec:\n    devices:\n%s\n' "$1" "$2"
}
podc() {  # podc NAME SOURCE (resourceClaimTemplateName: X | resourceClaimName: Y)
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  restartPolicy: Never
  resourceClaims: [{name: gpu, $2}]
  containers:
  - name: main
    image: gpulet.test/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
YAML
}
gpu_nodes() { kc exec "$1" -- sh -c 'ls /dev/ | grep "^nvidia[0-9][0-9]*$" | sort | tr "\n" " "' 2>&1; }
claim_of() { kc get pod "$1" -o 'jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}'; }
devices_of() { kc get resourceclaim "$1" -o 'jsonpath={.status.allocation.devices.results[*].device}'; }
show() { running "$1" || { kc describe pod "$1" | tail -n 8; tail -n 5 "$D/logs/gpulet-dra.log"; }; }

# --- 1 GPU ------------------------------------------------------------------------------------------
template one-gpu '      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.gpulet.io}' | kc apply -f - >/dev/null
t0=$(now)
podc dra-1 "resourceClaimTemplateName: one-gpu" | kc apply -f - >/dev/null
wait_until 60 running dra-1
t1=$(now)
check "1-GPU claim: pod Running" running dra-1; show dra-1
running dra-1 && echo "figure: kubectl apply -> pod Running (DRA, 1 GPU): $(elapsed "$t0" "$t1") s"
c1=$(claim_of dra-1); d1=$(devices_of "$c1")
check "1-GPU claim: allocated one gpu.gpulet.io device ($d1)" [ "$(wc -w <<< "$d1")" = 1 ]
check "1-GPU claim: the container sees exactly /dev/nvidia${d1#gpu-} ($(gpu_nodes dra-1))" \
  [ "$(gpu_nodes dra-1)" = "nvidia${d1#gpu-} " ]
uid1=$(kc get resourceclaim "$c1" -o 'jsonpath={.metadata.uid}')
check "1-GPU claim: its CDI spec is in the CDI directory" [ -f "$D/cdi/gpu.gpulet.io-claim_$uid1.json" ]
ready() { [ "$(kc get resourceclaim "$1" -o 'jsonpath={.status.devices[0].conditions[0].status}')" = True ]; }
check "1-GPU claim: status.devices has Ready=True" wait_until 10 ready "$c1"

# --- 2 GPUs in one NVLink domain, with a CEL selector on memory -------------------------------------
template two-nvlinked '      requests:
      - name: gpus
        exactly:
          deviceClassName: gpu.gpulet.io
          count: 2
          selectors:
          - cel: {expression: "device.capacity[\"gpu.gpulet.io\"].memory.compareTo(quantity(\"79Gi\")) >= 0"}
      constraints:
      - requests: [gpus]
        matchAttribute: gpu.gpulet.io/nvlinkDomain' | kc apply -f - >/dev/null
podc dra-2 "resourceClaimTemplateName: two-nvlinked" | kc apply -f - >/dev/null
wait_until 60 running dra-2
check "2 NVLinked GPUs with memory >= 79Gi (CEL): pod Running" running dra-2; show dra-2
d2=$(devices_of "$(claim_of dra-2)")
check "2 NVLinked GPUs: 2 devices allocated ($d2), 2 device nodes ($(gpu_nodes dra-2))" \
  bash -c '[ "$(wc -w <<< "$1")" = 2 ] && [ "$(wc -w <<< "$2")" = 2 ]' _ "$d2" "$(gpu_nodes dra-2)"

# --- unsatisfiable: memory >= 100Gi stays Pending with the scheduler's reason ------------------------
template too-big '      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.gpulet.io
          selectors:
          - cel: {expression: "device.capacity[\"gpu.gpulet.io\"].memory.compareTo(quantity(\"100Gi\")) >= 0"}' | kc apply -f - >/dev/null
podc dra-big "resourceClaimTemplateName: too-big" | kc apply -f - >/dev/null
unschedulable() { [ "$(kc get pod dra-big -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}')" = Unschedulable ]; }
wait_until 30 unschedulable
msg=$(kc get pod dra-big -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}')
check "claim no device satisfies: Unschedulable, the scheduler says so ($msg)" \
  bash -c '[[ "$1" == *"cannot allocate all claims"* ]]' _ "$msg"
sleep 1
check "claim no device satisfies: still Pending" [ "$(phase dra-big)" = Pending ]

# --- one claim shared by two pods ----------------------------------------------------------------------
kc apply -f - >/dev/null <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared-gpu, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.gpulet.io}
YAML
podc dra-sa "resourceClaimName: shared-gpu" | kc apply -f - >/dev/null
podc dra-sb "resourceClaimName: shared-gpu" | kc apply -f - >/dev/null
wait_until 60 running dra-sa; wait_until 60 running dra-sb
check "shared claim: both pods Running" bash -c '[ "$1" = Running ] && [ "$2" = Running ]' _ "$(phase dra-sa)" "$(phase dra-sb)"
show dra-sa; show dra-sb
check "shared claim: both see the same one GPU ($(gpu_nodes dra-sa)/ $(gpu_nodes dra-sb))" \
  bash -c '[ -n "$1" ] && [ "$1" = "$2" ] && [ "$(wc -w <<< "$1")" = 1 ]' _ "$(gpu_nodes dra-sa)" "$(gpu_nodes dra-sb)"
check "shared claim: reserved for 2 pods" \
  [ "$(kc get resourceclaim shared-gpu -o 'jsonpath={.status.reservedFor[*].name}' | wc -w)" = 2 ]

# --- a fractional claim: the interposer's limits through opaque config ---------------------------------
template frac '      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.gpulet.io}
      config:
      - requests: [gpu]
        opaque:
          driver: gpu.gpulet.io
          parameters: {apiVersion: gpu.gpulet.io/v1alpha1, kind: VgpuConfig, memory: 4Gi, cores: 30}' | kc apply -f - >/dev/null
podc dra-frac "resourceClaimTemplateName: frac" | kc apply -f - >/dev/null
wait_until 60 running dra-frac
check "fractional claim: pod Running" running dra-frac; show dra-frac
env_frac=$(kc exec dra-frac -- sh -c 'echo $GPULET_VGPU_MEMORY_LIMIT $GPULET_VGPU_CORE_LIMIT $LD_PRELOAD' 2>&1)
check "fractional claim: interposer environment 4Gi / 30 % / LD_PRELOAD ($env_frac)" \
  [ "$env_frac" = "4294967296 30 /usr/lib/gpulet/libgpulet-vcuda.so" ]
check "fractional claim: the accounting file and the interposer are mounted" \
  kc exec dra-frac -- sh -c 'test -f /var/run/gpulet/vgpu/accounting && test -f /usr/lib/gpulet/libgpulet-vcuda.so'

# --- XID 79 on the shared claim's GPU: it leaves the slice, the claim's device turns not Ready ----------
xg=$(devices_of shared-gpu); xg=${xg#gpu-}
t0=$(now)
"$SIM" fault xid --gpu "$xg" --code 79 --sim-root "$D/sim" >/dev/null
gone() { ! slice_devices | tr ' ' '\n' | grep -qx "gpu-$xg"; }
wait_until 10 gone
t1=$(now)
check "XID 79 on GPU $xg: it leaves the ResourceSlice ($(slice_devices | wc -w) devices left)" gone
echo "figure: XID injected -> ResourceSlice without the GPU (kubectl polled every 0.1 s): $(elapsed "$t0" "$t1") s"
not_ready() { [ "$(kc get resourceclaim shared-gpu -o 'jsonpath={.status.devices[0].conditions[0].status}')" = False ]; }
check "XID 79 on GPU $xg: the shared claim's device condition Ready=False ($(kc get resourceclaim shared-gpu -o 'jsonpath={.status.devices[0].conditions[0].reason}'))" wait_until 10 not_ready

# --- a driver restart with prepared claims ----------------------------------------------------------------
check "the DRA driver stops (TERM)" stop_pid gpulet-dra
start_dra dgx-h100 "$D/sim"
restored() { grep -q "prepared claims from" "$D/logs/gpulet-dra.log" && [ "$(grep -c "the kubelet registered driver" "$D/logs/gpulet-dra.log")" -ge 2 ]; }
check "restart: the driver is back and registered" wait_until 30 restored
check "restart: 4 prepared claims restored from the checkpoint (1 GPU, 2 GPUs, shared, fractional)" \
  grep -q "DRA: 4 prepared claims from" "$D/logs/gpulet-dra.log"
check "restart: the pods keep running" bash -c '[ "$1 $2" = "Running Running" ]' _ "$(phase dra-1)" "$(phase dra-2)"
kc delete pod dra-1 --grace-period=0 --wait=true --timeout=60s >/dev/null 2>&1
unprepared() { [ ! -e "$D/cdi/gpu.gpulet.io-claim_$uid1.json" ]; }
check "restart: deleting a pod prepared before it unprepares its claim (CDI spec removed)" wait_until 30 unprepared

# --- a MIG device by profile (a100-mig) ------------------------------------------------------------------
delete_pods dra-2 dra-big dra-sa dra-sb dra-frac
kc delete resourceclaim shared-gpu --wait=false >/dev/null 2>&1
# The cluster's plugin start makes the a100-mig sim root and its MIG capability nodes.
"$cluster" plugin "$build" a100-mig --mig-strategy mixed >/dev/null
stop_pid gpulet-device-plugin
stop_pid gpulet-dra
mig_slice() { slice_devices | grep -q "mig"; }
start_dra a100-mig "$D/sim-a100-mig"
check "a100-mig: the slice holds MIG devices ($(slice_devices | wc -w) devices)" wait_until 30 mig_slice
template mig-1g '      requests:
      - name: mig
        exactly:
          deviceClassName: mig.gpulet.io
          selectors:
          - cel: {expression: "device.attributes[\"gpu.gpulet.io\"].profile == \"1g.5gb\""}' | kc apply -f - >/dev/null
podc dra-mig "resourceClaimTemplateName: mig-1g" | kc apply -f - >/dev/null
wait_until 60 running dra-mig
check "MIG 1g.5gb claim: pod Running" running dra-mig; show dra-mig
dm=$(devices_of "$(claim_of dra-mig)")
check "MIG 1g.5gb claim: a MIG device allocated ($dm)" bash -c '[[ "$1" == gpu-*-mig-* ]]' _ "$dm"
caps=$(kc exec dra-mig -- sh -c 'ls /dev/nvidia-caps 2>/dev/null | wc -l' 2>&1)
check "MIG 1g.5gb claim: the container has its GPU and 2 MIG capability nodes ($(gpu_nodes dra-mig)/ $caps caps)" \
  bash -c '[ "$(wc -w <<< "$1")" = 1 ] && [ "$2" = 2 ]' _ "$(gpu_nodes dra-mig)" "$caps"

trap - EXIT
"$cluster" down "$build" >/dev/null || check "cluster down" false
no_leftovers "down (dra)" "$holder"
rm -rf "$STATE"
finish
