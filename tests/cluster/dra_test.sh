#!/bin/bash
# gpulet as a DRA driver on the real cluster: a containerd 2 cluster of its own (the kubelet passes
# CDI device IDs through CRI), where `gpulet dra-driver` replaces the device plugin on the same fake
# GPUs, registers with the real kubelet through plugins_registry and publishes its ResourceSlice;
# the real scheduler allocates ResourceClaims from it and the real kubelet prepares them.
# The driver runs as the agent does in deploy/overlays/dra: with a token of the service account
# gpulet-node bound to a pod on this node, under that overlay's RBAC and admission policies, so
# gpulet-node-own-resourceslices judges every slice it writes (and refuses, with its message, the
# slices of another node written with the same token), and gpulet-node-own-claim-status every
# claim status it writes (and refuses another pool's device, another driver's entry, a changed
# reservedFor, a claim not allocated on its node).
# Scenarios: 1 GPU; 2 GPUs in one NVLink domain (matchAttribute); a CEL selector on memory; one
# claim shared by two pods; a fractional claim (interposer environment and accounting file) and a
# CUDA program in a fractional claim's container (vcuda_probe on the fake driver through the
# interposer) that holds exactly the claimed memory; an unsatisfiable claim stays Pending with the
# scheduler's reason; XID 79 -> the GPU leaves the slice (timed); a driver restart with prepared
# claims (unprepare still works after it); consumable capacity (DRAConsumableCapacity on: two
# fractional claims packed onto one GPU, a third that does not fit Unschedulable); a MIG device by
# profile on a100-mig.
# Usage: dra_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
STATE=$build/cluster-test-dra
. "$(dirname "$0")/leftovers.sh"
. "$(dirname "$0")/dra_lib.sh"
# Checks at the end of a pipeline (`... | denied ...`) run in this shell, so their failures count
# (without it they printed FAIL and the test still passed).
shopt -s lastpipe
SIM=$(dirname "$GPULET")/gpulet-sim
LIB=$(dirname "$GPULET")/../lib/libgpulet-vcuda.so
PROBE=$build/tests/vcuda_probe
FAKECUDA=$build/lib/fake_cuda/libcuda.so.1
# The fake CUDA driver in the probe's pods has the simulated machine's GPUs, by their NVML UUIDs,
# and sees only those whose device nodes the claim's CDI device gave the container, as the real
# driver does: the interposer finds its GPU by GPULET_VGPU_UUID among them.
MACHINE_UUIDS=$("$GPULET" info --simulate dgx-h100 --json | python3 -c 'import json, sys
print(",".join(g["uuid"] for g in sorted(json.load(sys.stdin)["gpus"], key=lambda g: g["index"])))')
for f in "$SIM" "$LIB" "$PROBE" "$FAKECUDA"; do [ -e "$f" ] || { echo "FAIL: $f not built"; exit 1; }; done
if [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
  echo "skipped: a cluster is running in $D (make cluster-down first; this test needs its own)"; exit 77
fi
rm -rf "$STATE"; mkdir -p "$STATE"
links > "$STATE/links.before"
kube_rules > "$STATE/kube-rules.before"
# DRAConsumableCapacity (alpha in 1.34) on every component, for the packing scenario.
GPULET_CLUSTER_RUNTIME=containerd2 GPULET_CLUSTER_FEATURE_GATES=${GPULET_CLUSTER_FEATURE_GATES-DRAConsumableCapacity=true} \
  "$cluster" up "$build" >/dev/null || { echo "FAIL: cluster up (containerd2)"; exit 1; }
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
    --node-name "$NODE" --kubeconfig "$D/agent.kubeconfig" --dra-cdi-dir "$D/cdi" \
    --dra-state-dir "$D/dra" --cdi-driver-root "$D/driver-root" --cdi-hook-path "" \
    --vgpu-library "$LIB" --health-hold-down 60s --unhealthy-devices-file "" "${@:3}" \
    >> "$D/logs/gpulet-dra.log" 2>&1 &
  echo $! > "$D/pids/gpulet-dra"
}
registered() { grep -q "the kubelet registered driver gpu.gpulet.io" "$D/logs/gpulet-dra.log"; }

# --- the agent's identity: deploy/overlays/dra's namespace, RBAC, policies and device classes ------
NS=gpulet-system
kc kustomize "$src/deploy/overlays/dra" | python3 -c '
import sys, yaml
want = {("Namespace", "gpulet-system"), ("ServiceAccount", "gpulet-node"), ("ClusterRole", "gpulet-node"),
        ("ClusterRoleBinding", "gpulet-node"), ("DeviceClass", "gpu.gpulet.io"), ("DeviceClass", "mig.gpulet.io")}
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
print(yaml.safe_dump_all([d for d in docs if (d["kind"], d["metadata"]["name"]) in want
                          or d["kind"].startswith("ValidatingAdmissionPolicy")]))' > "$STATE/agent.yaml"
applied() { kc apply -f "$STATE/agent.yaml" > "$STATE/apply.out" 2>&1 || { cat "$STATE/apply.out"; false; }; }
check "deploy/overlays/dra: namespace, gpulet-node RBAC, admission policies, DeviceClasses applied" applied
check "DeviceClasses gpu.gpulet.io and mig.gpulet.io exist" kc get deviceclass gpu.gpulet.io mig.gpulet.io
examples_ok() { kc apply --dry-run=server -f "$src/examples/dra/" > "$STATE/examples.out" 2>&1 || { cat "$STATE/examples.out"; false; }; }
check "examples/dra/ accepted by the API server (server-side dry run; the consumable-capacity template too)" examples_ok
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: dra-agent, namespace: $NS}
spec:
  nodeName: $NODE
  serviceAccountName: gpulet-node
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: gpulet.test/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}]
YAML
agent_running() { [ "$(kc -n "$NS" get pod dra-agent -o jsonpath='{.status.phase}')" = Running ]; }
check "pod $NS/dra-agent (service account gpulet-node) Running on $NODE" wait_until 60 agent_running
token=$(kc create token gpulet-node -n "$NS" --duration 1h --bound-object-kind Pod --bound-object-name dra-agent \
  --bound-object-uid "$(kc -n "$NS" get pod dra-agent -o jsonpath='{.metadata.uid}')")
