#!/bin/bash
# gpulet installed the admin's way on the real cluster, then uninstalled:
# - the image: `make image`'s steps plus the test layer Containerfile.sim (the fake NVML), imported
#   into the cluster's containerd (lib.sh's gpulet_image);
# - `kubectl apply -k tests/cluster/deploy` (deploy/overlays/containerd with the test cluster's
#   needs, see its kustomization.yaml): the install init container configures the cluster's
#   containerd (/etc/containerd/config.toml in the cluster's namespace) and restarts it; the agent
#   runs as a pod on the real kubelet, registers nvidia.com/gpu (8, the host-process plugin having
#   been stopped), validates the node (label gpulet.io/gpu-stack=ready, no taint left); the
#   scheduler Deployment runs; a 2-GPU pod runs and sees its 2 device nodes. The driver is a
#   stand-in driver container's root (/run/nvidia/driver): install finds it there and the agent's
#   validation probe mounts its files (this overlay's pods get device specs, not the shim: no
#   libraries; cluster.dra_daemonset checks them in a claim's container);
# - the vGPU path (vgpu_checks.sh, vgpu_restart_checks.sh), and examples/05-vgpu.yaml as printed on
#   the cluster's pod network: its container gets one GPU and the example's limits;
# - uninstall as docs/install.md says: `kubectl debug node/... --profile=sysadmin -- gpulet
#   uninstall --host-root /host`, then `kubectl delete -k`: containerd's config.toml is byte for
#   byte what it was, nothing of gpulet is left on the node, nvidia.com/gpu is gone;
# - then the product's own device-plugin settings (tests/cluster/deploy/defaults) on this
#   containerd 1.6: the agent keeps the node tainted, saying GPU pods would get no GPUs (on a host
#   whose containerd is 1.7 or newer, which has CDI in its CRI, it validates the node instead).
# The host-process plugin is restarted at the end for the scenarios after this one.
# Usage: install_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
command -v podman >/dev/null || { echo "skipped: podman missing (the image is built with podman build)"; exit 77; }
[ "$(cat "$D/runtime" 2>/dev/null)" = containerd ] || { echo "skipped: the install test runs on containerd 1.6"; exit 77; }
NS=gpulet-system
OVERLAY=$src/tests/cluster/deploy
CONFIG=$D/fixed/etc/containerd/config.toml
work=$build/cluster-install-test
rm -rf "$work" && mkdir -p "$work"
cleanup() {
  kc delete -k "$OVERLAY" --ignore-not-found --wait=true --timeout=90s >/dev/null 2>&1
  kc label node "$NODE" feature.node.kubernetes.io/pci-10de.present- gpulet.io/gpu-stack- >/dev/null 2>&1
  kc taint node "$NODE" gpulet.io/gpu-stack-not-ready- >/dev/null 2>&1
  kc delete deployment gpu-reboot --ignore-not-found >/dev/null 2>&1
  [ -n "$(cat "$D/pids/kubelet" 2>/dev/null)" ] && kill -0 "$(cat "$D/pids/kubelet")" 2>/dev/null || "$cluster" kubelet-start "$build" >/dev/null 2>&1
  kc delete pod vgpu-a vgpu-b vgpu-inference gpu-installed --ignore-not-found --grace-period=0 >/dev/null 2>&1
  [ ! -f "$D/kube-scheduler-config.yaml" ] || "$cluster" scheduler "$build" >/dev/null 2>&1
  restart_plugin
  rm -rf "$D/fixed/run/nvidia/driver"
}
trap cleanup EXIT

# --- the image (lib.sh) -----------------------------------------------------------------------------
gpulet_image "$work" || exit 1

# --- install ---------------------------------------------------------------------------------------
driver_container_root "$work/driver-root.log" || exit 1  # removed by cleanup, for the scenarios after
cp "$CONFIG" "$work/config.before"
# The audit log from here to the uninstall is what gpulet's accounts did while installed (earlier
# scenarios use gpulet-node tokens to be refused on purpose; kubectl delete -k removes the RBAC
# while the agent is still stopping).
audit_from=$(wc -l < "$D/logs/audit.log")
"$cluster" plugin "$build" none >/dev/null
gone() { [ "$(allocatable nvidia.com/gpu)" = 0 ]; }
check "host-process plugin stopped: nvidia.com/gpu allocatable 0" wait_until 30 gone
# What NFD would say of a node with an NVIDIA PCI device (the DaemonSet's node affinity).
kc label node "$NODE" feature.node.kubernetes.io/pci-10de.present=true --overwrite >/dev/null
restarts_before=$(grep -c 'containerd restarted' "$D/logs/engine-restarter.log" 2>/dev/null)
t0=$(now)
check "kubectl apply -k tests/cluster/deploy" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig apply -k $OVERLAY > $work/apply.log 2>&1"
agent_up() { [ "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[*].status.phase}')" = Running ]; }
# GPUs 4-7 are shared as vGPU (the overlay's gpulet.vgpu.gpus): 4 whole GPUs, 4 x 100 cores,
# 4 x 320 memory units (80 GiB in 256 MiB units).
gpus8() { [ "$(allocatable nvidia.com/gpu)" = 4 ] && [ "$(allocatable tencent.com/vcuda-core)" = 400 ] \
  && [ "$(allocatable tencent.com/vcuda-memory)" = 1280 ]; }
