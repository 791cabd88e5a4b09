#!/usr/bin/env bash
# make gpu-check: what gpulet does on a real NVIDIA GPU host, measured against the host's own
# nvidia-smi, printed as one table (check | result | detail). Rows:
#   inventory, the host's NVML found under --host-root, labels, CDI spec, agent + kubelet emulator
#   Allocate, exporter values under load, NVML-only RSS beside the exporter's, interposer memory
#   limit through the driver API (one process and 8 racing ones, with nvidia-smi's per-process
#   view; one program built against glibc 2.31), PyTorch under a limit, compute share for large and
#   small kernels, and a container started through gpulet-container-runtime and runc with
#   nvidia-smi inside (GPU named by a CDI annotation, as the device plugin does).
# Without a GPU it prints "skipped: no NVIDIA GPU" and exits 0, so CI (no GPU) can call it.
#
# usage: testing/gpu_check/check.sh [BUILD_DIR]   (default build; a bundle made by
#        testing/gpu_check/bundle.sh has the same layout plus lib/deps for hosts without the
#        build's shared libraries). Needs root for the container row (skipped otherwise).
# Exit status: 0 when no row FAILed, 1 otherwise. Rows that cannot run say SKIP and why.
set -u
B=$(cd "${1:-build}" 2>/dev/null && pwd) || B=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU"
  exit 0
fi
if [[ ! -x $B/bin/gpulet ]]; then
  echo "gpu-check: $B/bin/gpulet not found: build first (make build) or pass a bundle directory" >&2
  exit 2
fi
[[ -d $B/lib/deps ]] && export LD_LIBRARY_PATH=$B/lib/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
G=$B/bin/gpulet
T=$(mktemp -d /tmp/gpulet-gpu-check.XXXXXX)
PY=$(command -v python3 || true)
HAVE_TORCH=no
[[ -n $PY ]] && timeout 60 "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null &&
  HAVE_TORCH=yes
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
trap '' PIPE  # a probe that died early must fail its row, not kill the check with SIGPIPE
FAILED=0
ROWS=()
row() {  # row CHECK RESULT DETAIL
  ROWS+=("$(printf '| %-30s | %-4s | %s |' "$1" "$2" "$3")")
  [[ $2 == FAIL ]] && FAILED=1
  printf '%-30s %-4s %s\n' "$1" "$2" "$3" >&2  # progress while it runs
}
kv() { awk -v k="$1" '$1 == k { print $2; exit }' "$2"; }  # kv KEY FILE: first "KEY value"
smi() { nvidia-smi --query-gpu="$1" --format=csv,noheader,nounits -i 0 | head -1 | sed 's/ *$//'; }
smi_pid_mib() {  # nvidia-smi's used memory of one process, MiB ("none" if it has no context)
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
    awk -F', *' -v p="$1" '$1 == p { print $2; f = 1 } END { if (!f) print "none" }'
}
fetch() {  # curl where there is one, else python's urllib
  if command -v curl >/dev/null; then curl -s "$1"
  else "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1"; fi
}
host_lib() { ldconfig -p 2>/dev/null | awk -v l="$1" '$1 == l && /x86-64/ { print $NF; exit }'; }  # by soname
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null; }

NAME=$(smi name); UUID=$(smi uuid); MEM=$(smi memory.total); DRV=$(smi driver_version)
echo "gpu-check: $NAME $UUID ${MEM} MiB, driver $DRV, torch $HAVE_TORCH, build $B" >&2

# 1. Inventory: every GPU nvidia-smi lists, with its name and UUID, and the driver version.
if timeout 60 "$G" info >"$T/info" 2>&1; then
  want=$(nvidia-smi -L | grep -c '^GPU '); got=$(grep -c '^GPU [0-9]*: ' "$T/info")
  missing=$(nvidia-smi -L | sed -n 's/^GPU [0-9]*: \(.*\)$/\1/p' | while read -r l; do
    grep -qF "$l" "$T/info" || echo "$l"; done)
  if [[ $want == "$got" && -z $missing ]] && grep -q "$DRV" "$T/info"; then
    row inventory PASS "$got GPU(s) as nvidia-smi -L: $NAME, $UUID; driver $DRV"
  else
    row inventory FAIL "gpulet info lists $got GPU(s), nvidia-smi $want; not in gpulet info: ${missing:-driver $DRV}"
  fi
