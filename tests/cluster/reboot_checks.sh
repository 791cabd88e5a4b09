# Sourced by install_test.sh while gpulet is installed: the seeds' reboot complaint on the real
# kubelet. GPU pods of a Deployment run; the node "reboots" (testing/k8s/cluster node-down: the
# kubelet stops, every container dies, checkpoints stay); the kubelet starts first and re-admits the
# pods before any device plugin registered: it rejects them (UnexpectedAdmissionError). The agent
# pod, started by that kubelet, registers and its readiness flow (validate, untaint, delete the
# rejected controller-owned pods) brings the Deployment back to all Running.
rs() {
  cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: gpu-reboot, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: gpu-reboot}}
  template:
    metadata: {labels: {app: gpu-reboot}}
    spec:
      hostNetwork: true
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 0
      containers:
      - name: main
        image: gpulet.test/busybox:1
        imagePullPolicy: Never
        command: [sleep, "3600"]
        resources:
          limits: {nvidia.com/gpu: 1}
YAML
}
phases() { kc get pods -l app=gpu-reboot -o 'jsonpath={range .items[*]}{.status.phase}{" "}{end}'; }
all_running() { [ "$(phases)" = "Running Running " ]; }
rs | kc apply -f - >/dev/null
wait_until 60 all_running
check "Deployment gpu-reboot: 2 GPU pods Running ($(phases))" all_running
before=$(kc get pods -l app=gpu-reboot -o 'jsonpath={.items[*].metadata.name}')
"$cluster" node-down "$build" > "$work/node-down.log" 2>&1
check "node down: kubelet stopped and every container killed" grep -q 'every container killed' "$work/node-down.log"
t_kubelet=$(now)
"$cluster" kubelet-start "$build" >/dev/null 2>&1
# The kubelet's verdict reaches the API a few seconds after its start (status manager): until then
# the pods still read Running there. Seen on the pods (phase Failed) or, if the agent was quicker
# in deleting them, in the kubelet's events.
api_rejected() {
  kc get pods -l app=gpu-reboot -o 'jsonpath={.items[*].status.reason}' | grep -q UnexpectedAdmissionError
}
rejected() {
  api_rejected || [ -n "$(kc get events --field-selector reason=UnexpectedAdmissionError -o name 2>/dev/null)" ]
}
wait_until 60 api_rejected
reasons=$(kc get events --field-selector reason=UnexpectedAdmissionError -o 'jsonpath={.items[0].message}' 2>/dev/null)
check "the kubelet, started first, rejected the GPU pods: UnexpectedAdmissionError (${reasons:0:160})" rejected
agent_started() { kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].status.containerStatuses[0].state.running.startedAt}'; }
agent_has_started() { [ -n "$(agent_started)" ]; }
wait_until 60 agent_has_started
healed() {
  [ "$(kc get pods -l app=gpu-reboot -o 'jsonpath={range .items[*]}{.metadata.name}{"="}{.status.phase}{" "}{end}' \
       | tr ' ' '\n' | grep -c '=Running$')" = 2 ] && [ "$(kc get pods -l app=gpu-reboot -o name | wc -l)" = 2 ]
}
wait_until 120 healed
t_healed=$(now)
check "after the agent: the Deployment's 2 GPU pods Running again, no rejected pod left ($(phases))" healed
started=$(agent_started)
if healed && [ -n "$started" ]; then
  t_agent=$(date -d "$started" +%s)
  echo "figure: reboot order: kubelet start -> agent container started: $(elapsed "$t_kubelet" "$t_agent") s (1 s resolution); agent container started -> all GPU pods Running: $(elapsed "$t_agent" "$t_healed") s"
fi
# Who removed the rejected pods: the agent's service account, in the API server's audit log.
deleted_by_agent=$(grep '"verb":"delete"' "$D/logs/audit.log" | grep '"ResponseComplete"' \
  | grep 'system:serviceaccount:gpulet-system:gpulet-node' | grep -c '/pods/gpu-reboot-.*"code":200')
check "the agent's readiness flow deleted the rejected pods (audit log: $deleted_by_agent deletes by gpulet-node)" \
  [ "$deleted_by_agent" -ge 1 ]
ready_again() { ready && untainted; }
check "the node is untainted and labelled ready again" ready_again
kc delete deployment gpu-reboot --wait=true --timeout=60s >/dev/null 2>&1
clean_pods $(kc get pods -l app=gpu-reboot -o name 2>/dev/null | sed 's|pod/||')
