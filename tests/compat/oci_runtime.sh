#!/bin/bash
# compat.oci_runtime: NVIDIA's nvidia-container-runtime (v1.20.2, mode auto) and
# gpulet-container-runtime (mode auto), each wrapping the real runc, on copies of the same bundle
# with the same request, against the same stand-in driver root (make-driver-root, whose
# libnvidia-ml is the fake on the simulated GPUs). The low-level runtime both are given is
# runc-capture (below): it saves the config.json the shim handed on, then execs runc. The
# container (busybox) prints what it sees: its /dev/nvidia* nodes, its NVIDIA mounts, its env.
# compare_oci.py compares the specs (devices, mounts, env, hooks) and the container views.
# Usage: oci_runtime.sh SRC BUILD [CASE...] | --bench N. Exit 77 without the peers, root, runc or
# busybox. KEEP=1 keeps the work directory (bundles, captured specs, outputs).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_peer nvidia-container-runtime nvidia-ctk nvidia-cdi-hook
need_root "runc containers and the stand-in driver root's device nodes (mknod)"
runc=$(command -v runc || true)
[ -n "$runc" ] || { echo "SKIPPED: runc is not installed"; exit 77; }
[ -x /bin/busybox ] || { echo "SKIPPED: busybox-static is not installed (the container's rootfs)"; exit 77; }
shift 2
work=$(mktemp -d /tmp/compat-oci.XXXXXX)
trap "${KEEP:+:} rm -rf $work" EXIT
profile=dgx-h100

"$BUILD/bin/gpulet" info --simulate "$profile" --sim-root "$work/sim" --json >"$work/topo.json"
version=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["driverVersion"])' "$work/topo.json")
gpus=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' "$work/topo.json")
uuid() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpus"][int(sys.argv[2])]["uuid"])' "$work/topo.json" "$1"; }
root=$work/root
"$SRC/tests/compat/make-driver-root" "$root" "$version" "$gpus" >/dev/null
cp "$BUILD/lib/fake/libnvidia-ml.so.1" "$root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.$version"
ldconfig -r "$root"
export GPULET_SIM_MACHINE=$profile GPULET_SIM_ROOT=$work/sim

# Each tool's CDI spec of that root, for the CDI-annotation requests (what each installs).
mkdir -p "$work/nvcdi" "$work/gpcdi"
"$NVBIN/nvidia-ctk" cdi generate --mode nvml --driver-root "$root" --dev-root "$root" \
  --nvidia-cdi-hook-path "$NVBIN/nvidia-cdi-hook" --format json --output "$work/nvcdi/nvidia.json" \
  >"$work/nvcdi.log" 2>&1 || { echo "FAIL: nvidia-ctk cdi generate"; tail -5 "$work/nvcdi.log"; exit 1; }
"$BUILD/bin/gpulet" cdi generate --simulate "$profile" --sim-root "$work/sim" --driver-root "$root" \
  --hook-path "$BUILD/bin/gpulet-container-hook" --output "$work/gpcdi/nvidia.json" >"$work/gpcdi.log" 2>&1 \
  || { echo "FAIL: gpulet cdi generate"; tail -5 "$work/gpcdi.log"; exit 1; }

# The low-level runtime of both shims: saves the edited config.json as $CAPTURE, then runc.
cat >"$work/runc-capture" <<EOF
#!/bin/sh
bundle=.
prev=
for a in "\$@"; do
  case "\$prev" in --bundle|-b) bundle=\$a ;; esac
  case "\$a" in --bundle=*) bundle=\${a#--bundle=} ;; esac
  prev=\$a
done
for a in "\$@"; do
  case "\$a" in create|run) cp "\$bundle/config.json" "\$bundle/captured.json" ;; esac
done
exec "$runc" "\$@"
EOF
chmod 755 "$work/runc-capture"

