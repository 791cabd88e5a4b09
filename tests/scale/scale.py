#!/usr/bin/env python3
"""The client side of the scale harness (tests/scale/run starts the cluster and calls this).

  scale.py nodes   --kind whole|vgpu|dra|drashare --count N --prefix NAME   create N fake nodes as
                   gpulet's agent would publish them for 8 H100s (and, for dra, their ResourceSlices)
  scale.py ready   --count N                 wait until N nodes are Ready (kwok initialised them)
  scale.py burst   --scenario NAME --kind whole|frac|dra|drashare --pods P [--policy binpack|spread|gpulet]
                   create P pods at once, time create -> bound for each from one watch, check the
                   placement from the API, count refused binds and bind errors in the logs; one JSON
                   line appended to --out
  scale.py clean                             delete every pod and claim of the namespace, wait for it
  scale.py table   --out FILE                the results as a Markdown table

Every call talks HTTPS to the API server with the harness's admin certificate (--server, --ca,
--cert, --key). Standard library only. Times are wall-clock (time.time()) on this machine:
  created  when the watch (opened before the first POST) delivered the pod's ADDED event;
  bound    when it delivered the first version of the pod with spec.nodeName set;
  burst    first POST sent -> last pod bound.
A watch the API server ends early is resumed from a LIST (the burst's row says how often; pods
bound in between then carry the LIST's time).
"""
import argparse
import collections
import http.client
import json
import math
import multiprocessing
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

NS = "scale"
GPUS_PER_NODE = 8
UNITS_PER_GPU = 320  # an H100 80GB: 80 GiB nominal in 256 MiB units (what the agent publishes)
CORE = "tencent.com/vcuda-core"
MEMORY = "tencent.com/vcuda-memory"
WHOLE = "nvidia.com/gpu"
DRIVER = "gpu.gpulet.io"
ANN_NODE_GPUS = "gpulet.io/vgpu-gpus"
ANN_GPUS_PREFIX = "gpulet.io/vgpu-gpus-"
ANN_POLICY = "gpulet.io/vgpu-policy"


class ApiError(Exception):
    pass


class Api:
    """One keep-alive HTTPS connection per thread."""

    def __init__(self, args):
        u = urllib.parse.urlparse(args.server)
        self.host, self.port = u.hostname, u.port
        self.ctx = ssl.create_default_context(cafile=args.ca)
        self.ctx.load_cert_chain(args.cert, args.key)
        self.local = threading.local()

    def connect(self, timeout=60):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def call(self, method, path, body=None, ok=(200, 201, 202)):
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        last = None
        for attempt in range(8):
            c = getattr(self.local, "conn", None)
            if c is None:
                c = self.local.conn = self.connect()
            try:
                c.request(method, path, body=data,
                          headers={"Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json",
                                   "Accept": "application/json"})
                r = c.getresponse()
                raw = r.read()
            except (http.client.HTTPException, OSError) as e:
                c.close()
                self.local.conn = None
                last = f"{type(e).__name__}: {e}"
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status == 429 or r.status >= 500:
                last = f"HTTP {r.status}: {raw[:200]!r}"
                time.sleep(0.5 * (attempt + 1))
                continue
            if r.status not in ok:
                raise ApiError(f"{method} {path}: HTTP {r.status}: {raw[:300].decode(errors='replace')}")
            return json.loads(raw) if raw else {}
        raise ApiError(f"{method} {path}: gave up after retries ({last})")

    def list_all(self, path):
        items, cont = [], ""
        sep = "&" if "?" in path else "?"
        while True:
            page = self.call("GET", f"{path}{sep}limit=2000" + (f"&continue={urllib.parse.quote(cont)}" if cont else ""))
            items += page.get("items", [])
            cont = page.get("metadata", {}).get("continue", "")
            if not cont:
                return items, page.get("metadata", {}).get("resourceVersion", "")


def parallel(fn, items, threads):
    """Runs fn(item) on `threads` threads; returns the exceptions raised (at most 5 kept)."""
    errors = []
    it = iter(list(items))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                try:
                    x = next(it)
                except StopIteration:
                    return
            try:
                fn(x)
            except Exception as e:  # noqa: BLE001 -- reported to the caller
                with lock:
                    if len(errors) < 5:
                        errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


# --- nodes --------------------------------------------------------------------------------------

def gpu_uuid(kind, node_index, gpu):
    k = {"whole": 1, "vgpu": 2, "dra": 3, "drashare": 4}[kind]
    return f"GPU-{k:02x}{node_index:06x}-5ca1-{gpu:04x}-0000-000000000000"


