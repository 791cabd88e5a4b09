# DRA helpers shared by dra_test.sh and dra_daemonset_test.sh (sourced after lib.sh).
# slice_devices: the names of gpu.gpulet.io devices in all ResourceSlices; slice_count N: there are N.
slice_devices() { kc get resourceslices -o json | python3 -c 'import json,sys
print(" ".join(sorted(d["name"] for s in json.load(sys.stdin)["items"] if s["spec"]["driver"] == "gpu.gpulet.io" for d in s["spec"].get("devices", []))))'; }
slice_count() { [ "$(slice_devices | wc -w)" = "$1" ]; }
# template NAME REQUEST_YAML...: a ResourceClaimTemplate; podc NAME [claim-source] : a pod using it.
template() {
  printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: %s, namespace: default}\nspec:\n  spec:\n    devices:\n%s\n' "$1" "$2"
}
podc() {  # podc NAME SOURCE (resourceClaimTemplateName: X | resourceClaimName: Y)
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  restartPolicy: Never
  resourceClaims: [{name: gpu, $2}]
  containers:
  - name: main
    image: gpulet.test/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
YAML
}
gpu_nodes() { kc exec "$1" -- sh -c 'ls /dev/ | grep "^nvidia[0-9][0-9]*$" | sort | tr "\n" " "' 2>&1; }
claim_of() { kc get pod "$1" -o 'jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}'; }
devices_of() { kc get resourceclaim "$1" -o 'jsonpath={.status.allocation.devices.results[*].device}'; }
# The fractional claim of the scenarios: one GPU, 4Gi and 30 % through the interposer.
frac_template() {
  template frac '      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.gpulet.io}
      config:
      - requests: [gpu]
        opaque:
          driver: gpu.gpulet.io
          parameters: {apiVersion: gpu.gpulet.io/v1alpha1, kind: VgpuConfig, memory: 4Gi, cores: 30}'
}
# frac_pod_checks POD SECONDS: POD (of frac_template's claim) Running within SECONDS, with the
# interposer's environment for 4Gi / 30 %, its library and the claim's accounting file mounted.
frac_pod_checks() {
  wait_until "$2" running "$1"
  check "fractional claim: pod Running" running "$1"; show "$1"
  local env; env=$(kc exec "$1" -- sh -c 'echo $GPULET_VGPU_MEMORY_LIMIT $GPULET_VGPU_CORE_LIMIT $LD_PRELOAD $GPULET_VGPU_UUID' 2>&1)
  check "fractional claim: interposer environment 4Gi / 30 % / LD_PRELOAD / its GPU's UUID ($env)" \
    bash -c '[[ "$1" == "4294967296 30 /usr/lib/gpulet/libgpulet-vcuda.so GPU-"* ]]' _ "$env"
  check "fractional claim: the accounting file and the interposer (not empty) are mounted" \
    kc exec "$1" -- sh -c 'test -f /var/run/gpulet/vgpu/accounting && test -s /usr/lib/gpulet/libgpulet-vcuda.so'
}
