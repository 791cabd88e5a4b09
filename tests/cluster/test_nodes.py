"""Three real nodes on one machine (issue 30 item 6): `GPULET_CLUSTER_NODES=3 testing/k8s/cluster up`
on containerd 2, gpulet-node, gpulet-node-1 and gpulet-node-2, each with its own mount namespace,
containerd, kubelet (ports, certificate, cgroup root) and 8 fake H100s from a device plugin of its
own; one control plane, one pod network. What only more than one node shows:

- the real kube-scheduler spreads whole-GPU pods over the nodes' own GPUs, and the API server
  reaches each node's kubelet (exec) on that node's port; pods on different nodes reach each other;
- gpulet's agent on every node (vGPU on GPUs 4-7) and gpulet's extender: binpack puts consecutive
  fractional pods on one node and one GPU, spread puts them on three nodes;
- the agent of one node restarted in the middle of a burst of fractional pods (a Deployment's):
  the pods the kubelet rejects meanwhile are replaced, all end Running with the grant they were
  bound with, and no GPU is over-committed;
- the agent installed as a DaemonSet (`kubectl apply -k`, on the pod network) on every node, then
  a new image rolled out one node at a time: the running fractional pods keep their containers and
  their grants, in the agent's accounting and the extender's; `kubectl delete -k` restores every
  node's containerd configuration;
- one node "reboots" (its kubelet stops, its containers die) while the others keep serving: a pod
  elsewhere keeps its container, a new one starts on another node during the outage, and the node
  serves fractional pods again once its kubelet and agent are back;
- a node with granted fractional pods (a Deployment's) is drained and deleted: the pods are placed
  again on another node and the extender's state drops the node, its grants with it;
- the agent as the DRA driver on an H100 node and a T4 node: a claim selecting by productName is
  allocated from, and runs on, the one node whose GPUs match.

Outside the DaemonSet step the agents run as host processes (`cluster plugin` with
GPULET_CLUSTER_PLUGIN=agent), which do not validate their engine as the DaemonSet's does: the pods
tolerate the not-yet-validated taint. The tests run in the file's order on one cluster; the last one
stops it and checks what it left."""
import collections
import json
import shutil
import subprocess
import urllib.request

import pytest
import yaml

import dra_support as ds
import harness as h
import vgpu_support as v

STATE = h.BUILD / "cluster-test-nodes"
LOGS_KEPT = h.BUILD / "cluster-test-nodes-logs"
NODES = ["gpulet-node", "gpulet-node-1", "gpulet-node-2"]
LIB = (h.GPULET.parent / "../lib/libgpulet-vcuda.so").resolve()
# The extender, a host process: its HTTP port (kube-scheduler's calls) and health port.
EXT_PORT, EXT_HEALTH = 24811, 24812
TOLERATE = [{"key": v.TAINT, "operator": "Exists", "effect": "NoSchedule"}]
PACK = {"gpulet.io/vgpu-policy": "binpack"}
SPREAD = {"gpulet.io/vgpu-policy": "spread"}
# A stand-in image with busybox's ping (testing/k8s/cluster EXAMPLE_IMAGES).
PING_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"


class Nodes:
    """The cluster, and the extender once a test started it."""

    def __init__(self, cluster):
        self.cluster, self.kube = cluster, cluster.kube
        self.extender = None
        self.agents = False
        self.survivor = ""  # the node of gpulet-node-1 and -2 that the drain step left


@pytest.fixture(scope="module")
def nodes(request):
    failed_before = request.session.testsfailed
    with h.own_cluster(STATE, env={"GPULET_CLUSTER_NODES": str(len(NODES))}) as c:
        n = Nodes(c)
        try:
            yield n
        finally:
            if request.session.testsfailed > failed_before:
                for log in ["kube-scheduler", "extender"] + [f"gpulet-device-plugin{sfx(x)}" for x in NODES]:
                    print(f"--- {log}.log (tail)")
                    print(h.tail_file((h.D / "logs" if (h.D / "logs").exists() else LOGS_KEPT) / f"{log}.log", 15))
            if n.extender is not None and n.extender.poll() is None:
                n.extender.terminate()


def on(node, *args, env=None, **kw):
    """testing/k8s/cluster ARGS acting on node (GPULET_CLUSTER_NODE)."""
    return h.must(h.CLUSTER, *args[:1], h.BUILD, *args[1:], env={"GPULET_CLUSTER_NODE": node, **(env or {})}, **kw)


def node_of(kube, name):
    return ((kube.pod(name) or {}).get("spec", {})).get("nodeName", "")


def pinned(node):
    return {"nodeSelector": {"kubernetes.io/hostname": node}}


