#!/bin/bash
# The same pods on another container runtime, a cluster of its own (after cluster.down):
# - containerd2: containerd v2.2.9 (testing/k8s/build; CDI on in its CRI). gpulet's device plugin
#   answers with CDI device names (deviceListStrategy envvar,cdi-cri, no device specs) and containerd
#   resolves them through the spec `gpulet cdi generate --driver-root` wrote for the fake driver
#   root. The Node reports containerd 2.2.9.
# - containerd-shim: Debian's containerd 1.6 with gpulet-container-runtime as its default runtime,
#   configured by `gpulet runtime configure --runtime containerd` on the cluster's config file. The
#   plugin passes only NVIDIA_VISIBLE_DEVICES (envvar, no device specs); the shim adds the nodes.
# - containerd-shim-cdi: the same engine and shim, the plugin's cdi-annotations strategy: CRI
#   container annotations cdi.k8s.io/*, which containerd 1.6 (no CDI in its CRI) copies into the OCI
#   spec only because the drop-in lists them in container_annotations; the shim is told to trust
#   nothing else (no NVIDIA_VISIBLE_DEVICES from unprivileged containers), so the 2 device nodes are
#   the annotations' doing.
# In both, gpu_pods_test.sh's checks pass (the 2-GPU pod sees exactly its 2 device nodes, which only
# the runtime's CDI handling can have made) and down leaves nothing.
# Usage: runtime_variant_test.sh SOURCE_DIR BUILD_DIR RUNTIME   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
RUNTIME=$3
STATE=$build/cluster-test-$RUNTIME
. "$(dirname "$0")/leftovers.sh"
if [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
  [ "$(cat "$D/runtime" 2>/dev/null)" = "$RUNTIME" ] ||
    { echo "skipped: a cluster on $(cat "$D/runtime" 2>/dev/null) is running in $D (make cluster-down first)"; exit 77; }
  echo "using the running $RUNTIME cluster in $D"
  started=
else
  why=$("$cluster" preflight "$build" 2>&1) || { echo "skipped: $why"; exit 77; }
  rm -rf "$STATE"; mkdir -p "$STATE"
  links > "$STATE/links.before"
  kube_rules > "$STATE/kube-rules.before"
  GPULET_CLUSTER_RUNTIME=$RUNTIME "$cluster" up "$build" >/dev/null || { echo "FAIL: cluster up ($RUNTIME)"; exit 1; }
  started=1
  read -r t0 t1 < "$D/startup-times"
  echo "figure: cluster up ($RUNTIME) -> nvidia.com/gpu allocatable: $(elapsed "$t0" "$t1") s"
fi
cmdline() { tr '\0' ' ' < "/proc/$(cat "$D/pids/$1")/cmdline"; }
if [ "$RUNTIME" = containerd2 ]; then
  v=$(kc get node "$NODE" -o 'jsonpath={.status.nodeInfo.containerRuntimeVersion}')
  check "the Node's runtime is containerd 2.2.9 ($v)" [ "$v" = containerd://2.2.9 ]
  check "the plugin answers with CDI names and no device specs (envvar,cdi-cri)" \
    bash -c '[[ "$1" == *"--device-list-strategy envvar,cdi-cri"* && "$1" != *pass-device-specs* ]]' _ "$(cmdline gpulet-device-plugin)"
elif [ "$RUNTIME" = containerd-shim-cdi ]; then
  check "gpulet runtime configure made the shim containerd's default runtime" \
    grep -q "default_runtime_name = 'nvidia'" "$D/fixed/etc/containerd/conf.d/99-gpulet.toml"
  check "gpulet runtime configure passes cdi.k8s.io/* container annotations to the shim" \
    grep -qF "container_annotations = [ 'cdi.k8s.io/*' ]" "$D/fixed/etc/containerd/conf.d/99-gpulet.toml"
  check "the plugin passes CDI annotations only (cdi-annotations, no device specs)" \
    bash -c '[[ "$1" == *"--device-list-strategy cdi-annotations"* && "$1" != *pass-device-specs* ]]' _ "$(cmdline gpulet-device-plugin)"
  check "the shim does not take NVIDIA_VISIBLE_DEVICES from unprivileged containers" \
    grep -q '"accept-nvidia-visible-devices-envvar-when-unprivileged": false' "$D/gpulet-runtime.json"
else
  check "gpulet runtime configure made the shim containerd's default runtime" \
    grep -q "default_runtime_name = 'nvidia'" "$D/fixed/etc/containerd/conf.d/99-gpulet.toml"
  check "the plugin passes NVIDIA_VISIBLE_DEVICES only (envvar, no device specs)" \
    bash -c '[[ "$1" == *"--device-list-strategy envvar"* && "$1" != *pass-device-specs* ]]' _ "$(cmdline gpulet-device-plugin)"
fi
bash "$(dirname "$0")/gpu_pods_test.sh" "$src" "$build" | sed 's/^/  gpu_pods: /'
check "gpu_pods_test.sh's checks pass on $RUNTIME" [ "${PIPESTATUS[0]}" = 0 ]
if [ -n "$started" ]; then
  holder=$(cat "$D/pids/holder")
  "$cluster" down "$build" >/dev/null || check "cluster down" false
  no_leftovers "down ($RUNTIME)" "$holder"
  rm -rf "$STATE"
fi
finish
