#!/bin/bash
# compat.runtime_configure: `nvidia-ctk runtime configure` and `gpulet runtime configure` on copies
# of the same engine config; the engines' effective configuration (containerd's own `config dump`,
# docker's daemon.json, CRI-O's file merged with its drop-ins) must be the same but for what
# docs/compat.md lists. Then a node moves from NVIDIA's toolkit to gpulet and back: each step must
# leave a config containerd parses, whose `nvidia` runtime is the last configured tool's shim.
# Usage: runtime_configure.sh SRC BUILD. Exit 77 without nvidia-ctk. containerd 2.x: the binary of
# testing/k8s/build (BUILD/k8s/containerd2/bin) or $GPULET_CONTAINERD2; skipped (said) without one.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_peer nvidia-ctk
work=$(mktemp -d /tmp/compat-rc.XXXXXX)
trap 'rm -rf "$work"' EXIT
eff="python3 $SRC/tests/compat/effective_config.py"
nvctk=$NVBIN/nvidia-ctk
gpulet=$BUILD/bin/gpulet
shim=/usr/local/bin/gpu-shim   # the same runtime path for both: only the wiring is compared
failed=0
# Differences docs/compat.md gives reasons for ([containerd-cdi-annotations]): gpulet's runtime
# entry passes CDI annotations through to the shim, so the device plugin's cdi-annotations strategy
# works on containerd 1.6, whose CRI has no CDI.
normalise() { python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for name, rt in (d.get("runtimes") or {}).items():
    if isinstance(rt, dict) and rt.get("container_annotations") == ["cdi.k8s.io/*"]:
        rt["container_annotations"] = []
print(json.dumps(d, indent=1, sort_keys=True))' "$1"; }
compare() {  # name nvidia.json gpulet.json
  if diff -u <(normalise "$2") <(normalise "$3") >"$work/$1.diff"; then
    echo "== $1: same effective configuration ($(grep -c . "$2") lines compared)"
    if ! diff -q "$2" "$3" >/dev/null; then echo "   deliberate: [containerd-cdi-annotations] container_annotations = [\"cdi.k8s.io/*\"] on gpulet's entry"; fi
  else
    echo "== $1: DIFFERENT"; sed 's/^/   /' "$work/$1.diff"; failed=1
  fi
}
dump() {  # containerd-binary config.toml out.json
  "$1" --config "$2" config dump >"$3.toml" 2>"$3.err" || { echo "   containerd cannot parse $2:"; tail -3 "$3.err"; return 1; }
  $eff containerd "$3.toml" >"$3"
}

# containerd 1.6 (config version 2) and 2.x (version 3)
c2=${GPULET_CONTAINERD2:-$BUILD/k8s/containerd2/bin/containerd}
for v in 1.6 2.x; do
  bin=containerd
  if [ $v = 2.x ]; then
    if [ ! -x "$c2" ]; then echo "== containerd $v: skipped: no containerd 2.x binary ($c2; testing/k8s/build makes it)"; continue; fi
    bin=$c2
  fi
  command -v "$bin" >/dev/null || { echo "== containerd $v: skipped: containerd not installed"; continue; }
  d=$work/containerd-$v
  mkdir -p "$d/nv" "$d/gp"
  "$bin" config default >"$d/nv/config.toml"
  cp "$d/nv/config.toml" "$d/gp/config.toml"
  for flags in "" "--set-as-default --enable-cdi"; do
    "$nvctk" runtime configure --runtime=containerd --config="$d/nv/config.toml" \
      --drop-in-config="$d/nv/conf.d/99-nvidia.toml" --nvidia-runtime-path=$shim $flags >"$d/nv.log" 2>&1
    "$gpulet" runtime configure --runtime containerd --config "$d/gp/config.toml" \
      --drop-in-config "$d/gp/conf.d/99-gpulet.toml" --runtime-path $shim $flags >"$d/gp.log" 2>&1
    dump "$bin" "$d/nv/config.toml" "$d/nv.json" && dump "$bin" "$d/gp/config.toml" "$d/gp.json" || { failed=1; continue; }
    compare "containerd $v ${flags:-(defaults)}" "$d/nv.json" "$d/gp.json"
  done
done

# Docker
d=$work/docker
mkdir -p "$d/nv" "$d/gp"
echo '{"log-level": "info", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}' >"$d/nv/daemon.json"
cp "$d/nv/daemon.json" "$d/gp/daemon.json"
"$nvctk" runtime configure --runtime=docker --config="$d/nv/daemon.json" --nvidia-runtime-path=$shim --set-as-default --enable-cdi >"$d/nv.log" 2>&1
"$gpulet" runtime configure --runtime docker --config "$d/gp/daemon.json" --runtime-path $shim --set-as-default --enable-cdi >"$d/gp.log" 2>&1
$eff docker "$d/nv/daemon.json" >"$d/nv.json"; $eff docker "$d/gp/daemon.json" >"$d/gp.json"
compare "docker --set-as-default --enable-cdi" "$d/nv.json" "$d/gp.json"

# CRI-O: a main file with runc and crun entries; each tool writes a drop-in.
d=$work/crio
mkdir -p "$d/nv" "$d/gp"
cat >"$d/nv/crio.conf" <<'TOML'
[crio.runtime]
default_runtime = "runc"
[crio.runtime.runtimes.runc]
runtime_path = "/usr/bin/runc"
runtime_type = "oci"
runtime_root = "/run/runc"
allowed_annotations = ["io.kubernetes.cri-o.Devices"]
[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
runtime_type = "oci"
runtime_root = "/run/crun"
TOML
cp "$d/nv/crio.conf" "$d/gp/crio.conf"
"$nvctk" runtime configure --runtime=crio --config="$d/nv/crio.conf" --drop-in-config="$d/nv/crio.conf.d/99-nvidia.toml" --nvidia-runtime-path=$shim --set-as-default >"$d/nv.log" 2>&1
"$gpulet" runtime configure --runtime crio --config "$d/gp/crio.conf" --runtime-path $shim --set-as-default >"$d/gp.log" 2>&1
$eff crio "$d/nv/crio.conf" "$d/nv/crio.conf.d" >"$d/nv.json"; $eff crio "$d/gp/crio.conf" "$d/gp/crio.conf.d" >"$d/gp.json"
compare "crio --set-as-default" "$d/nv.json" "$d/gp.json"

# A containerd 1.6 node moving from NVIDIA's toolkit to gpulet and back.
if command -v containerd >/dev/null; then
  d=$work/migrate
  mkdir -p "$d"
  containerd config default >"$d/config.toml"
  step() {  # label expected-binary
    if ! dump containerd "$d/config.toml" "$d/$1.json"; then failed=1; return; fi
    got=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["runtimes"].get("nvidia",{}); print(r.get("options",{}).get("BinaryName"), d["default_runtime_name"])' "$d/$1.json")
    if [ "$got" = "$2 nvidia" ]; then echo "== migrate, $1: containerd parses it; nvidia -> $2 (default)"; else echo "== migrate, $1: FAIL: nvidia runtime/default is '$got', want '$2 nvidia'"; failed=1; fi
  }
  "$nvctk" runtime configure --runtime=containerd --config="$d/config.toml" --drop-in-config="$d/conf.d/99-nvidia.toml" \
    --nvidia-runtime-path=/usr/bin/nvidia-container-runtime --set-as-default >/dev/null 2>&1
  step "1 NVIDIA's toolkit" /usr/bin/nvidia-container-runtime
  "$gpulet" runtime configure --runtime containerd --config "$d/config.toml" --drop-in-config "$d/conf.d/99-gpulet.toml" \
    --runtime-path /usr/bin/gpulet-container-runtime --set-as-default >/dev/null 2>&1
  step "2 gpulet over it" /usr/bin/gpulet-container-runtime
  "$nvctk" runtime configure --runtime=containerd --config="$d/config.toml" --drop-in-config="$d/conf.d/99-nvidia.toml" \
    --nvidia-runtime-path=/usr/bin/nvidia-container-runtime --set-as-default >/dev/null 2>&1
  step "3 NVIDIA's again" /usr/bin/nvidia-container-runtime
fi
exit $failed
