#!/bin/bash
# On the real one-node cluster (testing/k8s/cluster): the real kubelet's device manager takes the
# 8 fake H100s gpulet's device plugin registers; a pod asking for 2 runs with 2 GPU UUIDs in
# NVIDIA_VISIBLE_DEVICES; a pod asking for 9 stays Pending with the real scheduler's reason.
# Uses the cluster `make cluster` left running, else starts one and, at the end, stops it and
# checks that nothing is left behind (processes, mounts, network devices, iptables rules).
# A port that is in use stops `cluster up` with one message and nothing left behind; so does a
# component failing after the others started (the device plugin on an unknown GPU profile).
# Usage: gpu_pods_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
set -uo pipefail
src=$1 build=$2
[ "${GPULET_E2E_CLUSTER:-}" = 1 ] || { echo "skipped: set GPULET_E2E_CLUSTER=1 (make e2e-cluster) to run on a real cluster"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "skipped: needs root (kubelet, containerd)"; exit 77; }
cluster=$src/testing/k8s/cluster
D=$build/cluster
K=$build/k8s/bin
kc() { "$K/kubectl" --kubeconfig "$D/admin.kubeconfig" "$@"; }
failures=0
check() {  # check DESCRIPTION CMD...
  if "${@:2}"; then echo "ok:   $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}
now() { date +%s.%N; }
elapsed() { awk "BEGIN{printf \"%.2f\", $2 - $1}"; }

# no_leftovers WHAT HOLDER_PID: after a stop, nothing of the cluster is left on the host.
no_leftovers() {
  local what=$1 holder=$2 left p args
  left=$(for p in /proc/[0-9]*; do
    mapfile -d '' args < "$p/cmdline" 2>/dev/null || continue
    case "${args[*]}" in *"$D/"*|*"$K/"*) echo "${p#/proc/}" ;; esac
  done)
  [ -z "$holder" ] || check "$what: the mount namespace holder ($holder) is gone" bash -c '! kill -0 "$1" 2>/dev/null' _ "$holder"
  check "$what: no cluster process left ($left)" [ -z "$left" ]
  check "$what: no mount under $D or on /var/lib/kubelet left" \
    bash -c '! grep -qE " ($1/|/var/lib/kubelet|/var/log/pods)" /proc/self/mountinfo' _ "$D"
  check "$what: network devices as before" [ "$(links)" = "$links_before" ]
  check "$what: KUBE-* iptables rules as before" [ "$(kube_rules)" = "$kube_rules_before" ]
  check "$what: no kubepods cgroup left" bash -c '! ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | grep -q .'
  check "$what: $D removed" [ ! -e "$D" ]
}
links() { ip -o link | awk -F': ' '{print $2}' | sort; }
kube_rules() { (iptables-save; ip6tables-save) 2>/dev/null | grep -E 'KUBE-' | sort; }

# --- a port in use: one message, exit 1, nothing created -----------------------------------------
if [ ! -d "$D" ]; then
  python3 -c 'import socket,time,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(60)' > /tmp/gpulet-cluster-port.$$ &
  holder=$!
  for _ in $(seq 50); do [ -s /tmp/gpulet-cluster-port.$$ ] && break; sleep 0.1; done
  port=$(cat /tmp/gpulet-cluster-port.$$)
  out=$(GPULET_CLUSTER_API_PORT=$port "$cluster" up "$build" 2>&1); rc=$?
  kill "$holder"; wait "$holder" 2>/dev/null; rm -f /tmp/gpulet-cluster-port.$$
  check "port $port in use: cluster up exits 1" [ "$rc" = 1 ]
  check "port in use: one message naming the port ($out)" \
    bash -c '[ "$(printf "%s\n" "$1" | wc -l)" = 1 ] && [[ "$1" == *"port $2 "*"in use"* ]]' _ "$out" "$port"
  check "port in use: no cluster directory left" [ ! -e "$D" ]
fi

