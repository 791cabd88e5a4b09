#!/bin/sh
# gpulet-test-restart-engine: `gpulet install/uninstall --restart` on the test cluster, which has no
# systemd. Asks testing/k8s/cluster (restart_watch) to restart its containerd through a request file
# in /run/gpulet-test of the host (mounted at /host) and waits until it is answered.
req=/host/run/gpulet-test/restart-containerd
echo "${HOSTNAME:-gpulet}" > "$req" || exit 1
i=0
while [ -e "$req" ]; do
  [ "$i" -lt 300 ] || { echo "gpulet-test-restart-engine: containerd was not restarted within 30 s" >&2; exit 1; }
  busybox sleep 0.1
  i=$((i + 1))
done
