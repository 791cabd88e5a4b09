#!/bin/bash
# gpulet's two ValidatingAdmissionPolicies on the real API server: gpulet-node-own-node
# (deploy/base/node-admission-policy.yaml) and gpulet-trusted-pod-annotations
# (deploy/components/vgpu/scheduler.yaml), applied with the node agent's RBAC (plus the vGPU
# component's pods: patch, so that a denial on a pod comes from the policy and not from RBAC).
# The node agent writes with a token bound to a pod running on the cluster's node, so the token
# carries the node-name claim; a second Node object, other-node, exists in the API only.
# Everything the test creates is removed when it exits (the cluster is shared with other scenarios).
# Usage: admission_policy_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
OTHER=other-node
NS=gpulet-system
W=$D/admission
mkdir -p "$W"

# docs FILE KIND/NAME...: the YAML documents of FILE with those kinds and metadata names.
docs() {
  local file=$1; shift
  awk -v want=" $* " '
    function flush() { if (doc != "" && index(want, " " kind "/" name " ")) printf "---\n%s", doc; doc = kind = name = "" }
    /^---/ { flush(); next }
    { doc = doc $0 "\n" }
    /^kind:/ { kind = $2 }
    /^  name:/ && name == "" { name = $2 }
    END { flush() }' "$file"
}
policies() {
  local f
  for f in namespace rbac-node node-admission-policy; do echo ---; cat "$src/deploy/base/$f.yaml"; done
  docs "$src/deploy/components/vgpu/scheduler.yaml" ServiceAccount/gpulet-scheduler \
    ClusterRole/gpulet-scheduler ClusterRoleBinding/gpulet-scheduler \
    ValidatingAdmissionPolicy/gpulet-trusted-pod-annotations \
    ValidatingAdmissionPolicyBinding/gpulet-trusted-pod-annotations \
    ValidatingAdmissionPolicy/gpulet-trusted-binding-annotations \
    ValidatingAdmissionPolicyBinding/gpulet-trusted-binding-annotations
  echo ---; cat "$src/deploy/components/mps/mps-tenant-policy.yaml"
}
# A tenant: the service account tenant in default, allowed to patch and update pods there.
tenant_rbac() {
  cat <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: vap-tenant, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: vap-tenant, namespace: default}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list, patch, update]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: vap-tenant, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: vap-tenant}
