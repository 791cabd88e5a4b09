#!/usr/bin/env python3
"""Placement quality in the live path (issue 30 item 3): the openb trace through the real
kube-scheduler + gpulet's extender on kwok nodes, against `gpulet-sched simulate` on the same
nodes, trace, arrival order and policy. tests/scale/run starts the cluster and calls this (the
scenario words openb:POLICY); tests/scale/openb is the one-command entry.

  openb.py nodes   --node-csv CSV --count N       the first N nodes of the openb node list as kwok
                   nodes shaped as gpulet's agent publishes a vGPU node (see node_body)
  openb.py replay  --policy binpack|gpulet ...    replay the simulator's arrival stream, compare

The arrival stream is the simulator's (src/placement/sim.cc ArrivalStream, re-implemented here
bit for bit with its splitmix64): the trace shuffled with --seed, then trimmed (random tasks
removed) or topped up (tasks redrawn) until the GPU it asks is --arrivals x the GPU capacity of
the N nodes. Pods are created in that order, at most --window of them unresolved at a time; a pod
is resolved when it is bound or when kube-scheduler marks it Unschedulable, and an unschedulable
pod is deleted at once (the simulator drops a task no node takes; no departures otherwise).
After the last one: the allocated share of GPU capacity = per GPU of the node annotations, the
cores granted to it by the pods' gpulet.io/vgpu-gpus-<i> annotations (100 for a whole GPU),
summed, over 100 x GPUs; the simulator's figure is placed milli-GPU / capacity at the end of the
same stream, so the two are the same quantity.

How openb pods map (as the simulator's ParseOpenbPods reads them): num_gpu 1 with gpu_milli <
1000 -> tencent.com/vcuda-core milli/10 (every openb value is a multiple of 10) and
tencent.com/vcuda-memory milli x 64 / 1000 units of 256 MiB rounded down (the share of a 16 GiB
GPU, the smallest in openb: memory then never runs out before cores on any GPU, as in the
simulator, which gives openb tasks no GPU memory); otherwise vcuda-core 100 x num_gpu. Every pod
requests the trace's cpu_milli and memory_mib (kube-scheduler checks them, as the simulator
does); CPU-only tasks (num_gpu 0) are created with only those (kube-scheduler places them alone:
the extender is not called for pods without vGPU resources). --gpu-only drops CPU and memory on
both sides (the simulator gets copies of the CSVs with those columns zeroed; CPU-only tasks are
then skipped live: they would ask nothing): the like-for-like check of the live machinery.
Standard library only (plus scale.py beside it).
"""
import argparse
import collections
import csv
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402

NS = scale.NS
CORE, MEMORY = scale.CORE, scale.MEMORY
ANN_NODE_GPUS, ANN_GPUS_PREFIX, ANN_POLICY = scale.ANN_NODE_GPUS, scale.ANN_GPUS_PREFIX, scale.ANN_POLICY
MASK = (1 << 64) - 1
# Nominal memory per openb GPU model, GiB (G2/G3 are Alibaba's anonymised models: 32 GiB assumed;
# memory never binds here, see above).
MODEL_GIB = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 32, "G3": 32}
POD_UNITS_PER_GPU = 64  # a pod's memory: its share of a 16 GiB GPU in 256 MiB units
SIM_POLICY = {"binpack": "best-fit"}  # the vGPU name -> the simulator's (placement/vgpu_policy.cc)


# --- the simulator's arrival stream ------------------------------------------------------------

def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


class Rng:
    def __init__(self, seed):
        self.s = seed & MASK

    def uniform(self, n):
        self.s, z = splitmix(self.s)
        return z % n


def gpu_milli(p):
    return 1000 * p["num_gpu"] if p["num_gpu"] > 1 or p["gpu_milli"] >= 1000 else p["gpu_milli"]


def arrival_stream(trace, capacity_milli, arrivals, seed):
    rng = Rng(seed)
    out = list(trace)
    for i in range(len(out), 1, -1):
        j = rng.uniform(i)
        out[i - 1], out[j] = out[j], out[i - 1]
    target = arrivals * capacity_milli
    total = float(sum(gpu_milli(p) for p in out))
    if total < target:
        i = 0
        while True:
            p = trace[rng.uniform(len(trace))]
            req = gpu_milli(p)
            if total + req > target:
                break
            if req == 0 and i > len(trace) * 100:
                break
            total += req
            out.append(dict(p, name=f"{p['name']}-tuned-{i}"))
            i += 1
    else:
        while total > target and out:
            k = rng.uniform(len(out))
            total -= gpu_milli(out[k])
            del out[k]
    return out


