# Sourced while gpulet is installed (agent with GPUs 4-7 as vGPU, gpulet-scheduler Deployment), by
# install_test.sh (containerd 1.6, device specs) and defaults_test.sh (containerd 2, the product's
# delivery): the vGPU path through the real control plane. Leaves vcuda pod vgpu-a Running and
# kube-scheduler on the shipped configuration; vgpu_restart_checks.sh goes on from there.
# - the real kube-apiserver calls gpulet's webhook over TLS (Service -> endpoints, CA published by
#   gpulet scheduler into the ValidatingWebhookConfiguration): `kubectl apply` of a bad pod fails
#   with our message;
# - the real kube-scheduler runs with the shipped KubeSchedulerConfiguration (ConfigMap
#   gpulet-kube-scheduler-config), only its addresses and file paths adapted to this cluster: the
#   extender is called over HTTPS with the scheduler's client certificate and binds the pods;
# - vcuda pods start with their limits, the interposer (env and library mount from the agent) and
#   exactly their granted GPU, delivered as the device plugin's settings deliver GPUs.

# The webhook's CA: gpulet scheduler issues its serving certificate and publishes the CA.
ca_published() {
  [ -n "$(kc get validatingwebhookconfiguration gpulet-vgpu -o 'jsonpath={.webhooks[0].clientConfig.caBundle}' 2>/dev/null)" ] \
    && kc -n "$NS" get secret gpulet-scheduler-tls >/dev/null 2>&1
}
wait_until 60 ca_published
check "gpulet scheduler published its CA in the webhook configuration and the TLS Secret" ca_published

vpod() { pod_limits "$1" "tencent.com/vcuda-core: $2, tencent.com/vcuda-memory: $3"; }  # vpod NAME CORES MEMORY_UNITS

# A share above one GPU that is not whole GPUs: refused by the webhook through the real API server.
out=$(vpod vgpu-bad 150 20 | kc apply -f - 2>&1); rc=$?
check "kubectl apply of vcuda-core 150 fails (rc $rc)" [ "$rc" != 0 ]
check "... with gpulet's message through the API server ($(head -c 300 <<< "$out"))" \
  bash -c '[[ "$1" == *"admission webhook \"vgpu.gpulet.io\" denied"*"not a multiple of 100"* ]]' _ "$out"
check "the refused pod does not exist" bash -c "! $K/kubectl --kubeconfig $D/admin.kubeconfig get pod vgpu-bad >/dev/null 2>&1"
# The pod's own env comes after the device plugin's: setting a limit would replace it.
out=$(vpod vgpu-env 30 20 | python3 -c '
import sys, yaml
p = yaml.safe_load(sys.stdin)
p["spec"]["containers"][0]["env"] = [{"name": "GPULET_VGPU_MEMORY_LIMIT", "value": "0"}]
print(yaml.safe_dump(p))' | kc apply -f - 2>&1); rc=$?
check "kubectl apply of a vcuda pod setting GPULET_VGPU_MEMORY_LIMIT in its env fails (rc $rc)" [ "$rc" != 0 ]
check "... with gpulet's message ($(head -c 200 <<< "$out"))" \
  bash -c '[[ "$1" == *"env GPULET_VGPU_MEMORY_LIMIT of container"*"would switch off the vGPU limits"* ]]' _ "$out"

# Leader election on the real API server: the replica holds the Lease and carries the label the
# extender's Service selects.
sched_pod=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-scheduler -o 'jsonpath={.items[0].metadata.name}')
leads() {
  [ "$(kc -n "$NS" get lease gpulet-scheduler -o 'jsonpath={.spec.holderIdentity}' 2>/dev/null)" = "$sched_pod" ] &&
    [ "$(kc -n "$NS" get pod "$sched_pod" -o 'jsonpath={.metadata.labels.gpulet\.io/extender-leader}')" = true ]
}
wait_until 30 leads
check "gpulet scheduler $sched_pod holds the Lease and carries gpulet.io/extender-leader=true" leads

# kube-scheduler with the shipped configuration: the extender at the gpulet scheduler pod's address
# (hostNetwork, 127.0.0.1; the extender Service's name is still the TLS server name), this
# cluster's scheduler client certificate (CN system:kube-scheduler, cluster CA), the CA from the
# Secret.
kc -n "$NS" get secret gpulet-scheduler-tls -o 'jsonpath={.data.ca\.crt}' | base64 -d > "$work/extender-ca.crt"
kc -n "$NS" get configmap gpulet-kube-scheduler-config -o 'jsonpath={.data.kube-scheduler-config\.yaml}' > "$work/shipped-scheduler-config.yaml"
python3 - "$work/shipped-scheduler-config.yaml" "$work/kube-scheduler.yaml" "$D" "$work/extender-ca.crt" <<'PY'
import sys, yaml
src, dst, d, ca = sys.argv[1:]
c = yaml.safe_load(open(src))
c["clientConnection"]["kubeconfig"] = d + "/scheduler.kubeconfig"
c["leaderElection"] = {"leaderElect": False}
(e,) = c["extenders"]
assert e["urlPrefix"] == "https://gpulet-scheduler-extender.gpulet-system.svc:12345/scheduler", e["urlPrefix"]
e["urlPrefix"] = "https://127.0.0.1:12345/scheduler"
e["tlsConfig"] = {"serverName": "gpulet-scheduler-extender.gpulet-system.svc", "certFile": d + "/pki/scheduler.crt",
                  "keyFile": d + "/pki/scheduler.key", "caFile": ca}
