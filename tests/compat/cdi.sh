#!/bin/bash
# compat.cdi: `nvidia-ctk cdi generate` and `gpulet cdi generate` on the same stand-in driver root
# (make-driver-root; its libnvidia-ml is the fake, which nvidia-ctk loads from the driver root) and
# the same simulated GPUs; compare_cdi.py compares the two specs.
# Usage: cdi.sh SRC BUILD. Exit 77 without the peers or root (device nodes need mknod).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_peer nvidia-ctk
need_root "the stand-in driver root's device nodes are made with mknod"
work=$(mktemp -d /tmp/compat-cdi.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
for c in dgx-h100:index dgx-h100:uuid a100-mig:index a100-mig:uuid pcie-t4:index; do
  profile=${c%:*} names=${c#*:}
  d=$work/$profile-$names
  mkdir -p "$d"
  "$BUILD/bin/gpulet" info --simulate "$profile" --sim-root "$d/sim" --json >"$d/topo.json"
  version=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["driverVersion"])' "$d/topo.json")
  gpus=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' "$d/topo.json")
  "$SRC/tests/compat/make-driver-root" "$d/root" "$version" "$gpus"
  # Both tools read MIG capability minors from the driver root; the sim root has the fake's.
  mkdir -p "$d/root/proc/driver/nvidia-caps" "$d/root/dev/nvidia-caps"
  cp "$d/sim/proc/driver/nvidia-caps/mig-minors" "$d/root/proc/driver/nvidia-caps/"
  cp -r "$d/sim/proc/driver/nvidia/capabilities" "$d/root/proc/driver/nvidia/" 2>/dev/null || true
  # The MIG capability nodes of the existing GPU/compute instances, as a MIG host has them.
  python3 - "$d/sim" "$d/root" <<'PY'
import glob, os, re, sys
sim, root = sys.argv[1], sys.argv[2]
major = int(re.search(r"^\s*(\d+) nvidia-caps$", open(sim + "/proc/devices").read(), re.M).group(1))
for f in glob.glob(sim + "/proc/driver/nvidia/capabilities/gpu*/mig/gi*/**/access", recursive=True):
    minor = int(re.search(r"DeviceFileMinor: (\d+)", open(f).read()).group(1))
    node = f"{root}/dev/nvidia-caps/nvidia-cap{minor}"
    if not os.path.exists(node):
        os.mknod(node, 0o444 | 0o020000, os.makedev(major, minor))
PY
  cp "$BUILD/lib/fake/libnvidia-ml.so.1" "$d/root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.$version"
  ldconfig -r "$d/root"
  # nvidia-ctk reads MIG capability files from the host's /proc/driver/nvidia/capabilities: the
  # sim root's, in a mount namespace of its own.
  GPULET_SIM_MACHINE=$profile GPULET_SIM_ROOT=$d/sim unshare -m sh -c \
    'mount --make-rprivate / && mount --bind "$0/proc/driver" /proc/driver && exec "$@"' "$d/sim" \
    "$NVBIN/nvidia-ctk" cdi generate --mode nvml \
    --driver-root "$d/root" --dev-root "$d/root" --device-name-strategy "$names" --format json \
    --output "$d/nvidia.json" >"$d/nvidia.log" 2>&1 || { echo "FAIL: nvidia-ctk cdi generate ($c)"; tail -5 "$d/nvidia.log"; failed=1; continue; }
  "$BUILD/bin/gpulet" cdi generate --simulate "$profile" --sim-root "$d/sim" --driver-root "$d/root" \
    --device-name-strategy "$names" --output "$d/gpulet.json" >"$d/gpulet.log" 2>&1 || { echo "FAIL: gpulet cdi generate ($c)"; tail -5 "$d/gpulet.log"; failed=1; continue; }
  echo "== $profile, device names by $names"
  python3 "$SRC/tests/compat/compare_cdi.py" "$d/nvidia.json" "$d/gpulet.json" "$d/topo.json" "$profile-$names" | sed 's/^/   /' || failed=1
done
exit $failed
