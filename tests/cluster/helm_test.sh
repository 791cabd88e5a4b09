#!/bin/bash
# The helm chart (deploy/helm/gpulet) on the real one-node cluster, with helm 4 and helm 3
# (testing/helm/get):
#  - every values set of the matrix renders to manifests the real kube-apiserver accepts in a
#    server-side dry run (the Prometheus Operator and cert-manager kinds come from stand-in CRDs
#    that accept any spec: only their presence is checked for those);
#  - helm install, then helm upgrade with a changed value rolls the DaemonSet (its pod is replaced
#    by one with the new value), helm rollback rolls it back, helm test runs a pod that gets one
#    nvidia.com/gpu from the cluster's device plugin and sees its device node, helm uninstall
#    removes every object of the release.
# The agent and test pods run with hostNetwork=true: only host-network pods start on this cluster
# (its CNI config is loopback-only). The node agent's image is a stand-in (gpulet.test/gpulet-stub:1: busybox and a `gpulet` script
# whose install/uninstall print their arguments and whose other commands sleep), because the real
# init container would configure this machine's own container engine. So this test does not show
# the engine configuration restored by the uninstall hook (tests/cluster for the image path does),
# and the hook itself is off (its Job reaches the API through the service network, which this
# cluster lacks: no kube-proxy, endpoint reconciler off).
# Usage: helm_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
helm_dir=$("$src/testing/helm/get" "$build") || { echo "FAIL: testing/helm/get"; exit 1; }
chart=$src/deploy/helm/gpulet
NS=gpulet-system
W=$D/helm
mkdir -p "$W"
export KUBECONFIG=$D/admin.kubeconfig
STUB=gpulet.test/gpulet-stub:1
# Host directories the agent's hostPath volumes create (DirectoryOrCreate) that were not there
# before: removed at the end if still empty (the kubelet's own paths live in the mount namespace).
host_dirs=(/etc/crio /etc/docker /lib64 /var/lib/gpulet /etc/kubernetes/node-feature-discovery/features.d
           /var/run/cdi /etc/nvidia-device-plugin)
created=()  # "DIR TOP": DIR is missing, TOP its highest missing ancestor (or DIR itself)
for d in "${host_dirs[@]}"; do
  [ -e "$d" ] && continue
  top=$d
  while [ ! -e "$(dirname "$top")" ]; do top=$(dirname "$top"); done
  created+=("$d $top")
done

cleanup() {
  local h
  for h in v4 v3; do "$helm_dir/$h/helm" uninstall gpulet -n "$NS" --no-hooks >/dev/null 2>&1; done
  # Pods gone first: until then the kubelet recreates their DirectoryOrCreate host paths.
  kc delete namespace "$NS" --ignore-not-found --timeout=120s >/dev/null 2>&1
  kc delete crd servicemonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com \
    issuers.cert-manager.io certificates.cert-manager.io --ignore-not-found >/dev/null 2>&1
  kc label node "$NODE" nvidia.com/gpu.present- >/dev/null 2>&1
  local d
  # The kubelet may still be tearing the pods' volumes down: a second pass a few seconds later.
  local top pass
  for pass in 1 2; do
    [ $pass = 2 ] && sleep 5
    for d in "${created[@]}"; do
      read -r d top <<<"$d"
      while rmdir "$d" 2>/dev/null && [ "$d" != "$top" ]; do d=$(dirname "$d"); done
    done
  done
}
trap cleanup EXIT

# The stand-in image, imported into the cluster's containerd as the cluster's own images are.
stub=$W/stub
mkdir -p "$stub/bin" "$stub/dev" "$stub/proc" "$stub/sys" "$stub/etc" "$stub/tmp"
cp "$(command -v busybox)" "$stub/bin/busybox"
for a in sh sleep; do ln -sf busybox "$stub/bin/$a"; done
cat > "$stub/bin/gpulet" <<'EOF'
#!/bin/sh
case "$1" in
  install|uninstall) echo "gpulet-stub $*"; exit 0 ;;
  *) trap 'exit 0' TERM; busybox sleep 2147483647 & wait ;;  # PID 1: stop on SIGTERM