cat > "$D/agent.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$(kc config view --minify -o jsonpath='{.clusters[0].cluster.server}')", certificate-authority: "$D/pki/ca.crt"}}]
users: [{name: gpulet-node, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: gpulet-node}}]
current-context: c
YAML
ka() { "$K/kubectl" --kubeconfig "$D/agent.kubeconfig" "$@"; }  # kubectl as the agent
node_claim=$(ka auth whoami -o jsonpath='{.status.userInfo.extra.authentication\.kubernetes\.io/node-name[0]}' 2>&1)
check "the agent's token carries its node: userInfo.extra[authentication.kubernetes.io/node-name] = $node_claim" \
  [ "$node_claim" = "$NODE" ]
# rslice NAME NODE POOL DRIVER: a ResourceSlice with one device.
rslice() {
  printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: %s}\nspec: {driver: %s, nodeName: %s, pool: {name: %s, generation: 1, resourceSliceCount: 1}, devices: [{name: gpu-0}]}\n' \
    "$1" "$4" "$2" "$3"
}
OWNP=gpulet-node-own-resourceslices
# denied_by POLICY DESCRIPTION MESSAGE KUBECTL-ARGS... (stdin: the object): the agent's request,
# refused by POLICY with MESSAGE. denied: the same for $OWNP.
denied_by() {
  local p=$1 d=$2 msg=$3; shift 3
  local out rc; out=$(ka "$@" 2>&1); rc=$?
  check "denied by $p: $d ($(head -c 300 <<< "$out"))" \
    bash -c '[ "$1" != 0 ] && [[ "$2" == *"ValidatingAdmissionPolicy '"'"'$3'"'"'"*"$4"* ]]' _ "$rc" "$out" "$p" "$msg"
}
denied() { denied_by "$OWNP" "$@"; }
# The agent's claim-status write refused: by POLICY, or before it by the API server's own
# validation, which (Kubernetes 1.34) refuses a status.devices entry that is not a device of the
# claim's allocation before any admission policy is consulted; either way the write does not land.
refused_status() {
  local p=$1 d=$2; shift 2
  local out rc; out=$(ka "$@" 2>&1); rc=$?
  check "refused (by $p or the API server's validation): $d ($(head -c 300 <<< "$out"))" \
    bash -c '[ "$1" != 0 ] && [[ "$2" == *"ValidatingAdmissionPolicy '"'"'$3'"'"'"* ||
                               "$2" == *"must be an allocated device in the claim"* ]]' _ "$rc" "$out" "$p"
}
# A new policy takes effect once the API server's informer has it: wait for its first refusal.
foreign_refused() { ! rslice other-node-gpu.gpulet.io other-node other-node gpu.gpulet.io | ka create --dry-run=server -f - >/dev/null 2>&1; }
check "the policy is in effect (a dry-run slice for other-node refused)" wait_until 30 foreign_refused
NOTOWN="the gpulet node agent may write only ResourceSlices of its own node"
rslice other-node-gpu.gpulet.io other-node other-node gpu.gpulet.io | denied "the agent creates a slice for other-node" "$NOTOWN" create -f -
rslice own-node-foreign-pool $NODE other-node gpu.gpulet.io | denied "the agent creates a slice on its node in other-node's pool" "$NOTOWN" create -f -
rslice own-node-other-driver $NODE $NODE example.com | denied "the agent creates a slice of another driver on its node" \
  "the gpulet node agent may write only ResourceSlices of driver gpu.gpulet.io" create -f -
