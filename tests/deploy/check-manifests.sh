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
for k in "$src/deploy" "$src"/deploy/overlays/*/; do
  name=${k#"$src/"}
  if ! out=$(kubectl kustomize "$k" 2>&1); then
    echo "FAIL $name: kubectl kustomize: $out"; rc=1; continue
  fi
  if res=$(node "$work/validate-objects.mjs" <<<"$out" 2>&1); then
    echo "ok   $name: $res"
  else
    echo "FAIL $name:"; echo "$res"; rc=1
  fi
done
# The default install's security properties (docs/security.md).
if res=$(kubectl kustomize "$src/deploy" | node "$work/check-policy.mjs" 2>&1); then
  echo "ok   deploy security properties: $res"
else
  echo "FAIL deploy security properties:"; echo "$res"; rc=1
fi
exit $rc
