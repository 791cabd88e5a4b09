#!/bin/bash
# gpulet as a DRA driver installed the admin's way: `kubectl apply -k` of deploy/overlays/dra (through
# tests/cluster/deploy/dra, which adds only what this loopback cluster lacks) on a containerd 2
# cluster of its own. The agent pod, not a host process, is the driver: its install init container
# configures containerd 2, it registers gpu.gpulet.io with the real kubelet from its own mounts,
# publishes the node's ResourceSlice and writes claim status with its own projected token (through
# the admission policies gpulet-node-own-resourceslices and gpulet-node-own-claim-status), and
# writes each claim's CDI spec where containerd reads it. The driver is a driver container's root
# (/run/nvidia/driver, as on GPU Operator hosts; this host has no NVIDIA driver of its own): install
# and the DRA driver find it there, the agent's validation probe container mounts its files, and
# a claim's container gets its libraries and an ld cache the hook made. A 1-GPU claim and a
# fractional claim run; `kubectl delete -k` then restores containerd's configuration byte for byte.
# Usage: dra_daemonset_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
STATE=$build/cluster-test-dra-daemonset
. "$(dirname "$0")/leftovers.sh"
. "$(dirname "$0")/dra_lib.sh"
own_containerd2_cluster "$src/tests/cluster/deploy/dra"

# --- install ---------------------------------------------------------------------------------------
driver_container_root "$STATE/driver-root.log" || exit 1
cp "$CONFIG" "$STATE/config.before"
"$cluster" plugin "$build" none >/dev/null
check "host-process device plugin stopped" bash -c '! kill -0 "$(cat "$1")" 2>/dev/null' _ "$D/pids/gpulet-device-plugin"
kc label node "$NODE" feature.node.kubernetes.io/pci-10de.present=true --overwrite >/dev/null
t0=$(now)
check "kubectl apply -k tests/cluster/deploy/dra" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig apply -k $OVERLAY > $STATE/apply.log 2>&1"
agent_up() { [ "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[*].status.phase}')" = Running ]; }
wait_until 120 agent_up
check "the agent DaemonSet's pod is Running on the real kubelet" agent_up
wait_until 60 slice_count 8
t1=$(now)
check "the agent pod published a ResourceSlice with 8 GPUs ($(slice_devices | wc -w))" slice_count 8
slice_count 8 && echo "figure: kubectl apply -k -> 8 GPUs in the agent's ResourceSlice: $(elapsed "$t0" "$t1") s"
agent=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}')
logs() { kc -n "$NS" logs "$agent" -c install > "$STATE/install.log" 2>&1; kc -n "$NS" logs "$agent" -c agent > "$STATE/agent.log" 2>&1; }
logs
check "install configured containerd 2's config.toml" grep -q 'configured /etc/containerd/config.toml' "$STATE/install.log"
check "install found the driver in the driver container's root /run/nvidia/driver" \
  grep -q "driver container's root /run/nvidia/driver" "$STATE/install.log"
registered() { logs; grep -q 'registered driver gpu.gpulet.io' "$STATE/agent.log"; }
check "the kubelet registered the agent's driver gpu.gpulet.io" wait_until 30 registered
check "nvidia.com/gpu is not offered by the device plugin (every GPU is DRA's): allocatable '$(allocatable nvidia.com/gpu)'" \
  bash -c '[ -z "$1" ] || [ "$1" = 0 ]' _ "$(allocatable nvidia.com/gpu)"
ready() { [ "$(kc get node "$NODE" -o 'jsonpath={.metadata.labels.gpulet\.io/gpu-stack}')" = ready ]; }
untainted() { ! kc get node "$NODE" -o 'jsonpath={.spec.taints[*].key}' | grep -q gpulet.io/gpu-stack-not-ready; }
validated() { ready && untainted; }  # the agent labels first, then lifts the taint
wait_until 60 validated
check "the agent validated the node (label gpulet.io/gpu-stack=ready, no gpulet.io/gpu-stack-not-ready taint)" validated
ready || { logs; grep -i 'valid\|taint\|readiness\|not ready' "$STATE/agent.log" | tail -n 5; }

# --- claims ------------------------------------------------------------------------------------------
template one-gpu '      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.gpulet.io}' | kc apply -f - >/dev/null
frac_template | kc apply -f - >/dev/null
show() {  # on failure: the pod's events, the agent's last words, the claim CDI specs, containerd on CDI
  running "$1" && return
  kc describe pod "$1" | tail -n 8; logs; tail -n 5 "$STATE/agent.log"
  for f in "$D"/fixed/var/run/cdi/gpu.gpulet.io-claim_*; do [ -f "$f" ] && { echo "--- $f"; head -c 3000 "$f"; echo; }; done
  grep -i cdi "$D/logs/containerd.log" 2>/dev/null | tail -n 5
}
t0=$(now)
podc ds-1 "resourceClaimTemplateName: one-gpu" | kc apply -f - >/dev/null
wait_until 90 running ds-1
t1=$(now)
check "1-GPU claim: pod Running" running ds-1; show ds-1
running ds-1 && echo "figure: kubectl apply -> pod Running (DRA through the agent pod, 1 GPU): $(elapsed "$t0" "$t1") s"
c1=$(claim_of ds-1); d1=$(devices_of "$c1")
check "1-GPU claim: the container sees exactly /dev/nvidia${d1#gpu-} ($(gpu_nodes ds-1))" [ "$(gpu_nodes ds-1)" = "nvidia${d1#gpu-} " ]
uid1=$(kc get resourceclaim "$c1" -o 'jsonpath={.metadata.uid}')
check "1-GPU claim: its CDI spec is in the node's /var/run/cdi" [ -f "$D/fixed/var/run/cdi/gpu.gpulet.io-claim_$uid1.json" ]
check "1-GPU claim: the driver container's libcuda.so.$driver_version is mounted and in the container's ld cache (the hook)" \
  driver_in_pod ds-1
claim_ready() { [ "$(kc get resourceclaim "$c1" -o 'jsonpath={.status.devices[0].conditions[0].status}')" = True ]; }
check "1-GPU claim: the agent pod wrote status.devices Ready=True (through gpulet-node-own-claim-status)" wait_until 15 claim_ready

podc ds-frac "resourceClaimTemplateName: frac" | kc apply -f - >/dev/null
frac_pod_checks ds-frac 90  # the interposer there is the one the init container installed
kc delete pod ds-1 ds-frac --grace-period=0 --wait=true --timeout=60s >/dev/null 2>&1
unprepared() { [ -z "$(ls "$D/fixed/var/run/cdi" | grep 'gpu.gpulet.io-claim_')" ]; }
check "both claims unprepared: their CDI specs are gone" wait_until 30 unprepared

# --- uninstall ----------------------------------------------------------------------------------------
check "kubectl delete -k" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig delete -k $OVERLAY --wait=true --timeout=90s > $STATE/delete.log 2>&1"
check "containerd 2's config.toml is byte for byte as before the install" cmp "$STATE/config.before" "$CONFIG"
gone() { [ -z "$(ls "$D/fixed/usr/local/gpulet" 2>/dev/null)" ]; }
check "the installed shim, hook and interposer are gone from /usr/local/gpulet" gone

trap - EXIT
"$cluster" down "$build" >/dev/null || check "cluster down" false
no_leftovers "down (dra daemonset)" "$holder"
rm -rf "$STATE"
finish