def frac(name, cores=30, units=8, policy=PACK, **spec):
    p = h.vgpu_pod(name, cores, units, tolerations=TOLERATE, **spec)
    p["metadata"]["annotations"] = dict(policy)
    return p


def container_id(kube, name):
    st = ((kube.pod(name) or {}).get("status", {}).get("containerStatuses") or [{}])[0]
    return st.get("containerID", ""), st.get("restartCount", -1)


def extender_state():
    with urllib.request.urlopen(f"http://127.0.0.1:{EXT_PORT}/scheduler/state", timeout=5) as r:
        return json.loads(r.read())


def used_cores(state, node):
    return sum(100 - g["freeCores"] for g in state.get(node, []))


def ready(kube, node):
    for c in ((kube.node(node) or {}).get("status", {}).get("conditions")) or []:
        if c["type"] == "Ready":
            return c["status"] == "True"
    return False


def test_three_nodes_each_with_its_own_kubelet_containerd_and_gpus(nodes):
    kube = nodes.kube
    ports = set()
    for n in NODES:
        h.wait_until(60, f"Node {n} Ready", lambda n=n: ready(kube, n))
        assert kube.allocatable("nvidia.com/gpu", node=n) == "8", f"{n}: nvidia.com/gpu {kube.allocatable('nvidia.com/gpu', node=n)!r}"
        ports.add(kube.node(n)["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"])
    assert len(ports) == len(NODES), f"each kubelet serves on a port of its own: {sorted(ports)}"
    kubelets = {(h.D / f"pids/kubelet{sfx(n)}").read_text().strip() for n in NODES}
    assert len(kubelets) == len(NODES), f"one kubelet process a node: {kubelets}"
    for n in NODES[1:]:
        assert (h.D / f"nodes/{n}/containerd/root").is_dir(), f"{n} has a containerd root of its own"
    t0, t1 = (float(x) for x in (h.D / "startup-times").read_text().split())
    h.figure(f"cluster up with {len(NODES)} real nodes (control plane, kubelets, device plugins) in {t1 - t0:.1f} s")


def test_whole_gpu_pods_fill_each_node_from_its_own_kubelet(nodes):
    kube = nodes.kube
    names = [f"whole-{i}" for i in range(len(NODES))]
    for name in names:
        kube.create(h.pod(name, {"nvidia.com/gpu": 8}))
    for name in names:
        kube.wait_running(name, 90)
    placed = {name: node_of(kube, name) for name in names}
    assert sorted(placed.values()) == sorted(NODES), f"8 GPUs a pod, one pod a node: {placed}"
    for name in names:
        # kubectl exec: the API server reaches the pod's own kubelet on that node's port.
        rc, out = kube.exec(name, "ls /dev | grep -c '^nvidia[0-9]'")
        assert rc == 0 and out.strip() == "8", f"{name} on {placed[name]} sees its 8 GPUs (rc {rc}): {out}"
    kube.create(h.pod("whole-extra", {"nvidia.com/gpu": 1}))
    h.wait_until(30, "whole-extra Unschedulable", lambda: kube.unschedulable("whole-extra"),
                 detail=lambda: kube.describe("whole-extra"))
    msg = kube.condition("whole-extra", "PodScheduled", field="message")
    assert f"0/{len(NODES)} nodes are available" in msg and "Insufficient nvidia.com/gpu" in msg, msg
    kube.clean_pods(*names, "whole-extra")


def test_pods_on_different_nodes_reach_each_other(nodes):
    kube = nodes.kube
    a, b = "net-a", "net-b"
    kube.create(h.pod(a, image=PING_IMAGE, hostNetwork=False, **pinned(NODES[0])))
    kube.create(h.pod(b, image=PING_IMAGE, hostNetwork=False, **pinned(NODES[2])))
    kube.wait_running(a)
    kube.wait_running(b)
    ip_a, ip_b = kube.pod(a)["status"]["podIP"], kube.pod(b)["status"]["podIP"]
    assert ip_a != ip_b, f"one address pool for every node's pods: {ip_a} twice"
    rc, out = kube.exec(a, f"ping -c 1 -W 2 {ip_b}")
    assert rc == 0, f"{a} ({NODES[0]}, {ip_a}) reaches {b} ({NODES[2]}, {ip_b}): {out}"
    kube.clean_pods(a, b)


def start_agent(node, *args, gpulet=h.GPULET):
    """gpulet's agent (the binary gpulet) as the node's device plugin: vGPU on GPUs 4-7, the
    extender's grants read from the API server; args added."""
    on(node, "plugin", "dgx-h100", "--node-name", node, "--kubeconfig", h.D / "admin.kubeconfig",
       "--vgpu-gpus", "4,5,6,7", "--vgpu-library", LIB, "--metrics-address", "127.0.0.1:0", *args,
       env={"GPULET_CLUSTER_PLUGIN": "agent", "GPULET": str(gpulet), "SPDLOG_LEVEL": "debug"})


