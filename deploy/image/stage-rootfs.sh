#!/usr/bin/env bash
# Stages the gpulet image's root filesystem from a build tree, for `podman build` of Containerfile
# FROM scratch (no base image to pull): the binaries (stripped), every shared library they load
# (as ldd resolves them on this Debian 12 build host, at the same paths) with the dynamic loader,
# the interposer library, runc for `gpulet validate`'s probe container (the host's may need host
# libraries), and a static busybox (sh for the agent's shell-outs, chroot for engine
# restarts on the host, the probe container's rootfs for `gpulet validate`).
# Usage: stage-rootfs.sh BUILD_DIR OUT_DIR     (OUT_DIR/rootfs is replaced)
set -euo pipefail
build=${1:?BUILD_DIR} out=${2:?OUT_DIR}
bins=(gpulet gpulet-container-runtime gpulet-container-hook)
for b in "${bins[@]}"; do
  [[ -x $build/bin/$b ]] || { echo "stage-rootfs: $build/bin/$b is not built (make build)" >&2; exit 1; }
done
[[ -f $build/lib/libgpulet-vcuda.so ]] || { echo "stage-rootfs: $build/lib/libgpulet-vcuda.so is not built" >&2; exit 1; }
[[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1 ||
  { echo "stage-rootfs: needs a static /bin/busybox (apt-get install busybox-static)" >&2; exit 1; }

root=$out/rootfs
rm -rf "$root"
mkdir -p "$root"/{usr/bin,usr/lib,bin,tmp,etc,var/lib/gpulet}
chmod 1777 "$root/tmp"
for b in "${bins[@]}"; do
  install -m 0755 "$build/bin/$b" "$root/usr/bin/$b"
  strip --strip-unneeded "$root/usr/bin/$b"
done
# `gpulet install` looks for the interposer beside its own directory: /usr/bin/../lib.
install -m 0644 "$build/lib/libgpulet-vcuda.so" "$root/usr/lib/libgpulet-vcuda.so"
strip --strip-unneeded "$root/usr/lib/libgpulet-vcuda.so"

# Shared libraries: whatever ldd resolves (paths of the form "=> /path" and the bare loader path),
# copied at the path the binary asks for, symlinks resolved.
runc=$(command -v runc || true)
[[ -n $runc ]] || { echo "stage-rootfs: needs runc (apt-get install runc)" >&2; exit 1; }
install -m 0755 "$runc" "$root/usr/bin/runc"
for b in "${bins[@]/#/$build/bin/}" "$runc"; do
  ldd "$b" 2>/dev/null | awk '/=> \//{print $3} /^\t\//{print $1}' || true
done | sort -u | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done

# The C library's parts the NVIDIA driver's libraries load (libnvidia-ml, which the agent and
# install dlopen from the host under /host: runc injects no driver into their containers), beside
# the libc the binaries use.
libdir=$(dirname "$(ldd "$build/bin/gpulet" | awk '/libc\.so\.6 =>/{print $3}')")
for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
  [[ -e $root$libdir/$l ]] || { mkdir -p "$root$libdir"; cp -L "$libdir/$l" "$root$libdir/$l"; }
done

install -m 0755 /bin/busybox "$root/bin/busybox"
for a in sh chroot timeout ls cat; do ln -sf busybox "$root/bin/$a"; done
echo "root:x:0:0:root:/:/bin/sh" >"$root/etc/passwd"
echo "nonroot:x:65532:65532::/:/bin/sh" >>"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
du -sh "$root" | awk '{print "stage-rootfs: " $1 " in " r}' r="$root"