wait_until 120 agent_up
check "the agent DaemonSet's pod is Running on the real kubelet" agent_up
wait_until 60 gpus8
t1=$(now)
check "the agent pod registered nvidia.com/gpu 4, vcuda-core 400, vcuda-memory 1280 ($(allocatable nvidia.com/gpu), $(allocatable tencent.com/vcuda-core), $(allocatable tencent.com/vcuda-memory))" gpus8
gpus8 && echo "figure: kubectl apply -k -> nvidia.com/gpu allocatable from the agent pod: $(elapsed "$t0" "$t1") s"
agent=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}')
kc -n "$NS" logs "$agent" -c install > "$work/install.log" 2>&1
kc -n "$NS" logs "$agent" -c agent > "$work/agent.log" 2>&1
check "install found the driver in the driver container's root /run/nvidia/driver" \
  grep -q "driver container's root /run/nvidia/driver" "$work/install.log"
check "install configured /etc/containerd/config.toml ($(grep -c . "$work/install.log") lines of output)" \
  grep -q 'configured /etc/containerd/config.toml' "$work/install.log"
check "install restarted containerd through --restart" grep -q 'restarted containerd' "$work/install.log"
check "containerd was restarted once by the cluster" \
  [ "$(grep -c 'containerd restarted' "$D/logs/engine-restarter.log")" = $((restarts_before + 1)) ]
check "config.toml imports gpulet's drop-in" grep -q '/etc/containerd/conf.d/99-gpulet.toml' "$CONFIG"
check "the drop-in names gpulet's runtime" grep -q '/usr/local/gpulet/bin/gpulet-container-runtime' \
  "$D/fixed/etc/containerd/conf.d/99-gpulet.toml"
check "the shim is on the node (/usr/local/gpulet/bin)" [ -x "$D/fixed/usr/local/gpulet/bin/gpulet-container-runtime" ]
ready() { [ "$(kc get node "$NODE" -o 'jsonpath={.metadata.labels.gpulet\.io/gpu-stack}')" = ready ]; }
untainted() { ! kc get node "$NODE" -o 'jsonpath={.spec.taints[*].key}' | grep -q gpulet.io/gpu-stack-not-ready; }
# The agent labels the node ready, then lifts the taint (readiness.cc: label first): wait for both.
validated() { ready && untainted; }
wait_until 60 validated
check "the agent validated the node: label gpulet.io/gpu-stack=ready" ready
check "no gpulet.io/gpu-stack-not-ready taint left" untainted
ready || grep -i 'valid\|taint\|readiness' "$work/agent.log" | tail -n 5
sched_up() { [ "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-scheduler -o 'jsonpath={.items[*].status.phase}')" = Running ]; }
wait_until 60 sched_up
check "the scheduler Deployment's pod is Running (image $(kc -n "$NS" get deploy gpulet-scheduler -o 'jsonpath={.spec.template.spec.containers[0].image}'))" sched_up

default_sa
clean_pods gpu-installed
pod gpu-installed nvidia.com/gpu 2 | kc apply -f - >/dev/null
wait_until 60 running gpu-installed
check "a 2-GPU pod runs on the agent's GPUs" running gpu-installed
nodes=$(kc exec gpu-installed -- sh -c 'ls /dev | grep -E "^nvidia[0-9]+$" | tr "\n" " "' 2>&1)
check "kubectl exec: the pod sees exactly 2 /dev/nvidiaN ($nodes)" bash -c '[ "$(wc -w <<< "$1")" = 2 ]' _ "$nodes"
clean_pods gpu-installed

