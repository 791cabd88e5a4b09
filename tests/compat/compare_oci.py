#!/usr/bin/env python3
"""Compares what nvidia-container-runtime and gpulet-container-runtime made of the same bundle.

usage: compare_oci.py CASE_DIR NVIDIA_EXIT GPULET_EXIT DRIVER_ROOT CASE

CASE_DIR/{nvidia,gpulet}/captured.json: the config.json each shim handed to runc (saved by
oci_runtime.sh's runc-capture); CASE_DIR/{nvidia,gpulet}.out: what the container saw (its
/dev/nvidia* nodes, its driver mounts, its NVIDIA_/GPULET_ env, libcuda in its ld cache). Prints one
line per difference and exits 1 when there is any that docs/compat.md ("OCI runtime") does not
list as deliberate. The deliberate ones, normalised here:
  [oci-modeset]   NVIDIA's runtime gives /dev/nvidia-modeset to every GPU container; gpulet only
                  with the `display` driver capability (libnvidia-container's rule).
  [oci-caps]      NVIDIA's jit-cdi mode mounts the video/graphics libraries (libnvidia-encode,
                  libnvidia-opticalflow, libnvcuvid) whatever NVIDIA_DRIVER_CAPABILITIES says;
                  gpulet only with `video` (or `all`), as libnvidia-container.
  [cdi-hooks]     hooks: NVIDIA's nvidia-ctk / nvidia-cdi-hook set (create-symlinks,
                  update-ldcache, apply-cuda-memory-limits, ...) vs gpulet-container-hook
                  update-ldcache; both must refresh the ld cache (checked in the container).
  [cdi-env]       NVIDIA_CTK_LIBCUDA_DIR and NVCT_EMPTY_DEVICE vs GPULET_DRIVER_VERSION /
                  GPULET_CUDA_DRIVER_VERSION.
  [cdi-void-mount] NVIDIA mounts /var/run/nvidia-container-devices/void.
Order is not compared (devices, mounts, env are sets: runc creates them all before the process).
"""
import json
import sys

import report

CAPS_LIBS = ("libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so")
TOOL_ENV = ("NVIDIA_CTK_LIBCUDA_DIR", "NVCT_EMPTY_DEVICE", "GPULET_DRIVER_VERSION",
            "GPULET_CUDA_DRIVER_VERSION")
VOID = "/var/run/nvidia-container-devices/void"


