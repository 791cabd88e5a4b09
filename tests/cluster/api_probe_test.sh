#!/bin/bash
# The fake API server's reference, checked on the real one: tests/k8s/api_probe.py runs its
# scenarios (create, get, list with label and field selectors, merge/strategic/JSON patches and
# their conflicts and content types, what the main resource and /status may change, binding, watch
# starts and selector transitions, graceful and immediate deletes, events, resource.k8s.io claims)
# against kube-apiserver as the cluster admin and compares the transcript with
# tests/k8s/api_probe.expected, which the fake must also answer (ctest k8s_api_probe_fake). A
# difference here means kube-apiserver changed: the expected file and the fake follow it.
# Usage: api_probe_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
default_sa
out=$(python3 "$src/tests/k8s/api_probe.py" --url "https://127.0.0.1:${GPULET_CLUSTER_API_PORT:-6443}" \
  --ca "$D/pki/ca.crt" --cert "$D/pki/admin.crt" --key "$D/pki/admin.key" \
  --expect "$src/tests/k8s/api_probe.expected" 2>&1)
rc=$?
printf '%s\n' "$out" | sed 's/^/  /'
check "kube-apiserver answers as tests/k8s/api_probe.expected says (the fake's reference)" [ "$rc" = 0 ]
finish