def start_extender(nodes, kubeconfig):
    """gpulet's extender as a host process acting as kubeconfig's user (the one before it
    stopped), serving once its state lists every node."""
    if nodes.extender is not None:
        nodes.extender.terminate()
        nodes.extender.wait(10)
    nodes.extender = subprocess.Popen(
        [str(h.GPULET), "scheduler", "--kubeconfig", str(kubeconfig),
         "--extender-listen", f"127.0.0.1:{EXT_PORT}", "--webhook-listen", "",
         "--health-listen", f"127.0.0.1:{EXT_HEALTH}", "--extender-debug-endpoints"],
        stdout=open(h.D / "logs/extender.log", "ab"), stderr=subprocess.STDOUT)
    h.wait_until(60, "the extender's state lists the three nodes",
                 lambda: all(n in extender_state() for n in NODES))


def service_account_kubeconfig(name, path):
    """A kubeconfig at path for ServiceAccount gpulet-system/name: the admin's cluster entry, a
    token from the TokenRequest API (`kubectl create token`)."""
    rc, token = h.kubectl("-n", h.NS, "create", "token", name, "--duration=1h")
    assert rc == 0, f"kubectl create token {name}: {h.tail(token)}"
    config = yaml.safe_load((h.D / "admin.kubeconfig").read_text())
    config["users"] = [{"name": name, "user": {"token": token.strip()}}]
    for c in config["contexts"]:
        c["context"]["user"] = name
    path.write_text(yaml.safe_dump(config))
    return path


def vgpu_capacity(kube, node):
    return (kube.allocatable("tencent.com/vcuda-core", node=node) == "400"
            and kube.allocatable("nvidia.com/gpu", node=node) == "4")


def test_extender_packs_and_spreads_fractional_pods_across_nodes(nodes):
    kube = nodes.kube
    for n in NODES:
        start_agent(n)
    for n in NODES:
        h.wait_until(60, f"{n}: 400 vcuda-core and 4 nvidia.com/gpu allocatable", lambda n=n: vgpu_capacity(kube, n),
                     detail=lambda n=n: h.tail_file(h.D / f"logs/gpulet-device-plugin{sfx(n)}.log"))
    nodes.agents = True
    start_extender(nodes, h.D / "admin.kubeconfig")
    # The shipped KubeSchedulerConfiguration, the extender at the host process's address (HTTP on
    # loopback).
    config = STATE / "kube-scheduler.yaml"
    shipped = yaml.safe_load(v.SHIPPED_SCHEDULER_CONFIG.read_text())["data"]["kube-scheduler-config.yaml"]
    config.write_text(yaml.safe_dump(v.scheduler_config_here(shipped, f"http://127.0.0.1:{EXT_PORT}/scheduler")))
    h.must(h.CLUSTER, "scheduler", h.BUILD, config)

    packed = [f"pack-{i}" for i in range(3)]
    for name in packed:  # one at a time: each decision sees the grants before it
        kube.create(frac(name))
        kube.wait_running(name, 90)
    where = {name: (node_of(kube, name), v.annotation(kube, name, "gpulet.io/vgpu-gpus-0")) for name in packed}
    assert len(set(where.values())) == 1, f"binpack: 3 x 30 cores on one node and one GPU: {where}"
    pack_node = where[packed[0]][0]
    state = extender_state()
    assert used_cores(state, pack_node) == 90, f"the extender holds 90 cores granted on {pack_node}: {state[pack_node]}"

    check_vgpu_env(kube, packed)
    kube.clean_pods(*packed)
    h.wait_until(30, "the extender frees the deleted pods' grants",
                 lambda: all(used_cores(extender_state(), n) == 0 for n in NODES),
                 detail=lambda: json.dumps(extender_state()))

    # Spread: each node scores by the compute free after the pod, so on empty nodes one pod each.
    spread = [f"spread-{i}" for i in range(3)]
    for name in spread:
        kube.create(frac(name, policy=SPREAD))
        kube.wait_running(name, 90)
    on_nodes = {name: node_of(kube, name) for name in spread}
    assert sorted(on_nodes.values()) == sorted(NODES), f"spread: one pod a node: {on_nodes}"
    check_vgpu_env(kube, spread)
    kube.clean_pods(*spread)
    h.wait_until(30, "the extender frees the deleted pods' grants",
                 lambda: all(used_cores(extender_state(), n) == 0 for n in NODES),
                 detail=lambda: json.dumps(extender_state()))


