#!/usr/bin/env bash
# make gpu-bundle: what travels to a GPU host. It must pack the build's binaries with the shared
# libraries they load, never the fake libcuda / libnvidia-ml (the host's driver must answer there),
# and succeed when a packed tool is static (busybox made ldd fail, and the bundle with it).
set -u
bundle=$1 build=$2
[[ -x $build/bin/gpulet && -f $build/lib/libgpulet-vcuda.so ]] ||
  { echo "skipped: $build has no gpulet or libgpulet-vcuda.so (build them first)"; exit 77; }
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
out=$(bash "$bundle" "$build" "$t/b" 2>&1) || fail "bundle.sh failed: $out"
for f in bin/gpulet bin/gpulet-container-runtime bin/gpulet-container-hook lib/libgpulet-vcuda.so; do
  [[ -f $t/b/$f ]] || fail "$f is not in the bundle"
done
ls "$t/b/lib/deps" | grep -qE '^lib(cuda|nvidia-ml)\.' && fail "a fake driver library was packed: $(ls "$t/b/lib/deps")"
# The packed gpulet finds every library it needs in the bundle or in the C/C++ runtime.
missing=$(LD_LIBRARY_PATH=$t/b/lib/deps ldd "$t/b/bin/gpulet" | grep 'not found')
[[ -z $missing ]] || fail "the bundled gpulet misses: $missing"
LD_LIBRARY_PATH=$t/b/lib/deps "$t/b/bin/gpulet" --help >/dev/null 2>&1 || fail "the bundled gpulet does not run"
echo "bundle passed: $(ls "$t/b/lib/deps" | wc -l) libraries"