def main():
    d, rc_nv, rc_gp, root, case = sys.argv[1:6]
    diffs, notes = [], []
    if rc_nv != rc_gp:
        diffs.append(f"exit status: NVIDIA {rc_nv} gpulet {rc_gp}")
        return report.finish("same", notes, diffs, f"{case}: {len(diffs)} difference(s)")
    if rc_nv != "0":
        notes.append(f"both refuse the container (exit {rc_nv})")
        return report.finish("same", notes, diffs, f"{case}: both refuse")

    def spec(who):
        try:
            with open(f"{d}/{who}/captured.json") as f:
                return json.load(f)
        except OSError:
            return None

    def caps(s):
        for e in s["process"].get("env", []):
            if e.startswith("NVIDIA_DRIVER_CAPABILITIES="):
                return set(e.split("=", 1)[1].split(","))
        return {"utility", "compute"}

    def view(who):
        out = {"dev": set(), "mount": set(), "env": set(), "ldcache-libcuda": set()}
        with open(f"{d}/{who}.out") as f:
            for line in f:
                kind, _, rest = line.strip().partition(" ")
                if kind in out:
                    out[kind].add(rest)
        return out

    a, b = spec("nvidia"), spec("gpulet")
    if a is None or b is None:
        diffs.append(f"no config.json reached runc: NVIDIA {'yes' if a else 'no'} gpulet {'yes' if b else 'no'}")
        return report.finish("same", notes, diffs, f"{case}: {len(diffs)} difference(s)")
    c = caps(a)
    # Devices requested by CDI name get the spec's edits as written, capabilities aside (both).
    explicit_cdi = any(k.startswith("cdi.k8s.io/") for k in a.get("annotations", {}))
    display = explicit_cdi or "display" in c or "graphics" in c or "all" in c
    video = explicit_cdi or "video" in c or "all" in c

    # Devices and their cgroup rules.
    da = {(x["path"], x.get("major"), x.get("minor")) for x in a.get("linux", {}).get("devices", [])}
    db = {(x["path"], x.get("major"), x.get("minor")) for x in b.get("linux", {}).get("devices", [])}
    if not display and any("nvidia-modeset" in x[0] for x in da - db):
        notes.append("[oci-modeset] NVIDIA adds /dev/nvidia-modeset without the display capability")
        da = {x for x in da if "nvidia-modeset" not in x[0]}
    if da != db:
        diffs.append(f"linux.devices: NVIDIA only {sorted(da - db)} gpulet only {sorted(db - da)}")

    def rules(s):
        return {(r.get("type"), r.get("major"), r.get("minor"), r.get("access"))
                for r in s.get("linux", {}).get("resources", {}).get("devices", []) if r.get("allow")}
    ra, rb = rules(a), rules(b)
    if not display:
        ra = {r for r in ra if (r[1], r[2]) != (195, 254)}
    if ra != rb:
        diffs.append(f"device cgroup allow rules: NVIDIA only {sorted(ra - rb)} gpulet only {sorted(rb - ra)}")

    # Driver mounts (source inside the driver root), destination and options.
    def mounts(s):
        return {(m["destination"], m.get("source", "").replace(root, "<root>"), ",".join(m.get("options", [])))
                for m in s.get("mounts", []) if m.get("source", "").startswith(root) or m["destination"] == VOID}
    ma, mb = mounts(a), mounts(b)
    extra = {m for m in ma - mb if m[0] == VOID or (not video and any(l in m[0] for l in CAPS_LIBS))}
    for m in sorted(extra):
        notes.append(f"[{'cdi-void-mount' if m[0] == VOID else 'oci-caps'}] NVIDIA mounts {m[0]}")
    ma -= extra
    if ma != mb:
        diffs.append(f"mounts: NVIDIA only {sorted(ma - mb)} gpulet only {sorted(mb - ma)}")

    # Environment.
    def env(s):
        return {e for e in s["process"].get("env", []) if e.split("=", 1)[0] not in TOOL_ENV}
    if env(a) != env(b):
        diffs.append(f"env: NVIDIA only {sorted(env(a) - env(b))} gpulet only {sorted(env(b) - env(a))}")

    # Hooks: each tool's own [cdi-hooks]; what matters is that both refresh the ld cache.
    ha = sum(len(v) for v in a.get("hooks", {}).values())
    hb = sum(len(v) for v in b.get("hooks", {}).values())
    if ha or hb:
        notes.append(f"[cdi-hooks] NVIDIA {ha} hook(s), gpulet {hb}")

    # The container's own view.
    va, vb = view("nvidia"), view("gpulet")
    if not display:
        va["dev"] = {x for x in va["dev"] if "nvidia-modeset" not in x}
    va["mount"] = {m for m in va["mount"] if not m.startswith(VOID) and (video or not any(l in m for l in CAPS_LIBS))}
    va["env"] = {e for e in va["env"] if e.split("=", 1)[0] not in TOOL_ENV}
    vb["env"] = {e for e in vb["env"] if e.split("=", 1)[0] not in TOOL_ENV}
    for k in va:
        if va[k] != vb[k]:
            diffs.append(f"container view {k}: NVIDIA only {sorted(va[k] - vb[k])} gpulet only {sorted(vb[k] - va[k])}")
    n = len(vb["dev"])
    return report.finish("same", notes, diffs,
                         f"{case}: {len(diffs)} difference(s); container sees {n} NVIDIA device node(s), "
                         f"{len(vb['mount'])} driver mount(s)")


if __name__ == "__main__":
    sys.exit(main())