def load_nodes(path, count):
    rows = list(csv.DictReader(open(path)))
    return rows[:count] if count else rows


def load_pods(path):
    out = []
    for r in csv.DictReader(open(path)):
        out.append({"name": r["name"], "cpu_milli": int(r["cpu_milli"]), "memory_mib": int(r["memory_mib"]),
                    "num_gpu": int(r["num_gpu"]), "gpu_milli": int(r["gpu_milli"])})
    return out


# --- nodes -------------------------------------------------------------------------------------

def node_name(sn):
    return sn.lower().replace("_", "-")


def node_body(row, index):
    name, gpus = node_name(row["sn"]), int(row["gpu"])
    units = MODEL_GIB.get(row["model"], 16) * 4
    cap = {"cpu": f"{row['cpu_milli']}m", "memory": f"{row['memory_mib']}Mi", "pods": "1000",
           "ephemeral-storage": "30Ti", CORE: str(100 * gpus), MEMORY: str(units * gpus)}
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "type": "kwok", "gpulet.io/scale-set": "openb", "gpulet.io/openb-model": row["model"],
              "nvidia.com/gpu.count": str(gpus)}
    # The agent's vGPU mode: every GPU shared in fractions, its inventory in the annotation the
    # extender places against (src/vgpu/rules/node_pool.h), as scale.py's node_body does.
    pool = [{"uuid": f"GPU-05{index:06x}-0be0-{g:04x}-0000-000000000000", "index": g, "memoryUnits": units,
             "healthy": True} for g in range(gpus)]
    ann = {"kwok.x-k8s.io/node": "fake", ANN_NODE_GPUS: json.dumps(pool, separators=(",", ":"))}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels, "annotations": ann},
            "spec": {}, "status": {"capacity": cap, "allocatable": dict(cap)}}


def cmd_nodes(api, a):
    rows = load_nodes(a.node_csv, a.count)
    t = time.time()
    errors = scale.parallel(lambda i: api.call("POST", "/api/v1/nodes", node_body(rows[i], i)), range(len(rows)),
                            a.threads)
    if errors:
        sys.exit(f"openb.py nodes: creating nodes failed: {errors[0]}")
    print(f"created {len(rows)} openb nodes ({sum(int(r['gpu']) for r in rows)} GPUs) in {time.time() - t:.1f} s")


# --- replay ------------------------------------------------------------------------------------

