#!/bin/bash
# The helm chart (deploy/helm/gpulet) on the real one-node cluster, with helm 4 and helm 3
# (testing/helm/get):
#  - every values set of the matrix renders to manifests the real kube-apiserver accepts in a
#    server-side dry run (the Prometheus Operator and cert-manager kinds come from stand-in CRDs
#    that accept any spec: only their presence is checked for those);
#  - with gpulet's real image (lib.sh's gpulet_image, as cluster.install_uninstall builds it):
#    helm install configures the cluster's containerd (gpulet's drop-in imported by config.toml);
#    helm upgrade with a changed value rolls the DaemonSet and does NOT restore the configuration
#    (the old pod's uninstall-on-delete container says so, containerd is not restarted, install's
#    record is untouched); helm rollback rolls it back the same way; helm test runs a pod that gets
#    one nvidia.com/gpu from the agent and sees its device node; helm uninstall (helm 4: --cascade
#    foreground --wait, helm 3: the default background deletion) restores config.toml byte for byte
#    through the uninstall-on-delete container, removes the drop-in and everything install placed,
#    leaves the agent's own state (/var/lib/gpulet/vgpu) as docs/install.md says, and removes every
#    object of the release.
# What only this cluster needs is given as chart values (as tests/cluster/deploy does for the
# kustomize tree): hostNetwork (only host-network pods start here), the API server at 127.0.0.1
# (no kube-proxy: env), the fake NVML (--simulate, its sim root), containerd restarted through
# gpulet-test-restart-engine (no systemd), the metrics port off 9400, GPUs as device specs.
# Usage: helm_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
helm_dir=$("$src/testing/helm/get" "$build") || { echo "FAIL: testing/helm/get"; exit 1; }
chart=$src/deploy/helm/gpulet
NS=gpulet-system
W=$D/helm
mkdir -p "$W"
export KUBECONFIG=$D/admin.kubeconfig
CONFIG=$D/fixed/etc/containerd/config.toml
DROPIN=$D/fixed/etc/containerd/conf.d/99-gpulet.toml
RECORD=$D/fixed/var/lib/gpulet/install.json
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
  kc label node "$NODE" nvidia.com/gpu.present- gpulet.io/gpu-stack- >/dev/null 2>&1
  kc taint node "$NODE" gpulet.io/gpu-stack-not-ready- >/dev/null 2>&1
  # A failed run may have left gpulet installed: undo it on the node as an admin would.
  [ ! -e "$RECORD" ] || "$GPULET" uninstall --host-root "$D/fixed" --restart=none >/dev/null 2>&1
  restart_plugin
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

command -v podman >/dev/null || { echo "skipped: podman missing (the image is built with podman build)"; exit 77; }
[ "$(cat "$D/runtime" 2>/dev/null)" = containerd ] || { echo "skipped: the helm test runs on containerd 1.6"; exit 77; }
gpulet_image "$W" || exit 1

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

# The agent's pods: exactly one, not being deleted, whose install init container got runtime $1,
# both containers ready.
rolled_to() {
  [ "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={range .items[*]}{.metadata.deletionTimestamp}|{.spec.initContainers[0].env[0].value}|{.status.containerStatuses[*].ready}{"\n"}{end}' 2>/dev/null)" = "|$1|true true" ]
}
agents_gone() { [ -z "$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o name 2>/dev/null)" ]; }
# After a failed wait: where the agent's pods stand.
diag() {
  kc -n "$NS" get pods -o wide 2>&1 | head -n 5
  kc -n "$NS" get events --sort-by=.lastTimestamp 2>&1 | tail -n 6
}
restarts() { grep -c 'containerd restarted' "$D/logs/engine-restarter.log" 2>/dev/null; }
# Streams the current agent pod's uninstall-on-delete log into $1 until that container ends.
follow_uninstall() {
  local pod
  pod=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}')
  kc -n "$NS" logs -f "$pod" -c uninstall-on-delete > "$1" 2>&1 &
  follow_pid=$!
}
follow_done() { wait_until 60 bash -c '! kill -0 "$1" 2>/dev/null' _ "$follow_pid"; }
gpus() { [ "$(allocatable nvidia.com/gpu)" = "$1" ]; }
ready() { [ "$(kc get node "$NODE" -o 'jsonpath={.metadata.labels.gpulet\.io/gpu-stack}')" = ready ]; }