yaml.safe_dump(c, open(dst, "w"))
PY
check "kube-scheduler restarted with the shipped KubeSchedulerConfiguration" \
  bash -c '"$1" scheduler "$2" "$3" >/dev/null 2>&1' _ "$cluster" "$build" "$work/kube-scheduler.yaml"

sched_log() { kc -n "$NS" logs -l app.kubernetes.io/name=gpulet-scheduler --tail=-1 2>/dev/null; }
clean_pods vgpu-a vgpu-b
t0=$(now)
vpod vgpu-a 30 20 | kc apply -f - >/dev/null
wait_until 60 running vgpu-a
t1=$(now)
check "vcuda pod (30 cores, 20 units) is Running" running vgpu-a
running vgpu-a && echo "figure: kubectl apply -> vcuda pod Running (extender + webhook + agent): $(elapsed "$t0" "$t1") s"
running vgpu-a || { kc describe pod vgpu-a | tail -n 8; sched_log | tail -n 5; }
ann() { kc get pod "$1" -o "jsonpath={.metadata.annotations.${2//./\\.}}"; }
check "the extender bound it: gpulet.io/vgpu-node=$NODE" [ "$(ann vgpu-a gpulet.io/vgpu-node)" = "$NODE" ]
gpus_a=$(ann vgpu-a gpulet.io/vgpu-gpus-0)
check "the extender chose its GPU (gpulet.io/vgpu-gpus-0=$gpus_a)" [ -n "$gpus_a" ]
check "the agent granted it (gpulet.io/vgpu-assigned=$(ann vgpu-a gpulet.io/vgpu-assigned))" [ "$(ann vgpu-a gpulet.io/vgpu-assigned)" = true ]
env_a=$(kc exec vgpu-a -- env 2>&1)
check "limits in the container: GPULET_VGPU_MEMORY_LIMIT=$((20 * 268435456))" grep -qx "GPULET_VGPU_MEMORY_LIMIT=$((20 * 268435456))" <<< "$env_a"
check "limits in the container: GPULET_VGPU_CORE_LIMIT=30" grep -qx 'GPULET_VGPU_CORE_LIMIT=30' <<< "$env_a"
check "the interposer: LD_PRELOAD=/usr/lib/gpulet/libgpulet-vcuda.so" grep -qx 'LD_PRELOAD=/usr/lib/gpulet/libgpulet-vcuda.so' <<< "$env_a"
check "the interposer library is mounted in the container" kc exec vgpu-a -- ls /usr/lib/gpulet/libgpulet-vcuda.so
check "GPULET_VGPU_UUID names the granted GPU (the interposer's)" grep -qx "GPULET_VGPU_UUID=$gpus_a" <<< "$env_a"
# The granted GPU's device node, delivered as the overlay's device plugin settings deliver GPUs
# (device specs or CDI names): NVIDIA_VISIBLE_DEVICES alone reaches nothing through runc.
# The fake dgx-h100's minors are its indexes (no minor in testing/profiles/dgx-h100.yaml).
index_a=$("$build/bin/gpulet" info --simulate dgx-h100 --json | python3 -c 'import json,sys
print(next((str(g["index"]) for g in json.load(sys.stdin)["gpus"] if g["uuid"] == sys.argv[1]), "?"))' "$gpus_a")
nodes_a=$(kc exec vgpu-a -- sh -c 'ls /dev | grep -E "^nvidia[0-9]+$" | tr "\n" " "' 2>&1)
check "the vcuda pod sees exactly its granted GPU's /dev/nvidia$index_a ($nodes_a)" [ "$nodes_a" = "nvidia$index_a " ]
check "the vcuda pod sees /dev/nvidiactl" kc exec vgpu-a -- sh -c 'test -c /dev/nvidiactl'


# Issue 31.6: the limits the interposer reads are a read-only file, not the environment, and the
# interposer comes through a read-only /etc/ld.so.preload (every process, whatever LD_PRELOAD says).
limits_a=$(kc exec vgpu-a -- cat /var/run/gpulet/vgpu/limits 2>&1)
check "the limits file in the container: GPULET_VGPU_MEMORY_LIMIT=$((20 * 268435456))" \
  grep -qx "GPULET_VGPU_MEMORY_LIMIT=$((20 * 268435456))" <<< "$limits_a"
check "... and GPULET_VGPU_UUID=$gpus_a" grep -qx "GPULET_VGPU_UUID=$gpus_a" <<< "$limits_a"
check "the container cannot change its limits file" \
  bash -c "! $K/kubectl --kubeconfig $D/admin.kubeconfig exec vgpu-a -- sh -c 'echo GPULET_VGPU_MEMORY_LIMIT=0 >> /var/run/gpulet/vgpu/limits' 2>/dev/null"
check "/etc/ld.so.preload names the interposer" \
  bash -c "[ \"\$($K/kubectl --kubeconfig $D/admin.kubeconfig exec vgpu-a -- cat /etc/ld.so.preload)\" = /usr/lib/gpulet/libgpulet-vcuda.so ]"
check "the container cannot change /etc/ld.so.preload" \
  bash -c "! $K/kubectl --kubeconfig $D/admin.kubeconfig exec vgpu-a -- sh -c ': > /etc/ld.so.preload' 2>/dev/null"
# Issue 31.3: the accounting file is on a 16 KiB tmpfs of its own: the container cannot grow it.
grow=$(kc exec vgpu-a -- sh -c 'dd if=/dev/zero bs=1024 count=4096 >> /var/run/gpulet/vgpu/accounting 2>/dev/null; wc -c < /var/run/gpulet/vgpu/accounting' 2>&1)
check "appending 4 MiB to the accounting file leaves it under 16 KiB ($grow bytes)" \
  bash -c '[[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -le 16384 ]' _ "$grow"
