#!/usr/bin/env python3
"""Compares what NVIDIA's device plugin and gpulet's answered on the same node and config.

usage: compare_dp.py NVIDIA.json GPULET.json TOPOLOGY.json CASE

NVIDIA.json / GPULET.json: compat_dp_probe output; TOPOLOGY.json: `gpulet info --json` of the node.
Prints one line per difference and exits 1 when there is any that docs/compat.md does not list as
deliberate. The deliberate ones are normalised here, each with the section of docs/compat.md that
gives the reason:
  [cdi-kind]       CDI device names: NVIDIA's plugin names its own spec's kind
                   (k8s.device-plugin.nvidia.com/gpu=ID); gpulet names the node's spec
                   (nvidia.com/gpu=ID, what `nvidia-ctk cdi generate` and `gpulet cdi generate` write).
  [cdi-key]        cdi-annotations key: NVIDIA's is nvidia-device-plugin_<random uuid> per response;
                   gpulet's is gpulet-device-plugin_<resource> (stable). Only the prefix is compared.
  [preferred-tie]  GetPreferredAllocation (whole GPUs, replicas): both answers must be valid (size, must-include, available);
                   gpulet's topology score must be >= NVIDIA's (NVIDIA's pair scores: 100 per NVLink,
                   PIX 50, PXB 40, PHB 30, NODE 20, SYS 10). Equal scores are equivalent answers
                   (ties broken differently); a higher one is gpulet's exact optimum.
  [error-code]     a refused request: both must refuse it; the code and message may differ (NVIDIA's
                   failRequestsGreaterThanOne answers UNKNOWN, gpulet INVALID_ARGUMENT naming the ID;
                   the kubelet fails the pod with UnexpectedAdmissionError either way).
  [id-order]       index IDs in NVIDIA_VISIBLE_DEVICES: NVIDIA's order is Go's map order (random per
                   call); gpulet's must be the same set sorted by (GPU index, MIG index). UUIDs:
                   both keep the request's order, compared exactly.
  [dup-devices]    passDeviceSpecs with several MIG devices of one GPU: NVIDIA's list carries the
                   parent's /dev/nvidiaN once per MIG device, gpulet's once. Compared as sets.
"""
import itertools
import json
import re
import sys

import report