rslice other-node-admin other-node other-node gpu.gpulet.io | kc create -f - >/dev/null
# (An update as the driver writes one, PUT: the agent may not patch.)
kc get resourceslice other-node-admin -o json |
  denied "the agent updates a slice of other-node (made by the admin)" "$NOTOWN" replace -f -
denied "the agent deletes a slice of other-node" "$NOTOWN" delete resourceslice other-node-admin
check "other-node's slice is still there" bash -c '"$1" --kubeconfig "$2" get resourceslice other-node-admin >/dev/null' \
  _ "$K/kubectl" "$D/admin.kubeconfig"
kc delete resourceslice other-node-admin >/dev/null
# A slice of this driver on this node under another name: the driver deletes it at start (DELETE of
# its own node's slice, with the agent's token).
rslice "$NODE-stale" $NODE $NODE gpu.gpulet.io | kc create -f - >/dev/null

check "the device plugin stops" stop_pid gpulet-device-plugin
start_dra dgx-h100 "$D/sim"
check "the kubelet registers gpu.gpulet.io (plugins_registry)" wait_until 30 registered
check "ResourceSlice with 8 GPUs published, written with the agent's token through $OWNP" wait_until 30 slice_count 8
stale_gone() { ! kc get resourceslice "$NODE-stale" >/dev/null 2>&1; }
check "the driver deleted its node's stale slice (allowed by $OWNP)" wait_until 10 stale_gone

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

# --- the agent's claim-status writes: gpulet-node-own-claim-status -----------------------------------
# The driver wrote the 1-GPU claim's Ready condition above with the agent's token, through this
# policy. Each case below PUTs the claim's status as the driver does, edited (python on `c`).
CSP=gpulet-node-own-claim-status
edited() { kc get resourceclaim "$1" -o json | python3 -c "import json, sys; c = json.load(sys.stdin); $2; print(json.dumps(c))"; }
own_ok() {
  edited "$c1" "c['status']['devices'][0]['conditions'][0]['message'] = 'rewritten by the agent'" |
    ka replace --subresource=status -f - > "$STATE/own-status.out" 2>&1 || { cat "$STATE/own-status.out"; false; }
}
check "allowed by $CSP: the agent rewrites its device's condition in a claim allocated on its node" own_ok
edited "$c1" "c['status']['devices'][0]['pool'] = 'other-node'" | refused_status "$CSP" \
  "the agent reports a device of other-node's pool" replace --subresource=status -f -
edited "$c1" "c['status']['devices'].append({'driver': 'example.com', 'pool': 'p', 'device': 'd'})" |
  refused_status "$CSP" "the agent adds another driver's entry" replace --subresource=status -f -
edited "$c1" "c['status']['reservedFor'] = []" | denied_by "$CSP" "the agent clears the claim's reservedFor" \
  "may change only status.devices" replace --subresource=status -f -