else
  row inventory FAIL "gpulet info: $(tail -c 300 "$T/info" | tr '\n' ' ')"
fi

# 1b. NVML as the agent's image finds it: in its container the loader has no driver, so
#     `--host-root` makes agent, install and validate look for the host's libnvidia-ml (its ld cache,
#     the library directories, a driver container's root) and dlopen that path. "/." is this host's
#     root under another name (a root of "/" skips the lookup). The runtime step may fail here.
timeout 60 "$G" validate --host-root /. --no-probe >"$T/hostnvml" 2>&1
lib=$(sed -n "s/.*NVML: the host's //p" "$T/hostnvml" | head -1)
if [[ -n $lib ]] && grep -q '^ok *driver:' "$T/hostnvml"; then
  row "host NVML lookup (--host-root)" PASS "found and loaded $lib"
else
  row "host NVML lookup (--host-root)" FAIL "$(grep -m2 -iE "nvml|driver" "$T/hostnvml" | tr '\n' ' ' | head -c 300)"
fi

# 2. Labels.
if timeout 60 "$G" labels --oneshot --output "$T/labels" --no-timestamp >"$T/labels.log" 2>&1; then
  want_product=$(echo "$NAME" | tr ' ' '-')
  got_product=$(sed -n 's/^nvidia.com\/gpu.product=//p' "$T/labels")
  got_mem=$(sed -n 's/^nvidia.com\/gpu.memory=//p' "$T/labels")
  got_cc=$(sed -n 's/^nvidia.com\/gpu.compute.major=//p' "$T/labels").$(sed -n 's/^nvidia.com\/gpu.compute.minor=//p' "$T/labels")
  want_cc=$(smi compute_cap 2>/dev/null || echo "$got_cc")
  if [[ $got_product == "$want_product" && $got_mem == "$MEM" && $got_cc == "$want_cc" ]]; then
    row labels PASS "product $got_product, memory $got_mem, compute $got_cc, $(wc -l <"$T/labels") labels"
  else
    row labels FAIL "product $got_product (want $want_product), memory $got_mem (want $MEM), compute $got_cc (want $want_cc)"
  fi
else
  row labels FAIL "$(tail -c 300 "$T/labels.log" | tr '\n' ' ')"
fi

# 3. CDI spec: every host path exists; nvidia-smi in it is the real binary, not a wrapper script.
mkdir -p "$T/cdi"
if timeout 60 "$G" cdi generate --output "$T/cdi/gpulet.json" --hook-path "$B/bin/gpulet-container-hook" \
    >"$T/cdi.log" 2>&1; then
  "$PY" - "$T/cdi/gpulet.json" >"$T/cdi.check" 2>&1 <<'EOF'
import json, os, sys
spec = json.load(open(sys.argv[1]))
edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in spec.get("devices", [])]
mounts = [m for e in edits for m in e.get("mounts", [])]
nodes = [n for e in edits for n in e.get("deviceNodes", [])]
missing = [m["hostPath"] for m in mounts if not os.path.exists(m["hostPath"])]
missing += [n.get("hostPath", n["path"]) for n in nodes if not os.path.exists(n.get("hostPath", n["path"]))]
smi = [m["hostPath"] for m in mounts if os.path.basename(m["containerPath"]) == "nvidia-smi"]
scripts = [p for p in smi if open(p, "rb").read(2) == b"#!"]
real = [p for p in smi if open(p, "rb").read(4) == b"\x7fELF"]
print(f"mounts {len(mounts)}")
print(f"nodes {len(nodes)}")
print(f"devices {len(spec.get('devices', []))}")
print(f"missing {','.join(missing) or '-'}")
print(f"smi_real {','.join(real) or '-'}")
print(f"smi_scripts {','.join(scripts) or '-'}")
EOF
  miss=$(kv missing "$T/cdi.check"); real=$(kv smi_real "$T/cdi.check")
  detail="$(kv mounts "$T/cdi.check") mounts, $(kv nodes "$T/cdi.check") nodes, $(kv devices "$T/cdi.check") devices; nvidia-smi ELF: $real; wrappers: $(kv smi_scripts "$T/cdi.check")"
  if [[ $miss == - && $real != - ]]; then row "CDI spec" PASS "$detail"
  else row "CDI spec" FAIL "$detail; missing host paths: $miss"; fi