esac
EOF
chmod 0755 "$stub/bin/gpulet"
"$src/testing/k8s/mkimage" "$W/stub.tar" "$STUB" "$stub" /bin/gpulet
# The cluster's ctr (containerd 2's own when the cluster runs it), in the cluster's mount namespace.
ctrd_path=$PATH
[ "$(cat "$D/runtime" 2>/dev/null)" = containerd2 ] && ctrd_path=$build/k8s/containerd2/bin:$PATH
ctr() { nsenter -t "$(cat "$D/pids/holder")" -m -- env PATH="$ctrd_path" ctr --address "$D/containerd/containerd.sock" -n k8s.io "$@"; }
ctr images import --all-platforms "$W/stub.tar" >"$W/import.log" 2>&1
check "stand-in image $STUB imported" grep -q "$STUB" <(ctr images ls -q)

# Stand-in CRDs: the kinds exist, any spec is accepted.
crd() {  # crd GROUP KIND PLURAL
  cat <<YAML
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: $3.$1}
spec:
  group: $1
  names: {kind: $2, plural: $3, singular: $(tr 'A-Z' 'a-z' <<<"$2")}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
YAML
}
{ crd monitoring.coreos.com ServiceMonitor servicemonitors; crd monitoring.coreos.com PrometheusRule prometheusrules
  crd cert-manager.io Issuer issuers; crd cert-manager.io Certificate certificates; } | kc apply -f - >/dev/null
kc wait --for condition=established --timeout=60s crd/servicemonitors.monitoring.coreos.com \
  crd/prometheusrules.monitoring.coreos.com crd/issuers.cert-manager.io crd/certificates.cert-manager.io >/dev/null
kc create namespace "$NS" >/dev/null 2>&1
kc label namespace "$NS" pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null