def test_an_agent_restarted_mid_burst_keeps_every_grant(nodes):
    """Issue 30 item 4's agent fault, on real kubelets: a Deployment of 24 fractional pods (30
    cores, binpack) created at once; once a third are bound, the agent of the node holding the
    most is restarted (SIGTERM and a new process: its device plugin registers with the kubelet
    again, its vGPU state is rebuilt from the API server) while that kubelet admits them. The
    kubelet rejects a pod whose Allocate finds no plugin (UnexpectedAdmissionError: the pod
    Failed, as with any device plugin's restart); its ReplicaSet replaces it, through the
    extender again. In the end 24 pods run, each container on the GPU its pod's annotation names
    (the agents correct their guesses of which like pod an Allocate is for right after each grant,
    from the kubelet's record), no GPU is over-committed, by the pods' grants or in the extender's
    state, and the rejected pods hold nothing there; deleting the Deployment frees every grant."""
    need_agents(nodes)
    kube = nodes.kube
    replicas, app = 24, "burst"
    spec = frac("x")["spec"]
    spec["restartPolicy"] = "Always"

    def pods():
        return [p for p in kube.pods(selector=f"app={app}") if not p["metadata"].get("deletionTimestamp")]

    def phase(p):
        return p.get("status", {}).get("phase", "")

    def bound():
        return collections.Counter(p["spec"].get("nodeName") for p in pods() if p["spec"].get("nodeName"))
    t0 = h.now()
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "namespace": "default"},
                 "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
                          "template": {"metadata": {"labels": {"app": app}, "annotations": PACK}, "spec": spec}}})
    try:
        h.wait_until(60, "a third of the burst bound", lambda: sum(bound().values()) >= replicas // 3,
                     interval=0.05, detail=lambda: dict(bound()))
        counts = bound()
        victim = counts.most_common(1)[0][0]
        start_agent(victim)
        h.figure(f"agent of {victim} restarted with {sum(counts.values())} of {replicas} pods bound "
                 f"({counts[victim]} on it) at {h.elapsed(t0)} s")
        running = h.wait_until(240, f"{replicas} pods of the Deployment Running",
                               lambda: (r := [p for p in pods() if phase(p) == "Running"]) and len(r) == replicas and r,
                               detail=lambda: collections.Counter(phase(p) for p in pods()))
        rejected = [p["metadata"]["name"] for p in pods() if phase(p) == "Failed"]
        h.figure(f"{replicas} fractional pods, one agent restarted among them: all Running {h.elapsed(t0)} s "
                 f"after the Deployment was created; {len(rejected)} rejected by the kubelet and replaced")
        names = [p["metadata"]["name"] for p in running]
        restarted = [n for n in names if container_id(kube, n)[1] != 0]
        assert not restarted, f"containers restarted: {restarted}"
        # The kubelet admits like pods in its own order, not the extender's: each agent corrects
        # its records from the kubelet's (PodResources) right after each grant, before the
        # container starts, so every pod's annotation names the GPU its container got.
        check_vgpu_env(kube, names)
        corrected = sum(line.count("in the other order") + line.count("the grant moves")
                        for n in NODES
                        for line in (h.D / f"logs/gpulet-device-plugin{sfx(n)}.log").read_text().splitlines())
        h.figure(f"grants corrected from the kubelet's admission order: {corrected}")
        granted = collections.Counter()
        for n in names:
            granted[(node_of(kube, n), v.annotation(kube, n, "gpulet.io/vgpu-gpus-0"))] += 30
        assert max(granted.values()) <= 100, f"a GPU over-committed by the pods' grants: {dict(granted)}"
        state = extender_state()
        assert sum(used_cores(state, n) for n in NODES) == 30 * replicas, \
            f"the extender holds the running pods' grants, none of the {len(rejected)} rejected: {json.dumps(state)}"
        assert all(g["freeCores"] >= 0 for n in NODES for g in state.get(n, [])), json.dumps(state)
    finally:
        for n in NODES:  # the next steps restart the agents: keep what they logged during the burst
            log = h.D / f"logs/gpulet-device-plugin{sfx(n)}.log"
            shutil.copyfile(log, h.D / f"logs/burst-gpulet-device-plugin{sfx(n)}.log")
        kube.delete("apps/v1", "Deployment", app, ns="default")
        h.wait_until(90, "the Deployment's pods gone", lambda: not kube.pods(selector=f"app={app}"))
    h.wait_until(30, "every grant freed", lambda: all(used_cores(extender_state(), n) == 0 for n in NODES),
                 detail=lambda: json.dumps(extender_state()))
    for n in NODES:
        h.wait_until(60, f"{n}: the agent's vGPU capacity", lambda n=n: vgpu_capacity(kube, n))