else
  row "CDI spec" FAIL "$(tail -c 300 "$T/cdi.log" | tr '\n' ' ')"
fi

# 4. The device plugin behind the kubelet emulator: registration, health, Allocate.
mkdir -p "$T/kubelet"
if [[ -x $B/bin/gpulet-kubelet-check ]]; then
  timeout 60 "$B/bin/gpulet-kubelet-check" "$T/kubelet" nvidia.com/gpu 40 >"$T/kubelet.out" 2>&1 &
  kpid=$!
  for _ in $(seq 50); do [[ -S $T/kubelet/kubelet.sock ]] && break; sleep 0.1; done
  t0=$(date +%s%N)
  "$G" device-plugin --device-plugin-dir "$T/kubelet" \
    --pod-resources-socket "$T/kubelet/pr.sock" >"$T/plugin.log" 2>&1 &
  ppid=$!; pids+=("$ppid")
  wait "$kpid"; krc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  kill "$ppid" 2>/dev/null
  alloc=$(kv allocated "$T/kubelet.out"); env=$(grep -o 'NVIDIA_VISIBLE_DEVICES=[^ ]*' "$T/kubelet.out" | head -1)
  if [[ $krc == 0 && -n $alloc ]] && nvidia-smi -L | grep -q "UUID: $alloc)"; then
    row "agent + kubelet Allocate" PASS "$(kv devices "$T/kubelet.out") device(s), $(kv healthy "$T/kubelet.out") healthy; allocated $alloc, $env; start->allocated ${ms} ms"
  else
    row "agent + kubelet Allocate" FAIL "rc $krc: $(tail -c 200 "$T/kubelet.out" | tr '\n' ' ') plugin: $(tail -c 200 "$T/plugin.log" | tr '\n' ' ')"
  fi
else
  row "agent + kubelet Allocate" SKIP "no $B/bin/gpulet-kubelet-check"
fi

# 5. The exporter under load, against nvidia-smi; its RSS; NVML-only RSS for comparison.
PORT=19400
"$G" exporter --address "127.0.0.1:$PORT" --interval 1s --families gpulet,dcgm,nvidia-smi \
  --pod-resources-socket "" --kubelet-checkpoint "" --vgpu-accounting-dir "" >"$T/exporter.log" 2>&1 &
epid=$!; pids+=("$epid")
load=""
if [[ $HAVE_TORCH == yes ]]; then
  "$PY" "$here/torch_probe.py" matmul 8192 9 >/dev/null 2>&1 &
  load=$!; pids+=("$load")
fi
sleep 6
fetch "http://127.0.0.1:$PORT/metrics" >"$T/metrics"
s_util=$(smi utilization.gpu); s_used=$(smi memory.used)
# The value is the last field: label values may hold spaces ("NVIDIA H200 NVL").
e_util=$(awk '/^DCGM_FI_DEV_GPU_UTIL\{/ { print $NF; exit }' "$T/metrics")
e_used=$(awk '/^DCGM_FI_DEV_FB_USED\{/ { print $NF; exit }' "$T/metrics")
fams=$(grep -c '^# TYPE ' "$T/metrics"); smi_fams=$(grep -c '^# TYPE nvidia_smi_' "$T/metrics")
# The GPM-backed profiling families (DCGM_FI_PROF_PCIE_* come from plain NVML counters).
gpm='DCGM_FI_PROF_(GR_ENGINE_ACTIVE|SM_ACTIVE|SM_OCCUPANCY|PIPE_[A-Z0-9_]*_ACTIVE|DRAM_ACTIVE)'
prof=$(grep -E "^# TYPE $gpm " "$T/metrics" | awk '{ printf "%s%s", s, $3; s = "," }')
prof_vals=$(grep -E "^$gpm\\{" "$T/metrics" | sed 's/{.*}//' |
  awk '{ sub(/DCGM_FI_PROF_/, "", $1); printf "%s%s=%s", s, $1, $NF; s = " " }')
