#!/bin/bash
# On the real one-node cluster: the real kubelet's device manager takes the 8 fake H100s gpulet's
# device plugin registers; a pod asking for 2 runs and, through `kubectl exec`, sees exactly its 2
# device nodes (containerd 1.6 made them from the plugin's device specs: nodes made with mknod under
# the fake driver root) and the matching 2 UUIDs in NVIDIA_VISIBLE_DEVICES (on containerd 2 the
# nodes come through CDI and the variable is void), both the GPUs the kubelet's checkpoint allocated
# to the pod; a pod asking for 9 stays Pending with the real scheduler's reason.
# Usage: gpu_pods_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster

check "Node $NODE shows nvidia.com/gpu: 8 allocatable" [ "$(allocatable nvidia.com/gpu)" = 8 ]
check "Node $NODE shows nvidia.com/gpu: 8 capacity" [ "$(capacity nvidia.com/gpu)" = 8 ]
default_sa

clean_pods gpu-2 gpu-9
t0=$(now)
pod gpu-2 nvidia.com/gpu 2 | kc apply -f - >/dev/null
wait_until 60 running gpu-2
t1=$(now)
check "pod asking for 2 GPUs is Running (phase: $(phase gpu-2))" running gpu-2
running gpu-2 && echo "figure: kubectl apply -> pod Running (2 GPUs): $(elapsed "$t0" "$t1") s"
running gpu-2 || kc describe pod gpu-2 | tail -n 15

# The GPUs the kubelet allocated to the pod: its device-manager checkpoint (inside the namespace,
# /var/lib/kubelet is $D/fixed/var/lib/kubelet).
uid=$(kc get pod gpu-2 -o 'jsonpath={.metadata.uid}')
allocated=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))["Data"]["PodDeviceEntries"]
print(" ".join(sorted(i for e in d if e["PodUID"] == sys.argv[2] and e["ResourceName"] == "nvidia.com/gpu"
                      for ids in e["DeviceIDs"].values() for i in ids)))' \
  "$D/fixed/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint" "$uid" 2>&1)
check "the kubelet's checkpoint: 2 GPUs allocated to the pod ($allocated)" \
  bash -c '[ "$(wc -w <<< "$1")" = 2 ]' _ "$allocated"
visible=$(kc exec gpu-2 -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES' 2>&1)
runtime=$(cat "$D/runtime" 2>/dev/null)
if [ "$runtime" = containerd2 ]; then
  # CDI: the devices come by name through CRI; the plugin sets the variable to void (as NVIDIA's
  # does) so that no NVIDIA runtime hook injects GPUs a second time.
  check "kubectl exec: NVIDIA_VISIBLE_DEVICES is void under CDI ($visible)" [ "$visible" = void ]
elif [ "$runtime" = containerd-shim-cdi ]; then
  # cdi-annotations alone: the plugin sets no variable; the devices are named only by the
  # cdi.k8s.io/* annotation, which containerd 1.6 copied into the container's OCI spec.
  check "kubectl exec: NVIDIA_VISIBLE_DEVICES is unset under cdi-annotations ($visible)" [ -z "$visible" ]
  cid=$(kc get pod gpu-2 -o 'jsonpath={.status.containerStatuses[0].containerID}')
  ann=$(ctr --address "$D/containerd/containerd.sock" -n k8s.io containers info "${cid#containerd://}" 2>&1 |
    python3 -c 'import json, sys; a = json.load(sys.stdin)["Spec"].get("annotations", {})
print(" ".join(sorted(k + "=" + v for k, v in a.items() if k.startswith("cdi.k8s.io/"))))' 2>&1)
  check "the OCI spec carries the plugin's annotation, naming 2 GPUs ($ann)" \
    bash -c '[[ "$1" == cdi.k8s.io/gpulet-device-plugin_gpu=* && "$(tr , "\n" <<< "${1#*=}" | grep -c "^nvidia.com/gpu=")" == 2 ]]' _ "$ann"
else
  check "kubectl exec: NVIDIA_VISIBLE_DEVICES holds the 2 allocated GPU UUIDs ($visible)" \
    [ "$(tr ',' '\n' <<< "$visible" | sort | tr '\n' ' ')" = "$allocated " ]
fi
# The device nodes in the container: `ls -l` prints "195, MINOR ... /dev/nvidiaN".
nodes=$(kc exec gpu-2 -- sh -c 'ls -l /dev/ | grep " nvidia[0-9]*$"' 2>&1)
names=$(printf '%s\n' "$nodes" | awk '{print $NF}' | sort | tr '\n' ' ')
check "kubectl exec: exactly 2 GPU device nodes in /dev ($names)" [ "$(printf '%s\n' "$nodes" | grep -c nvidia)" = 2 ]
# Their minors are the fake GPUs' minors (= indices); gpulet info maps the indices to UUIDs.
want=$(for m in $(printf '%s\n' "$nodes" | awk '{gsub(",", "", $5); print $6}'); do
  "$GPULET" info --simulate dgx-h100 --sim-root "$D/sim" | sed -n "s/^GPU $m: .*(UUID: \(GPU-[^)]*\)).*/\1/p"
done | sort | tr '\n' ' ')
check "the device nodes' minors are the allocated GPUs ($want= $allocated)" \
  bash -c '[ -n "$1" ] && [ "$1" = "$2 " ]' _ "$want" "$allocated"
check "Node still shows nvidia.com/gpu: 8 allocatable with the pod running" [ "$(allocatable nvidia.com/gpu)" = 8 ]

pod gpu-9 nvidia.com/gpu 9 | kc apply -f - >/dev/null
unschedulable() { [ "$(kc get pod gpu-9 -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}')" = Unschedulable ]; }
wait_until 30 unschedulable
msg=$(kc get pod gpu-9 -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}')
check "pod asking for 9 GPUs: PodScheduled reason Unschedulable" unschedulable
check "pod asking for 9 GPUs: the scheduler says 'Insufficient nvidia.com/gpu' ($msg)" \
  bash -c '[[ "$1" == *"Insufficient nvidia.com/gpu"* ]]' _ "$msg"
sleep 2
check "pod asking for 9 GPUs is still Pending" [ "$(phase gpu-9)" = Pending ]

delete_pods gpu-2 gpu-9
finish
