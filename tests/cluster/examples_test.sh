#!/bin/bash
# On the real one-node cluster: the pods of examples/ as printed (`kubectl apply -f examples/`, the
# same files the README and `make demo` use), on the cluster's pod network (the CNI bridge plugin,
# host-local addresses; the images are the cluster's stand-ins, testing/k8s/stand-in). As the
# README says of the demo: cuda-vectoradd runs to completion ("Test PASSED") and frees its GPU; the
# training (2 GPUs), the LLM server (4) and the embeddings server (1) run, each container seeing as
# many GPUs as it asked for; the notebook waits Pending ("Insufficient nvidia.com/gpu") until
# cuda-vectoradd completes, then runs; the vGPU example waits Pending (this node offers no
# fractional GPUs unless gpulet's agent is installed with a vGPU pool: cluster.install_uninstall).
# Each pod has an address of the pod subnet (not the host's network), the node reaches it and it
# reaches the node through the bridge; once the pods are deleted their veths and addresses are
# released (CNI DEL). Fails on a cluster without a pod network: the sandboxes never start.
# Usage: examples_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
ex=$src/examples
pods="cuda-vectoradd pytorch-ddp-train llm-serving embeddings notebook vgpu-inference"
trap 'delete_pods $pods' EXIT
default_sa
clean_pods $pods
left=$(kc get pods -o name 2>/dev/null | grep -E "/(${pods// /|})\$")
check "no pod of examples/ left from before ($left)" [ -z "$left" ]

# The pod network the cluster writes for containerd's CRI (testing/k8s/cluster pod_network_up).
conflist=$D/cni/10-gpulet-pods.conflist
read -r bridge subnet gateway < <(python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))["plugins"][0]; r = p["ipam"]["ranges"][0][0]
print(p["type"] == "bridge" and p["bridge"], r["subnet"], r["gateway"])' "$conflist" 2>/dev/null)
check "the cluster's CNI network is the bridge plugin on $bridge, subnet $subnet, gateway $gateway" \
  bash -c '[ -n "$3" ] && [ "$1" != False ]' _ "$bridge" "$subnet" "$gateway"
check "the bridge $bridge is up on the host with $gateway" bash -c 'ip -o -4 addr show dev "$1" | grep -q " $2/"' _ "$bridge" "$gateway"
# on_pod_network IP HOSTNETWORK: a pod not on the host's network, at an address of $subnet other
# than the gateway's.
on_pod_network() {
  [ -z "$2" ] && python3 -c 'import ipaddress, sys
a = ipaddress.ip_address(sys.argv[1]); n = ipaddress.ip_network(sys.argv[2])
sys.exit(0 if a in n and str(a) != sys.argv[3] else 1)' "$1" "$subnet" "$gateway" 2>/dev/null
}

