#!/bin/bash
# A new user's first GPU pod, with the product's defaults: `kubectl apply -k` of deploy/overlays/
# containerd (through tests/cluster/deploy/defaults, which adds only what this loopback cluster
# lacks, not a device-plugin setting) on a containerd 2 cluster of its own, whose default runtime
# stays runc (install does not make gpulet's shim the default), which injects no driver into
# gpulet's own containers either: the driver is a stand-in driver container's root whose
# libnvidia-ml is the fake NVML, found and loaded by install and the agent. A pod asking for 2
# nvidia.com/gpu must see exactly its 2 device nodes and the driver's libcuda in its ld cache. A
# ConfigMap edit to settings that reach no container taints the validated node until it is undone.
# `kubectl delete -k` restores containerd's configuration.
# Usage: defaults_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
STATE=$build/cluster-test-defaults
. "$(dirname "$0")/leftovers.sh"
own_containerd2_cluster "$src/tests/cluster/deploy/defaults"
driver_container_root "$STATE/driver-root.log" || exit 1
driver_nvml_is_the_fake || exit 1

cp "$CONFIG" "$STATE/config.before"
"$cluster" plugin "$build" none >/dev/null
# The host-process plugin's CDI spec (the same kind and device names, a stand-in driver of its own)
# goes with it: a node has only the spec install writes.
rm -f "$D/cdi/nvidia.yaml"
kc label node "$NODE" feature.node.kubernetes.io/pci-10de.present=true --overwrite >/dev/null
check "kubectl apply -k tests/cluster/deploy/defaults" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig apply -k $OVERLAY > $STATE/apply.log 2>&1"
agent_up() { [ "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[*].status.phase}')" = Running ]; }
wait_until 120 agent_up
check "the agent DaemonSet's pod is Running" agent_up
gpus() { [ "$(allocatable nvidia.com/gpu)" = 8 ]; }
wait_until 60 gpus
check "the agent registered nvidia.com/gpu 8 ($(allocatable nvidia.com/gpu))" gpus
agent=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}')
kc -n "$NS" logs "$agent" -c install > "$STATE/install.log" 2>&1
kc -n "$NS" logs "$agent" -c agent > "$STATE/agent.log" 2>&1
nvml="NVML: the host's /host/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.$driver_version"
check "install loaded the host driver's NVML from under /host (no --simulate)" grep -qF "$nvml" "$STATE/install.log"
check "the agent loaded the host driver's NVML from under /host (no --simulate)" grep -qF "$nvml" "$STATE/agent.log"
untainted() { ! kc get node "$NODE" -o 'jsonpath={.spec.taints[*].key}' | grep -q gpulet.io/gpu-stack-not-ready; }
wait_until 60 untainted
check "the agent validated the node (no gpulet.io/gpu-stack-not-ready taint)" untainted
# What docs/install.md tells an admin to run: the same verdict as the agent's.
validate_in_pod() {  # validate_in_pod OUT: rc of gpulet validate in the agent's container
  kc -n "$NS" exec ds/gpulet-node -c agent -- gpulet validate --host-root /host \
    --config-file /etc/gpulet/config.yaml > "$1" 2>&1
}
validate_in_pod "$STATE/validate.out"; rc=$?
check "kubectl exec ... gpulet validate --config-file: rc 0, driver, runtime and device-plugin ok (rc $rc)" \
  bash -c '[ "$1" = 0 ] && [ "$(grep -c "^ok " "$2")" = 3 ]' _ "$rc" "$STATE/validate.out"
[ "$rc" = 0 ] || cat "$STATE/validate.out"
check "containerd's default runtime is still runc (install did not take it over)" \
  bash -c '! grep -rq "default_runtime_name = .nvidia." "$1"/fixed/etc/containerd' _ "$D"