def check_vgpu_env(kube, names):
    """The agent of each pod's node delivered the extender's grant: that GPU, 30 cores."""
    for name in names:
        rc, out = kube.exec(name, 'echo "$GPULET_VGPU_UUID $GPULET_VGPU_CORE_LIMIT"')
        want = f"{v.annotation(kube, name, 'gpulet.io/vgpu-gpus-0')} 30"
        assert rc == 0 and out.strip() == want, f"{name} on {node_of(kube, name)}: {out!r}, want {want!r}"


def need_agents(nodes):
    if not nodes.agents or nodes.extender is None:
        pytest.skip("needs the agents and the extender of the packing step (it failed before that)")


def sfx(node):
    """The suffix of the node's pid and log names in testing/k8s/cluster."""
    return "" if node == NODES[0] else f"-{node}"


def vgpu_view(url, pod):
    """An agent's view of the pod's vGPU container, from the agent's exporter at url: {family:
    value} of its core and memory limits."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        name = line.split("{")[0]
        if name in LIMIT_FAMILIES and f'pod="{pod}"' in line:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


LIMIT_FAMILIES = ("gpulet_vgpu_container_core_limit_ratio", "gpulet_vgpu_container_memory_limit_bytes")
OVERLAY = h.SRC / "tests/cluster/deploy/nodes"
NEXT_IMG = "gpulet.test/gpulet-sim:next"
AGENT = "app.kubernetes.io/name=gpulet-node"
NFD_LABEL = "feature.node.kubernetes.io/pci-10de.present"


def node_dir(node):
    """The node's directory in testing/k8s/cluster (the bind sources of its fixed paths)."""
    return h.D if node == NODES[0] else h.D / f"nodes/{node}"


def agent_pods(kube):
    """{node: the DaemonSet's agent pod there}, pods being deleted left out."""
    return {p["spec"].get("nodeName", ""): p for p in kube.pods(ns=h.NS, selector=AGENT)
            if not p["metadata"].get("deletionTimestamp")}


def pod_ready(p):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions") or [])


def agent_url(kube, node):
    """The node's agent pod's exporter, on the pod network (the overlay's port)."""
    return f"http://{agent_pods(kube)[node]['status']['podIP']}:19400/metrics"


def agent_log(kube, node):
    p = agent_pods(kube).get(node)
    if p:
        return h.tail(kube.logs(p["metadata"]["name"], ns=h.NS, container="agent"), 10)
    return f"no agent pod on {node}: {h.tail(h.kubectl('-n', h.NS, 'describe', 'daemonset', 'gpulet-node')[1], 8)}"


def installed(kube, node):
    """The node's agent pod Ready, its GPUs shared as the overlay says, the node validated."""
    p = agent_pods(kube).get(node)
    return (p is not None and pod_ready(p) and vgpu_capacity(kube, node)
            and kube.label("gpulet.io/gpu-stack", node=node) == "ready")


