#!/bin/bash
# cluster.up (ctest fixture setup): uses the cluster `make cluster` left running, else starts one
# for the scenarios (cluster.down stops it). Before starting, two failed starts: a port in use, and
# a component failing once the others run (the device plugin on an unknown GPU profile); each exits
# 1 with one message naming the problem and leaves nothing behind.
# Usage: up_test.sh SOURCE_DIR BUILD_DIR   (skips with 77 unless GPULET_E2E_CLUSTER=1)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/leftovers.sh"
rm -rf "$STATE"
if [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
  echo "using the running cluster in $D (cluster.down will leave it running)"
  finish
fi
mkdir -p "$STATE"
# A machine that cannot run a cluster at all (CI without root or cgroup controllers): every test
# skips with the reason instead of failing (need_cluster reads it).
if ! why=$("$cluster" preflight "$build" 2>&1); then
  echo "$why" > "$STATE/cannot-run"
  echo "skipped: $why"
  exit 77
fi
now > "$STATE/suite-start"
links > "$STATE/links.before"
kube_rules > "$STATE/kube-rules.before"

# --- a port in use: one message, exit 1, nothing created -----------------------------------------
python3 -c 'import socket,time,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(60)' > "$STATE/port" &
holder=$!
for _ in $(seq 50); do [ -s "$STATE/port" ] && break; sleep 0.1; done
port=$(cat "$STATE/port")
out=$(GPULET_CLUSTER_API_PORT=$port "$cluster" up "$build" 2>&1); rc=$?
kill "$holder"; wait "$holder" 2>/dev/null
check "port $port in use: cluster up exits 1" [ "$rc" = 1 ]
check "port in use: one message naming the port ($out)" \
  bash -c '[ "$(printf "%s\n" "$1" | wc -l)" = 1 ] && [[ "$1" == *"port $2 "*"in use"* ]]' _ "$out" "$port"
check "port in use: no cluster directory left" [ ! -e "$D" ]

# --- a component that fails once the others run: one message naming it, and all of it stopped ----
out=$(GPULET_CLUSTER_PROFILE=no-such-machine "$cluster" up "$build" 2>&1); rc=$?
check "failed start (bad GPU profile): cluster up exits 1" [ "$rc" = 1 ]
check "failed start: the message names the device plugin ($(printf '%s' "$out" | grep -m1 exited))" \
  bash -c '[[ "$1" == *"gpulet-device-plugin exited while waiting for nvidia.com/gpu"* ]]' _ "$out"
no_leftovers "failed start" ""

# --- the cluster the scenarios share ---------------------------------------------------------------
if "$cluster" up "$build"; then
  touch "$STATE/started"
  read -r t0 t1 < "$D/startup-times"
  echo "figure: cluster up -> nvidia.com/gpu allocatable: $(elapsed "$t0" "$t1") s"
else
  check "cluster up" false
fi
finish