"$cluster" plugin "$build" none >/dev/null
check "host-process plugin stopped: nvidia.com/gpu allocatable 0" wait_until 30 gpus 0
kc label node "$NODE" nvidia.com/gpu.present=true --overwrite >/dev/null
default_sa
for h in v4 v3; do
  helm=$helm_dir/$h/helm
  values=(--set image.registry=gpulet.test --set image.repository=gpulet-sim --set image.tag=cluster
          --set image.pullPolicy=Never --set hostNetwork=true --set exporter.port=19400
          --set vgpu.enabled=false --set compatWithCPUManager=true --set 'deviceListStrategy={envvar}'
          --set-json 'install.args=["--simulate=dgx-h100","--restart=/usr/bin/gpulet-test-restart-engine"]'
          --set-json 'uninstall.args=["--restart=/usr/bin/gpulet-test-restart-engine"]'
          --set-json 'agent.args=["--simulate=dgx-h100","--sim-root=/run/gpulet-test/sim"]'
          --set-json 'env=[{"name":"KUBERNETES_SERVICE_HOST","value":"127.0.0.1"},{"name":"KUBERNETES_SERVICE_PORT","value":"6443"}]'
          --set-json 'extraVolumes=[{"name":"gpulet-test","hostPath":{"path":"/run/gpulet-test","type":"Directory"}}]'
          --set-json 'extraVolumeMounts=[{"name":"gpulet-test","mountPath":"/run/gpulet-test"}]'
          --set test.image=gpulet.test/busybox:1
          --set-json 'test.command=["sh","-c","set -- /dev/nvidia[0-9]*; echo GPU device nodes: $*; [ $# = 1 ] && [ -c $1 ]"]')
  cp "$CONFIG" "$W/config.before"
  r0=$(restarts)
  t0=$(now)
  out=$("$helm" install gpulet "$chart" -n "$NS" "${values[@]}" 2>&1)
  rc=$?
  check "helm $h install" [ $rc = 0 ]
  [ $rc = 0 ] || { echo "$out" | tail -n 5; continue; }
  wait_until 120 rolled_to auto || diag
  check "helm $h install: the agent pod runs, agent and uninstall-on-delete ready" rolled_to auto
  wait_until 60 gpus 8
  check "helm $h install: the agent registered nvidia.com/gpu 8 ($(allocatable nvidia.com/gpu))" gpus 8
  gpus 8 && echo "figure: helm $h install -> nvidia.com/gpu allocatable: $(elapsed "$t0" "$(now)") s"
  check "helm $h install: config.toml imports gpulet's drop-in" grep -q '/etc/containerd/conf.d/99-gpulet.toml' "$CONFIG"
  check "helm $h install: the drop-in names gpulet's runtime" grep -q '/usr/local/gpulet/bin/gpulet-container-runtime' "$DROPIN"
  check "helm $h install: containerd restarted once ($r0 -> $(restarts))" [ "$(restarts)" = $((r0 + 1)) ]

  for step in upgrade rollback; do
    cp "$CONFIG" "$W/config.installed"; cp "$RECORD" "$W/record.installed"
    r1=$(restarts)
    gen=$(kc -n "$NS" get ds gpulet-node -o jsonpath='{.metadata.generation}')
    follow_uninstall "$W/$h-$step.log"
    if [ $step = upgrade ]; then
      want=containerd
      out=$("$helm" upgrade gpulet "$chart" -n "$NS" "${values[@]}" --set runtime=containerd 2>&1)
    else
      want=auto
      out=$("$helm" rollback gpulet 1 -n "$NS" 2>&1)
    fi
    rc=$?
    check "helm $h $step (runtime $want)" [ $rc = 0 ]
    [ $rc = 0 ] || echo "$out" | tail -n 5
    wait_until 120 rolled_to $want || diag
    check "helm $h $step: the DaemonSet rolled (generation $gen -> $(kc -n "$NS" get ds gpulet-node -o jsonpath='{.metadata.generation}')), its new pod has runtime $want" \
      rolled_to $want
    follow_done
    check "helm $h $step: the old pod's uninstall-on-delete kept the configuration ($(grep -m1 kept "$W/$h-$step.log"))" \
      grep -q "kept the engine configuration: DaemonSet $NS/gpulet-node stays" "$W/$h-$step.log"
    check "helm $h $step: config.toml unchanged, the drop-in in place" \
      bash -c 'cmp -s "$1" "$2" && [ -f "$3" ]' _ "$W/config.installed" "$CONFIG" "$DROPIN"
    check "helm $h $step: install's record untouched (not uninstalled and installed again)" cmp -s "$W/record.installed" "$RECORD"
    check "helm $h $step: containerd not restarted ($r1 -> $(restarts))" [ "$(restarts)" = "$r1" ]
  done

  wait_until 60 ready
  out=$("$helm" test gpulet -n "$NS" --logs 2>&1)
  rc=$?
  check "helm $h test: the test pod got one GPU and saw its device node" [ $rc = 0 ]
  echo "$out" | grep -E "GPU device nodes|Phase|Error" | head -n 4
  [ $rc = 0 ] || kc -n "$NS" describe pod gpulet-test-gpu 2>&1 | tail -n 8

  r2=$(restarts)
  follow_uninstall "$W/$h-uninstall.log"
  t0=$(now)
  if [ $h = v4 ]; then how=(--cascade foreground --wait --timeout 2m); else how=(--wait); fi
  out=$("$helm" uninstall gpulet -n "$NS" "${how[@]}" 2>&1)
  rc=$?
  check "helm $h uninstall ${how[*]}" [ $rc = 0 ]
  [ $rc = 0 ] || echo "$out" | tail -n 5
  [ $h = v4 ] && echo "figure: helm v4 uninstall --cascade foreground --wait (returns once the node is restored): $(elapsed "$t0" "$(now)") s"
  # helm 3's background deletion returns before the garbage collector has deleted the pods.
  wait_until 90 agents_gone
  check "helm $h uninstall: the agent pod is gone" agents_gone
  follow_done
  sed 's/^/    /' "$W/$h-uninstall.log" | grep -v '^\s*$' | head -n 12
  check "helm $h uninstall: uninstall-on-delete saw the DaemonSet deleted and uninstalled" \
    grep -qE "DaemonSet $NS/gpulet-node (was deleted|is being deleted|is gone): uninstalling" "$W/$h-uninstall.log"
  check "helm $h uninstall: containerd's config.toml is byte for byte as before the install" cmp "$W/config.before" "$CONFIG"
  check "helm $h uninstall: gpulet's drop-in removed" [ ! -e "$DROPIN" ]
  check "helm $h uninstall: containerd restarted once ($r2 -> $(restarts))" [ "$(restarts)" = $((r2 + 1)) ]
  # What install placed is gone; the agent's own state stays (docs/install.md, "Uninstall").
  left=$(find "$D/fixed/usr/local/gpulet" "$D/fixed/var/lib/gpulet" "$D/fixed/var/run/cdi" -mindepth 1 \
    -not -path "$D/fixed/var/lib/gpulet/vgpu*" 2>/dev/null)
  check "helm $h uninstall: nothing install placed is left in /usr/local/gpulet, /var/lib/gpulet, /var/run/cdi ($left)" [ -z "$left" ]
  echo "note: left by the agent (not by install): $(cd "$D/fixed" && find var/lib/gpulet/vgpu -type f 2>/dev/null | tr '\n' ' ')"
  left=$( { kc get clusterrole,clusterrolebinding,validatingwebhookconfiguration,validatingadmissionpolicy,validatingadmissionpolicybinding -o name
            kc -n "$NS" get all,configmap,serviceaccount,role,rolebinding,networkpolicy -o name; } 2>/dev/null |
          grep -E 'gpulet' | grep -v -e 'configmap/kube-root-ca.crt' -e 'pod/gpulet-test-gpu')
  check "helm $h uninstall: nothing of the release is left (${left//$'\n'/ })" [ -z "$left" ]
  clean_pods -n "$NS" gpulet-test-gpu
  wait_until 30 gpus 0
done
finish