def test_a_rolling_daemonset_upgrade_keeps_every_node_s_grants(nodes):
    """gpulet's agent installed as the admin does (`kubectl apply -k`, deploy/overlays/containerd
    through tests/cluster/deploy/nodes: the DaemonSet on the pod network) on the three nodes, each
    configuring and restarting its node's containerd and validating it; then a new image rolled out
    (`kubectl set image`, the DaemonSet's RollingUpdate, maxUnavailable 1): never more than one node
    without a Ready agent, and the fractional pods running on every node keep their containers,
    their grants in the agent's accounting (the new agent's exporter reads the same limits) and
    the extender's; new pods then fill the GPUs around them. `kubectl delete -k` then restores each
    node's containerd configuration, and the host-process agents of the other steps come back."""
    need_agents(nodes)
    if not shutil.which("podman"):
        pytest.skip("podman missing (the image is built with podman build)")
    kube = nodes.kube
    configs = {n: node_dir(n) / "fixed/etc/containerd/config.toml" for n in NODES}
    before_install = {n: c.read_bytes() for n, c in configs.items()}
    for n in NODES:  # the node is the DaemonSet's now; a node has only the CDI spec install writes
        on(n, "plugin", "none")
        (node_dir(n) / "cdi/nvidia.yaml").unlink(missing_ok=True)
        # What NFD writes on a node with an NVIDIA PCI device (the DaemonSet's node affinity).
        v.patch_node(kube, {"metadata": {"labels": {NFD_LABEL: "true"}}}, node=n)
    nodes.agents = False
    h.gpulet_image(STATE, containerd2=True, nodes=NODES)
    for n in NODES:
        rc, out = h.node_ctr(n, "images", "tag", h.SIM_IMG, NEXT_IMG)
        assert rc == 0, f"ctr images tag on {n}: {h.tail(out)}"
    t0 = h.now()
    rc, out = h.kubectl("apply", "-k", OVERLAY)
    assert rc == 0, f"kubectl apply -k {OVERLAY}: {h.tail(out)}"
    for n in NODES:
        h.wait_until(120, f"{n}: the agent pod Ready, 400 vcuda-core and 4 nvidia.com/gpu, the node validated",
                     lambda n=n: installed(kube, n), detail=lambda n=n: agent_log(kube, n))
    h.figure(f"kubectl apply -k -> the agent DaemonSet serving and validated on {len(NODES)} nodes: {h.elapsed(t0)} s")
    for n in NODES:
        assert configs[n].read_bytes() != before_install[n], f"install configured {n}'s own containerd"
    # The installed admission policies let only gpulet's scheduler ServiceAccount bind with vGPU
    # annotations: the extender acts as that account from here on (its state from the API again).
    start_extender(nodes, service_account_kubeconfig("gpulet-scheduler", STATE / "scheduler.kubeconfig"))

    roll = [f"roll-{i}" for i in range(len(NODES))]
    for name in roll:
        kube.create(frac(name, policy=SPREAD))
        kube.wait_running(name, 90)
    where = {name: node_of(kube, name) for name in roll}
    assert sorted(where.values()) == sorted(NODES), f"spread: one pod a node: {where}"
    check_vgpu_env(kube, roll)
    want = {"gpulet_vgpu_container_core_limit_ratio": 0.3,
            "gpulet_vgpu_container_memory_limit_bytes": 8.0 * v.UNIT}
    for name, node in where.items():
        h.wait_until(30, f"{node}'s agent accounts {name}'s limits", lambda n=node, p=name: vgpu_view(agent_url(kube, n), p) == want,
                     detail=lambda n=node, p=name: vgpu_view(agent_url(kube, n), p))
    before = {name: container_id(kube, name) for name in roll}
    old = {n: p["metadata"]["uid"] for n, p in agent_pods(kube).items()}

    t0 = h.now()
    rc, out = h.kubectl("-n", h.NS, "set", "image", "daemonset/gpulet-node", f"*={NEXT_IMG}")
    assert rc == 0, f"kubectl set image: {h.tail(out)}"
    fewest, replaced = len(NODES), {}

    def rolled():
        nonlocal fewest
        pods = agent_pods(kube)
        fewest = min(fewest, sum(1 for n in NODES if n in pods and pod_ready(pods[n])))
        for n, p in pods.items():
            new = p["metadata"]["uid"] != old.get(n) and pod_ready(p)
            if new and n not in replaced and all(c["image"] == NEXT_IMG for c in p["spec"]["containers"]):
                replaced[n] = h.elapsed(t0)
        return len(replaced) == len(NODES)
    h.wait_until(240, "every node's agent pod replaced by a Ready one of the new image", rolled, interval=0.2,
                 detail=lambda: f"replaced {replaced}; {[(n, p['metadata']['uid'] != old.get(n), pod_ready(p)) for n, p in agent_pods(kube).items()]}")
    h.figure(f"rolling DaemonSet upgrade over {len(NODES)} nodes, one at a time: {h.elapsed(t0)} s (each node's new agent Ready at {replaced})")
    assert fewest >= len(NODES) - 1, f"maxUnavailable 1: at one point only {fewest} of {len(NODES)} nodes had a Ready agent"
    for name, node in where.items():
        h.wait_until(30, f"the new agent of {node} accounts {name}'s limits as the old one did",
                     lambda n=node, p=name: vgpu_view(agent_url(kube, n), p) == want,
                     detail=lambda n=node, p=name: vgpu_view(agent_url(kube, n), p))
    for name in roll:
        assert container_id(kube, name) == before[name], f"{name} keeps its container through the upgrade"
        assert kube.running(name), f"{name} still Running"
    check_vgpu_env(kube, roll)
    state = extender_state()
    assert all(used_cores(state, n) == 30 for n in NODES), f"the extender still holds one 30-core grant a node: {state}"
    # Each node's GPUs 4-7: the roll pod's keeps 70 cores free, the three others 100: pods of 90
    # cores fit one a free GPU, 3 a node, and a tenth nowhere.
    more = [f"fill-{i}" for i in range(3 * len(NODES))]
    for name in more:
        kube.create(frac(name, cores=90, units=8))
    for name in more:
        kube.wait_running(name, 90)
    kube.create(frac("one-too-many", cores=90, units=8))
    h.wait_until(30, "one-too-many Unschedulable", lambda: kube.unschedulable("one-too-many"),
                 detail=lambda: kube.describe("one-too-many"))
    state = extender_state()
    assert all(used_cores(state, n) == 300 for n in NODES), f"every node's vGPU GPUs hold 300 cores: {state}"
    for name in more:
        node = node_of(kube, name)
        kept = next(p for p, n in where.items() if n == node)
        assert v.annotation(kube, name, "gpulet.io/vgpu-gpus-0") != v.annotation(kube, kept, "gpulet.io/vgpu-gpus-0"), \
            f"{name} is not put on {kept}'s GPU ({node})"
    kube.clean_pods(*roll, *more, "one-too-many")
    h.wait_until(30, "every grant freed", lambda: all(used_cores(extender_state(), n) == 0 for n in NODES),
                 detail=lambda: json.dumps(extender_state()))

    rc, out = h.kubectl("delete", "-k", OVERLAY, "--wait=true", "--timeout=120s")
    assert rc == 0, f"kubectl delete -k: {h.tail(out)}"
    h.wait_until(60, "the agent pods gone", lambda: not kube.pods(ns=h.NS, selector=AGENT))
    for n in NODES:
        assert configs[n].read_bytes() == before_install[n], f"uninstall restored {n}'s containerd configuration"
    start_extender(nodes, h.D / "admin.kubeconfig")  # its ServiceAccount is gone
    for n in NODES:
        v.patch_node(kube, {"metadata": {"labels": {NFD_LABEL: None}}}, node=n)
        start_agent(n)
    for n in NODES:
        h.wait_until(60, f"{n}: the host-process agent serves again", lambda n=n: vgpu_capacity(kube, n),
                     detail=lambda n=n: h.tail_file(h.D / f"logs/gpulet-device-plugin{sfx(n)}.log"))
    nodes.agents = True


