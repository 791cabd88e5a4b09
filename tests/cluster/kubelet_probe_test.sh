#!/bin/bash
# The kubelet emulator's reference, checked on the real kubelet: gpulet-kubelet-probe
# (testing/kubelet/probe.h) registers a device plugin for probe.gpulet.io/dev (4 devices,
# GetPreferredAllocation and PreStartContainer asked for) and records every call the kubelet makes;
# this script takes the same steps as tests/kubelet_emulator/kubelet_probe_test.cc does on the
# emulator (bad registrations, a pod of 2, a device turning unhealthy, a pod of 1 for which the
# plugin prefers an unknown device, a pod bound to the node directly that does not fit, a kubelet
# restart, the plugin gone) and notes what kubectl and the PodResources API show in between. The
# transcript must be tests/kubelet_emulator/kubelet_probe.expected, which the emulator must also
# write: a difference here means the kubelet changed.
# Usage: kubelet_probe_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
need_cluster
default_sa
PROBE=$build/bin/gpulet-kubelet-probe
[ -x "$PROBE" ] || { echo "FAIL: $PROBE is not built (cmake --build --target gpulet-kubelet-probe)"; exit 1; }
DP=$D/fixed/var/lib/kubelet/device-plugins
PR=$D/fixed/var/lib/kubelet/pod-resources/kubelet.sock
LOG=$build/kubelet-probe.transcript
R=probe.gpulet.io/dev
: > "$LOG"
pods="probe-kp-1 probe-kp-2 probe-kp-3"
clean_pods $pods
note() { echo "$*" >> "$LOG"; }
node_line() {
  note "node: capacity=$(capacity $R | sed 's/^$/0/') allocatable=$(allocatable $R | sed 's/^$/0/')"
}
pod_line() {
  local p r m
  p=$(phase "$1"); r=$(kc get pod "$1" -o 'jsonpath={.status.reason}'); m=$(kc get pod "$1" -o 'jsonpath={.status.message}')
  note "pod $1: $p${r:+ $r \"$m\"}"
}
settled() { local p; p=$(phase "$1"); [ "$p" = Running ] || [ "$p" = Failed ]; }
podres() { "$PROBE" podresources "$PR" >> "$LOG"; }
want_alloc() { [ "$(allocatable $R)" = "$1" ]; }

"$PROBE" serve "$DP" "$LOG" 2> "$build/kubelet-probe.err" &
probe=$!
wait_until 30 want_alloc 4; node_line
pod probe-kp-1 $R 2 | kc apply -f - >/dev/null
wait_until 60 settled probe-kp-1; pod_line probe-kp-1
podres
kill -USR1 $probe
wait_until 30 want_alloc 3; node_line
podres
pod probe-kp-2 $R 1 | kc apply -f - >/dev/null
wait_until 60 settled probe-kp-2; pod_line probe-kp-2
pod probe-kp-3 $R 2 | sed "s/^spec:/spec:\n  nodeName: $NODE/" | kc apply -f - >/dev/null
wait_until 60 settled probe-kp-3; pod_line probe-kp-3
podres
n=$(wc -l < "$LOG")
gpus=$(allocatable nvidia.com/gpu)
t0=$(now)
"$cluster" kubelet-restart "$build" >/dev/null 2>&1
reregistered() { tail -n +"$((n + 1))" "$LOG" | grep -q '^register: OK'; }
wait_until 30 reregistered
sleep 2
wait_until 30 want_alloc 3; node_line
podres
# gpulet's own plugin (the cluster's host process) registers again with the restarted kubelet too.
gpus_back() { [ "$(allocatable nvidia.com/gpu)" = "$gpus" ]; }
if [ -n "$gpus" ] && [ "$gpus" != 0 ]; then
  wait_until 30 gpus_back
  check "after the kubelet restart gpulet's plugin registered again: nvidia.com/gpu $gpus allocatable" gpus_back
  gpus_back && echo "figure: kubelet restart -> nvidia.com/gpu allocatable again (gpulet re-registered), at most: $(elapsed "$t0" "$(now)") s (seen after the probe's own checks)"
fi
kill -TERM $probe; wait $probe
wait_until 30 want_alloc 0; node_line

sed 's/^/  /' "$LOG"
if diff -u <(grep -v '^#' "$src/tests/kubelet_emulator/kubelet_probe.expected" | grep -v '^$') "$LOG" > "$build/kubelet-probe.diff"; then
  check "the real kubelet's transcript is tests/kubelet_emulator/kubelet_probe.expected (the emulator's reference)" true
else
  sed 's/^/  /' "$build/kubelet-probe.diff"
  check "the real kubelet's transcript is tests/kubelet_emulator/kubelet_probe.expected (the emulator's reference)" false
fi
delete_pods $pods
finish