# NVIDIA's runtime: its config.toml found through XDG_CONFIG_HOME; the driver root is the stand-in.
mkdir -p "$work/xdg/nvidia-container-runtime"
cat >"$work/xdg/nvidia-container-runtime/config.toml" <<EOF
accept-nvidia-visible-devices-as-volume-mounts = true
[nvidia-container-cli]
root = "$root"
[nvidia-container-runtime]
runtimes = ["$work/runc-capture"]
mode = "auto"
debug = "$work/nvidia-runtime.log"
log-level = "debug"
[nvidia-container-runtime.modes.cdi]
spec-dirs = ["$work/nvcdi"]
[nvidia-ctk]
path = "$NVBIN/nvidia-ctk"
EOF
# (The device plugin's volume-mounts strategy needs the key above in NVIDIA's; gpulet's default.)
# gpulet's: the same choices. NVIDIA's accepts NVIDIA_VISIBLE_DEVICES from unprivileged
# containers by default; gpulet's only when told (docs/runtime.md, Security).
cat >"$work/gpulet-runtime.json" <<EOF
{"mode": "auto", "runtimes": ["$work/runc-capture"], "spec-dirs": ["$work/gpcdi"],
 "hook-path": "$BUILD/bin/gpulet-container-hook",
 "accept-nvidia-visible-devices-envvar-when-unprivileged": true}
EOF

# case | env of the container (space separated) | annotation (key=value), mount:ID,ID or empty
u1=$(uuid 1) u3=$(uuid 3)
cases=(
  "envvar-uuid|NVIDIA_VISIBLE_DEVICES=$u1|"
  "envvar-index|NVIDIA_VISIBLE_DEVICES=1,3|"
  "envvar-all|NVIDIA_VISIBLE_DEVICES=all|"
  "envvar-none|NVIDIA_VISIBLE_DEVICES=none|"
  "envvar-void|NVIDIA_VISIBLE_DEVICES=void|"
  "no-request||"
  "caps-all|NVIDIA_VISIBLE_DEVICES=$u3 NVIDIA_DRIVER_CAPABILITIES=all|"
  "cdi-annotation||cdi.k8s.io/device-plugin=nvidia.com/gpu=1,nvidia.com/gpu=3"
  "volume-mounts|NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices|mount:$u1,$u3"
)

make_bundle() {  # DIR ENV ANNOTATION
  local b=$1
  mkdir -p "$b/rootfs/bin" "$b/rootfs/proc" "$b/rootfs/sys" "$b/rootfs/dev" "$b/rootfs/etc" "$b/rootfs/tmp"
  cp /bin/busybox "$b/rootfs/bin/busybox"
  for a in sh ls cat env grep sort awk; do ln -s busybox "$b/rootfs/bin/$a"; done
  python3 - "$b" "$2" "$3" <<'PY'
import json, sys
b, env, ann = sys.argv[1], sys.argv[2].split(), sys.argv[3]
script = ("for d in /dev/nvidia*; do [ -e \"$d\" ] && ls -ln \"$d\" | awk '{print \"dev\", $1, $5, $6, $NF}'; done; "
          "awk '$5 ~ /nvidia|libcuda|cuda/ {print \"mount\", $5, $6}' /proc/self/mountinfo | sort; "
          "env | grep -E '^(NVIDIA_|CUDA_|GPULET_)' | sort | sed 's/^/env /'; "
          "[ -e /etc/ld.so.cache ] && grep -c libcuda /etc/ld.so.cache | sed 's/^/ldcache-libcuda /' || echo 'ldcache-libcuda none'")
with open(b + "/config.json") as f:
    spec = json.load(f)
spec["process"]["terminal"] = False
spec["process"]["args"] = ["/bin/sh", "-c", script]
spec["process"]["env"] = ["PATH=/bin"] + env
spec["root"] = {"path": "rootfs", "readonly": False}
spec["hostname"] = "compat"
if ann.startswith("mount:"):  # the device plugin's volume-mounts strategy: /dev/null per device
    for i in ann[len("mount:"):].split(","):
        spec["mounts"].append({"destination": "/var/run/nvidia-container-devices/" + i, "type": "bind",
                               "source": "/dev/null", "options": ["bind", "ro"]})
elif ann:
    k, v = ann.split("=", 1)
    spec["annotations"] = {k: v}
json.dump(spec, open(b + "/config.json", "w"), indent=1)
PY
}

run_container() {  # SHIM BUNDLE ID: output in BUNDLE.out, errors in BUNDLE.err
  local shim=$1 b=$2 id=$3 rc=0
  "$shim" --root "$work/runc-state" create --bundle "$b" "$id" >"$b.out" 2>"$b.err" </dev/null || return $?
  "$runc" --root "$work/runc-state" start "$id" 2>>"$b.err" || rc=$?
  for _ in $(seq 100); do
    "$runc" --root "$work/runc-state" state "$id" 2>/dev/null | grep -q '"status": "stopped"' && break
    sleep 0.1
  done
  "$runc" --root "$work/runc-state" delete --force "$id" 2>>"$b.err" || true
  return $rc
}