# --- vGPU: the real API server calls the webhook, the real kube-scheduler the extender ------------
. "$src/tests/cluster/vgpu_checks.sh"
# examples/05-vgpu.yaml as printed (on the pod network; its image is the cluster's vectoradd
# stand-in, which lists the GPU and limits it got and exits 0, so the pod, restartPolicy Always,
# runs it again): 30 cores and 20 units of one GPU of the vGPU pool. Deleted before the restart
# checks, whose binpack expectation counts only their own pods.
clean_pods vgpu-inference
out=$(kc apply -f "$src/examples/05-vgpu.yaml" 2>&1)
check "kubectl apply -f examples/05-vgpu.yaml ($out)" [ "$out" = "pod/vgpu-inference created" ]
vlogs() { kc logs vgpu-inference 2>/dev/null; kc logs vgpu-inference --previous 2>/dev/null; }
passed() { vlogs | grep -q 'Test PASSED'; }
wait_until 60 passed
logs=$(vlogs)
check "vgpu-inference ran: \"Test PASSED\" on 1 GPU ($(grep -m1 '^GPUs' <<< "$logs"))" \
  bash -c '[[ "$1" == *"Test PASSED"* && "$1" == *"GPUs: 1 "* ]]' _ "$logs"
check "... with GPULET_VGPU_CORE_LIMIT=30 and a 5 GiB memory limit" \
  bash -c 'grep -qx GPULET_VGPU_CORE_LIMIT=30 <<< "$1" && grep -qx GPULET_VGPU_MEMORY_LIMIT=$((20 * 268435456)) <<< "$1"' _ "$logs"
vip=$(kc get pod vgpu-inference -o 'jsonpath={.status.podIP}')
check "vgpu-inference is on the pod network ($vip, hostNetwork: $(kc get pod vgpu-inference -o 'jsonpath={.spec.hostNetwork}'))" \
  python3 -c 'import ipaddress, json, sys
r = json.load(open(sys.argv[1]))["plugins"][0]["ipam"]["ranges"][0][0]
sys.exit(0 if ipaddress.ip_address(sys.argv[2]) in ipaddress.ip_network(r["subnet"]) else 1)' "$D/cni/10-gpulet-pods.conflist" "$vip"
passed || { kc describe pod vgpu-inference | tail -n 10; }
clean_pods vgpu-inference
. "$src/tests/cluster/vgpu_restart_checks.sh"

# --- the reboot order: kubelet first, then the agent -------------------------------------------------
. "$src/tests/cluster/reboot_checks.sh"

sed -n "$((audit_from + 1)),\$p" "$D/logs/audit.log" > "$work/audit.log"

# --- uninstall (docs/install.md) -------------------------------------------------------------------
out=$(kc debug "node/$NODE" --profile=sysadmin --image="$SIM_IMG" --image-pull-policy=Never \
  -- gpulet uninstall --host-root /host --restart=/usr/bin/gpulet-test-restart-engine 2>&1)
dbg=$(sed -n 's/.*debugging pod \([^ ]*\).*/\1/p' <<< "$out")
check "kubectl debug node started the uninstall pod ($dbg)" [ -n "$dbg" ]
done_pod() { [[ "$(phase "$dbg")" == Succeeded || "$(phase "$dbg")" == Failed ]]; }
wait_until 90 done_pod
# The pod can read Succeeded before containerd has written its last output to the container's log
# (CI once read an empty log from a pod whose uninstall had worked), so the log is read until it
# shows the end of uninstall's report or 20 s pass.
uninstall_logged() { kc logs "$dbg" > "$work/uninstall.log" 2>&1 && grep -q 'restored /etc/containerd/config.toml' "$work/uninstall.log"; }
wait_until 20 uninstall_logged
check "gpulet uninstall succeeded in the debug pod ($(phase "$dbg"))" [ "$(phase "$dbg")" = Succeeded ]
check "uninstall restored /etc/containerd/config.toml" grep -q 'restored /etc/containerd/config.toml' "$work/uninstall.log"
kc delete pod "$dbg" --grace-period=0 --ignore-not-found >/dev/null 2>&1
check "kubectl delete -k" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig delete -k $OVERLAY --wait=true --timeout=90s > $work/delete.log 2>&1"
check "containerd's config.toml is byte for byte as before the install" cmp "$work/config.before" "$CONFIG"
# What install placed is gone. The agent's own state stays (its vGPU checkpoint and accounting in
# /var/lib/gpulet/vgpu, the NFD feature file): uninstall removes only what install recorded.
left=$(find "$D/fixed/usr/local/gpulet" "$D/fixed/var/lib/gpulet" "$D/fixed/var/run/cdi" -mindepth 1 \
  -not -path "$D/fixed/var/lib/gpulet/vgpu*" 2>/dev/null)
