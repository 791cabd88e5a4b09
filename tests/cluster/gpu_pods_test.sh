#!/bin/bash
# On the real one-node cluster: the real kubelet's device manager takes the 8 fake H100s gpulet's
# device plugin registers; a pod asking for 2 runs and, through `kubectl exec`, sees exactly its 2
# device nodes (containerd 1.6 made them from the plugin's device specs: nodes made with mknod under
# the fake driver root) and the matching 2 UUIDs in NVIDIA_VISIBLE_DEVICES; a pod asking for 9
# stays Pending with the real scheduler's reason.
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

visible=$(kc exec gpu-2 -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES' 2>&1)
check "kubectl exec: NVIDIA_VISIBLE_DEVICES holds 2 distinct GPU UUIDs ($visible)" bash -c '
  IFS=, read -ra ids <<< "$1"
  [ "${#ids[@]}" = 2 ] && [ "${ids[0]}" != "${ids[1]}" ] &&
  [[ "${ids[0]}" == GPU-* ]] && [[ "${ids[1]}" == GPU-* ]]' _ "$visible"
# The device nodes in the container: `ls -l` prints "195, MINOR ... /dev/nvidiaN".
nodes=$(kc exec gpu-2 -- sh -c 'ls -l /dev/ | grep " nvidia[0-9]*$"' 2>&1)
names=$(printf '%s\n' "$nodes" | awk '{print $NF}' | sort | tr '\n' ' ')
check "kubectl exec: exactly 2 GPU device nodes in /dev ($names)" [ "$(printf '%s\n' "$nodes" | grep -c nvidia)" = 2 ]
# Their minors are the fake GPUs' minors (= indices); gpulet info maps the indices to UUIDs.
want=$(for m in $(printf '%s\n' "$nodes" | awk '{gsub(",", "", $5); print $6}'); do
  "$GPULET" info --simulate dgx-h100 --sim-root "$D/sim" | sed -n "s/^GPU $m: .*(UUID: \(GPU-[^)]*\)).*/\1/p"
done | sort | tr '\n' ' ')
got=$(tr ',' '\n' <<< "$visible" | sort | tr '\n' ' ')
check "the device nodes' minors are the GPUs in NVIDIA_VISIBLE_DEVICES ($want= $got)" \
  bash -c '[ -n "$1" ] && [ "$1" = "$2" ]' _ "$want" "$got"
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