def test_one_node_reboots_while_the_others_serve(nodes):
    need_agents(nodes)
    kube = nodes.kube
    down = NODES[1]
    kube.create(h.pod("steady", {"nvidia.com/gpu": 1}, tolerations=TOLERATE, **pinned(NODES[0])))
    kube.create(frac("on-rebooted", **pinned(down)))
    kube.wait_running("steady")
    kube.wait_running("on-rebooted", 90)
    before = container_id(kube, "steady")
    on(down, "node-down")
    kube.create(frac("during", **pinned(NODES[2])))
    kube.wait_running("during", 90)
    assert container_id(kube, "steady") == before, f"steady on {NODES[0]} keeps its container: {before} -> {container_id(kube, 'steady')}"
    t0 = h.now()
    on(down, "kubelet-start")
    start_agent(down)
    h.wait_until(120, f"{down} Ready with its vGPU capacity again", lambda: ready(kube, down) and vgpu_capacity(kube, down),
                 detail=lambda: h.tail_file(h.D / f"logs/kubelet-{down}.log"))
    # The pod whose container the reboot killed ends (restartPolicy Never) and its grant with it.
    h.wait_until(60, "on-rebooted ends after the reboot", lambda: kube.phase("on-rebooted") in ("Failed", "Succeeded"),
                 detail=lambda: kube.describe("on-rebooted"))
    kube.create(frac("after", **pinned(down)))
    kube.wait_running("after", 90)
    h.figure(f"{down} rebooted: kubelet and agent started -> a new fractional pod Running on it in {h.elapsed(t0)} s")
    assert container_id(kube, "steady") == before, "steady kept its container through the other node's reboot"
    kube.clean_pods("steady", "on-rebooted", "during", "after")


