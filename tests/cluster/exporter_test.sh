#!/bin/bash
# gpulet's exporter on the real kubelet's PodResources API and device-manager checkpoint: started
# in the cluster's mount namespace (where /var/lib/kubelet is the kubelet's) on the cluster's fake
# GPUs, it attributes a pod's 2 GPUs to the pod: the first scrape after the pod is Running carries
# pod/namespace/container labels on the metrics of exactly those 2 GPUs (the UUIDs in the pod's
# NVIDIA_VISIBLE_DEVICES), and after the pod is deleted the labels go away.
# Usage: exporter_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
default_sa
PORT=${GPULET_CLUSTER_EXPORTER_PORT:-19400}
nsenter -t "$(cat "$D/pids/holder")" -m -- nice -n 19 "$GPULET" exporter --simulate dgx-h100 \
  --sim-root "$D/sim" --address "127.0.0.1:$PORT" --interval 1s --no-hostname \
  --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock \
  --kubelet-checkpoint /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint \
  --vgpu-accounting-dir "" > "$D/logs/exporter.log" 2>&1 &
exporter=$!
trap 'kill $exporter 2>/dev/null; wait $exporter 2>/dev/null' EXIT
scrape() { curl -sf "http://127.0.0.1:$PORT/metrics"; }
serving() { [ -n "$(scrape)" ]; }
check "exporter serves /metrics" wait_until 20 serving
scrape > "$D/scrape-before"
check "before the pod: no metric names pod exp-2" bash -c '! grep -q "pod=\"exp-2\"" "$1"' _ "$D/scrape-before"

clean_pods exp-2
pod exp-2 nvidia.com/gpu 2 | kc apply -f - >/dev/null
wait_until 60 running exp-2
t_run=$(now)
scrape > "$D/scrape-first"
t_scrape=$(now)
check "pod exp-2 (2 GPUs) is Running" running exp-2
echo "figure: pod Running seen -> first scrape done: $(elapsed "$t_run" "$t_scrape") s"
uuids=$(kc exec exp-2 -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES' | tr ',' '\n' | sort | tr '\n' ' ')
labelled=$(grep 'pod="exp-2"' "$D/scrape-first" | grep 'namespace="default"' | grep 'container="main"' |
  grep -o 'GPU-[0-9a-f-]*' | sort -u | tr '\n' ' ')
check "first scrape after Running: metrics with pod/namespace/container of exp-2 name its 2 GPUs ($labelled= $uuids)" \
  bash -c '[ -n "$1" ] && [ "$1" = "$2" ]' _ "$labelled" "$uuids"
n=$(grep -c 'pod="exp-2"' "$D/scrape-first")
echo "figure: $n series carry pod=\"exp-2\" in the first scrape"

clean_pods exp-2
# (grep -c, not -q: under pipefail, grep -q quitting early fails curl with SIGPIPE.)
gone() { local body; body=$(scrape) && [ -n "$body" ] && [ "$(grep -c 'pod="exp-2"' <<< "$body")" = 0 ]; }
wait_until 30 gone
check "pod deleted: no metric names pod exp-2 any more" gone
finish