erss=$(rss_kib "$epid")
[[ -n $load ]] && wait "$load" 2>/dev/null
if [[ -n $e_util && -n $e_used ]]; then
  du=$(awk -v a="$e_util" -v b="$s_util" 'BEGIN { d = a - b; print (d < 0 ? -d : d) }')
  dm=$(awk -v a="$e_used" -v b="$s_used" 'BEGIN { d = a - b; print (d < 0 ? -d : d) }')
  res=PASS; [[ $(awk -v d="$du" 'BEGIN { print (d > 10) }') == 1 || $(awk -v d="$dm" 'BEGIN { print (d > 64) }') == 1 ]] && res=FAIL
  row "exporter vs nvidia-smi" $res "util $e_util vs $s_util %, used $e_used vs $s_used MiB (load: $([[ -n $load ]] && echo torch matmul || echo none))"
else
  row "exporter vs nvidia-smi" FAIL "no DCGM_FI_DEV_GPU_UTIL/FB_USED in the scrape: $(tail -c 200 "$T/exporter.log" | tr '\n' ' ')"
fi
row "exporter families" INFO "$fams families, $smi_fams nvidia_smi_*; exporter RSS ${erss:-?} KiB"
if [[ -n $prof ]]; then row "profiling (GPM)" PASS "$prof; $prof_vals"
else row "profiling (GPM)" FAIL "no GPM-backed DCGM_FI_PROF_* families served"; fi
if [[ -x $B/bin/nvml_rss ]]; then
  # What NVML alone costs a process (dlopen, init, one sample of every GPU), beside the exporter.
  timeout 60 "$B/bin/nvml_rss" >"$T/nvml_rss" 2>&1
  last=$(tail -1 "$T/nvml_rss")
  row "NVML-only process RSS" INFO "${last:-no output}; exporter ${erss:-?} KiB"
fi
kill "$epid" 2>/dev/null

# The GPU layer's conformance suite against the real NVML (GPM plausibility included).
if [[ -x $B/tests/gpu_real_nvml_test ]]; then
  timeout 120 "$B/tests/gpu_real_nvml_test" >"$T/conf" 2>&1; rc=$?
  sum=$(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \] [0-9]+ test' "$T/conf" | sed 's/, listed below://' | tr -s ' ' | tr '\n' ' ')
  if [[ $rc == 0 ]] && ! grep -qE '^\[  PASSED  \] [1-9]' "$T/conf"; then row "GPU layer conformance" SKIP "$sum"
  elif [[ $rc == 0 ]]; then row "GPU layer conformance" PASS "$sum"
  else row "GPU layer conformance" FAIL "$sum $(grep -m3 -E 'Failure|error' "$T/conf" | tr '\n' ' ' | head -c 300)"; fi
fi

