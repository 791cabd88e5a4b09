#!/usr/bin/env python3
"""Compares `nvidia-ctk cdi generate` and `gpulet cdi generate` specs of the same driver root.

usage: compare_cdi.py NVIDIA.json GPULET.json TOPOLOGY.json CASE   (TOPOLOGY: `gpulet info --json`)
Exit 1 on a difference docs/compat.md does not list as deliberate. Normalised, with the reason in
docs/compat.md ("CDI specs"):
  hook binaries and the hooks themselves: NVIDIA's nvidia-cdi-hook subcommands are listed per
      kind; gpulet has one (update-ldcache) -- [cdi-hooks];
  device node attributes (major, minor, fileMode, permissions): gpulet leaves them to the runtime,
      which reads them from the host node -- [cdi-node-attrs];
  env NVIDIA_CTK_* / GPULET_* (each tool's own facts) -- [cdi-env];
  NVIDIA's mount of /var/run/nvidia-container-devices/void -- [cdi-void-mount];
  gpulet also names MIG-enabled GPUs whole (nvidia-ctk leaves them out): the names its device
      plugin's `migStrategy: none` hands out with CDI must resolve -- [cdi-mig-parents].
Compared exactly: cdiVersion, kind, device names, every device's and the shared device node
paths and host paths, every mount (container path, host path, options), the remaining env.
"""
import json
import sys

import report

KNOWN_NVIDIA_HOOKS = {"create-symlinks", "enable-cuda-compat", "update-ldcache",
                      "disable-device-node-modification", "update-application-profile",
                      "apply-cuda-memory-limits", "chmod", "create-soname-symlinks"}


def load(p):
    with open(p) as f:
        return json.load(f)


def nodes(edits):
    return sorted((n["path"], n.get("hostPath", n["path"])) for n in edits.get("deviceNodes", []))


def mounts(edits):
    return {m["containerPath"]: (m["hostPath"], tuple(m.get("options", [])))
            for m in edits.get("mounts", [])
            if m["containerPath"] != "/var/run/nvidia-container-devices/void"}  # [cdi-void-mount]


def env(edits):
    return sorted(e for e in edits.get("env", [])
                  if not e.startswith(("NVIDIA_CTK_", "GPULET_")))  # [cdi-env]


def hooks(edits):
    return sorted({h["args"][1] for h in edits.get("hooks", []) if len(h.get("args", [])) > 1})


def main():
    a, b, topo, case = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3]), sys.argv[4]
    diffs, notes = [], []
    mig_parents = set()
    for g in topo["gpus"]:
        if g["migEnabled"]:
            mig_parents |= {str(g["index"]), g["uuid"]}
    for k in ("cdiVersion", "kind"):
        if a[k] != b[k]:
            diffs.append(f"{k}: NVIDIA {a[k]} gpulet {b[k]}")
    da = {d["name"]: d["containerEdits"] for d in a["devices"]}
    db = {d["name"]: d["containerEdits"] for d in b["devices"]}
    extra = sorted(set(db) - set(da) & mig_parents)
    if extra:
        notes.append(f"[cdi-mig-parents] gpulet also names the MIG-enabled GPUs {extra}")
        for n in extra:
            del db[n]
    if sorted(da) != sorted(db):
        diffs.append(f"device names: NVIDIA {sorted(da)} gpulet {sorted(db)}")
    for name in sorted(set(da) & set(db)):
        for what, f in (("device nodes", nodes), ("mounts", mounts), ("env", env)):
            if f(da[name]) != f(db[name]):
                diffs.append(f"device {name}: {what}: NVIDIA {f(da[name])} gpulet {f(db[name])}")
        ha, hb = hooks(da[name]), hooks(db[name])
        if ha != hb:
            notes.append(f"device {name}: [cdi-hooks] NVIDIA {ha} gpulet {hb}")
    ea, eb = a["containerEdits"], b["containerEdits"]
    if nodes(ea) != nodes(eb):
        diffs.append(f"shared device nodes: NVIDIA {nodes(ea)} gpulet {nodes(eb)}")
    ma, mb = mounts(ea), mounts(eb)
    for p in sorted(set(ma) | set(mb)):
        if ma.get(p) != mb.get(p):
            diffs.append(f"mount {p}: NVIDIA {ma.get(p)} gpulet {mb.get(p)}")
    if env(ea) != env(eb):
        diffs.append(f"env: NVIDIA {env(ea)} gpulet {env(eb)}")
    ha, hb = hooks(ea), hooks(eb)
    unknown = set(ha) - KNOWN_NVIDIA_HOOKS
    if unknown:
        diffs.append(f"NVIDIA's spec has hooks docs/compat.md does not discuss: {sorted(unknown)}")
    if "update-ldcache" not in hb:
        diffs.append("gpulet's spec lacks its update-ldcache hook")
    notes.append(f"[cdi-hooks] NVIDIA {ha} gpulet {hb}")
    attrs = [n for n in ea.get("deviceNodes", []) if "major" in n]
    if attrs:
        notes.append(f"[cdi-node-attrs] NVIDIA gives major/minor/fileMode for {len(attrs)} shared nodes; gpulet leaves them to the runtime")
    return report.finish("deliberate", notes, diffs, f"{case}: {len(diffs)} difference(s) beyond docs/compat.md, {len(da)} devices, {len(ma)} mounts compared")


if __name__ == "__main__":
    sys.exit(main())
