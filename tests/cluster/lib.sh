# Shared by the tests on the real one-node cluster (tests/cluster/*_test.sh); sourced, not run.
# Each test script takes SOURCE_DIR BUILD_DIR and skips (77) unless GPULET_E2E_CLUSTER=1. ctest runs
# them in one fixture: cluster.up starts the cluster (unless `make cluster` left one running), the
# scenarios share it, cluster.down stops it (only when cluster.up started it) and checks leftovers.
set -uo pipefail
src=$1 build=$2
[ "${GPULET_E2E_CLUSTER:-}" = 1 ] || { echo "skipped: set GPULET_E2E_CLUSTER=1 (make e2e-cluster) to run on a real cluster"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "skipped: needs root (kubelet, containerd)"; exit 77; }
cluster=$src/testing/k8s/cluster
D=$build/cluster
K=$build/k8s/bin
# The gpulet the cluster runs (as testing/k8s/cluster picks it).
GPULET=${GPULET:-$build/bin/gpulet}
# Written by cluster.up when it started the cluster (cluster.down then stops it): outside $D, which
# `cluster down` removes.
STATE=$build/cluster-test
NODE=gpulet-node
kc() { "$K/kubectl" --kubeconfig "$D/admin.kubeconfig" "$@"; }
failures=0
check() {  # check DESCRIPTION CMD...
  if "${@:2}"; then echo "ok:   $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}
now() { date +%s.%N; }
elapsed() { awk "BEGIN{printf \"%.2f\", $2 - $1}"; }
finish() {
  [ "$failures" = 0 ] && echo "all checks passed" || echo "$failures check(s) failed"
  [ "$failures" = 0 ]
  exit
}
# The scenarios need the cluster cluster.up left (or `make cluster`): without it, one clear failure.
need_cluster() {
  [ ! -f "$STATE/cannot-run" ] || { echo "skipped: $(cat "$STATE/cannot-run")"; exit 77; }
  [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1 \
    || { echo "FAIL: no cluster running in $D (cluster.up failed, or run make cluster)"; exit 1; }
}
# allocatable RESOURCE: the Node's allocatable count of RESOURCE ("" when absent).
allocatable() { kc get node "$NODE" -o "jsonpath={.status.allocatable.${1//./\\.}}"; }
capacity() { kc get node "$NODE" -o "jsonpath={.status.capacity.${1//./\\.}}"; }
# wait_until SECONDS CMD...: polls CMD every 0.1 s; returns its last status.
wait_until() {
  local end; end=$(awk "BEGIN{printf \"%.3f\", $(now) + $1}"); shift
  until "$@"; do
    awk "BEGIN{exit !($(now) > $end)}" && return 1
    sleep 0.1
  done
}
# restart_plugin PROFILE [ARGS...]: the device plugin again, on PROFILE with ARGS (cluster plugin).
restart_plugin() { "$cluster" plugin "$build" "$@" >/dev/null; }

# pod NAME RESOURCE COUNT: a hostNetwork busybox pod asking for COUNT of RESOURCE.
pod() { pod_limits "$1" "$2: $3"; }

# pod_limits NAME LIMITS: the same pod with the limits map's entries given as text ("a: 1, b: 2").
pod_limits() {
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
      limits: {$2}
YAML
}
phase() { kc get pod "$1" -o 'jsonpath={.status.phase}' 2>/dev/null; }
running() { [ "$(phase "$1")" = Running ]; }
# driver_container_root LOG: a stand-in NVIDIA driver container's root at /run/nvidia/driver in the
# cluster's namespace ($D/fixed/run/nvidia/driver, tests/compat/make-driver-root), for the fake
# dgx-h100's driver version, as GPU Operator hosts have one (the host here has no NVIDIA driver of
# its own, so install uses it). Sets $driver_version. driver_in_pod POD: the pod's container has the
# driver's libcuda mounted and listed in its ld cache (the hook's ldconfig).
driver_container_root() {
  driver_version=$("$build/bin/gpulet" info --simulate dgx-h100 --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["driverVersion"])')
  "$src/tests/compat/make-driver-root" "$D/fixed/run/nvidia/driver" "$driver_version" 8 > "$1" 2>&1 \
    || { echo "FAIL: make-driver-root"; tail -n 5 "$1"; return 1; }
}
# driver_nvml_is_the_fake: that driver's libnvidia-ml becomes the fake NVML (for
# tests/cluster/deploy/host-nvml, where nothing passes --simulate and install and the agent must
# find and load the host's NVML as on a real node).
driver_nvml_is_the_fake() {
  cp "$build/lib/fake/libnvidia-ml.so.1" \
    "$D/fixed/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.$driver_version" &&
    ldconfig -r "$D/fixed/run/nvidia/driver"
}
driver_in_pod() {
  kc exec "$1" -- sh -c "test -s /usr/lib/x86_64-linux-gnu/libcuda.so.$driver_version && grep -q libcuda.so.1 /etc/ld.so.cache"
}
# Pods need the namespace's default ServiceAccount (made by the controller-manager).
default_sa() { wait_until 30 kc get serviceaccount default >/dev/null 2>&1; }
delete_pods() { kc delete pod "$@" --ignore-not-found --grace-period=0 --wait=false >/dev/null 2>&1; }
# Before a scenario re-creates a pod of the same name: gone for good, not merely terminating.
clean_pods() { kc delete pod "$@" --ignore-not-found --grace-period=0 --timeout=60s >/dev/null 2>&1; }

# gpulet's image for pods on this cluster, as an admin builds it (`make image`'s steps:
# deploy/image/stage-rootfs.sh, podman build of Containerfile; `make image` itself would first
# build every target), plus the test layer Containerfile.sim (the fake NVML, the engine restart
# helper), saved as an OCI archive and imported into the cluster's containerd as $SIM_IMG.
# Imported once per cluster: a later scenario finds it there. Usage: gpulet_image WORKDIR
GPULET_IMG=gpulet.test/gpulet:cluster
SIM_IMG=gpulet.test/gpulet-sim:cluster
# on_node CMD...: CMD in the cluster's mount namespace, the node as the kubelet and containerd see
# it (the tmpfs mounts of vGPU grants are there, not on this host's $D/fixed).
on_node() { nsenter -t "$(cat "$D/pids/holder")" -m -- "$@"; }
ctr_k8s() { nsenter -t "$(cat "$D/pids/holder")" -m -- ctr --address "$D/containerd/containerd.sock" -n k8s.io "$@"; }
gpulet_image() {
  local work=$1 t0 sim lib
  if [[ "$(ctr_k8s images ls -q 2>/dev/null)" == *"$SIM_IMG"* ]]; then
    echo "note: $SIM_IMG already in the cluster's containerd"
    return 0
  fi
  t0=$(now)
  "$src/deploy/image/stage-rootfs.sh" "$build" "$work" > "$work/stage.log" 2>&1 \
    || { echo "FAIL: stage-rootfs.sh: $(tail -n 3 "$work/stage.log")"; return 1; }
  podman build -q -f "$src/Containerfile" -t "$GPULET_IMG" "$work" > "$work/podman.log" 2>&1 \
    || { echo "FAIL: podman build of Containerfile: $(tail -n 3 "$work/podman.log")"; return 1; }
  # The test layer: the fake NVML at <gpulet's dir>/../lib/fake and the libraries it loads that the
  # image lacks (copied at the paths ldd resolves, as stage-rootfs.sh does), the restart helper.
  sim=$work/sim/rootfs
  mkdir -p "$sim/usr/lib/fake" "$sim/usr/bin"
  cp "$build/lib/fake/libnvidia-ml.so.1" "$sim/usr/lib/fake/"
  ldd "$build/lib/fake/libnvidia-ml.so.1" | awk '/=> \//{print $3}' | while read -r lib; do
    [ -e "$work/rootfs$lib" ] || { mkdir -p "$sim$(dirname "$lib")"; cp -L "$lib" "$sim$lib"; }
  done
  install -m 0755 "$src/tests/cluster/deploy/restart-engine.sh" "$sim/usr/bin/gpulet-test-restart-engine"
  podman build -q -f "$src/tests/cluster/deploy/Containerfile.sim" --build-arg "BASE=$GPULET_IMG" -t "$SIM_IMG" \
    "$work/sim" >> "$work/podman.log" 2>&1 \
    || { echo "FAIL: podman build of Containerfile.sim: $(tail -n 3 "$work/podman.log")"; return 1; }
  podman save --format oci-archive -o "$work/gpulet.tar" "$SIM_IMG" >> "$work/podman.log" 2>&1 \
    || { echo "FAIL: podman save: $(tail -n 3 "$work/podman.log")"; return 1; }
  podman rmi -f "$SIM_IMG" "$GPULET_IMG" >/dev/null 2>&1
  check "image imported into the cluster's containerd" ctr_k8s images import "$work/gpulet.tar"
  check "containerd lists $SIM_IMG" bash -c '[[ "$1" == *"$2"* ]]' _ "$(ctr_k8s images ls -q)" "$SIM_IMG"
  echo "figure: make image steps + test layer + import: $(elapsed "$t0" "$(now)") s"
}
