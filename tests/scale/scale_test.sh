#!/bin/bash
# ctest scale.small (label cluster): the small version of the scale harness (tests/scale/run) --
# 100 nodes per set, bursts of 400 pods through the default scheduler (whole GPUs), gpulet's
# extender (binpack and spread) and DRA claims. Fails when a correctness check fails (a pod not
# bound within the timeout, an over-committed GPU, a bind error in the kube-scheduler log); the
# throughput figures are printed, not judged. Skips (77) unless GPULET_E2E_CLUSTER=1, which
# `make e2e-cluster` sets, and when the Go-built peers are missing (testing/k8s/build,
# testing/kwok/build). Needs no root. 67 s on 2 cores at load 1-3 (README "Scale").
# usage: scale_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
if [ "${GPULET_E2E_CLUSTER:-}" != 1 ]; then
  echo "skipped: the scale harness runs with GPULET_E2E_CLUSTER=1 (make e2e-cluster; make scale for the full one)"
  exit 77
fi
export SCALE_NODES=${SCALE_NODES:-100}
export SCALE_SCENARIOS=${SCALE_SCENARIOS:-whole:400 binpack:400 spread:400 dra:400}
export SCALE_TIMEOUT=${SCALE_TIMEOUT:-150}
export SCALE_OUT=${SCALE_OUT:-$build/scale/ctest-results.jsonl}
export SCALE_DIR=${SCALE_DIR:-$build/scale/ctest}
exec bash "$src/tests/scale/run" "$build"