# Server-side dry run of the values matrix (the overlays' equivalents and the chart-only choices).
matrix=()
for f in "$src"/tests/helm/equivalents/*.yaml; do matrix+=("-f $f"); done
matrix+=("--set config.map.default=v1 --set config.map.t4=v1 --set config.default=default"
         "--set gfd.enabled=false --set exporter.enabled=false --set vgpu.enabled=false"
         "--set vgpu.gpus=all --set exporter.serviceMonitor.enabled=true --set exporter.prometheusRule.enabled=true"
         "--set nodeSelector.gpu=true --set imagePullSecrets={regcred} --set image.pullPolicy=Always --set runtime=docker")
for h in v4 v3; do
  helm=$helm_dir/$h/helm
  for m in "${matrix[@]}"; do
    # shellcheck disable=SC2086
    out=$("$helm" template gpulet "$chart" -n "$NS" $m 2>&1 >"$W/rendered.yaml" &&
          kc apply --dry-run=server -f "$W/rendered.yaml" 2>&1)
    rc=$?
    check "helm $h: server-side dry run accepts: $m" [ $rc = 0 ]
    [ $rc = 0 ] || echo "$out" | grep -iv "unchanged\|created\|configured" | head -n 5
  done
done

# The DaemonSet's pod: the one on $NODE, with its install init container's runtime value.
agent_runtime() {
  kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node \
    -o 'jsonpath={range .items[?(@.metadata.deletionTimestamp)]}deleting {end}{range .items[*]}{.spec.initContainers[0].env[0].value}{" "}{end}' 2>/dev/null
}
rolled_to() {  # exactly one agent pod, not being deleted, whose init container got runtime $1 and ran
  [ "$(agent_runtime)" = "$1 " ] &&
    kc -n "$NS" logs ds/gpulet-node -c install 2>/dev/null | grep -q -- "--runtime=$1"
}
# After a failed wait: where the agent's pods stand.
diag() {
  kc -n "$NS" get pods -o wide 2>&1 | head -n 5
  kc -n "$NS" get events --sort-by=.lastTimestamp 2>&1 | tail -n 6
}
kc label node "$NODE" nvidia.com/gpu.present=true --overwrite >/dev/null
default_sa
for h in v4 v3; do
  helm=$helm_dir/$h/helm
  common=(--set image.registry=gpulet.test --set image.repository=gpulet-stub --set image.tag=1
          --set image.pullPolicy=Never --set uninstall.enabled=false --set hostNetwork=true
          --set test.image=gpulet.test/busybox:1
          --set-json 'test.command=["sh","-c","set -- /dev/nvidia[0-9]*; echo GPU device nodes: $*; [ $# = 1 ] && [ -c $1 ]"]')
  out=$("$helm" install gpulet "$chart" -n "$NS" "${common[@]}" 2>&1)
  rc=$?
  check "helm $h install" [ $rc = 0 ]
  [ $rc = 0 ] || { echo "$out" | tail -n 5; continue; }
  wait_until 90 rolled_to auto || diag
  check "helm $h: agent pod on $NODE ran its install step (runtime auto)" rolled_to auto
  rev1=$(kc -n "$NS" get ds gpulet-node -o jsonpath='{.metadata.generation}')
  out=$("$helm" upgrade gpulet "$chart" -n "$NS" "${common[@]}" --set runtime=containerd 2>&1)
  rc=$?
  check "helm $h upgrade --set runtime=containerd" [ $rc = 0 ]
  [ $rc = 0 ] || echo "$out" | tail -n 5
  wait_until 90 rolled_to containerd || diag
  check "helm $h upgrade: the DaemonSet rolled (generation $rev1 -> $(kc -n "$NS" get ds gpulet-node -o jsonpath='{.metadata.generation}')), its new pod has runtime containerd" \
    rolled_to containerd
  out=$("$helm" rollback gpulet 1 -n "$NS" 2>&1)
  rc=$?
  check "helm $h rollback to revision 1" [ $rc = 0 ]
  [ $rc = 0 ] || echo "$out" | tail -n 5
  wait_until 90 rolled_to auto || diag
  check "helm $h rollback: the DaemonSet rolled back, its pod has runtime auto again" rolled_to auto
  out=$("$helm" test gpulet -n "$NS" --logs 2>&1)
  rc=$?
  check "helm $h test: the test pod got one GPU and saw its device node" [ $rc = 0 ]
  echo "$out" | grep -E "GPU device nodes|Phase|Error" | head -n 4
  [ $rc = 0 ] || kc -n "$NS" describe pod gpulet-test-gpu 2>&1 | tail -n 8
  out=$("$helm" uninstall gpulet -n "$NS" --wait 2>&1)
  rc=$?
  check "helm $h uninstall" [ $rc = 0 ]
  [ $rc = 0 ] || echo "$out" | tail -n 5
  # The agent's pods go with their DaemonSet (garbage collection, after --wait returned); the
  # last `helm test` pod stays, as helm leaves test hooks (docs/install.md).
  agents_gone() { [ -z "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o name 2>/dev/null)" ]; }
  wait_until 60 agents_gone
  left=$( { kc get clusterrole,clusterrolebinding,validatingwebhookconfiguration,validatingadmissionpolicy,validatingadmissionpolicybinding -o name
            kc -n "$NS" get all,configmap,serviceaccount,role,rolebinding,networkpolicy -o name; } 2>/dev/null |
          grep -E 'gpulet' | grep -v -e 'configmap/kube-root-ca.crt' -e 'pod/gpulet-test-gpu')
  check "helm $h uninstall: nothing of the release is left (${left//$'\n'/ })" [ -z "$left" ]
  clean_pods -n "$NS" gpulet-test-gpu
done
finish
