# Sourced by install_test.sh after vgpu_checks.sh (vcuda pod vgpu-a Running, kube-scheduler on the
# shipped configuration): the agent pod deleted and recreated between two vcuda pods loses nothing:
# the first keeps its grant and accounting, the Node its vGPU capacity, and the second is placed and
# starts. Puts kube-scheduler back on its flags.
# The agent restarted mid-way (its pod deleted; the DaemonSet makes another).
uid_a=$(kc get pod vgpu-a -o 'jsonpath={.metadata.uid}')
old_agent=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[0].metadata.name}')
t0=$(now)
kc -n "$NS" delete pod "$old_agent" --wait=true --timeout=60s >/dev/null 2>&1
new_agent_up() {
  local n; n=$(kc -n "$NS" get pods -l app.kubernetes.io/name=gpulet-node -o 'jsonpath={.items[?(@.status.phase=="Running")].metadata.name}')
  [ -n "$n" ] && [ "$n" != "$old_agent" ] && gpus8
}
wait_until 90 new_agent_up
t1=$(now)
check "a new agent pod runs and the Node has its vGPU capacity again" new_agent_up
new_agent_up && echo "figure: agent pod deleted -> new agent re-registered with the real kubelet: $(elapsed "$t0" "$t1") s"
check "vcuda pod A still Running after the agent restart" running vgpu-a
check "A keeps its grant (same GPU, assigned)" bash -c '[ "$1" = "$2" ] && [ "$3" = true ]' _ \
  "$(ann vgpu-a gpulet.io/vgpu-gpus-0)" "$gpus_a" "$(ann vgpu-a gpulet.io/vgpu-assigned)"
# The grant directory is a tmpfs of the node's mount namespace (the agent's Bidirectional mount).
on_tmpfs_with_accounting() { [ "$(on_node findmnt -n -o FSTYPE "$1")" = tmpfs ] && on_node test -e "$1/accounting"; }
check "A's accounting file is still on the node, on its tmpfs" on_tmpfs_with_accounting "/var/lib/gpulet/vgpu/$uid_a/main"
vpod vgpu-b 50 40 | kc apply -f - >/dev/null
wait_until 60 running vgpu-b
check "vcuda pod B (50 cores, 40 units) placed and Running after the restart" running vgpu-b
running vgpu-b || { kc describe pod vgpu-b | tail -n 8; kc -n "$NS" logs -l app.kubernetes.io/name=gpulet-node -c agent --tail=10; }
check "B got GPULET_VGPU_CORE_LIMIT=50" bash -c "$K/kubectl --kubeconfig $D/admin.kubeconfig exec vgpu-b -- env | grep -qx GPULET_VGPU_CORE_LIMIT=50"
# binpack: B goes on A's GPU (30 + 50 <= 100) -- only right if the new agent still counts A there.
check "binpack put B on A's GPU ($(ann vgpu-b gpulet.io/vgpu-gpus-0))" [ "$(ann vgpu-b gpulet.io/vgpu-gpus-0)" = "$gpus_a" ]
check "the extender's bind stamped both (gpulet.io/vgpu-bind-time)" \
  bash -c '[ -n "$1" ] && [ -n "$2" ]' _ "$(ann vgpu-a gpulet.io/vgpu-bind-time)" "$(ann vgpu-b gpulet.io/vgpu-bind-time)"
clean_pods vgpu-a vgpu-b
"$cluster" scheduler "$build" >/dev/null 2>&1 || check "kube-scheduler back to its flags" false