# The stand-in images: every image the examples name is in the cluster's containerd, under the
# full name the CRI looks up (a name without a registry is docker.io's, library/ for one element).
have=$(ctr_k8s images ls -q 2>/dev/null)
for img in $(sed -n 's/^ *image: *//p' "$ex"/*.yaml | sort -u); do
  full=docker.io/library/$img
  if [[ "$img" == */* ]]; then
    case ${img%%/*} in *.*|*:*|localhost) full=$img ;; *) full=docker.io/$img ;; esac
  fi
  check "the cluster's containerd has $full (a stand-in)" grep -qxF "$full" <<< "$have"
done

# The examples fill the 8 GPUs as the README says only when no other pod holds one (the scenario
# before may have left a pod terminating).
gpus_in_use() {
  kc get pods -A -o json | python3 -c 'import json, sys
print(sum(int(c["resources"].get("limits", {}).get("nvidia.com/gpu", 0)) for p in json.load(sys.stdin)["items"]
          if p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed")
          for c in p["spec"]["containers"]))'
}
gpus_free() { [ "$(gpus_in_use)" = 0 ]; }
wait_until 90 gpus_free
check "no other pod holds a GPU ($(gpus_in_use) in use)" gpus_free

# --- kubectl apply -f examples/ --------------------------------------------------------------------
t0=$(now)
out=$(kc apply -f "$ex/" 2>&1); rc=$?
check "kubectl apply -f examples/ (rc $rc): $(tr '\n' ';' <<< "$out")" [ "$rc" = 0 ]
sched_msg() { kc get pod "$1" -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}' 2>/dev/null; }
waits_for() { [[ "$(sched_msg "$1")" == *"Insufficient $2"* ]]; }  # waits_for POD RESOURCE
wait_until 30 waits_for notebook nvidia.com/gpu
vectoradd_then=$(phase cuda-vectoradd)
check "notebook waits Pending while cuda-vectoradd holds a GPU ($(sched_msg notebook); cuda-vectoradd: $vectoradd_then)" \
  bash -c '[[ "$1" == *"Insufficient nvidia.com/gpu"* ]] && [ "$2" != Succeeded ]' _ "$(sched_msg notebook)" "$vectoradd_then"
succeeded() { [ "$(phase "$1")" = Succeeded ]; }
wait_until 60 succeeded cuda-vectoradd
t1=$(now)
check "cuda-vectoradd Succeeded (phase: $(phase cuda-vectoradd))" succeeded cuda-vectoradd
succeeded cuda-vectoradd && echo "figure: kubectl apply -f examples/ -> cuda-vectoradd Succeeded: $(elapsed "$t0" "$t1") s"
# The README's and docs/cluster.md's command for it.
check "kubectl wait pod/cuda-vectoradd --for=jsonpath='{.status.phase}'=Succeeded, as printed" \
  kc wait pod/cuda-vectoradd --for=jsonpath='{.status.phase}'=Succeeded --timeout=10s
logs=$(kc logs cuda-vectoradd 2>&1)
check "kubectl logs cuda-vectoradd: 1 GPU, \"Test PASSED\" ($(tr '\n' ';' <<< "$logs"))" \
  bash -c '[[ "$1" == *"GPUs: 1 "* && "$1" == *"Test PASSED"* ]]' _ "$logs"
wait_until 120 running notebook
check "notebook Running once cuda-vectoradd freed its GPU (phase: $(phase notebook); $(elapsed "$t1" "$(now)") s after)" running notebook
running notebook || kc describe pod notebook | tail -n 15

# name GPUS: the long-running example pods and the GPUs each asked for.
for p in "pytorch-ddp-train 2" "llm-serving 4" "embeddings 1" "notebook 1"; do
  read -r name gpus <<< "$p"
  wait_until 60 running "$name"
  check "$name Running (phase: $(phase "$name"))" running "$name"
  running "$name" || { kc describe pod "$name" | tail -n 15; continue; }
  logs=$(kc logs "$name" 2>&1)
  check "$name: its container sees $gpus GPU(s) and serves ($(tr '\n' ';' <<< "$logs" | head -c 300))" \
    bash -c '[[ "$1" == *"GPUs: $2 "* && "$1" == *"running until the pod is deleted"* ]]' _ "$logs" "$gpus"
done
check "Node $NODE: all 8 GPUs allocated to the examples' running pods" bash -c '[ "$1" = 8 ]' _ \
  "$(kc get pods -o json | python3 -c 'import json, sys
print(sum(int(c["resources"].get("limits", {}).get("nvidia.com/gpu", 0)) for p in json.load(sys.stdin)["items"]
          if p["status"].get("phase") == "Running" for c in p["spec"]["containers"]))')"
wait_until 30 waits_for vgpu-inference tencent.com/vcuda
check "vgpu-inference waits Pending: no fractional GPUs on this node ($(sched_msg vgpu-inference))" \
  bash -c '[ "$1" = Pending ] && [[ "$2" == *"Insufficient tencent.com/vcuda"* ]]' _ "$(phase vgpu-inference)" "$(sched_msg vgpu-inference)"

# --- the pod network -------------------------------------------------------------------------------
ips=
for name in cuda-vectoradd pytorch-ddp-train llm-serving embeddings notebook; do
  ip=$(kc get pod "$name" -o 'jsonpath={.status.podIP}')
  hn=$(kc get pod "$name" -o 'jsonpath={.spec.hostNetwork}')
  check "$name: on the pod network, address $ip in $subnet (hostNetwork: ${hn:-false})" \
    on_pod_network "$ip" "$hn"
  [ "$name" = cuda-vectoradd ] || ips="$ips $ip"
done
check "the running pods' addresses are distinct ($ips)" bash -c '[ "$(tr " " "\n" <<< "$1" | grep . | sort -u | wc -l)" = 4 ]' _ "$ips"
veths=$(ip -o link show master "$bridge" 2>/dev/null | grep -c veth)
check "4 pod veths on $bridge (the running pods; cuda-vectoradd's sandbox is gone: $veths)" [ "$veths" = 4 ]
ip=$(kc get pod embeddings -o 'jsonpath={.status.podIP}')
check "the node reaches embeddings at $ip through $bridge" bash -c 'busybox ping -c 1 -W 2 "$1" >/dev/null' _ "$ip"
out=$(kc exec embeddings -- sh -c "ip -4 -o addr show eth0; ip route; ping -c 1 -W 2 $gateway" 2>&1)
check "embeddings: eth0 has $ip, the default route is $gateway, which answers ($(tr '\n' ';' <<< "$out"))" \
  bash -c '[[ "$1" == *"inet $2/"* && "$1" == *"default via $3"* && "$1" == *"1 packets received"* ]]' _ "$out" "$ip" "$gateway"

# --- deleted: CNI DEL releases the veths and the addresses -----------------------------------------
kc delete -f "$ex/" --grace-period=0 --force --wait=true --timeout=60s >/dev/null 2>&1
no_veths() { [ -z "$(ip -o link show master "$bridge" 2>/dev/null)" ]; }
wait_until 30 no_veths
check "pods deleted: no veth left on $bridge" no_veths
# The bridge plugin deletes the veth first, then asks host-local to release the address.
held() { (cd "$D/cni-state" 2>/dev/null && for a in $ips; do ls -- */"$a" 2>/dev/null; done); }
released() { [ -z "$(held)" ]; }
wait_until 30 released
check "pods deleted: host-local released their addresses ($(held))" released
finish
