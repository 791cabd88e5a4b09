#!/bin/bash
# cluster.down (ctest fixture cleanup): stops the cluster cluster.up started (one that `make
# cluster` left running stays) and checks that nothing is left behind: no process, mount, network
# device, KUBE-* iptables rule or kubepods cgroup, and the cluster directory removed. Prints the
# suite's wall time (cluster.up's start to here).
# Usage: down_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/leftovers.sh"
if [ -f "$STATE/cannot-run" ]; then
  echo "skipped: $(cat "$STATE/cannot-run")"; rm -rf "$STATE"; exit 77
fi
if [ ! -f "$STATE/started" ]; then
  echo "the cluster was not started by cluster.up: left running"
  finish
fi
holder=$(cat "$D/pids/holder" 2>/dev/null)
"$cluster" down "$build" || check "cluster down" false
no_leftovers "down" "$holder"
echo "figure: the cluster suite, cluster.up start -> cluster.down done: $(elapsed "$(cat "$STATE/suite-start")" "$(now)") s"
rm -rf "$STATE"
finish
