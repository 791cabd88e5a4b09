# Shared by the tests/compat scripts: locate the NVIDIA peers or skip (exit 77) saying why.
# Sets SRC, BUILD, NVBIN; needs "$1" = source dir, "$2" = build dir.
# The scripts run under `set -euo pipefail`: a command that fails for a reason nobody checked ends
# the test at once. This trap (inherited by functions and subshells: -E) makes every such end say
# FAIL, where and which command, instead of leaving ctest a bare status 1. A check that can fail for
# an expected reason (a grep with no match, a missing directory) is written `|| true` or tested
# with `if`, and then says what it found itself.
set -E
trap 'echo "FAIL: ${BASH_SOURCE[0]##*/}:$LINENO: \`$BASH_COMMAND\` exited $? (an unchecked command failed)"' ERR
SRC=$(cd "$1" && pwd)
BUILD=$(cd "$2" && pwd)
NVBIN=${GPULET_NVIDIA_BIN:-$BUILD/nvidia/bin}
need_peer() {
  for b in "$@"; do
    if [ ! -x "$NVBIN/$b" ]; then
      echo "SKIPPED: NVIDIA's $b is not built in $NVBIN (run testing/nvidia/build $BUILD; needs Go and the module proxy)"
      exit 77
    fi
  done
}
need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "SKIPPED: needs root ($*)"
    exit 77
  fi
}