# 6. Interposer, driver API: one process and eight racing ones under one 1 GiB limit; what the
#    interposer let them hold and what nvidia-smi says they hold on the device.
VC=$B/lib/libgpulet-vcuda.so
PROBE=$B/tests/vcuda_probe
LIMIT=$((1 << 30))
if [[ -f $VC && -x $PROBE ]]; then
  fill_group() {  # fill_group N: N probes on one accounting file; sets held_total smi_total
    local n=$1 acct=$T/acct.$1 i
    local -a in out ps
    held_total=0; smi_total=0
    for ((i = 0; i < n; ++i)); do
      mkfifo "$T/in.$n.$i"
      # No `timeout` in front: nvidia-smi must see the probe's own pid (cleanup kills it).
      env LD_PRELOAD="$VC" GPULET_VGPU_MEMORY_LIMIT=$LIMIT GPULET_VGPU_ACCOUNTING="$acct" \
        NVIDIA_VISIBLE_DEVICES="$UUID" "$PROBE" ctxfill $((64 << 20)) \
        <"$T/in.$n.$i" >"$T/out.$n.$i" 2>&1 &
      ps[i]=$!; pids+=("$!")
      exec {fd}>"$T/in.$n.$i"; in[i]=$fd
    done
    for ((i = 0; i < n; ++i)); do echo go >&"${in[i]}"; done
    for ((i = 0; i < n; ++i)); do
      for _ in $(seq 600); do grep -q '^held' "$T/out.$n.$i" && break; sleep 0.1; done
      h=$(kv held "$T/out.$n.$i"); held_total=$((held_total + ${h:-0}))
    done
    sleep 0.5
    for ((i = 0; i < n; ++i)); do
      m=$(smi_pid_mib "${ps[i]}"); [[ $m =~ ^[0-9]+$ ]] && smi_total=$((smi_total + m))
    done
    for ((i = 0; i < n; ++i)); do exec {in[i]}>&-; done
    wait "${ps[@]}" 2>/dev/null
  }
  fill_group 1
  res=PASS; ((smi_total > 1024 || held_total > LIMIT)) && res=FAIL
  row "driver API, 1 GiB, 1 process" $res "allocations held $((held_total >> 20)) MiB; nvidia-smi shows $smi_total MiB for it"
  fill_group 8
  res=PASS; ((smi_total > 1024 || held_total > LIMIT)) && res=FAIL
  row "driver API, 1 GiB, 8 processes" $res "allocations held $((held_total >> 20)) MiB together; nvidia-smi shows $smi_total MiB for them"
  # The same limit in an Ubuntu 20.04-era userland: a program built against glibc 2.31, run by that
  # glibc's loader with the host driver's libcuda, the interposer preloaded (it binds only
  # GLIBC_2.17-era symbols: src/vgpu/interposer/glibc_floor.h).
  OLD=$B/lib/glibc-2.31
  if [[ -x $B/tests/alloc-glibc2.31 && -x $OLD/ld-linux-x86-64.so.2 ]]; then
    drv=$(host_lib libcuda.so.1)
    env LD_PRELOAD="$VC" GPULET_VGPU_MEMORY_LIMIT=$LIMIT GPULET_VGPU_ACCOUNTING="$T/acct.old" \
      GPULET_VGPU_UUID="$UUID" "$OLD/ld-linux-x86-64.so.2" --library-path "$OLD:$(dirname "${drv:-/x}")" \
      "$B/tests/alloc-glibc2.31" 64 64 3 >"$T/old" 2>&1 &
    opid=$!; pids+=("$opid")
    for _ in $(seq 300); do grep -q '^held' "$T/old" && break; sleep 0.1; done
    sleep 0.5; m=$(smi_pid_mib "$opid"); wait "$opid" 2>/dev/null
    read -r _ h _ r _ t < <(grep '^held' "$T/old")
    res=PASS; [[ $r == 2 && $m =~ ^[0-9]+$ ]] && ((m <= 1024)) || res=FAIL
    row "1 GiB, glibc 2.31 program" $res "held ${h:-?} MiB, then ${r:-no} refusal (2 = out of memory), total shown ${t:-?} MiB; nvidia-smi shows ${m:-?} MiB $(grep -v '^held' "$T/old" | head -c 200 | tr '\n' ' ')"
  else
    row "1 GiB, glibc 2.31 program" SKIP "no tests/alloc-glibc2.31 in $B (bundle.sh builds it)"
  fi
  # Launch-bound work under a 50 % share must not be slowed below its share (issue 24.4).
  "$PROBE" latency 20000 >"$T/lat0" 2>&1
  env LD_PRELOAD="$VC" GPULET_VGPU_CORE_LIMIT=50 GPULET_VGPU_ACCOUNTING="$T/acct.lat" \
    NVIDIA_VISIBLE_DEVICES="$UUID" "$PROBE" latency 20000 >"$T/lat50" 2>&1
  a=$(kv launch_us "$T/lat0"); b=$(kv launch_us "$T/lat50")
  res=PASS; [[ -z $a || -z $b ]] || (( $(awk -v a="$a" -v b="$b" 'BEGIN { print (b > 1.5 * a + 0.5) }') )) && res=FAIL
  row "empty kernel, 50 % limit" $res "${b:-?} us per launch vs ${a:-?} us unlimited"
  # The GPU time a kernel-bound program gets under a 30 % share (kernels that spin on the GPU
  # clock): long (1 ms) and short (20 us) kernels. Not host-bound, unlike small matmuls from Python.
  for us in 1000 20; do
    env LD_PRELOAD="$VC" GPULET_VGPU_CORE_LIMIT=30 GPULET_VGPU_ACCOUNTING="$T/acct.busy$us" \
      NVIDIA_VISIBLE_DEVICES="$UUID" "$PROBE" busy 5 $us >"$T/busy$us" 2>&1
    b=$(kv busy_share "$T/busy$us")
    res=PASS; [[ -z $b ]] || (( $(awk -v b="$b" 'BEGIN { print (b < 27 || b > 33) }') )) && res=FAIL
    row "GPU time, 30 %, ${us} us kernels" $res "${b:-?} % of the GPU's time (target 27-33)"
  done
  # Shares as floors (issue 20.2): greedy processes side by side, each paced at its share, running
  # fixed-work kernels (their duration is the SM time they get); a share is a process's kernel rate
  # beside the others divided by the rate alone, unlimited. Same as interposer_gpu_share_test.
  "$PROBE" workcal 1000 >"$T/wcal" 2>&1
  it=$(kv iters "$T/wcal")
  "$PROBE" work 4 "${it:-1000}" >"$T/walone" 2>&1
  alone=$(kv rate "$T/walone")
  for mix in "10 90" "30 50" "30 30 40"; do
    i=0; fps=()
    for s in $mix; do
      env LD_PRELOAD="$VC" GPULET_VGPU_CORE_LIMIT=$s GPULET_VGPU_MEMORY_LIMIT=$((8 << 30)) \
        GPULET_VGPU_ACCOUNTING="$T/acct.floor.${mix// /_}.$i" NVIDIA_VISIBLE_DEVICES="$UUID" \
        "$PROBE" work 8 "${it:-1000}" >"$T/floor.$i" 2>&1 &
      fps+=("$!"); pids+=("$!"); i=$((i + 1))
    done
    wait "${fps[@]}" 2>/dev/null
    got=""; res=PASS; i=0
    for s in $mix; do
      g=$(awk -v r="$(kv rate "$T/floor.$i")" -v a="$alone" 'BEGIN { if (a > 0 && r > 0) printf "%.1f", 100 * r / a; else print "?" }')
      got="$got $s:$g"
      awk -v g="$g" -v s="$s" 'BEGIN { exit !(g == "?" || g < s - 5 || g > s + 5) }' && res=FAIL
      i=$((i + 1))
    done
    row "shares ${mix// //} side by side" $res "share:got %${got} of the rate alone (target +-5 points)"
  done