# --- the cluster ---------------------------------------------------------------------------------
started=
if [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
  echo "using the running cluster in $D"
else
  links_before=$(links)
  kube_rules_before=$(kube_rules)
  # A component that fails once the others run: one message naming it, and all of it stopped.
  out=$(GPULET_CLUSTER_PROFILE=no-such-machine "$cluster" up "$build" 2>&1); rc=$?
  check "failed start (bad GPU profile): cluster up exits 1" [ "$rc" = 1 ]
  check "failed start: the message names the device plugin ($(printf '%s' "$out" | grep -m1 exited))" \
    bash -c '[[ "$1" == *"gpulet-device-plugin exited while waiting for nvidia.com/gpu"* ]]' _ "$out"
  no_leftovers "failed start" ""
  "$cluster" up "$build" || { echo "FAIL: cluster up"; exit 1; }
  started=1
  read -r t0 t1 < "$D/startup-times"
  echo "figure: cluster up -> nvidia.com/gpu allocatable: $(elapsed "$t0" "$t1") s"
fi

node=$(kc get nodes -o 'jsonpath={.items[0].metadata.name}')
check "Node $node shows nvidia.com/gpu: 8 allocatable" \
  [ "$(kc get node "$node" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}')" = 8 ]
check "Node $node shows nvidia.com/gpu: 8 capacity" \
  [ "$(kc get node "$node" -o 'jsonpath={.status.capacity.nvidia\.com/gpu}')" = 8 ]

# Pods need the namespace's default ServiceAccount (made by the controller-manager).
for _ in $(seq 150); do kc get serviceaccount default >/dev/null 2>&1 && break; sleep 0.2; done

pod() {  # pod NAME GPUS
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  restartPolicy: Never
  containers:
  - name: main
    image: gpulet.test/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources:
      limits: {nvidia.com/gpu: $2}
YAML
}

kc delete pod gpu-2 gpu-9 --ignore-not-found --grace-period=0 >/dev/null 2>&1
t0=$(now)
pod gpu-2 2 | kc apply -f - >/dev/null
for _ in $(seq 600); do
  [ "$(kc get pod gpu-2 -o 'jsonpath={.status.phase}')" = Running ] && break
  sleep 0.1
done
t1=$(now)
phase=$(kc get pod gpu-2 -o 'jsonpath={.status.phase}')
check "pod asking for 2 GPUs is Running (phase: $phase)" [ "$phase" = Running ]
[ "$phase" = Running ] && echo "figure: kubectl apply -> pod Running (2 GPUs): $(elapsed "$t0" "$t1") s"
[ "$phase" = Running ] || kc describe pod gpu-2 | tail -n 15

visible=$(kc exec gpu-2 -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES' 2>&1)
check "kubectl exec: NVIDIA_VISIBLE_DEVICES holds 2 distinct GPU UUIDs ($visible)" bash -c '
  IFS=, read -ra ids <<< "$1"
  [ "${#ids[@]}" = 2 ] && [ "${ids[0]}" != "${ids[1]}" ] &&
  [[ "${ids[0]}" == GPU-* ]] && [[ "${ids[1]}" == GPU-* ]]' _ "$visible"
check "Node still shows nvidia.com/gpu: 8 allocatable with the pod running" \
  [ "$(kc get node "$node" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}')" = 8 ]

pod gpu-9 9 | kc apply -f - >/dev/null
reason= msg=
for _ in $(seq 300); do
  reason=$(kc get pod gpu-9 -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}')
  [ "$reason" = Unschedulable ] && break
  sleep 0.1
done
msg=$(kc get pod gpu-9 -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}')
check "pod asking for 9 GPUs: PodScheduled reason Unschedulable ($reason)" [ "$reason" = Unschedulable ]
check "pod asking for 9 GPUs: the scheduler says 'Insufficient nvidia.com/gpu' ($msg)" \
  bash -c '[[ "$1" == *"Insufficient nvidia.com/gpu"* ]]' _ "$msg"
sleep 2
check "pod asking for 9 GPUs is still Pending" [ "$(kc get pod gpu-9 -o 'jsonpath={.status.phase}')" = Pending ]

kc delete pod gpu-2 gpu-9 --grace-period=0 --wait=false >/dev/null 2>&1

# --- down leaves nothing behind --------------------------------------------------------------------
if [ -n "$started" ]; then
  holder=$(cat "$D/pids/holder")
  "$cluster" down "$build" || { echo "FAIL: cluster down"; failures=$((failures + 1)); }
  no_leftovers "down" "$holder"
fi

[ "$failures" = 0 ] && echo "all checks passed" || echo "$failures check(s) failed"
[ "$failures" = 0 ]