PCIE = {"PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}


def load(path):
    with open(path) as f:
        return json.load(f)


def pair_score(link):
    if link.startswith("NV"):
        return 100 * int(link[2:])
    return PCIE.get(link, 0)


def main():
    nv, gp, topo, case = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3]), sys.argv[4]
    index_of = {}
    for g in topo["gpus"]:
        index_of[g["uuid"]] = g["index"]
        index_of[str(g["index"])] = g["index"]
    matrix = [g["topology"] for g in topo["gpus"]]
    diffs, notes = [], []

    def gpu_of(dev_id):
        base = dev_id.split("::")[0]
        return index_of.get(base)

    def score(ids):
        gpus = [gpu_of(i) for i in ids]
        if any(g is None for g in gpus):
            return None
        return sum(pair_score(matrix[a][b]) for a, b in itertools.combinations(gpus, 2) if a != b)

    def norm_cdi(name):
        return name.replace("k8s.device-plugin.nvidia.com/", "nvidia.com/", 1)  # [cdi-kind]

    def norm_response(r):
        ann = {}
        for k, v in r["annotations"].items():
            if k.startswith("cdi.k8s.io/"):  # [cdi-key]
                k = "cdi.k8s.io/*"
                v = ",".join(sorted(norm_cdi(x) for x in v.split(",")))
            ann[k] = v
        return {
            "envs": r["envs"],
            "mounts": sorted(r["mounts"], key=lambda m: m["container_path"]),
            "devices": sorted({json.dumps(d, sort_keys=True) for d in r["devices"]}),  # [dup-devices]
            "annotations": ann,
            "cdi_devices": sorted(norm_cdi(c) for c in r["cdi_devices"]),
        }

    nres = {r["name"]: r for r in nv["resources"]}
    gres = {r["name"]: r for r in gp["resources"]}
    if sorted(nres) != sorted(gres):
        diffs.append(f"resources: NVIDIA {sorted(nres)} gpulet {sorted(gres)}")
    for name in sorted(set(nres) & set(gres)):
        a, b = nres[name], gres[name]
        where = f"{case} {name}"
        for key in ("endpoint", "preferred_allocation", "pre_start_required"):
            if a[key] != b[key]:
                diffs.append(f"{where}: {key}: NVIDIA {a[key]} gpulet {b[key]}")
        if a["devices"] != b["devices"]:
            da = {d["id"]: d for d in a["devices"]}
            db = {d["id"]: d for d in b["devices"]}
            for i in sorted(set(da) | set(db)):
                if da.get(i) != db.get(i):
                    diffs.append(f"{where}: ListAndWatch device {i}: NVIDIA {da.get(i)} gpulet {db.get(i)}")
        for qa, qb in zip(a.get("preferred", []), b.get("preferred", [])):
            q = f"{where}: GetPreferredAllocation size {qa['size']} must_include {qa['must_include']}"
            if "error" in qa or "error" in qb:
                if ("error" in qa) != ("error" in qb):
                    diffs.append(f"{q}: NVIDIA {qa.get('error') or qa['result']} gpulet {qb.get('error') or qb['result']}")
                continue
            ra, rb = qa["result"], qb["result"]
            if ra == rb:
                continue
            avail = {d["id"] for d in b["devices"]}
            valid = len(rb) == qb["size"] and set(qb["must_include"]) <= set(rb) and set(rb) <= avail
            sa, sb = score(ra), score(rb)
            if not valid:
                diffs.append(f"{q}: gpulet's answer {rb} is not a valid allocation")
            elif sa is not None and sb is not None and sb < sa:
                diffs.append(f"{q}: gpulet's answer scores {sb} < NVIDIA's {sa} ({rb} vs {ra})")
            elif sa is None or sb is None:
                notes.append(f"{q}: differs, not scored (MIG devices: greedy in both) NVIDIA {ra} gpulet {rb}")
            else:
                notes.append(f"{q}: [preferred-tie] scores NVIDIA {sa} gpulet {sb}")
        if len(a.get("preferred", [])) != len(b.get("preferred", [])):
            diffs.append(f"{where}: different number of preferred queries")
        for qa, qb in zip(a["allocate"], b["allocate"]):
            q = f"{where}: Allocate {qa['ids']}"
            if "error" in qa or "error" in qb:
                if "error" not in qa or "error" not in qb:
                    diffs.append(f"{q}: NVIDIA {qa.get('error') or 'OK'} gpulet {qb.get('error') or 'OK'}")
                elif qa["error"] != qb["error"]:  # [error-code]
                    notes.append(f"{q}: [error-code] both refuse: NVIDIA {qa['error']} gpulet {qb['error']}")
                continue
            na, nb = norm_response(qa["response"]), norm_response(qb["response"])
            ea, eb = na["envs"].get("NVIDIA_VISIBLE_DEVICES"), nb["envs"].get("NVIDIA_VISIBLE_DEVICES")
            if ea and eb and ea != eb and sorted(ea.split(",")) == sorted(eb.split(",")):  # [id-order]
                ids = eb.split(",")
                if all(re.fullmatch(r"\d+(:\d+)?", i) for i in ids):
                    key = [tuple(int(x) for x in i.split(":")) for i in ids]
                    if key == sorted(key):
                        notes.append(f"{q}: [id-order] NVIDIA_VISIBLE_DEVICES NVIDIA {ea} (map order) gpulet {eb} (sorted)")
                        nb["envs"]["NVIDIA_VISIBLE_DEVICES"] = ea
                    else:
                        diffs.append(f"{q}: NVIDIA_VISIBLE_DEVICES: gpulet's index IDs {eb} are not sorted")
            for key in na:
                if na[key] != nb[key]:
                    diffs.append(f"{q}: {key}: NVIDIA {na[key]} gpulet {nb[key]}")
    return report.finish("same-or-better", notes, diffs, f"{case}: {len(diffs)} difference(s), {len(notes)} equivalent or better answer(s)")


if __name__ == "__main__":
    sys.exit(main())