t0=$(now)
pod first-gpu nvidia.com/gpu 2 | kc apply -f - >/dev/null
wait_until 60 running first-gpu
t1=$(now)
check "a pod asking for 2 nvidia.com/gpu is Running" running first-gpu
running first-gpu && echo "figure: kubectl apply -> pod Running (2 GPUs, product defaults, containerd 2): $(elapsed "$t0" "$t1") s"
nodes=$(kc exec first-gpu -- sh -c 'ls /dev | grep -E "^nvidia[0-9]+$" | tr "\n" " "' 2>&1)
check "the pod sees exactly 2 /dev/nvidiaN ($nodes)" bash -c '[ "$(wc -w <<< "$1")" = 2 ]' _ "$nodes"
check "the pod has the driver's libcuda.so.$driver_version mounted and in its ld cache" driver_in_pod first-gpu
check "the pod sees /dev/nvidiactl" kc exec first-gpu -- sh -c 'test -c /dev/nvidiactl'
driver_in_pod first-gpu || {  # what the pod got, and the spec install wrote
  kc exec first-gpu -- sh -c 'ls -la /usr/lib/x86_64-linux-gnu/ /etc/ld.so.cache 2>&1 | head -n 20'
  grep -n -A3 'libcuda\|hooks' "$D"/fixed/var/run/cdi/gpulet-nvidia.yaml | head -n 30
}
kc delete pod first-gpu --grace-period=0 --wait=true --timeout=60s >/dev/null 2>&1

# A settings change within the validated boot (a ConfigMap edit; a helm upgrade restarts the agent,
# which checks its settings on start) is checked against this engine: volume-mounts alone reach no
# container while runc is the default runtime, so the node is tainted until the settings are fixed.
strategy() {  # strategy FROM TO: edits the shipped ConfigMap's deviceListStrategy
  kc -n "$NS" get configmap gpulet-config -o yaml | sed "s/deviceListStrategy: \[$1\]/deviceListStrategy: [$2]/" |
    kc replace -f - >/dev/null
}
append_config() {  # append_config YAML: added to the end of the ConfigMap's config.yaml
  kc -n "$NS" get configmap gpulet-config -o json | python3 -c '
import json, sys
cm = json.load(sys.stdin)
cm["data"]["config.yaml"] += sys.argv[1]
json.dump(cm, sys.stdout)' "$1" | kc replace -f - >/dev/null
}
tainted() { kc get node "$NODE" -o 'jsonpath={.spec.taints[*].key}' | grep -q gpulet.io/gpu-stack-not-ready; }
strategy "volume-mounts, cdi-cri" "volume-mounts"
check "deviceListStrategy [volume-mounts] in the ConfigMap" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig -n $NS get configmap gpulet-config -o yaml | grep -qF 'deviceListStrategy: [volume-mounts]'"
t0=$(now)
wait_until 120 tainted
t1=$(now)
check "settings that reach no container taint the validated node" tainted
tainted && echo "figure: ConfigMap edit -> node tainted: $(elapsed "$t0" "$t1") s"
kc -n "$NS" logs "$agent" -c agent > "$STATE/agent.log" 2>&1
check "the agent says why (the shim is not the default runtime)" grep -q "no longer validates with the current settings.*not the engine's default runtime" "$STATE/agent.log"
validate_in_pod "$STATE/validate-bad.out"; rc=$?
check "gpulet validate --config-file in the pod agrees: rc 1, the runtime step names the fix (rc $rc)" \
  bash -c '[ "$1" = 1 ] && grep -q "^FAIL runtime: GPU containers would start without their GPUs.*set-as-default" "$2"' _ "$rc" "$STATE/validate-bad.out"
strategy "volume-mounts" "volume-mounts, cdi-cri"
wait_until 120 untainted
check "the shipped settings again: the node validates and is untainted" untainted

# vGPU turned on as an admin does (gpulet.vgpu.gpus in the ConfigMap): a vcuda pod's granted GPU
# reaches it the way whole GPUs do here, through CDI in CRI, with the driver's libraries.
append_config 'gpulet:
  vgpu:
    gpus: "4,5,6,7"
'
vgpu_up() { [ "$(allocatable nvidia.com/gpu)" = 4 ] && [ "$(allocatable tencent.com/vcuda-core)" = 400 ]; }
wait_until 120 vgpu_up
check "GPUs 4-7 as vGPU after the ConfigMap edit (nvidia.com/gpu $(allocatable nvidia.com/gpu), vcuda-core $(allocatable tencent.com/vcuda-core))" vgpu_up
check "the node is still validated (no gpulet.io/gpu-stack-not-ready taint)" untainted
work=$STATE
. "$src/tests/cluster/vgpu_checks.sh"
check "the vcuda pod has the driver's libcuda.so.$driver_version mounted and in its ld cache" driver_in_pod vgpu-a
# Issue 30.5: what the agent costs the API server at rest (vGPU on, a vcuda pod running, nothing
# changing): a window of the audit log, per verb and resource. Watches stay open; the readiness
# controller reads the Node (and, in the two minutes after validating, lists the node's pods for
# rejected ones) at most every 10 s: at most 7 of each a minute (before: 60 GETs and 30 lists).
idle_from=$(wc -l < "$D/logs/audit.log")
sleep 60
tail -n +"$((idle_from + 1))" "$D/logs/audit.log" > "$STATE/idle-audit.log"
python3 "$src/tests/cluster/idle_requests.py" "$STATE/idle-audit.log" 60 7 | tee "$STATE/idle.txt"
check "the idle agent asks for nothing more than once per 10 s" bash -c '! grep -q "^OVER" "$1" && grep -q "^figure: idle agent" "$1"' _ "$STATE/idle.txt"
clean_pods vgpu-a
"$cluster" scheduler "$build" >/dev/null 2>&1 || check "kube-scheduler back to its flags" false