def test_a_drained_and_deleted_node_frees_its_grants(nodes):
    need_agents(nodes)
    kube = nodes.kube
    # Off gpulet-node, whose namespace holds the control plane: the Deployment's pods pack onto
    # gpulet-node-1 or -2 and, once it is drained, onto the other.
    spec = frac("x")["spec"]
    spec["restartPolicy"] = "Always"
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [NODES[0]]}]}]}}}
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "frac", "namespace": "default"},
                 "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "frac"}},
                          "template": {"metadata": {"labels": {"app": "frac"}, "annotations": PACK}, "spec": spec}}})

    def running_on():
        pods = kube.pods(selector="app=frac")
        live = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        return sorted(p["spec"]["nodeName"] for p in live) if len(live) == 2 and len(pods) == 2 else None

    first = h.wait_until(120, "the Deployment's 2 pods Running", running_on)
    assert len(set(first)) == 1, f"binpack: both on one node: {first}"
    gone = first[0]
    assert used_cores(extender_state(), gone) == 60
    t0 = h.now()
    rc, out = h.kubectl("drain", gone, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s")
    assert rc == 0, f"kubectl drain {gone}: {h.tail(out)}"
    again = h.wait_until(120, "the Deployment's 2 pods Running again, elsewhere",
                         lambda: (r := running_on()) and gone not in r and r)
    h.figure(f"drain of {gone}: its 2 fractional pods Running on {again[0]} after {h.elapsed(t0)} s")
    nodes.survivor = again[0]
    on(gone, "node-down")
    h.must(h.K / "kubectl", "--kubeconfig", h.D / "admin.kubeconfig", "delete", "node", gone)
    h.wait_until(30, f"the extender drops {gone}", lambda: gone not in extender_state(),
                 detail=lambda: json.dumps(extender_state()))
    state = extender_state()
    assert used_cores(state, again[0]) == 60, f"the moved pods' 60 cores granted on {again[0]}: {state.get(again[0])}"
    kube.delete("apps/v1", "Deployment", "frac", ns="default")
    h.wait_until(60, "the Deployment's pods gone", lambda: not kube.pods(selector="app=frac"))
    h.wait_until(30, "every grant freed", lambda: all(used_cores(extender_state(), n) == 0 for n in extender_state()),
                 detail=lambda: json.dumps(extender_state()))


def test_dra_claims_that_only_one_node_satisfies(nodes):
    """gpulet's agent as the DRA driver on two nodes of different GPUs: gpulet-node's H100s 0-1, a
    T4 machine's (pcie-t4) two T4s; a claim selecting by productName lands where its GPU is."""
    need_agents(nodes)
    kube = nodes.kube
    if not nodes.survivor:
        pytest.skip("needs the node the drain step left (it failed before that)")
    t4 = nodes.survivor
    h.must(h.K / "kubectl", "--kubeconfig", h.D / "admin.kubeconfig", "apply", "-f",
           h.SRC / "deploy/components/dra/deviceclasses.yaml")
    dra = ["--dra-gpus", "all", "--cdi-driver-root", h.D / "driver-root", "--cdi-hook-path", ""]
    start_agent(NODES[0], "--dra-gpus", "0,1", *dra[2:])
    on(t4, "plugin", "pcie-t4", "--node-name", t4, "--kubeconfig", h.D / "admin.kubeconfig",
       "--metrics-address", "127.0.0.1:0", *dra, env={"GPULET_CLUSTER_PLUGIN": "agent"})

    def pools():
        items = kube.get(f"{ds.RESOURCE}/resourceslices")["items"]
        return sorted((s["spec"]["pool"]["name"], len(s["spec"].get("devices", []))) for s in items
                      if s["spec"]["driver"] == ds.DRIVER)
    want = sorted([(NODES[0], 2), (t4, 2)])
    h.wait_until(60, f"ResourceSlices: 2 H100s of {NODES[0]}, 2 T4s of {t4}", lambda: pools() == want,
                 detail=lambda: f"slices {pools()}")
    product = 'device.attributes["gpu.gpulet.io"].productName'
    for name, cel in (("t4", f'{product} == "Tesla T4"'), ("h100", f'{product}.startsWith("NVIDIA H100")')):
        kube.create(ds.template(name, [ds.request(cel=cel)]))
        kube.create(ds.template_pod(f"dra-{name}", name, tolerations=TOLERATE))
    for name, node in (("t4", t4), ("h100", NODES[0])):
        ds.wait_pod(kube, f"dra-{name}", 90, f"the {name} claim's pod Running", lambda n=name: kube.describe(f"dra-{n}"))
        assert node_of(kube, f"dra-{name}") == node, f"dra-{name} runs where its GPU is ({node}): {node_of(kube, f'dra-{name}')}"
        results = ds.allocation(ds.claim(kube, ds.claim_of(kube, f"dra-{name}")))
        assert [r["pool"] for r in results] == [node], f"the {name} claim's device is of {node}'s pool: {results}"
    kube.clean_pods("dra-t4", "dra-h100")


def test_the_cluster_stops_and_leaves_nothing(nodes, request):
    if request.session.testsfailed:  # the logs go with the cluster: kept for the failures' reader
        shutil.rmtree(LOGS_KEPT, ignore_errors=True)
        shutil.copytree(h.D / "logs", LOGS_KEPT)
        for p in nodes.kube.pods(ns=h.NS, selector=AGENT):  # the DaemonSet's, where a step left it
            name = p["metadata"]["name"]
            (LOGS_KEPT / f"{name}.log").write_text(nodes.kube.logs(name, ns=h.NS, container="agent"))
        print(f"the cluster's logs are kept in {LOGS_KEPT}")
    if nodes.extender is not None:
        nodes.extender.terminate()
        nodes.extender.wait(10)
    nodes.cluster.down_leaves_nothing("three nodes")
