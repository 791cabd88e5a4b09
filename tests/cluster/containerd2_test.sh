#!/bin/bash
# The same pods on containerd 2.x (testing/k8s/build's v2.2.9, CDI on in its CRI): a cluster of its
# own (GPULET_CLUSTER_RUNTIME=containerd2, after cluster.down) where gpulet's device plugin answers
# with CDI device names (deviceListStrategy envvar,cdi-cri, no device specs) and containerd resolves
# them through the spec `gpulet cdi generate --driver-root` wrote for the fake driver root. The
# Node reports containerd 2.2.9; gpu_pods_test.sh's checks pass there (the 2-GPU pod sees exactly
# its 2 device nodes, now made by CDI, and the matching NVIDIA_VISIBLE_DEVICES); down leaves nothing.
# Usage: containerd2_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
STATE=$build/cluster-test-containerd2
. "$(dirname "$0")/leftovers.sh"
if [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
  [ "$(cat "$D/runtime" 2>/dev/null)" = containerd2 ] ||
    { echo "skipped: a containerd 1.6 cluster is running in $D (make cluster-down first)"; exit 77; }
  echo "using the running containerd2 cluster in $D"
  started=
else
  rm -rf "$STATE"; mkdir -p "$STATE"
  links > "$STATE/links.before"
  kube_rules > "$STATE/kube-rules.before"
  GPULET_CLUSTER_RUNTIME=containerd2 "$cluster" up "$build" >/dev/null || { echo "FAIL: cluster up (containerd2)"; exit 1; }
  started=1
  read -r t0 t1 < "$D/startup-times"
  echo "figure: cluster up (containerd 2) -> nvidia.com/gpu allocatable: $(elapsed "$t0" "$t1") s"
fi
v=$(kc get node "$NODE" -o 'jsonpath={.status.nodeInfo.containerRuntimeVersion}')
check "the Node's runtime is containerd 2.2.9 ($v)" [ "$v" = containerd://2.2.9 ]
check "the plugin answers with CDI names only: no device specs (deviceListStrategy envvar,cdi-cri)" \
  bash -c 'tr "\0" " " < "/proc/$1/cmdline" | grep -q -- "--device-list-strategy envvar,cdi-cri"' _ "$(cat "$D/pids/gpulet-device-plugin")"
bash "$(dirname "$0")/gpu_pods_test.sh" "$src" "$build" | sed 's/^/  gpu_pods: /'
check "gpu_pods_test.sh's checks pass on containerd 2 with CDI" [ "${PIPESTATUS[0]}" = 0 ]
if [ -n "$started" ]; then
  holder=$(cat "$D/pids/holder")
  "$cluster" down "$build" >/dev/null || check "cluster down" false
  no_leftovers "down (containerd2)" "$holder"
  rm -rf "$STATE"
fi
finish