check "nothing install placed is left in /usr/local/gpulet, /var/lib/gpulet, /var/run/cdi ($left)" [ -z "$left" ]
echo "note: left by the agent (not by install): $(cd "$D/fixed" && find var/lib/gpulet/vgpu etc/kubernetes -type f 2>/dev/null | tr '\n' ' ')"
check "namespace $NS gone" bash -c "! $K/kubectl --kubeconfig $D/admin.kubeconfig get namespace $NS >/dev/null 2>&1"
wait_until 30 gone
check "nvidia.com/gpu no longer allocatable" gone
# RBAC: every request of gpulet's service accounts in the API server's audit log; none refused.
"$K/kubectl" kustomize "$OVERLAY" > "$work/manifests.yaml"
python3 "$src/tests/cluster/rbac_audit.py" "$work/audit.log" "$work/manifests.yaml" > "$work/rbac.txt" 2>&1; rc=$?
cat "$work/rbac.txt"
check "no request of a gpulet service account was refused (403) in the audit log" bash -c '! grep -q "^REFUSED " "$1"' _ "$work/rbac.txt"
# Issue 31.9: RBAC cannot scope list/watch by field selector; the audit log proves that the agent
# only ever lists and watches its own node's pods.
check "the node agent listed and watched only its own node's pods (fieldSelector spec.nodeName)" \
  bash -c '! grep -q "^UNSCOPED " "$1" && grep -q "^figure: gpulet-node pod lists and watches: [1-9]" "$1"' _ "$work/rbac.txt"
check "rbac_audit.py exited 0 (rc $rc)" [ "$rc" = 0 ]
check "the audit log shows both accounts at work" bash -c 'grep -q "^== gpulet-node" "$1" && grep -q "^== gpulet-scheduler" "$1" && grep -q "used " "$1"' _ "$work/rbac.txt"
# --- the shipped device-plugin settings on containerd 1.6 --------------------------------------------
# tests/cluster/deploy/defaults (the product's own settings, NVML from the host driver: the fake as
# the driver container's libnvidia-ml) on this cluster's containerd 1.6, whose default runtime is
# runc and whose CRI has no CDI: GPU pods would start without their GPUs, so the agent must keep
# the node tainted and say why (docs/install.md, "How a pod gets its GPUs").
driver_nvml_is_the_fake
DEFAULTS=$src/tests/cluster/deploy/defaults
# A node gpulet has not validated yet (validation runs once per boot: forget this boot's).
kc annotate node "$NODE" gpulet.io/validated-boot-id- >/dev/null
kc label node "$NODE" gpulet.io/gpu-stack- >/dev/null
check "kubectl apply -k tests/cluster/deploy/defaults on containerd 1.6" \
  bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig apply -k $DEFAULTS > $work/apply-defaults.log 2>&1"
# The engine as the kubelet reports it: the verdict depends on it. Debian's containerd is 1.6; a
# host whose containerd is 1.7 or newer (CDI in its CRI) rightly gets the node validated instead.
engine=$(kc get node "$NODE" -o 'jsonpath={.status.nodeInfo.containerRuntimeVersion}')
echo "figure: the node's engine: $engine"
agent_log() {
  local a; a=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}' 2>/dev/null)
  [ -n "$a" ] && kc -n "$NS" logs "$a" -c agent > "$work/agent-defaults.log" 2>&1
}
said() { agent_log && grep -q "GPU containers would start without their GPUs: containerd://v\?1\.[0-6]\." "$work/agent-defaults.log"; }
judged() { agent_log && grep -q "validated for boot .*delivery checked against $engine" "$work/agent-defaults.log"; }
if [[ $engine =~ ^containerd://v?1\.[0-6]\. ]]; then
  wait_until 120 said
  check "the agent says GPU containers would start without their GPUs (no CDI in containerd 1.6's CRI, runc the default)" said
  tainted() { ! untainted; }
  check "the node keeps the gpulet.io/gpu-stack-not-ready taint" tainted
  ok=said
else
  wait_until 120 judged
  check "on $engine (CDI in its CRI) the agent validates the node, judging delivery by that version" judged
  check "... and the node is labelled ready and untainted" validated
  ok=judged
fi
if ! $ok; then  # what the agent judged, on what (its validation summary names the engine version)
  echo "--- the defaults agent's log"; cat "$work/agent-defaults.log"
  echo "--- the agent's config:"; kc -n "$NS" exec "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}')" -c agent -- cat /etc/gpulet/config.yaml 2>&1 | head -30
fi
check "kubectl delete -k tests/cluster/deploy/defaults" \
  bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig delete -k $DEFAULTS --wait=true --timeout=90s > $work/delete-defaults.log 2>&1"
check "containerd's config.toml is byte for byte as before, again" cmp "$work/config.before" "$CONFIG"

[ "$failures" = 0 ] || { echo "--- install log"; cat "$work/install.log"; echo "--- agent log (tail)"; tail -n 20 "$work/agent.log"; echo "--- uninstall log"; cat "$work/uninstall.log"; }
finish