subjects: [{kind: ServiceAccount, name: vap-tenant, namespace: default}]
YAML
}
# apod NAME NAMESPACE NODE [SERVICEACCOUNT]: a busybox pod bound to NODE (no scheduler involved),
# with gpulet's assignment annotations as the extender would have written them.
apod() {
  cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $2
  labels: {app: vap}
  annotations: {gpulet.io/vgpu-node: $3, gpulet.io/vgpu-assigned: "false", team: a}
spec:
  nodeName: $3
  serviceAccountName: ${4:-default}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  restartPolicy: Never
  containers: [{name: main, image: gpulet.test/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}]
YAML
}
cleanup() {
  kc delete pod -n default vap-tenant-pod vap-other-pod vap-unbound vap-mps-own vap-mps-plain --ignore-not-found --grace-period=0 --force >/dev/null 2>&1
  kc delete pod -n "$NS" vap-agent --ignore-not-found --grace-period=0 --force >/dev/null 2>&1
  kc delete node "$OTHER" --ignore-not-found >/dev/null 2>&1
  kc label node "$NODE" gpulet.io/vap-test- >/dev/null 2>&1
  kc annotate node "$NODE" gpulet.io/vap-test- >/dev/null 2>&1
  tenant_rbac | kc delete -f - --ignore-not-found >/dev/null 2>&1
  policies | kc delete -f - --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1
  rm -rf "$W"
}
# The test applies and removes deploy/'s objects: never on a cluster where gpulet was deployed.
MARK=gpulet.test/admission-policy-test
if kc get namespace "$NS" >/dev/null 2>&1 && [ -z "$(kc get namespace "$NS" -o jsonpath="{.metadata.labels.${MARK//./\\.}}")" ]; then
  echo "FAIL: namespace $NS exists (gpulet deployed?); this test would replace and delete its policies and RBAC"
  exit 1
fi
trap cleanup EXIT
cleanup; mkdir -p "$W"
default_sa

# --- apply what deploy/ ships ---------------------------------------------------------------------
apply_policies() { policies | kc apply -f - > "$W/apply.out" 2>&1 || { cat "$W/apply.out"; false; }; }
check "kubectl apply: namespace, node agent RBAC, both policies and bindings, gpulet-scheduler RBAC" apply_policies
# The vGPU component (deploy/components/vgpu/kustomization.yaml) lets the agent patch pods.
kc patch clusterrole gpulet-node --type json \
  -p '[{"op":"add","path":"/rules/-","value":{"apiGroups":[""],"resources":["pods"],"verbs":["patch"]}}]' >/dev/null
tenant_rbac | kc apply -f - >/dev/null
kc label namespace "$NS" "$MARK=1" >/dev/null
# The API server type-checks the CEL when it stores a policy; an error shows in status.typeChecking.
checked() { [ -n "$(kc get validatingadmissionpolicy "$1" -o jsonpath='{.status.observedGeneration}')" ]; }
for p in gpulet-node-own-node gpulet-node-own-events gpulet-trusted-pod-annotations \
  gpulet-trusted-binding-annotations gpulet-mps-one-tenant-per-node; do
  wait_until 20 checked "$p"
  tc=$(kc get validatingadmissionpolicy "$p" -o jsonpath='{.status.typeChecking.expressionWarnings}')
  check "policy $p: type-checked, no CEL warnings (${tc:-none})" bash -c '[ -z "$1" ] && [ -z "$2" ]' _ "$tc" "$(checked "$p" || echo unchecked)"
done

# --- a second Node, in the API only ----------------------------------------------------------------
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $OTHER, labels: {kubernetes.io/hostname: $OTHER}}
YAML
check "Node $OTHER exists" kc get node "$OTHER" -o name

# --- tokens -----------------------------------------------------------------------------------------
apod vap-agent "$NS" "$NODE" gpulet-node | kc apply -f - >/dev/null
agent_running() { [ "$(kc get pod -n "$NS" vap-agent -o jsonpath='{.status.phase}')" = Running ]; }
wait_until 60 agent_running
check "pod $NS/vap-agent (service account gpulet-node) is Running on $NODE" \
  [ "$(kc get pod -n "$NS" vap-agent -o jsonpath='{.status.phase}/{.spec.nodeName}')" = "Running/$NODE" ]
uid=$(kc get pod -n "$NS" vap-agent -o jsonpath='{.metadata.uid}')
agent_token=$(kc create token gpulet-node -n "$NS" --bound-object-kind Pod --bound-object-name vap-agent \
  --bound-object-uid "$uid")
claims() { cut -d. -f2 <<< "$1" | tr '_-' '/+' | base64 -d 2>/dev/null; }  # (jq tolerates the missing padding's error)
claims "$agent_token" > "$W/agent-claims.json" || true
echo "agent token claims: $(jq -c '{sub, "kubernetes.io"}' "$W/agent-claims.json")"
check "the agent token's node claim names $NODE" \
  [ "$(jq -r '."kubernetes.io".node.name' "$W/agent-claims.json")" = "$NODE" ]
scheduler_token=$(kc create token gpulet-scheduler -n "$NS")
tenant_token=$(kc create token vap-tenant -n default)
server=$(kc config view --minify -o jsonpath='{.clusters[0].cluster.server}')
# as TOKEN ARGS...: kubectl authenticated by TOKEN alone (no client certificate).
as() {
  local tok=$1; shift
  "$K/kubectl" --kubeconfig /dev/null --server "$server" --certificate-authority "$D/pki/ca.crt" --token "$tok" "$@"
}
whoami=$(as "$agent_token" auth whoami -o json)
echo "agent as the API server sees it: $(jq -c .status.userInfo <<< "$whoami")"
check "the API server puts the node name in userInfo.extra[authentication.kubernetes.io/node-name]" \
  [ "$(jq -r '.status.userInfo.extra["authentication.kubernetes.io/node-name"][0]' <<< "$whoami")" = "$NODE" ]

# allowed DESCRIPTION TOKEN KUBECTL-ARGS...: the request succeeds.
allowed() {
  local d=$1 tok=$2; shift 2
  local out; out=$(as "$tok" "$@" 2>&1); local rc=$?
  check "allowed: $d" [ "$rc" = 0 ]
  [ "$rc" = 0 ] || echo "      $out"
}
# denied DESCRIPTION POLICY MESSAGE TOKEN KUBECTL-ARGS...: refused by POLICY with MESSAGE.
denied() {
  local d=$1 policy=$2 msg=$3 tok=$4; shift 4
  local out; out=$(as "$tok" "$@" 2>&1); local rc=$?
  echo "      kubectl: $out"
  check "denied by $policy: $d" bash -c '[ "$1" != 0 ] && [[ "$2" == *"ValidatingAdmissionPolicy '"'"'$3'"'"'"*"$4"* ]]' \
    _ "$rc" "$out" "$policy" "$msg"
}
OWN="gpulet-node-own-node" TRUST="gpulet-trusted-pod-annotations"

# A new policy takes effect once the API server's informer has it: wait for the first denial.
other_refused() { ! as "$agent_token" label node "$OTHER" gpulet.io/vap-test=1 >/dev/null 2>&1; }
wait_until 30 other_refused

# --- gpulet-node-own-node: Nodes ----------------------------------------------------------------------
allowed "the agent labels its own Node (gpulet.io/vap-test=1)" "$agent_token" label node "$NODE" gpulet.io/vap-test=1
allowed "the agent annotates its own Node" "$agent_token" annotate node "$NODE" gpulet.io/vap-test=1
allowed "the agent sets a gpulet.io taint on its own Node" "$agent_token" taint node "$NODE" gpulet.io/vap-test=1:PreferNoSchedule
allowed "the agent removes that taint" "$agent_token" taint node "$NODE" gpulet.io/vap-test-
check "its own Node carries the label" [ "$(kc get node "$NODE" -o jsonpath='{.metadata.labels.gpulet\.io/vap-test}')" = 1 ]
denied "the agent labels $OTHER" "$OWN" "the gpulet node agent may write only its own Node" \
  "$agent_token" label node "$OTHER" gpulet.io/vap-test=1
denied "the agent annotates $OTHER" "$OWN" "the gpulet node agent may write only its own Node" \
  "$agent_token" annotate node "$OTHER" gpulet.io/vap-test=1
denied "the agent sets a kubernetes.io label on its own Node" "$OWN" \
  "the gpulet node agent may change only labels, annotations and gpulet.io taints of its Node" \
  "$agent_token" label node "$NODE" node-role.kubernetes.io/gpu=
denied "the agent cordons its own Node" "$OWN" \
  "the gpulet node agent may change only labels, annotations and gpulet.io taints of its Node" \
  "$agent_token" patch node "$NODE" --type=merge -p '{"spec":{"unschedulable":true}}'
denied "the agent sets a non-gpulet taint on its own Node" "$OWN" \
  "the gpulet node agent may change only labels, annotations and gpulet.io taints of its Node" \
  "$agent_token" taint node "$NODE" example.com/evil=1:NoSchedule

# --- gpulet-node-own-node: Pods -------------------------------------------------------------------------
apod vap-other-pod default "$OTHER" | kc apply -f - >/dev/null
check "pod default/vap-other-pod is bound to $OTHER" \
  [ "$(kc get pod vap-other-pod -o jsonpath='{.spec.nodeName}')" = "$OTHER" ]
denied "the agent annotates a pod bound to $OTHER" "$OWN" "the gpulet node agent may write only pods bound to its own node" \
  "$agent_token" annotate pod -n default vap-other-pod --overwrite gpulet.io/vgpu-assigned=true
denied "the agent deletes a pod bound to $OTHER" "$OWN" "the gpulet node agent may write only pods bound to its own node" \
  "$agent_token" delete pod -n default vap-other-pod --wait=false
allowed "the agent sets gpulet.io/vgpu-assigned on a pod bound to its node" \
  "$agent_token" annotate pod -n "$NS" vap-agent --overwrite gpulet.io/vgpu-assigned=true
denied "the agent changes another annotation of a pod bound to its node" "$OWN" \
  "the gpulet node agent may change only gpulet.io/vgpu-* annotations of pods" \
  "$agent_token" annotate pod -n "$NS" vap-agent --overwrite team=b
denied "the agent changes a label of a pod bound to its node" "$OWN" \
  "the gpulet node agent may change only gpulet.io/vgpu-* annotations of pods" \
  "$agent_token" label pod -n "$NS" vap-agent --overwrite app=other
denied "the agent changes the image of a pod bound to its node" "$OWN" \
  "the gpulet node agent may change only gpulet.io/vgpu-* annotations of pods" \
  "$agent_token" patch pod -n "$NS" vap-agent --type=json \
  -p '[{"op":"replace","path":"/spec/containers/0/image","value":"gpulet.test/evil:1"}]'

# --- gpulet-node-own-events: what the agent records --------------------------------------------------
# event NAME KIND OBJECT INSTANCE: an Event about KIND/OBJECT reported as node INSTANCE.
event() {
  cat <<YAML
apiVersion: v1
kind: Event
metadata: {name: $1, namespace: default}
involvedObject: {kind: $2, name: $3, apiVersion: v1}
type: Normal
reason: VapTest
message: admission policy test
source: {component: gpulet-agent, host: $4}
reportingComponent: gpulet-agent
reportingInstance: $4
YAML
}
EV="gpulet-node-own-events"
event vap-ev-own Node "$NODE" "$NODE" > "$W/ev-own.yaml"
allowed "the agent records an event about its own Node" "$agent_token" create -f "$W/ev-own.yaml"
event vap-ev-pod Pod some-pod "$NODE" > "$W/ev-pod.yaml"
allowed "the agent records an event about a pod, as its node" "$agent_token" create -f "$W/ev-pod.yaml"
event vap-ev-other Node "$OTHER" "$NODE" > "$W/ev-other.yaml"
denied "the agent records an event about $OTHER" "$EV" "only about pods and its own Node" \
  "$agent_token" create -f "$W/ev-other.yaml"
event vap-ev-forged Pod some-pod "$OTHER" > "$W/ev-forged.yaml"
denied "the agent records an event as $OTHER" "$EV" "only as its own node" \
  "$agent_token" create -f "$W/ev-forged.yaml"
event vap-ev-secret Secret some-secret "$NODE" > "$W/ev-secret.yaml"
denied "the agent records an event about a Secret" "$EV" "only about pods and its own Node" \
  "$agent_token" create -f "$W/ev-secret.yaml"
kc delete event -n default vap-ev-own vap-ev-pod --ignore-not-found >/dev/null 2>&1

# --- gpulet-trusted-pod-annotations ---------------------------------------------------------------------
apod vap-tenant-pod default "$OTHER" | kc apply -f - >/dev/null
MSG="gpulet.io/vgpu-node, -gpus-<i>, -bind-time, -assigned and tencent.com/vcuda-core-limit are written by gpulet only, and gpulet.io/vgpu-disable is set only at creation (where the webhook checks the namespace)"
denied "a tenant changes gpulet.io/vgpu-assigned" "$TRUST" "$MSG" \
  "$tenant_token" annotate pod -n default vap-tenant-pod --overwrite gpulet.io/vgpu-assigned=true
denied "a tenant removes gpulet.io/vgpu-node" "$TRUST" "$MSG" \
  "$tenant_token" annotate pod -n default vap-tenant-pod gpulet.io/vgpu-node-
denied "a tenant adds gpulet.io/vgpu-gpus-0" "$TRUST" "$MSG" \
  "$tenant_token" annotate pod -n default vap-tenant-pod gpulet.io/vgpu-gpus-0=GPU-0
denied "a tenant adds tencent.com/vcuda-core-limit" "$TRUST" "$MSG" \
  "$tenant_token" annotate pod -n default vap-tenant-pod tencent.com/vcuda-core-limit=100
# The vGPU opt-out added after creation (the pod waiting behind a scheduling gate, say): the webhook
# sees CREATE only, so the policy must refuse it, for a tenant and for the cluster admin alike.
denied "a tenant adds the vGPU opt-out gpulet.io/vgpu-disable after creation" "$TRUST" "$MSG" \
  "$tenant_token" annotate pod -n default vap-tenant-pod gpulet.io/vgpu-disable=true
allowed "a tenant changes an annotation of its own (team=b)" \
  "$tenant_token" annotate pod -n default vap-tenant-pod --overwrite team=b
# The extender writes its assignment in the Binding (pods/binding), so its service account has no
# pod patch outside gpulet-system at all: RBAC refuses before any policy runs.
out=$(as "$scheduler_token" annotate pod -n default vap-tenant-pod gpulet.io/vgpu-gpus-0=GPU-0 2>&1); rc=$?
echo "      kubectl (gpulet-scheduler): $out"
check "forbidden by RBAC: the gpulet-scheduler service account annotates a tenant's pod" \
  bash -c '[ "$1" != 0 ] && [[ "$2" == *"cannot patch resource \"pods\""* ]]' _ "$rc" "$out"
# The policy binds every user but gpulet's two, cluster administrators (system:masters) included.
out=$(kc annotate pod -n default vap-tenant-pod --overwrite gpulet.io/vgpu-assigned=true 2>&1); rc=$?
echo "      kubectl (admin): $out"
check "denied by $TRUST: the cluster admin changes gpulet.io/vgpu-assigned" \
  bash -c '[ "$1" != 0 ] && [[ "$2" == *"$3"* ]]' _ "$rc" "$out" "$MSG"

# --- gpulet-trusted-binding-annotations: a Binding copies its annotations onto the pod -----------
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: vap-unbound, namespace: default}
spec:
  schedulerName: no-such-scheduler
  containers: [{name: c, image: gpulet.test/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}]
YAML
binding() {
  printf '{"apiVersion":"v1","kind":"Binding","metadata":{"name":"vap-unbound"%s},"target":{"kind":"Node","name":"%s"}}' "$1" "$OTHER" > "$W/binding.json"
  kc create --raw /api/v1/namespaces/default/pods/vap-unbound/binding -f "$W/binding.json" 2>&1
}
out=$(binding ',"annotations":{"gpulet.io/vgpu-gpus-0":"GPU-0","gpulet.io/vgpu-node":"'"$OTHER"'"}'); rc=$?
echo "      binding (admin): $out"
check "denied by gpulet-trusted-binding-annotations: a Binding carrying gpulet.io/vgpu-gpus-0 from the cluster admin" \
  bash -c '[ "$1" != 0 ] && [[ "$2" == *"gpulet-trusted-binding-annotations"*"only from gpulet"* ]]' _ "$rc" "$out"
check "... and the pod stays unbound" [ -z "$(kc get pod -n default vap-unbound -o jsonpath='{.spec.nodeName}')" ]
out=$(binding ',"annotations":{"team":"b"}'); rc=$?
check "allowed: a Binding with annotations of its own binds ($out)" [ "$rc" = 0 ]
check "... its annotation is on the pod with the node" \
  [ "$(kc get pod -n default vap-unbound -o jsonpath='{.spec.nodeName}/{.metadata.annotations.team}')" = "$OTHER/b" ]

# --- gpulet-mps-one-tenant-per-node (deploy/components/mps): MPS clients of a node share /dev/shm --
# mpod NAME RESOURCE [TENANT]: a pod asking RESOURCE: 1, selecting gpulet.io/mps-tenant=TENANT.
mpod() {
  local sel=""
  [ -n "${3:-}" ] && sel="nodeSelector: {gpulet.io/mps-tenant: $3}"
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  schedulerName: no-such-scheduler
  $sel
  containers: [{name: c, image: gpulet.test/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"], resources: {limits: {$2: 1}}}]
YAML
}
MPS=gpulet-mps-one-tenant-per-node
out=$(mpod vap-mps-none nvidia.com/gpu.shared | kc apply -f - 2>&1); rc=$?
echo "      kubectl: $out"
check "denied by $MPS: a pod asking nvidia.com/gpu.shared without gpulet.io/mps-tenant" \
  bash -c '[ "$1" != 0 ] && [[ "$2" == *"$3"*"gpulet.io/mps-tenant: default"* ]]' _ "$rc" "$out" "$MPS"
out=$(mpod vap-mps-other nvidia.com/gpu.shared team-b | kc apply -f - 2>&1); rc=$?
check "denied by $MPS: a pod of default selecting team-b's MPS nodes" \
  bash -c '[ "$1" != 0 ] && [[ "$2" == *"$3"* ]]' _ "$rc" "$out" "$MPS"
out=$(mpod vap-mps-own nvidia.com/gpu.shared default | kc apply -f - 2>&1); rc=$?
check "allowed: a pod of default selecting default's MPS nodes ($out)" [ "$rc" = 0 ]
out=$(mpod vap-mps-plain example.com/widget | kc apply -f - 2>&1); rc=$?
check "allowed: a pod asking a resource that is not MPS-shared ($out)" [ "$rc" = 0 ]
finish