cbig=$(claim_of dra-big)
edited "$cbig" "c.setdefault('status', {})['devices'] = [{'driver': 'gpu.gpulet.io', 'pool': '$NODE', 'device': 'gpu-0'}]" |
  refused_status "$CSP" "the agent writes the status of a claim not allocated ($cbig)" \
  replace --subresource=status -f -
check "the 1-GPU pod is still Running, its claim still reserved for it" \
  bash -c '[ "$1" = Running ] && [ "$2" = dra-1 ]' _ "$(phase dra-1)" \
  "$(kc get resourceclaim "$c1" -o 'jsonpath={.status.reservedFor[*].name}')"

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
frac_template | kc apply -f - >/dev/null
podc dra-frac "resourceClaimTemplateName: frac" | kc apply -f - >/dev/null
frac_pod_checks dra-frac 60

# --- a CUDA program in a fractional claim's container: exactly the claimed 4Gi -------------------------
# The image: busybox, vcuda_probe, the fake CUDA driver (it answers NVML too) in /opt/fake-cuda, and
# the C/C++ runtime of those and of the interposer (which the claim's CDI device mounts) at the
# host's paths. The fake GPU has the H100's 80 GiB (only the interposer makes it 4 GiB), and a
# context holds 512 MiB on it as a real one does (518 MiB on an H200): the limit covers both.
ctrd_path=$build/k8s/containerd2/bin:$PATH
ctr() { nsenter -t "$holder" -m -- env PATH="$ctrd_path" ctr --address "$D/containerd/containerd.sock" -n k8s.io "$@"; }
cuda_image() {
  local r=$STATE/cuda-image l
  mkdir -p "$r/bin" "$r/opt/probe" "$r/opt/fake-cuda" "$r/dev" "$r/proc" "$r/sys" "$r/etc" "$r/tmp"
  cp "$(command -v busybox)" "$r/bin/busybox"
  for l in sh sleep cat env; do ln -s busybox "$r/bin/$l"; done
  cp "$PROBE" "$r/opt/probe/"
  cp "$FAKECUDA" "$r/opt/fake-cuda/libcuda.so.1"
  ln -s libcuda.so.1 "$r/opt/fake-cuda/libnvidia-ml.so.1"
  for l in $(LD_LIBRARY_PATH=$(dirname "$FAKECUDA") ldd "$PROBE" "$FAKECUDA" "$LIB" |
             awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' | sort -u); do
    case $l in "$build"/*) ;; *) cp -L --parents "$l" "$r" || return 1 ;; esac
  done
  "$src/testing/k8s/mkimage" "$STATE/cuda.tar" gpulet.test/cuda-probe:1 "$r" /bin/sh &&
    ctr images import --all-platforms "$STATE/cuda.tar" > "$STATE/import.log" 2>&1 || { cat "$STATE/import.log"; false; }
}
check "image gpulet.test/cuda-probe:1 (vcuda_probe on the fake CUDA driver) imported" cuda_image
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: dra-cuda, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  restartPolicy: Never
  resourceClaims: [{name: gpu, resourceClaimTemplateName: frac}]
  containers:
  - name: main
    image: gpulet.test/cuda-probe:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    env:
    - {name: LD_LIBRARY_PATH, value: /opt/fake-cuda}
    - {name: FAKE_CUDA_DEVICE_MEMORY, value: "85899345920"}
    - {name: FAKE_CUDA_CONTEXT_BYTES, value: "536870912"}
    - {name: FAKE_CUDA_UUIDS, value: "$MACHINE_UUIDS"}
    - {name: FAKE_CUDA_DEVICE_NODES, value: /dev}
    resources: {claims: [{name: gpu}]}
YAML
wait_until 60 running dra-cuda
check "fractional claim, CUDA program: pod Running" running dra-cuda; show dra-cuda
# 256 MiB allocations until the first refusal: with the context's 512 MiB, 14 succeed (3.5 GiB),
# the 15th is CUDA_ERROR_OUT_OF_MEMORY (2), and the process then holds exactly 4 GiB.
cuda=$(kc exec dra-cuda -- /opt/probe/vcuda_probe limit 268435456 2>&1)
echo "      vcuda_probe limit 256MiB under the interposer: $(tr '\n' ' ' <<< "$cuda")"
field() { awk -v k="$1" -v i="$2" '$1 == k {print $(i + 1)}' <<< "$cuda"; }
check "fractional claim, CUDA program: cuMemGetInfo = 3.5Gi free of the claimed 4Gi total ($(field meminfo 1) / $(field meminfo 2))" \
  [ "$(field meminfo 1) $(field meminfo 2)" = "3758096384 4294967296" ]
check "fractional claim, CUDA program: allocations up to the limit succeed ($(field held 1) bytes + the 512Mi context)" \
  [ "$(field held 1)" = 3758096384 ]
check "fractional claim, CUDA program: the next one is refused with CUDA_ERROR_OUT_OF_MEMORY (CUresult $(field refused 1))" \
  [ "$(field refused 1)" = 2 ]
check "fractional claim, CUDA program: then cuMemGetInfo reports 0 free of 4Gi ($(field meminfo_full 1) / $(field meminfo_full 2))" \
  [ "$(field meminfo_full 1) $(field meminfo_full 2)" = "0 4294967296" ]
# The same program with LD_PRELOAD cleared and the opt-out and a bigger limit in its environment
# (what an entrypoint can do): still the claim's 4Gi. The interposer comes through the read-only
# /etc/ld.so.preload and reads its limits from the read-only limits file (issue 31.6); before, it
# saw the fake GPU's whole 80 GiB and held 19 x 4Gi.
cuda=$(kc exec dra-cuda -- env LD_PRELOAD= GPULET_VGPU_DISABLE=1 GPULET_VGPU_MEMORY_LIMIT=85899345920 /opt/probe/vcuda_probe limit 4294967296 2>&1)
check "fractional claim, CUDA program with LD_PRELOAD cleared and the limit lifted in its env: still 4Gi (total $(field meminfo 2), 4Gi chunks held: $(field held 1))" \
  [ "$(field meminfo 2) $(field held 1)" = "4294967296 0" ]

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
check "restart: 5 prepared claims restored from the checkpoint (1 GPU, 2 GPUs, shared, 2 fractional)" \
  grep -q "DRA: 5 prepared claims from" "$D/logs/gpulet-dra.log"
check "restart: the pods keep running" bash -c '[ "$1 $2" = "Running Running" ]' _ "$(phase dra-1)" "$(phase dra-2)"
kc delete pod dra-1 --grace-period=0 --wait=true --timeout=60s >/dev/null 2>&1
unprepared() { [ ! -e "$D/cdi/gpu.gpulet.io-claim_$uid1.json" ]; }
check "restart: deleting a pod prepared before it unprepares its claim (CDI spec removed)" wait_until 30 unprepared

# --- consumable capacity: fractional claims packed onto one GPU by the scheduler ----------------------------
# The driver again, publishing its GPUs with allowMultipleAllocations and memory/cores request
# policies; three claims pinned to one free GPU (index == N): 48Gi/25 and 24Gi/50 fit its 81559Mi
# together, a third of 16Gi does not. Each container holds exactly its share (vcuda_probe).
check "consumable capacity: the DRA driver stops (TERM)" stop_pid gpulet-dra
start_dra dgx-h100 "$D/sim" --dra-consumable-capacity true
shareable() { kc get resourceslices -o json | python3 -c 'import json,sys
sys.exit(not any(d.get("allowMultipleAllocations") for s in json.load(sys.stdin)["items"] for d in s["spec"].get("devices", [])))'; }
check "consumable capacity: the API server keeps allowMultipleAllocations (gate ${GPULET_CLUSTER_FEATURE_GATES-DRAConsumableCapacity=true})" \
  wait_until 30 shareable
shareable || grep "resourceslices" "$D/logs/gpulet-dra.log" | tail -n 1 | cut -c 1-600
taken=$(kc get resourceclaims -A -o 'jsonpath={.items[*].status.allocation.devices.results[*].device}')
free=$(for g in $(slice_devices); do grep -qw "$g" <<< "$taken" || echo "${g#gpu-}"; done | head -n 1)
check "consumable capacity: a GPU no claim holds (gpu-$free)" [ -n "$free" ]
captemplate() {  # captemplate NAME MEMORY CORES
  template "$1" "      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.gpulet.io
          selectors:
          - cel: {expression: \"device.attributes[\\\"gpu.gpulet.io\\\"].index == $free\"}
          capacity:
            requests: {memory: $2, cores: \"$3\"}"
}
cudapod() {  # cudapod NAME TEMPLATE: the CUDA probe image with a claim from TEMPLATE
  podc "$1" "resourceClaimTemplateName: $2" | sed 's|image: gpulet.test/busybox:1|image: gpulet.test/cuda-probe:1\
    env: [{name: LD_LIBRARY_PATH, value: /opt/fake-cuda}, {name: FAKE_CUDA_DEVICE_MEMORY, value: "85899345920"}, {name: FAKE_CUDA_CONTEXT_BYTES, value: "536870912"}, {name: FAKE_CUDA_UUIDS, value: "'"$MACHINE_UUIDS"'"}, {name: FAKE_CUDA_DEVICE_NODES, value: /dev}]|'
}
captemplate cap-48 48Gi 25 | kc apply -f - >/dev/null
captemplate cap-24 24Gi 50 | kc apply -f - >/dev/null
captemplate cap-16 16Gi 10 | kc apply -f - >/dev/null
cudapod dra-cap-a cap-48 | kc apply -f - >/dev/null
wait_until 60 running dra-cap-a
cudapod dra-cap-b cap-24 | kc apply -f - >/dev/null
wait_until 60 running dra-cap-b
check "consumable capacity: 48Gi and 24Gi claims on gpu-$free both Running" \
  bash -c '[ "$1 $2" = "Running Running" ]' _ "$(phase dra-cap-a)" "$(phase dra-cap-b)"
show dra-cap-a; show dra-cap-b
ca=$(claim_of dra-cap-a) cb=$(claim_of dra-cap-b)
check "consumable capacity: both allocated gpu-$free ($(devices_of "$ca") / $(devices_of "$cb")), each with its shareID" \
  bash -c '[ "$1 $2" = "gpu-$3 gpu-$3" ] && [ -n "$4" ] && [ "$4" != "$5" ]' _ "$(devices_of "$ca")" "$(devices_of "$cb")" "$free" \
  "$(kc get resourceclaim "$ca" -o 'jsonpath={.status.allocation.devices.results[0].shareID}')" \
  "$(kc get resourceclaim "$cb" -o 'jsonpath={.status.allocation.devices.results[0].shareID}')"
both_ready() { ready "$ca" && ready "$cb"; }
check "consumable capacity: both claims' status.devices Ready=True (each entry with its shareID)" wait_until 10 both_ready
check "consumable capacity: both containers see /dev/nvidia$free ($(gpu_nodes dra-cap-a)/ $(gpu_nodes dra-cap-b))" \
  bash -c '[ "$1" = "nvidia$3 " ] && [ "$2" = "nvidia$3 " ]' _ "$(gpu_nodes dra-cap-a)" "$(gpu_nodes dra-cap-b)" "$free"
for p in "dra-cap-a 51539607552 25" "dra-cap-b 25769803776 50"; do
  set -- $p
  lim=$(kc exec "$1" -- sh -c 'echo $GPULET_VGPU_MEMORY_LIMIT $GPULET_VGPU_CORE_LIMIT' 2>&1)
  check "consumable capacity: $1's consumedCapacity is its interposer limit ($lim)" [ "$lim" = "$2 $3" ]
  cuda=$(kc exec "$1" -- /opt/probe/vcuda_probe limit 268435456 2>&1)
  check "consumable capacity: $1's CUDA program holds exactly $2 bytes (total $(field meminfo 2), held $(field held 1) + 512Mi context, refused $(field refused 1), then $(field meminfo_full 1) free)" \
    [ "$(field meminfo 2) $(field held 1) $(field refused 1) $(field meminfo_full 1)" = "$2 $(($2 - 536870912)) 2 0" ]
done
cudapod dra-cap-c cap-16 | kc apply -f - >/dev/null
cap_unschedulable() { [ "$(kc get pod dra-cap-c -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}')" = Unschedulable ]; }
wait_until 30 cap_unschedulable
check "consumable capacity: a third claim of 16Gi does not fit gpu-$free's rest: Unschedulable ($(kc get pod dra-cap-c -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}'))" \
  cap_unschedulable

# --- a MIG device by profile (a100-mig) ------------------------------------------------------------------
delete_pods dra-2 dra-big dra-sa dra-sb dra-frac dra-cuda dra-cap-a dra-cap-b dra-cap-c
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