# MPS as an admin turns it on: deploy/overlays/mps (its MPS root on the host) and sharing.mps in the
# ConfigMap. The agent's container has no driver (runc injects none), so it must run the host
# driver's nvidia-cuda-mps-control (here the fake one, at the driver root's /usr/bin) itself.
cp "$build/testing/gpulet-fake-mps-control" "$D/fixed/run/nvidia/driver/usr/bin/nvidia-cuda-mps-control"
OVERLAY=$src/tests/cluster/deploy/defaults-mps
check "kubectl apply -k tests/cluster/deploy/defaults-mps" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig apply -k $OVERLAY > $STATE/apply-mps.log 2>&1"
append_config 'sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 2
'
mps_up() { [ "$(allocatable nvidia.com/gpu)" = 16 ]; }
wait_until 120 mps_up
check "sharing.mps: nvidia.com/gpu 16 (8 GPUs x 2 replicas; $(allocatable nvidia.com/gpu))" mps_up
# The overlay rolled the DaemonSet: the log to read is the new pod's, once the old one is gone.
kc -n "$NS" rollout status ds/gpulet-node --timeout=120s >/dev/null 2>&1
agent=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}')
kc -n "$NS" logs "$agent" -c agent > "$STATE/agent-mps.log" 2>&1
mps_up || grep -i mps "$STATE/agent-mps.log" | tail -n 5
check "the agent runs the host driver's programs (no driver in its container)" \
  grep -q "driver programs for sharing.mps: the host's, from /host/run/nvidia/driver" "$STATE/agent-mps.log"
check "the host driver's MPS control daemon runs (its pid file on the host)" \
  test -s "$D/fixed/run/nvidia/mps/nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid"
# One tenant per MPS node (gpulet-mps-one-tenant-per-node, in the overlay): without the node
# selector the pod is refused; the node is default's, so default's pod selecting it runs.
out=$(pod mps-gpu nvidia.com/gpu 1 | kc apply -f - 2>&1); rc=$?
check "an MPS client pod without gpulet.io/mps-tenant is refused ($out)" \
  bash -c '[ "$1" != 0 ] && [[ "$2" == *"gpulet-mps-one-tenant-per-node"* ]]' _ "$rc" "$out"
kc label node "$NODE" --overwrite gpulet.io/mps-tenant=default >/dev/null
pod mps-gpu nvidia.com/gpu 1 | python3 -c '
import sys, yaml
p = yaml.safe_load(sys.stdin)
p["spec"]["nodeSelector"] = {"gpulet.io/mps-tenant": "default"}
print(yaml.safe_dump(p))' | kc apply -f - >/dev/null
wait_until 60 running mps-gpu
check "an MPS client pod of default on default's MPS node is Running" running mps-gpu
check "the pod reaches the daemon: CUDA_MPS_PIPE_DIRECTORY and its control socket" \
  kc exec mps-gpu -- sh -c 'test -S "$CUDA_MPS_PIPE_DIRECTORY/control"'
clean_pods mps-gpu
kc label node "$NODE" gpulet.io/mps-tenant- >/dev/null

check "kubectl delete -k" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig delete -k $OVERLAY --wait=true --timeout=90s > $STATE/delete.log 2>&1"
check "containerd 2's config.toml is byte for byte as before the install" cmp "$STATE/config.before" "$CONFIG"
trap - EXIT
"$cluster" down "$build" >/dev/null || check "cluster down" false
no_leftovers "down (defaults)" "$holder"
[ "$failures" = 0 ] && rm -rf "$STATE" || { echo "--- install log"; cat "$STATE/install.log"; echo "--- agent log (tail)"; tail -n 20 "$STATE/agent.log"; }
finish