else
  row "interposer (driver API)" SKIP "no $VC or $PROBE"
fi

# 7. PyTorch under the interposer: the limit as CUDA reports it, what it may hold, nvidia-smi's view;
#    compute share for large and small kernels.
if [[ $HAVE_TORCH == yes && -f $VC ]]; then
  env LD_PRELOAD="$VC" GPULET_VGPU_MEMORY_LIMIT=$((4 << 30)) NVIDIA_VISIBLE_DEVICES="$UUID" \
    GPULET_VGPU_ACCOUNTING="$T/acct.torch" timeout 120 "$PY" "$here/torch_probe.py" mem >"$T/tmem" 2>&1
  total=$(kv total_mib "$T/tmem"); held=$(kv held_mib "$T/tmem"); used=$(kv smi_used_mib "$T/tmem")
  res=PASS; [[ $total != 4096 || $(kv oom "$T/tmem") != yes || ! $used =~ ^[0-9]+$ ]] && res=FAIL
  [[ $used =~ ^[0-9]+$ ]] && ((used > 4096)) && res=FAIL
  row "PyTorch, 4 GiB limit" $res "sees total ${total:-?} MiB, held ${held:-?} MiB then OOM=$(kv oom "$T/tmem"); nvidia-smi shows ${used:-?} MiB for it"
  # With each run: nvidia-smi's utilization (the share of time a kernel ran), SM clock and power,
  # read halfway through by the probe. A loop that keeps the GPU busy less than its share is not
  # meant to be slowed; a GPU that runs cooler under a share may clock higher than under full load.
  for n in 8192 1024; do
    timeout 60 "$PY" "$here/torch_probe.py" matmul $n 6 >"$T/mm0" 2>&1
    env LD_PRELOAD="$VC" GPULET_VGPU_CORE_LIMIT=30 NVIDIA_VISIBLE_DEVICES="$UUID" \
      GPULET_VGPU_ACCOUNTING="$T/acct.mm$n" timeout 60 "$PY" "$here/torch_probe.py" matmul $n 6 >"$T/mm30" 2>&1
    a=$(kv tflops "$T/mm0"); b=$(kv tflops "$T/mm30")
    pct=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.1f", 100 * b / a; else print "?" }')
    res=PASS; [[ $pct == "?" ]] || (( $(awk -v p="$pct" 'BEGIN { print (p < 27 || p > 33) }') )) && res=FAIL
    row "compute 30 %, ${n}^3 bf16" $res "$b of $a TFLOP/s = $pct % (target 27-33); util %,SM MHz,W unlimited $(kv smi "$T/mm0"), limited $(kv smi "$T/mm30")"
  done
  timeout 60 "$PY" "$here/torch_probe.py" launch 20000 >"$T/l0" 2>&1
  env LD_PRELOAD="$VC" GPULET_VGPU_CORE_LIMIT=50 NVIDIA_VISIBLE_DEVICES="$UUID" \
    GPULET_VGPU_ACCOUNTING="$T/acct.launch" timeout 60 "$PY" "$here/torch_probe.py" launch 20000 >"$T/l50" 2>&1
  a=$(kv us_per_launch "$T/l0"); b=$(kv us_per_launch "$T/l50")
  res=PASS; [[ -z $a || -z $b ]] || (( $(awk -v a="$a" -v b="$b" 'BEGIN { print (b > 1.5 * a + 1) }') )) && res=FAIL
  row "small kernels, 50 % limit" $res "${b:-?} us per launch-bound op vs ${a:-?} us unlimited"