def pod_body(p, i, run, policy, gpu_only):
    name = f"{run}-{i:05d}"
    res = {} if gpu_only else {"cpu": f"{p['cpu_milli']}m", "memory": f"{p['memory_mib']}Mi"}
    lim = {}
    if p["num_gpu"] == 1 and p["gpu_milli"] < 1000:
        lim = {CORE: str(p["gpu_milli"] // 10), MEMORY: str(p["gpu_milli"] * POD_UNITS_PER_GPU // 1000)}
    elif p["num_gpu"] > 0:
        lim = {CORE: str(100 * p["num_gpu"])}
    res.update(lim)
    meta = {"name": name, "namespace": NS, "labels": {"openb-run": run}, "annotations": {"openb/task": p["name"]}}
    # Every task names the policy: with SCALE_ALL_PODS=1 the extender places the CPU-only ones too.
    meta["annotations"][ANN_POLICY] = policy
    c = {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": res, "limits": lim}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0, "containers": [c]}}


class Tracker:
    """A watch on the run's pods: which are bound, which kube-scheduler found unschedulable."""

    def __init__(self, api, run):
        self.api, self.run = api, run
        self.cv = threading.Condition()
        self.bound, self.failed = set(), set()
        self.stops = 0
        self.done = False

    def resolved(self, name):
        return name in self.bound or name in self.failed

    def see(self, o):
        name = o.get("metadata", {}).get("name")
        if not name:
            return
        if o.get("spec", {}).get("nodeName"):
            self.bound.add(name)
            self.failed.discard(name)
        elif name not in self.bound:
            for c in o.get("status", {}).get("conditions", []):
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                    self.failed.add(name)

    def loop(self, rv):
        sel = urllib.parse.quote(f"openb-run={self.run}")
        while not self.done:
            c = self.api.connect(timeout=600)
            try:
                c.request("GET", f"/api/v1/namespaces/{NS}/pods?watch=1&resourceVersion={rv}&labelSelector={sel}"
                                 f"&allowWatchBookmarks=true&timeoutSeconds=300", headers={"Accept": "application/json"})
                r = c.getresponse()
                if r.status == 200:
                    for line in r:
                        ev = json.loads(line)
                        o = ev.get("object", {})
                        if ev.get("type") == "ERROR":
                            break
                        rv = o.get("metadata", {}).get("resourceVersion", rv)
                        if ev.get("type") in ("ADDED", "MODIFIED"):
                            with self.cv:
                                self.see(o)
                                self.cv.notify_all()
                        if self.done:
                            break
            except (OSError, http.client.HTTPException, ValueError):
                pass
            c.close()
            if self.done:
                return
            self.stops += 1
            items, rv = self.api.list_all(f"/api/v1/namespaces/{NS}/pods?labelSelector={sel}")
            with self.cv:
                for o in items:
                    self.see(o)
                self.cv.notify_all()


def live_share(api, run):
    nodes, _ = api.list_all("/api/v1/nodes?labelSelector=" + urllib.parse.quote("gpulet.io/scale-set=openb"))
    owner = {}
    for n in nodes:
        for g in json.loads(n["metadata"].get("annotations", {}).get(ANN_NODE_GPUS, "[]")):
            owner[g["uuid"]] = n["metadata"]["name"]
    pods, _ = api.list_all(f"/api/v1/namespaces/{NS}/pods?labelSelector=" + urllib.parse.quote(f"openb-run={run}"))
    cores = collections.Counter()
    problems, requested = [], 0
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node:
            continue
        lim = p["spec"]["containers"][0]["resources"].get("limits", {})
        cc = int(lim.get(CORE, 0))
        if cc <= 0:
            continue
        requested += cc
        uuids = [u for u in p["metadata"].get("annotations", {}).get(f"{ANN_GPUS_PREFIX}0", "").split(",") if u]
        want = cc // 100 if cc >= 100 else 1
        if len(uuids) != want or any(owner.get(u) != node for u in uuids):
            problems.append(f"{p['metadata']['name']}: GPUs {uuids} on {node}, {want} expected there")
        for u in uuids:
            cores[u] += 100 if cc >= 100 else cc
    over = [u for u, c in cores.items() if c > 100]
    granted = sum(min(100, c) for c in cores.values())
    return {"gpus": len(owner), "share_pct": round(100.0 * granted / max(1, 100 * len(owner)), 3),
            "share_from_requests_pct": round(100.0 * requested / max(1, 100 * len(owner)), 3),
            "pods_listed": len(pods), "gpus_touched": len(cores), "overcommitted_gpus": len(over),
            "placement_problems": len(problems), "problem_examples": problems[:3]}


def simulate(a, sim_policy, gpu_only, ties):
    d = os.path.join(a.workdir, "openb-sim")
    os.makedirs(d, exist_ok=True)
    nodes = load_nodes(a.node_csv, a.count)
    ncsv = os.path.join(d, "nodes.csv")
    with open(ncsv, "w") as f:
        f.write("sn,cpu_milli,memory_mib,gpu,model\n")
        for r in nodes:
            cpu, mem = ("0", "0") if gpu_only else (r["cpu_milli"], r["memory_mib"])
            f.write(f"{r['sn']},{cpu},{mem},{r['gpu']},{r['model']}\n")
    pcsv = a.trace
    if gpu_only:
        pcsv = os.path.join(d, "pods-gpu-only.csv")
        with open(pcsv, "w") as f:
            f.write("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
            for p in load_pods(a.trace):
                f.write(f"{p['name']},0,0,{p['num_gpu']},{p['gpu_milli']}\n")
    cmd = [a.sched, "simulate", "--nodes", ncsv, "--pods", pcsv, "--policy", sim_policy, "--seed", str(a.seed),
           "--seeds", "1", "--arrivals", str(a.arrivals), "--ties", ties, "--jobs", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == sim_policy:
            return {"share_pct": float(f[1]), "failed": float(f[5])}
    sys.exit(f"openb.py: no {sim_policy} row in the simulator's output:\n{out}")


def cmd_replay(api, a):
    rows = load_nodes(a.node_csv, a.count)
    capacity = 1000 * sum(int(r["gpu"]) for r in rows)
    stream = arrival_stream(load_pods(a.trace), capacity, a.arrivals, a.seed)
    if a.gpu_only:
        stream = [p for p in stream if p["num_gpu"] > 0]
    run = f"openb-{a.policy}{'-g' if a.gpu_only else ''}"
    bodies = [pod_body(p, i, run, a.policy, a.gpu_only) for i, p in enumerate(stream)]
    names = [b["metadata"]["name"] for b in bodies]
    _, rv = api.list_all(f"/api/v1/namespaces/{NS}/pods?labelSelector=" + urllib.parse.quote(f"openb-run={run}"))
    tr = Tracker(api, run)
    wt = threading.Thread(target=tr.loop, args=(rv,), daemon=True)
    wt.start()
    time.sleep(0.5)
    deleted = set()
    load = open("/proc/loadavg").read().split()[:3]
    t0 = time.time()
    last_print = t0
    stalled = None

    def delete_failed():
        for n in list(tr.failed - deleted):
            api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{n}?gracePeriodSeconds=0", ok=(200, 202, 404))
            deleted.add(n)

    posted = 0
    while True:
        with tr.cv:
            unresolved = [n for n in names[:posted] if not tr.resolved(n)] if posted else []
            if posted < len(bodies) and len(unresolved) < a.window:
                pass
            elif posted >= len(bodies) and not unresolved:
                break
            else:
                before = len(tr.bound) + len(tr.failed)
                tr.cv.wait(1.0)
                after = len(tr.bound) + len(tr.failed)
                now = time.time()
                if after != before:
                    stalled = None
                elif stalled is None:
                    stalled = now
                elif now - stalled > a.stall:
                    print(f"  openb {run}: no pod resolved for {a.stall:.0f} s; {len(unresolved)} left unresolved "
                          f"(e.g. {unresolved[:3]})", flush=True)
                    break
        delete_failed()
        with tr.cv:
            ready = posted < len(bodies) and len([n for n in names[:posted] if not tr.resolved(n)]) < a.window
        if ready:
            api.call("POST", f"/api/v1/namespaces/{NS}/pods", bodies[posted])
            posted += 1
        if time.time() - last_print > 30:
            last_print = time.time()
            print(f"  openb {run}: {posted}/{len(bodies)} created, {len(tr.bound)} bound, {len(tr.failed)} unschedulable, "
                  f"{last_print - t0:.0f} s", flush=True)
    delete_failed()
    t_end = time.time()
    tr.done = True
    gpu_pods = [p for p in stream if p["num_gpu"] > 0]
    live = live_share(api, run)
    sim_policy = SIM_POLICY.get(a.policy, a.policy)
    sims = {t: simulate(a, sim_policy, a.gpu_only, t) for t in ("random", "first")}
    bound_gpu = sum(1 for i, p in enumerate(stream) if p["num_gpu"] > 0 and names[i] in tr.bound)
    row = {"scenario": run, "policy": a.policy, "sim_policy": sim_policy, "gpu_only": a.gpu_only,
           "nodes": len(rows), "gpus": capacity // 1000, "trace": os.path.basename(a.trace), "seed": a.seed,
           "arrivals": a.arrivals, "tasks": len(stream), "gpu_tasks": len(gpu_pods), "bound": len(tr.bound),
           "bound_gpu_tasks": bound_gpu, "unschedulable": len(tr.failed), "window": a.window,
           "nodes_to_score": a.nodes_to_score or "default", "seconds": round(t_end - t0, 1),
           "pods_per_s": round(len(tr.bound | tr.failed) / max(1e-9, t_end - t0), 1), "watch_resumed": tr.stops,
           "live_share_pct": live["share_pct"], "sim_share_pct": sims["random"]["share_pct"],
           "sim_share_first_ties_pct": sims["first"]["share_pct"], "sim_failed": sims["random"]["failed"],
           "live_minus_sim_points": round(live["share_pct"] - sims["random"]["share_pct"], 3),
           "loadavg_before": " ".join(load), "live": live}
    with open(a.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"  openb {run}: {len(rows)} nodes ({row['gpus']} GPUs), {len(stream)} tasks; live {live['share_pct']:.2f}% "
          f"(from requests {live['share_from_requests_pct']:.2f}%) vs simulated {sim_policy} "
          f"{sims['random']['share_pct']:.2f}% (ties random; first {sims['first']['share_pct']:.2f}%): "
          f"{row['live_minus_sim_points']:+.2f} points; bound {len(tr.bound)}, unschedulable {len(tr.failed)} "
          f"(simulator: {sims['random']['failed']:.0f} failed); {row['seconds']} s; over-committed GPUs "
          f"{live['overcommitted_gpus']}, placement problems {live['placement_problems']}", flush=True)
    if a.max_gap is not None and abs(row["live_minus_sim_points"]) > a.max_gap:
        print(f"  FAIL {run}: live share {row['live_minus_sim_points']:+.2f} points from the simulator's "
              f"(--max-gap {a.max_gap})", flush=True)
        sys.exit(1)
    if live["overcommitted_gpus"] or live["placement_problems"]:
        print(f"  FAIL {run}: {live['overcommitted_gpus']} over-committed GPUs, {live['placement_problems']} "
              f"placement problems {live['problem_examples']}", flush=True)
        sys.exit(1)


def cmd_stream(api, a):
    """Debug: the arrival stream's size and GPU ask (compare with the simulator's task count)."""
    rows = load_nodes(a.node_csv, a.count)
    s = arrival_stream(load_pods(a.trace), 1000 * sum(int(r["gpu"]) for r in rows), a.arrivals, a.seed)
    print(len(s), sum(gpu_milli(p) for p in s), [p["name"] for p in s[:5]])


def cmd_table(api, a):
    rows = [json.loads(l) for l in open(a.out) if l.strip()]
    print("| scenario | nodes (GPUs) | tasks | live share | simulated (ties random / first) | live - sim | bound "
          "(unschedulable; sim failed) | time | pods/s | nodes to score | over-committed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['nodes']} ({r['gpus']}) | {r['tasks']} | {r['live_share_pct']:.2f}% | "
              f"{r['sim_policy']} {r['sim_share_pct']:.2f}% / {r['sim_share_first_ties_pct']:.2f}% | "
              f"{r['live_minus_sim_points']:+.2f} | {r['bound']} ({r['unschedulable']}; {r['sim_failed']:.0f}) | "
              f"{r['seconds']} s | {r['pods_per_s']} | {r['nodes_to_score']} | {r['live']['overcommitted_gpus']} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["nodes", "replay", "stream", "table"])
    p.add_argument("--server")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--node-csv")
    p.add_argument("--count", type=int, default=0, help="the first N nodes (0: all)")
    p.add_argument("--trace")
    p.add_argument("--policy", default="binpack")
    p.add_argument("--gpu-only", action="store_true")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--arrivals", type=float, default=1.3)
    p.add_argument("--window", type=int, default=16, help="pods created but not yet bound or unschedulable, at most")
    p.add_argument("--stall", type=float, default=120, help="give up when no pod resolves for this long (s)")
    p.add_argument("--sched", help="gpulet-sched binary (the simulator)")
    p.add_argument("--nodes-to-score", default="", help="reported: kube-scheduler's percentageOfNodesToScore")
    p.add_argument("--max-gap", type=float, help="replay: exit 1 when |live - simulated| exceeds this (points)")
    p.add_argument("--workdir", default=".")
    p.add_argument("--out", default="openb-results.jsonl")
    a = p.parse_args()
    api = scale.Api(a) if a.command in ("nodes", "replay") else None
    {"nodes": cmd_nodes, "replay": cmd_replay, "stream": cmd_stream, "table": cmd_table}[a.command](api, a)


if __name__ == "__main__":
    main()