# --bench N: the shims' added time on `create` instead of the comparison (bench/compat/run.sh).
# The envvar-uuid bundle (one GPU); runc alone, runc via NVIDIA's, runc via gpulet's, taken in
# turn N times (interleaved, so drifting load hits all three alike); each `create` timed as a whole
# (fork to exit, createRuntime/createContainer hooks included, as containerd waits for it), the
# bundle's config.json restored and the container deleted outside the timing. Medians and p90.
if [ "${1:-}" = --bench ]; then
  n=${2:-30}
  for who in runc nvidia gpulet; do
    mkdir -p "$work/bench/$who"
    (cd "$work/bench/$who" && "$runc" spec)
    make_bundle "$work/bench/$who" "NVIDIA_VISIBLE_DEVICES=$u1" ""
    cp "$work/bench/$who/config.json" "$work/bench/$who/config.orig"
  done
  XDG_CONFIG_HOME=$work/xdg GPULET_RUNTIME_CONFIG=$work/gpulet-runtime.json python3 - "$work" "$n" "$runc" \
    "$NVBIN/nvidia-container-runtime" "$BUILD/bin/gpulet-container-runtime" <<'PY'
import shutil, statistics, subprocess, sys, time
work, n, runc, nv, gp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
shims = {"runc": runc, "nvidia": nv, "gpulet": gp}
ms = {k: [] for k in shims}
for i in range(n + 1):  # the first round warms the page cache, not counted
    for who, exe in shims.items():
        b = f"{work}/bench/{who}"
        shutil.copy(f"{b}/config.orig", f"{b}/config.json")
        cid = f"bench-{who}-{i}"
        t = time.perf_counter_ns()
        # Not a pipe: the created container holds its stdio until it is started or deleted.
        with open(f"{b}.err", "w") as err:
            r = subprocess.run([exe, "--root", f"{work}/runc-state", "create", "--bundle", b, cid],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        dt = (time.perf_counter_ns() - t) / 1e6
        subprocess.run([runc, "--root", f"{work}/runc-state", "delete", "--force", cid],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            sys.exit(f"{who} create failed: {open(b + '.err').read()[-300:]}")
        if i:
            ms[who].append(dt)
def p90(v):
    return sorted(v)[int(0.9 * (len(v) - 1))]
base = statistics.median(ms["runc"])
print(f"| create of a 1-GPU container (envvar, dgx-h100 stand-in root), {n} runs | median | p90 | added to runc alone (median) |")
print("|---|---|---|---|")
for who, label in (("runc", "runc alone"), ("nvidia", "nvidia-container-runtime v1.20.2 -> runc"),
                   ("gpulet", "gpulet-container-runtime -> runc")):
    m = statistics.median(ms[who])
    print(f"| {label} | {m:.1f} ms | {p90(ms[who]):.1f} ms | {'-' if who == 'runc' else f'{m - base:+.1f} ms'} |")
PY
  exit 0
fi

failed=0
ran=0
for c in "${cases[@]}"; do
  IFS='|' read -r name env ann <<<"$c"
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  ran=$((ran + 1))
  d=$work/$name
  for who in nvidia gpulet; do
    mkdir -p "$d/$who"
    (cd "$d/$who" && "$runc" spec)
    make_bundle "$d/$who" "$env" "$ann"
  done
  # create, as containerd calls it (NVIDIA's runtime edits the spec on create only), then start
  # and wait for the container to stop.
  rc_nv=0 rc_gp=0
  XDG_CONFIG_HOME=$work/xdg run_container "$NVBIN/nvidia-container-runtime" "$d/nvidia" "compat-nv-$name" || rc_nv=$?
  GPULET_RUNTIME_CONFIG=$work/gpulet-runtime.json run_container "$BUILD/bin/gpulet-container-runtime" \
    "$d/gpulet" "compat-gp-$name" || rc_gp=$?
  echo "== $name (${env:-no env}${ann:+, annotation $ann}): exit NVIDIA $rc_nv gpulet $rc_gp"
  if ! python3 "$SRC/tests/compat/compare_oci.py" "$d" "$rc_nv" "$rc_gp" "$root" "$name" | sed 's/^/   /'; then
    failed=$((failed + 1))
    for who in nvidia gpulet; do echo "   --- $who stderr (tail)"; tail -5 "$d/$who.err" | sed 's/^/   /'; done
  fi
done
echo "OCI runtime compatibility: $ran case(s), $failed with differences not in docs/compat.md"
[ $failed -eq 0 ]
