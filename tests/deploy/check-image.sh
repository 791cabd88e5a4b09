#!/usr/bin/env bash
# The gpulet image builds FROM scratch (Containerfile + deploy/image/stage-rootfs.sh, what
# `make image` runs) and its binaries start inside it: every shared library they need is there.
# Hermetic: podman storage in a temporary directory. Exit 77 = skipped (podman missing, not root).
set -uo pipefail
src=$1 build=$2
command -v podman >/dev/null || { echo "SKIP: podman is not installed"; exit 77; }
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root for podman storage and runc"; exit 77; }
tmp=$(mktemp -d /tmp/gpulet-image-XXXXXX)
trap 'podman --root "$tmp/storage" --runroot "$tmp/run" rmi -af >/dev/null 2>&1; rm -rf "$tmp"' EXIT
# The sandbox this may run in refuses podman's default RLIMIT_NOFILE; none is needed.
printf '[containers]\ndefault_ulimits = []\n' >"$tmp/containers.conf"
p=(env CONTAINERS_CONF="$tmp/containers.conf" podman --root "$tmp/storage" --runroot "$tmp/run")
"$src/deploy/image/stage-rootfs.sh" "$build" "$tmp/ctx" ||
  { echo "FAIL: deploy/image/stage-rootfs.sh $build could not stage the image's rootfs (its message is above)"; exit 1; }
"${p[@]}" build -q -f "$src/Containerfile" -t gpulet-test:latest "$tmp/ctx" >/dev/null ||
  { echo "FAIL: podman build of the Containerfile failed (its message is above)"; exit 1; }
# Read-only image with a /tmp of its own, as the DaemonSet's agent runs it: the validation probe's
# bundle (`runc spec`) goes to /tmp, nothing else needs a writable image.
out=$("${p[@]}" run --rm --network none --read-only --read-only-tmpfs=false --tmpfs /tmp \
  --entrypoint sh gpulet-test:latest -c \
  'gpulet --help && gpulet-container-runtime --version; runc --version; gpulet-container-hook; ls /usr/lib/libgpulet-vcuda.so; ls /bin/sh /bin/chroot /bin/timeout
   mkdir /tmp/bundle && runc spec --bundle /tmp/bundle && echo "bundle in /tmp: ok"
   touch /usr/x 2>/dev/null || echo "image is read-only"' 2>&1)
rc=0
for want in "Subcommands:" "validate" "install" "runc version" \
            "/usr/lib/libgpulet-vcuda.so" "/bin/chroot" "/bin/timeout" "bundle in /tmp: ok" \
            "image is read-only"; do
  grep -qF -- "$want" <<<"$out" || { echo "FAIL: the image's output lacks \"$want\""; rc=1; }
done
grep -q "error while loading shared libraries" <<<"$out" && { echo "FAIL: missing library"; rc=1; }
[[ $rc == 0 ]] && echo "ok   image builds and its binaries run" || echo "$out"
exit $rc