else
  row "PyTorch under the interposer" SKIP "torch with CUDA not importable by ${PY:-python3}"
fi

# 8. A container through gpulet-container-runtime and runc, with nvidia-smi inside. The rootfs is a
#    static busybox plus the host's glibc (nvidia-smi is dynamically linked).
RUNC=$(command -v runc || true); [[ -x $B/bin/runc ]] && RUNC=$B/bin/runc
BUSYBOX=$(command -v busybox || true); [[ -x $B/bin/busybox ]] && BUSYBOX=$B/bin/busybox
if [[ $(id -u) != 0 ]]; then
  row "container (shim + runc)" SKIP "needs root"
elif [[ -z $RUNC || -z $BUSYBOX ]]; then
  row "container (shim + runc)" SKIP "no runc or busybox (bundle.sh carries both)"
elif [[ ! -f $T/cdi/gpulet.json ]]; then
  row "container (shim + runc)" SKIP "no CDI spec (row CDI spec failed)"
else
  bundle=$T/bundle; r=$bundle/rootfs
  mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/lib64" "$r/lib/x86_64-linux-gnu"
  cp "$BUSYBOX" "$r/bin/busybox"; ln -s busybox "$r/bin/sh"
  for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
    f=$(host_lib "$l")
    [[ -n $f ]] && cp -L "$f" "$r/lib/x86_64-linux-gnu/$l"
  done
  cp -L /lib64/ld-linux-x86-64.so.2 "$r/lib64/"
  (cd "$bundle" && "$RUNC" spec)
  "$PY" - "$bundle/config.json" <<'EOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
c["process"]["terminal"] = False
c["process"]["args"] = ["/bin/sh", "-c", "nvidia-smi -L; ls /dev | grep nvidia | tr '\\n' ' '"]
c["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=void")
# As the device plugin's cdi-annotations strategy hands it over (an unprivileged container's own
# NVIDIA_VISIBLE_DEVICES is not trusted by default).
c["annotations"] = {"cdi.k8s.io/gpulet-gpu-check": "nvidia.com/gpu=0"}
c["process"]["env"].append("NVIDIA_DRIVER_CAPABILITIES=compute,utility")
c["root"]["readonly"] = False
json.dump(c, open(p, "w"))
EOF
  cat >"$T/runtime.json" <<EOF
{"mode": "cdi", "runtimes": ["$RUNC"], "spec-dirs": ["$T/cdi"], "hook-path": "$B/bin/gpulet-container-hook"}
EOF
  cid=gpulet-gpu-check-$$
  GPULET_RUNTIME_CONFIG=$T/runtime.json timeout 60 "$B/bin/gpulet-container-runtime" run \
    --bundle "$bundle" "$cid" >"$T/ctr.out" 2>&1 </dev/null
  rc=$?
  "$RUNC" delete -f "$cid" >/dev/null 2>&1
  if [[ $rc == 0 ]] && grep -q "^GPU 0: .*$UUID" "$T/ctr.out"; then
    row "container (shim + runc)" PASS "nvidia-smi -L inside: $(grep '^GPU 0' "$T/ctr.out" | head -c 80); /dev: $(tail -1 "$T/ctr.out" | head -c 120)"
  else
    row "container (shim + runc)" FAIL "rc $rc: $(tail -c 400 "$T/ctr.out" | tr '\n' ' ')"
  fi
fi

echo
echo "gpulet gpu-check on $NAME ($MEM MiB), driver $DRV, $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| check                          | res  | detail |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
exit $FAILED