def node_body(kind, name, index):
    cap = {"cpu": "224", "memory": "2Ti", "pods": "110", "ephemeral-storage": "30Ti"}
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "type": "kwok", "gpulet.io/scale-set": kind,
              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": str(GPUS_PER_NODE)}
    ann = {"kwok.x-k8s.io/node": "fake"}
    if kind == "whole":
        cap[WHOLE] = str(GPUS_PER_NODE)
    elif kind == "vgpu":
        # The agent's vGPU mode: every GPU shared in fractions (none offered whole), its inventory
        # in the annotation the extender places against (src/vgpu/rules/node_pool.h).
        cap[CORE] = str(100 * GPUS_PER_NODE)
        cap[MEMORY] = str(UNITS_PER_GPU * GPUS_PER_NODE)
        pool = [{"uuid": gpu_uuid(kind, index, g), "index": g, "memoryUnits": UNITS_PER_GPU, "healthy": True}
                for g in range(GPUS_PER_NODE)]
        ann[ANN_NODE_GPUS] = json.dumps(pool, separators=(",", ":"))
    # dra, drashare: no extended resource; the GPUs are the devices of its ResourceSlice.
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": ann},
            "spec": {}, "status": {"capacity": cap, "allocatable": dict(cap)}}


def slice_bodies(kind, name, index, node_uid):
    # As src/dra/slices.cc and devices.cc shape them: one slice per node named <node>-<driver>, pool =
    # the node, devices gpu-<index> with type/uuid/index attributes and the memory capacity; with
    # consumable capacity (drashare: the agent's --dra-consumable-capacity) each GPU may be shared,
    # memory in 256 MiB steps and 1..100 cores.
    # drashare publishes one slice per GPU (<node>-<driver>-gpu-<g>, the pool's resourceSliceCount
    # 8) unless SCALE_DRASHARE_SLICES=one: kube-scheduler 1.34's consumable-capacity allocator
    # (k8s.io/dynamic-resource-allocation structured/internal/experimental, allocateDevice) checks
    # the remaining capacity of the device at the request's device index in the candidate's slice
    # (Devices[0] for a one-device request), not of the candidate itself (kubernetes#133705, fixed
    # in 1.35.0): with the agent's single slice only gpu-0 of each node takes shares. One device
    # per slice makes Devices[0] the candidate. Reproduce the bug with SCALE_DRASHARE_SLICES=one.
    per_gpu = kind == "drashare" and os.environ.get("SCALE_DRASHARE_SLICES", "per-gpu") != "one"
    devices = []
    for g in range(GPUS_PER_NODE):
        d = {"name": f"gpu-{g}",
             "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid(kind, index, g)},
                            "index": {"int": g}, "productName": {"string": "NVIDIA H100 80GB HBM3"}},
             "capacity": {"memory": {"value": "80Gi"}}}
        if kind == "drashare":
            d["allowMultipleAllocations"] = True
            d["capacity"]["memory"]["requestPolicy"] = {"default": "80Gi",
                                                        "validRange": {"min": "256Mi", "step": "256Mi"}}
            d["capacity"]["cores"] = {"value": "100", "requestPolicy": {
                "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}
        devices.append(d)
    groups = [[d] for d in devices] if per_gpu else [devices]

    def body(suffix, devs):
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{name}-{DRIVER}{suffix}",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                  "uid": node_uid, "controller": True}]},
                "spec": {"driver": DRIVER, "nodeName": name,
                         "pool": {"name": name, "generation": 1, "resourceSliceCount": len(groups)},
                         "devices": devs}}
    return [body(f"-{g[0]['name']}" if per_gpu else "", g) for g in groups]


def cmd_nodes(api, a):
    def make(i):
        name = f"{a.prefix}-{i:05d}"
        node = api.call("POST", "/api/v1/nodes", node_body(a.kind, name, i))
        if a.kind in ("dra", "drashare"):
            for body in slice_bodies(a.kind, name, i, node["metadata"]["uid"]):
                api.call("POST", "/apis/resource.k8s.io/v1/resourceslices", body)

    t = time.time()
    errors = parallel(make, range(a.count), a.threads)
    if errors:
        sys.exit(f"scale.py nodes: creating {a.kind} nodes failed: {errors[0]}")
    print(f"created {a.count} {a.kind} nodes in {time.time() - t:.1f} s")


def cmd_ready(api, a):
    end = time.time() + a.timeout
    while True:
        nodes, _ = api.list_all("/api/v1/nodes")
        ready = sum(1 for n in nodes for c in n.get("status", {}).get("conditions", [])
                    if c.get("type") == "Ready" and c.get("status") == "True")
        if ready >= a.count:
            print(f"{ready} nodes Ready")
            return
        if time.time() > end:
            sys.exit(f"scale.py ready: only {ready} of {a.count} nodes Ready after {a.timeout} s (is kwok running? its log: kwok.log)")
        time.sleep(1)


# --- bursts -------------------------------------------------------------------------------------

def pod_body(a, sid, i):
    name = f"{sid}-{i:05d}"
    res = {"cpu": "1", "memory": "1Gi"}
    meta = {"name": name, "namespace": NS, "labels": {"scale-burst": sid}}
    spec = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    if a.kind == "whole":
        res[WHOLE] = "1"
    elif a.kind == "frac":
        res[CORE] = str(a.cores)
        res[MEMORY] = str(a.units)
        if a.policy:
            meta["annotations"] = {ANN_POLICY: a.policy}
    elif a.kind in ("dra", "drashare"):
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    spec["containers"][0].setdefault("resources", {})
    spec["containers"][0]["resources"]["requests"] = dict(res)
    spec["containers"][0]["resources"]["limits"] = {k: v for k, v in res.items() if k not in ("cpu", "memory")}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def claim_body(a, name):
    exactly = {"deviceClassName": DRIVER}
    if a.kind == "drashare":
        # The same share as the vGPU pods': cores, and memory in 256 MiB units.
        exactly["capacity"] = {"requests": {"cores": str(a.cores), "memory": f"{a.units * 256}Mi"}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def watch(args, sid, rv, pods, deadline, out, ready, progress=None):
    """Child process: watches the burst's pods; writes {name: [added, bound]} to `out`, with the
    reasons a watch ended early. A watch the API server ends (or that breaks) is resumed from a
    fresh LIST: pods bound in between get the LIST's time (later than the truth; counted as
    "resynced")."""
    api = Api(args)
    sel = urllib.parse.quote(f"scale-burst={sid}")
    added, bound, stops, resynced = {}, {}, [], 0
    first = True
    while len(bound) < pods and time.time() < deadline:
        c = api.connect(timeout=max(30, deadline - time.time() + 30))
        try:
            c.request("GET", f"/api/v1/namespaces/{NS}/pods?watch=1&resourceVersion={rv}&labelSelector={sel}"
                             f"&allowWatchBookmarks=true&timeoutSeconds={int(deadline - time.time()) + 30}",
                      headers={"Accept": "application/json"})
            r = c.getresponse()
        except (OSError, http.client.HTTPException) as e:
            stops.append(f"watch request: {type(e).__name__}: {e}")
            r = None
        if first:
            ready.set()
            first = False
            if r is None or r.status != 200:
                json.dump({"error": f"watch: {stops[-1] if r is None else 'HTTP %d' % r.status}"}, open(out, "w"))
                return
        if r is not None and r.status == 200:
            try:
                for line in r:
                    t = time.time()
                    ev = json.loads(line)
                    o = ev.get("object", {})
                    if ev.get("type") == "ERROR":
                        stops.append(f"watch ERROR event: {o.get('message', o)}"[:300])
                        break
                    rv = o.get("metadata", {}).get("resourceVersion", rv)
                    if ev.get("type") == "BOOKMARK":
                        continue
                    name = o.get("metadata", {}).get("name")
                    if not name:
                        continue
                    added.setdefault(name, t)
                    if o.get("spec", {}).get("nodeName") and name not in bound:
                        bound[name] = t
                        if progress is not None:
                            progress.value = len(bound)
                    if len(bound) >= pods or t > deadline:
                        break
                else:
                    stops.append("watch ended by the server")
            except (OSError, http.client.HTTPException, ValueError) as e:
                stops.append(f"watch broke: {type(e).__name__}: {e}"[:300])
        elif r is not None:
            stops.append(f"watch: HTTP {r.status}")
        c.close()
        if len(bound) >= pods or time.time() >= deadline:
            break
        # Resume from a LIST: what happened while no watch was open.
        try:
            items, rv = api.list_all(f"/api/v1/namespaces/{NS}/pods?labelSelector={sel}")
        except ApiError as e:
            stops.append(f"resync: {e}"[:300])
            time.sleep(1)
            continue
        t = time.time()
        for o in items:
            name = o["metadata"]["name"]
            added.setdefault(name, t)
            if o["spec"].get("nodeName") and name not in bound:
                bound[name] = t
                resynced += 1
    result = {n: [added.get(n), bound.get(n)] for n in added}
    json.dump({"pods": result, "stops": stops, "resynced": resynced}, open(out, "w"))


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def proc_figures(pid):
    """(RSS MiB, peak RSS MiB, CPU seconds) of a process, or Nones."""
    try:
        status = open(f"/proc/{pid}/status").read()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
        hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        return rss, hwm, cpu
    except (OSError, AttributeError, IndexError, ValueError):
        return None, None, None


def log_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def log_since(path, offset):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


# kube-scheduler's error lines for a pod whose scheduling cycle or binding failed ("Error
# scheduling pod; retrying": an extender's bind refused, an extender call that failed or timed
# out), and for API calls that timed out. A refused bind of gpulet's extender says "no longer fits".
SCHED_ERROR = re.compile(r"Error scheduling pod|[Ff]ailed to bind|[Bb]inding rejected|Client\.Timeout|"
                         r"context deadline exceeded|i/o timeout|connection refused|connection reset")
REFUSED = "no longer fits"


def check_frac(api, pods, a):
    nodes, _ = api.list_all("/api/v1/nodes?labelSelector=" + urllib.parse.quote("gpulet.io/scale-set=vgpu"))
    units, owner = {}, {}
    for n in nodes:
        for g in json.loads(n["metadata"].get("annotations", {}).get(ANN_NODE_GPUS, "[]")):
            units[g["uuid"]] = g["memoryUnits"]
            owner[g["uuid"]] = n["metadata"]["name"]
    cores, mem = collections.Counter(), collections.Counter()
    problems = []
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node:
            continue
        ann = p["metadata"].get("annotations", {})
        for i, c in enumerate(p["spec"]["containers"]):
            lim = c.get("resources", {}).get("limits", {})
            cc, mm = int(lim.get(CORE, 0)), int(lim.get(MEMORY, 0))
            if cc <= 0:
                continue
            uuids = [u for u in ann.get(f"{ANN_GPUS_PREFIX}{i}", "").split(",") if u]
            want = max(1, cc // 100) if cc >= 100 else 1
            if len(uuids) != want:
                problems.append(f"{p['metadata']['name']} container {i}: {len(uuids)} GPUs annotated, {want} expected")
                continue
            for u in uuids:
                if owner.get(u) != node:
                    problems.append(f"{p['metadata']['name']}: GPU {u} is not on its node {node}")
                cores[u] += 100 if cc >= 100 else cc
                mem[u] += units.get(u, 0) if cc >= 100 else mm
    over = [u for u in cores if cores[u] > 100 or mem[u] > units.get(u, 0)]
    per_gpu = min(100 // a.cores, UNITS_PER_GPU // a.units) if a.cores < 100 else 1
    return {"overcommitted_gpus": len(over), "placement_problems": len(problems), "problem_examples": problems[:3],
            "gpus_used": len(cores), "gpus_min": math.ceil(len([p for p in pods if p["spec"].get("nodeName")]) / per_gpu)}


def check_whole(api, pods, a):
    per_node = collections.Counter()
    for p in pods:
        if p["spec"].get("nodeName"):
            for c in p["spec"]["containers"]:
                per_node[p["spec"]["nodeName"]] += int(c.get("resources", {}).get("limits", {}).get(WHOLE, 0))
    over = [n for n, v in per_node.items() if v > GPUS_PER_NODE]
    used = sum(per_node.values())
    return {"overcommitted_gpus": sum(per_node[n] - GPUS_PER_NODE for n in over), "placement_problems": 0,
            "gpus_used": used, "gpus_min": used}


def mib(q):
    """A memory quantity in MiB (the forms the API server writes: 5Gi, 5120Mi, bytes)."""
    for suffix, f in (("Ki", 1 / 1024), ("Mi", 1), ("Gi", 1024), ("Ti", 1024 * 1024)):
        if q.endswith(suffix):
            return float(q[:-2]) * f
    return float(q) / (1 << 20)


def check_dra(api, pods, a):
    claims, _ = api.list_all(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")
    by_name = {c["metadata"]["name"]: c for c in claims}
    holders, cores, mem = collections.Counter(), collections.Counter(), collections.Counter()
    problems = []
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node:
            continue
        c = by_name.get(p["metadata"]["name"])
        results = (c or {}).get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        if not results:
            problems.append(f"{p['metadata']['name']}: bound without an allocated claim")
            continue
        for r in results:
            d = (r["driver"], r["pool"], r["device"])
            holders[d] += 1
            used = r.get("consumedCapacity", {})
            cores[d] += int(used.get("cores", "100"))
            mem[d] += mib(used.get("memory", "80Gi"))
            if r["pool"] != node:
                problems.append(f"{p['metadata']['name']}: device {r['pool']}/{r['device']} is not on its node {node}")
            if a.kind == "drashare" and not (r.get("shareID") and used):
                problems.append(f"{p['metadata']['name']}: share of {r['pool']}/{r['device']} without shareID or consumedCapacity")
    bound = len([p for p in pods if p["spec"].get("nodeName")])
    if a.kind == "dra":
        over = [d for d, n in holders.items() if n > 1]
        return {"overcommitted_gpus": len(over), "placement_problems": len(problems), "problem_examples": problems[:3],
                "gpus_used": len(holders), "gpus_min": bound}
    over = [d for d in holders if cores[d] > 100 or mem[d] > 80 * 1024]
    per_gpu = min(100 // a.cores, UNITS_PER_GPU // a.units)
    return {"overcommitted_gpus": len(over), "placement_problems": len(problems), "problem_examples": problems[:3],
            "gpus_used": len(holders), "gpus_min": math.ceil(bound / per_gpu)}


def cmd_burst(api, a):
    sid = a.scenario
    if a.kind in ("dra", "drashare"):
        t = time.time()
        errors = parallel(lambda i: api.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
                                             claim_body(a, f"{sid}-{i:05d}")), range(a.pods), a.threads)
        if errors:
            sys.exit(f"scale.py burst: creating claims failed: {errors[0]}")
        print(f"  {a.pods} ResourceClaims created beforehand in {time.time() - t:.1f} s (not timed)", flush=True)
    figs = {name: proc_figures(pid) for name, pid in
            (("extender", a.extender_pid), ("scheduler", a.scheduler_pid), ("apiserver", a.apiserver_pid),
             ("kwok", a.kwok_pid)) if pid}
    logs = {"extender": (a.extender_log, log_size(a.extender_log)),
            "scheduler": (a.scheduler_log, log_size(a.scheduler_log))}
    bodies = [pod_body(a, sid, i) for i in range(a.pods)]
    _, rv = api.list_all(f"/api/v1/namespaces/{NS}/pods?labelSelector=" + urllib.parse.quote(f"scale-burst={sid}"))
    deadline = time.time() + a.timeout
    out = os.path.join(a.workdir, f"{sid}.watch.json")
    ready = multiprocessing.Event()
    progress = multiprocessing.Value("i", 0)
    w = multiprocessing.Process(target=watch, args=(a, sid, rv, a.pods, deadline, out, ready, progress))
    w.start()
    if not ready.wait(30):
        w.kill()
        sys.exit("scale.py burst: the pod watch did not start within 30 s")
    load = open("/proc/loadavg").read().split()[:3]
    posted = {}
    t0 = time.time()

    def create(b):
        api.call("POST", f"/api/v1/namespaces/{NS}/pods", b)
        posted[b["metadata"]["name"]] = time.time()

    errors = parallel(create, bodies, a.threads)
    t_posted = time.time()
    disturbed = None
    if a.disturb:
        # The fault (tests/scale/disturb) once the given share of the burst is bound: mid-burst,
        # with binds in flight, as a rollout or a crash would land.
        while w.is_alive() and progress.value < a.disturb_at * a.pods and time.time() < deadline:
            w.join(0.1)
        t_d = time.time()
        with open(os.path.join(a.workdir, f"{sid}.disturb.log"), "w") as log:
            rc = subprocess.run(["bash", "-c", a.disturb], stdout=log, stderr=subprocess.STDOUT).returncode
        disturbed = {"at_s": round(t_d - t0, 2), "bound_then": progress.value, "took_s": round(time.time() - t_d, 2),
                     "rc": rc}
        print(f"  {sid}: {a.disturb!r} at {disturbed['at_s']} s ({disturbed['bound_then']} bound), "
              f"took {disturbed['took_s']} s, exit {rc}", flush=True)
    w.join(max(1, deadline - time.time() + 5))
    if w.is_alive():
        w.terminate()
        w.join(5)
    try:
        watched = json.load(open(out))
    except (OSError, ValueError):
        watched = {"stops": ["the watcher wrote no result"]}
    if "error" in watched:
        sys.exit(f"scale.py burst: {watched['error']}")
    seen = watched.get("pods", {})
    pods, _ = api.list_all(f"/api/v1/namespaces/{NS}/pods?labelSelector=" + urllib.parse.quote(f"scale-burst={sid}"))
    bound_api = sum(1 for p in pods if p["spec"].get("nodeName"))
    lat = [b - c for c, b in seen.values() if c is not None and b is not None]
    last_bound = max((b for _, b in seen.values() if b is not None), default=None)
    check = {"whole": check_whole, "frac": check_frac, "dra": check_dra, "drashare": check_dra}[a.kind](api, pods, a)
    ext_lines = log_since(*logs["extender"])
    sched_lines = log_since(*logs["scheduler"])
    # Refusals are counted where kube-scheduler reports them (the extender answers the bind with
    # the error; it may or may not log it too); the other errors beside them.
    refused = sum(1 for l in sched_lines if REFUSED in l)
    refused_logged = sum(1 for l in ext_lines if REFUSED in l)
    bind_errors = [l for l in sched_lines if SCHED_ERROR.search(l) and REFUSED not in l]
    after = {name: proc_figures(pid) for name, pid in
             (("extender", a.extender_pid), ("scheduler", a.scheduler_pid), ("apiserver", a.apiserver_pid),
              ("kwok", a.kwok_pid)) if pid}
    cpu = {n: round(after[n][2] - figs[n][2], 1) for n in after if after[n][2] is not None and figs.get(n, (None,) * 3)[2] is not None}
    row = {
        "scenario": sid, "kind": a.kind, "policy": a.policy or "", "nodes": a.nodes, "pods": a.pods,
        "created": len(posted), "create_errors": [str(e) for e in errors][:3],
        "create_s": round(t_posted - t0, 2), "create_rate": round(len(posted) / max(1e-9, t_posted - t0), 1),
        "bound_watch": len(lat), "bound_api": bound_api,
        "all_bound_s": round(last_bound - t0, 2) if last_bound and bound_api == a.pods else None,
        "pods_per_s": round(a.pods / (last_bound - t0), 1) if last_bound and bound_api == a.pods else None,
        "p50_s": round(pct(lat, 50), 3), "p99_s": round(pct(lat, 99), 3), "max_s": round(max(lat, default=float("nan")), 3),
        "t0": round(t0, 3), "t_end": round(time.time(), 3),
        "watch_stops": watched.get("stops", [])[:5], "watch_resynced": watched.get("resynced", 0),
        "refused_binds": refused, "refused_in_extender_log": refused_logged, "bind_errors": len(bind_errors), "bind_error_examples": [l[-300:] for l in bind_errors[:3]],
        "cpu_s": cpu,
        "extender_rss_mib": round(after["extender"][0], 1) if after.get("extender", (None,))[0] else None,
        "extender_peak_rss_mib": round(after["extender"][1], 1) if after.get("extender", (None,))[0] else None,
        "loadavg_before": " ".join(load), "loadavg_after": " ".join(open("/proc/loadavg").read().split()[:3]),
        "gpulet": a.gpulet_label,
    }
    row.update(check)
    failures = []
    if errors:
        failures.append(f"{len(errors)}+ pods not created: {errors[0]}")
    if bound_api != a.pods:
        failures.append(f"{a.pods - bound_api} of {a.pods} pods not bound within {a.timeout} s")
    if watched.get("stops"):
        print(f"  note {sid}: the watch was resumed {len(watched['stops'])} times ({watched['stops'][0]}); "
              f"{watched.get('resynced', 0)} bound times taken from a LIST", flush=True)
    if check["overcommitted_gpus"]:
        failures.append(f"{check['overcommitted_gpus']} GPUs over-committed")
    if check["placement_problems"]:
        failures.append(f"{check['placement_problems']} placement problems, e.g. {check['problem_examples'][0]}")
    if refused:
        failures.append(f"{refused} binds refused by the extender (kube-scheduler's log: {REFUSED!r})")
    if bind_errors and not a.disturb:
        failures.append(f"{len(bind_errors)} other scheduling errors in the kube-scheduler log, e.g. {bind_errors[0][-200:]}")
    if disturbed is not None:
        # A fault makes kube-scheduler's calls fail for a while (reported, retried); what must hold
        # is every pod bound once, nothing over-committed, and the burst within 2x its undisturbed
        # time (a burst of the same policy and size earlier in the run, --baseline).
        row["disturbance"] = {"command": a.disturb, **disturbed}
        if disturbed["rc"] != 0:
            failures.append(f"the disturbance exited {disturbed['rc']} (its log: {sid}.disturb.log)")
        base = [r for r in (json.loads(l) for l in open(a.out) if l.strip())
                if r.get("scenario") == a.baseline] if a.baseline and os.path.exists(a.out) else []
        if base and base[-1].get("all_bound_s") and row["all_bound_s"]:
            row["vs_baseline"] = round(row["all_bound_s"] / base[-1]["all_bound_s"], 2)
            if row["vs_baseline"] > a.max_ratio:
                failures.append(f"{row['all_bound_s']} s is {row['vs_baseline']}x the undisturbed "
                                f"{a.baseline} ({base[-1]['all_bound_s']} s): more than {a.max_ratio}x")
        elif a.baseline:
            row["vs_baseline"] = None
    row["failures"] = failures
    with open(a.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"  {sid}: {row['bound_api']}/{a.pods} bound, create->all bound {row['all_bound_s']} s "
          f"({row['pods_per_s']} pods/s), p50 {row['p50_s']} s, p99 {row['p99_s']} s; created in {row['create_s']} s "
          f"({row['create_rate']}/s); refused binds {refused}, bind errors {len(bind_errors)}, "
          f"over-committed GPUs {check['overcommitted_gpus']}, GPUs used {check['gpus_used']} (min {check['gpus_min']}); "
          f"extender RSS {row['extender_rss_mib']} MiB; CPU s {cpu}; load {row['loadavg_before']}", flush=True)
    for fl in failures:
        print(f"  FAIL {sid}: {fl}", flush=True)


def cmd_node_delete(api, a):
    """A node deleted with granted pods on it, and back (issue 30 item 4): the vGPU node holding the
    most bound pods of the namespace loses its pods and itself (as PodGC and a node's removal do),
    is created again under the same name, and must then take 8 pods of a whole GPU each through the
    extender, one per GPU: a grant of the deleted pods left in the extender's state would refuse
    some of them. Exit status 1 when it does not."""
    pods, _ = api.list_all(f"/api/v1/namespaces/{NS}/pods")
    per = collections.Counter(p["spec"].get("nodeName") for p in pods
                              if p["spec"].get("nodeName", "").startswith("vgpu-"))
    if not per:
        sys.exit("scale.py node-delete: no vGPU node has a bound pod (run a frac burst first)")
    node, held = per.most_common(1)[0]
    t = time.time()
    parallel(lambda p: api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}?gracePeriodSeconds=0",
                                ok=(200, 202, 404)),
             [p for p in pods if p["spec"].get("nodeName") == node], a.threads)
    api.call("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
    while True:
        left, _ = api.list_all(f"/api/v1/namespaces/{NS}/pods?fieldSelector=spec.nodeName%3D{node}")
        try:
            api.call("GET", f"/api/v1/nodes/{node}")
            gone = False
        except ApiError:
            gone = True
        if gone and not left:
            break
        if time.time() - t > a.timeout:
            sys.exit(f"scale.py node-delete: node {node} or its pods still there after {a.timeout} s")
        time.sleep(0.2)
    api.call("POST", "/api/v1/nodes", node_body("vgpu", node, int(node.rsplit("-", 1)[1])))
    print(f"  node-delete: {node} deleted with its {held} pods and created again in {time.time() - t:.1f} s", flush=True)
    # kwok marks it Ready; then one pod per GPU, pinned to it.
    while not any(c["type"] == "Ready" and c["status"] == "True"
                  for c in api.call("GET", f"/api/v1/nodes/{node}").get("status", {}).get("conditions", [])):
        if time.time() - t > a.timeout:
            sys.exit(f"scale.py node-delete: {node} not Ready again after {a.timeout} s")
        time.sleep(0.2)
    b = argparse.Namespace(kind="frac", cores=100, units=UNITS_PER_GPU, policy="")
    bodies = []
    for i in range(GPUS_PER_NODE):
        body = pod_body(b, "refill", i)
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        bodies.append(body)
    t1 = time.time()
    errors = parallel(lambda body: api.call("POST", f"/api/v1/namespaces/{NS}/pods", body), bodies, a.threads)
    if errors:
        sys.exit(f"scale.py node-delete: creating the refill pods failed: {errors[0]}")
    while True:
        refill, _ = api.list_all(f"/api/v1/namespaces/{NS}/pods?labelSelector=scale-burst%3Drefill")
        bound = [p for p in refill if p["spec"].get("nodeName") == node]
        if len(bound) == GPUS_PER_NODE or time.time() - t1 > a.timeout:
            break
        time.sleep(0.2)
    gpus = collections.Counter(u for p in bound for u in p["metadata"].get("annotations", {})
                               .get(f"{ANN_GPUS_PREFIX}0", "").split(",") if u)
    ok = len(bound) == GPUS_PER_NODE and len(gpus) == GPUS_PER_NODE and max(gpus.values(), default=0) == 1
    print(f"  node-delete: {len(bound)} of {GPUS_PER_NODE} whole-GPU pods bound on the new {node} in "
          f"{time.time() - t1:.1f} s, on {len(gpus)} distinct GPUs", flush=True)
    if not ok:
        sys.exit(f"  FAIL node-delete: the recreated {node} took {len(bound)} of {GPUS_PER_NODE} whole-GPU pods "
                 f"(GPUs {dict(gpus)}): the deleted pods' grants were not freed")


def cmd_clean(api, a):
    t = time.time()
    api.call("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    api.call("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")
    while True:
        pods, _ = api.list_all(f"/api/v1/namespaces/{NS}/pods")
        claims, _ = api.list_all(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")
        if not pods and not claims:
            break
        # A claim the scheduler allocated keeps its finalizer until kube-controller-manager's claim
        # controller deallocates it; none runs here, so the harness lifts it once the pods are gone.
        if not pods:
            parallel(lambda c: api.call("PATCH", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/"
                                                 f"{c['metadata']['name']}", {"metadata": {"finalizers": None}},
                                        ok=(200, 404)),
                     [c for c in claims if c["metadata"].get("finalizers")], a.threads)
        if time.time() - t > a.timeout:
            sys.exit(f"scale.py clean: {len(pods)} pods and {len(claims)} claims still there after {a.timeout} s")
        time.sleep(0.5)
    print(f"  cleaned in {time.time() - t:.1f} s")


def fmt(v, unit=""):
    return "-" if v is None else f"{v}{unit}"


def cmd_table(api, a):
    rows = [json.loads(l) for l in open(a.out) if l.strip()]
    print("| scenario | nodes | pods | create -> all bound | pods/s | p50 / p99 create->bound | created in | refused binds | "
          "bind errors | over-committed GPUs | GPUs used (min) | extender RSS (peak) | CPU s: extender / kube-scheduler / apiserver | load before | gpulet |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r.get("cpu_s", {})
        print(f"| {r['scenario']} | {r['nodes']} | {r['pods']} | {fmt(r['all_bound_s'], ' s')} | {fmt(r['pods_per_s'])} | "
              f"{r['p50_s']} / {r['p99_s']} s | {r['create_s']} s | {r['refused_binds']} | {r['bind_errors']} | "
              f"{r['overcommitted_gpus']} | {r['gpus_used']} ({r['gpus_min']}) | "
              f"{fmt(r.get('extender_rss_mib'), ' MiB')} ({fmt(r.get('extender_peak_rss_mib'))}) | "
              f"{c.get('extender', '-')} / {c.get('scheduler', '-')} / {c.get('apiserver', '-')} | {r['loadavg_before']} | {r.get('gpulet', '')} |")
    bad = [(r["scenario"], f) for r in rows for f in r.get("failures", [])]
    for s, f in bad:
        print(f"FAIL {s}: {f}")
    sys.exit(1 if bad and a.strict else 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["nodes", "ready", "burst", "clean", "table", "node-delete"])
    p.add_argument("--server")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--kind")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--prefix", default="node")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--scenario")
    p.add_argument("--pods", type=int, default=0)
    p.add_argument("--nodes", type=int, default=0, help="nodes per set (reported)")
    p.add_argument("--policy", default="")
    p.add_argument("--cores", type=int, default=30)
    p.add_argument("--units", type=int, default=20)
    p.add_argument("--workdir", default=".")
    p.add_argument("--out", default="results.jsonl")
    p.add_argument("--extender-pid", type=int, default=0)
    p.add_argument("--scheduler-pid", type=int, default=0)
    p.add_argument("--apiserver-pid", type=int, default=0)
    p.add_argument("--kwok-pid", type=int, default=0)
    p.add_argument("--extender-log", default="")
    p.add_argument("--scheduler-log", default="")
    p.add_argument("--gpulet-label", default="")
    p.add_argument("--strict", action="store_true", help="table: exit 1 when a burst failed a check")
    p.add_argument("--disturb", default="", help="burst: a shell command run once --disturb-at of the pods are bound")
    p.add_argument("--disturb-at", type=float, default=0.3)
    p.add_argument("--baseline", default="", help="burst: the undisturbed scenario whose time this one must stay within --max-ratio of")
    p.add_argument("--max-ratio", type=float, default=2.0)
    a = p.parse_args()
    api = Api(a) if a.command != "table" else None
    {"nodes": cmd_nodes, "ready": cmd_ready, "burst": cmd_burst, "clean": cmd_clean, "table": cmd_table,
     "node-delete": cmd_node_delete}[a.command](api, a)


if __name__ == "__main__":
    main()
