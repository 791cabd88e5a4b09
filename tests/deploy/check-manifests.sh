#!/usr/bin/env bash
# Renders every kustomize entry point under deploy/ with `kubectl kustomize` and validates each object
# against the Kubernetes API schemas (validate-objects.mjs). Exit 77 = skipped (tool missing).
set -uo pipefail
src=$1 work=$2
command -v kubectl >/dev/null || { echo "SKIP: kubectl not installed"; exit 77; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "SKIP: node/npm not installed"; exit 77; }
mkdir -p "$work"
if [[ ! -d $work/node_modules/kubernetes-models || ! -d $work/node_modules/@kubernetes-models/cert-manager ]]; then
  (cd "$work" && npm install --no-audit --no-fund --silent kubernetes-models@5 \
     @kubernetes-models/prometheus-operator@6 @kubernetes-models/cert-manager@4 yaml@2 >/dev/null 2>&1) ||
    { echo "SKIP: npm could not install kubernetes-models"; exit 77; }
fi
cp "$src/tests/deploy/validate-objects.mjs" "$src/tests/deploy/check-policy.mjs" "$work/"
rc=0
# render NAME CMD...: CMD prints manifests; each object is validated (one line per entry point).
render() {
  local name=$1 out res; shift
  if ! out=$("$@" 2>&1); then
    echo "FAIL $name: $out"; rc=1; return
  fi
  if res=$(node "$work/validate-objects.mjs" <<<"$out" 2>&1); then
    echo "ok   $name: $res"
  else
    echo "FAIL $name:"; echo "$res"; rc=1
  fi
}
for k in "$src/deploy" "$src"/deploy/overlays/*/; do
  render "${k#"$src/"}" kubectl kustomize "$k"
done
# The helm chart's renderings too (helm from testing/helm/get, when the helm tests fetched it): the
# overlays' equivalents, plus the chart-only choices, hooks and the test pod included.
helm=$(dirname "$work")/helm/v4/helm
if [[ -x $helm ]]; then
  sets=("-f $src/tests/helm/equivalents/deploy.yaml"
        "-f $src/tests/helm/equivalents/monitoring.yaml --set certificates.source=cert-manager"
        "--set config.map.default=v1 --set config.map.t4=v1 --set config.default=default --set gfd.enabled=false"
        "--set vgpu.enabled=false --set exporter.enabled=false --set nodeSelector.gpu=true --set imagePullSecrets={regcred}")
  for s in "${sets[@]}"; do
    # shellcheck disable=SC2086
    render "helm template $s" "$helm" template gpulet "$src/deploy/helm/gpulet" -n gpulet-system $s
  done
else
  echo "note: $helm missing (testing/helm/get), the chart's renderings not validated here"
fi
# The security properties (docs/security.md) of the default install and of the DRA one (whose
# agent also writes ResourceSlices).
policy() {  # policy NAME CMD...: CMD prints manifests that must have the properties
  local name=$1 res; shift
  if res=$("$@" | node "$work/check-policy.mjs" 2>&1); then
    echo "ok   $name security properties: $res"
  else
    echo "FAIL $name security properties:"; echo "$res"; rc=1
  fi
}
policy deploy kubectl kustomize "$src/deploy"
policy deploy/overlays/dra kubectl kustomize "$src/deploy/overlays/dra"
if [[ -x $helm ]]; then
  policy "helm chart" "$helm" template gpulet "$src/deploy/helm/gpulet" -n gpulet-system
  policy "helm chart (dra.enabled)" "$helm" template gpulet "$src/deploy/helm/gpulet" -n gpulet-system --set dra.enabled=true
fi
exit $rc
