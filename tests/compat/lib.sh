# Shared by the tests/compat scripts: locate the NVIDIA peers or skip (exit 77) saying why.
# Sets SRC, BUILD, NVBIN; needs "$1" = source dir, "$2" = build dir.
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
