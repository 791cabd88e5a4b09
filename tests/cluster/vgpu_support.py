"""What the install scenarios (test_install.py, test_defaults.py) share while gpulet is installed the
admin's way: the agent and scheduler pods, the node's verdict, and three runs of checks.

- vgpu_checks (install on containerd 1.6 with device specs, and defaults on containerd 2 with the
  product's delivery): the vGPU path through the real control plane. Leaves vcuda pod vgpu-a
  Running and kube-scheduler on the shipped configuration; restart_checks goes on from there.
  - the real kube-apiserver calls gpulet's webhook over TLS (Service -> endpoints, CA published by
    gpulet scheduler into the ValidatingWebhookConfiguration): `kubectl apply` of a bad pod fails
    with our message;
  - the real kube-scheduler runs with the shipped KubeSchedulerConfiguration (ConfigMap
    gpulet-kube-scheduler-config), only its addresses and file paths adapted to this cluster: the
    extender is called over HTTPS with the scheduler's client certificate and binds the pods;
  - vcuda pods start with their limits, the interposer (env and library mount from the agent) and
    exactly their granted GPU, delivered as the device plugin's settings deliver GPUs.
- restart_checks (install, after vgpu_checks: vcuda pod vgpu-a Running, kube-scheduler on the
  shipped configuration): the agent pod deleted and recreated between two vcuda pods loses nothing:
  the first keeps its grant and accounting, the Node its vGPU capacity, and the second is placed
  and starts. Puts kube-scheduler back on its flags.
- reboot_checks (install, while gpulet is installed): the seeds' reboot complaint on the real
  kubelet. GPU pods of a Deployment run; the node "reboots" (testing/k8s/cluster node-down: the
  kubelet stops, every container dies, checkpoints stay); the kubelet starts first and re-admits
  the pods before any device plugin registered: it rejects them (UnexpectedAdmissionError). The
  agent pod, started by that kubelet, registers and its readiness flow (validate, untaint, delete
  the rejected controller-owned pods) brings the Deployment back to all Running.
"""
import base64
import json
import re
import time
from datetime import datetime

import yaml

import harness as h

NS = h.NS
AGENT = "app.kubernetes.io/name=gpulet-node"
SCHEDULER = "app.kubernetes.io/name=gpulet-scheduler"
TAINT = "gpulet.io/gpu-stack-not-ready"
UNIT = 268435456  # a tencent.com/vcuda-memory unit: 256 MiB


# --- the installed pods and the node's verdict -----------------------------------------------------


def agent_pods(kube):
    return kube.pods(NS, AGENT)


def agent_name(kube):
    """The first agent pod's name ("" when none)."""
    pods = agent_pods(kube)
    return pods[0]["metadata"]["name"] if pods else ""


def phases(kube, ns, selector):
    return " ".join(p.get("status", {}).get("phase", "") for p in kube.pods(ns, selector))


def agent_up(kube):
    """The agent DaemonSet's one pod is Running."""
    return phases(kube, NS, AGENT) == "Running"


def scheduler_up(kube):
    return phases(kube, NS, SCHEDULER) == "Running"


def ready(kube):
    return kube.label("gpulet.io/gpu-stack") == "ready"


def untainted(kube):
    return TAINT not in kube.taints()


def tainted(kube):
    return not untainted(kube)


def validated(kube):
    """The agent labels the node ready, then lifts the taint (readiness.cc: label first): both."""
    return ready(kube) and untainted(kube)


def annotation(kube, pod, key, ns="default"):
    return ((kube.pod(pod, ns) or {}).get("metadata", {}).get("annotations") or {}).get(key, "")


def dev_nodes(kube, pod):
    """The /dev/nvidiaN names the pod's container sees."""
    return kube.exec(pod, 'ls /dev | grep -E "^nvidia[0-9]+$" | tr "\\n" " "')[1].split()


def env_lines(text):
    return text.splitlines()


def patch_node(kube, body, node=h.NODE):
    """A merge patch of the Node (a null removes a label or annotation)."""
    status, obj = kube.raw("PATCH", f"/api/v1/nodes/{node}", body,
                           content_type="application/merge-patch+json")
    assert status == 200, f"PATCH node {node} {body}: HTTP {status}: {obj}"


def untaint(kube):
    node = kube.node() or {}
    taints = node.get("spec", {}).get("taints") or []
    if any(t["key"] == TAINT for t in taints):
        patch_node(kube, {"spec": {"taints": [t for t in taints if t["key"] != TAINT]}})


def kubectl_apply(obj):
    """`kubectl apply -f -` of obj (what a user sees when the API server refuses it)."""
    return h.kubectl("apply", "-f", "-", input=json.dumps(obj))


def scheduler_log(lines=None):
    out = h.kubectl("-n", NS, "logs", "-l", SCHEDULER, "--tail=-1")[1]
    return h.tail(out, lines) if lines else out


def scheduler_back():
    """kube-scheduler on its flags again (`cluster scheduler`)."""
    rc, out = h.sh(h.CLUSTER, "scheduler", h.BUILD)
    assert rc == 0, f"kube-scheduler back to its flags: {h.tail(out, 5)}"


# --- vGPU: the real API server calls the webhook, the real kube-scheduler the extender ------------


SHIPPED_SCHEDULER_CONFIG = h.SRC / "deploy/components/vgpu/kube-scheduler-config.yaml"


def scheduler_config_here(text, url, tls=None):
    """The shipped KubeSchedulerConfiguration (text) with only what differs on this cluster: its
    scheduler's kubeconfig, no leader election, the extender at url, reached with tls (a
    tlsConfig), or over plain HTTP when None."""
    c = yaml.safe_load(text)
    c["clientConnection"]["kubeconfig"] = str(h.D / "scheduler.kubeconfig")
    c["leaderElection"] = {"leaderElect": False}
    (e,) = c["extenders"]
    assert e["urlPrefix"] == "https://gpulet-scheduler-extender.gpulet-system.svc:12345/scheduler", \
        f"the shipped extender's urlPrefix: {e['urlPrefix']}"
    e["urlPrefix"] = url
    if tls is None:
        e["enableHTTPS"] = False
        e.pop("tlsConfig", None)
    else:
        e["tlsConfig"] = tls
    return c


def vgpu_checks(kube, work):
    """Returns what restart_checks goes on from: {"gpus_a": vgpu-a's GPU, "sched_pod": ...}."""
    # The webhook's CA: gpulet scheduler issues its serving certificate and publishes the CA.
    def ca_published():
        vwc = kube.get("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gpulet-vgpu")
        bundle = ((vwc or {}).get("webhooks") or [{}])[0].get("clientConfig", {}).get("caBundle")
        return bool(bundle) and kube.get(f"/api/v1/namespaces/{NS}/secrets/gpulet-scheduler-tls") is not None
    h.wait_until(60, "gpulet scheduler published its CA in the webhook configuration and the TLS Secret",
                 ca_published)

    # A share above one GPU that is not whole GPUs: refused by the webhook through the real API server.
    rc, out = kubectl_apply(h.vgpu_pod("vgpu-bad", 150, 20))
    assert rc != 0, f"kubectl apply of vcuda-core 150 fails (rc {rc}): {out}"
    assert re.search(r'admission webhook "vgpu.gpulet.io" denied.*not a multiple of 100', out, re.S), \
        f"... with gpulet's message through the API server ({out[:300]})"
    assert kube.pod("vgpu-bad") is None, "the refused pod does not exist"
    # The pod's own env comes after the device plugin's: setting a limit would replace it.
    p = h.vgpu_pod("vgpu-env", 30, 20)
    p["spec"]["containers"][0]["env"] = [{"name": "GPULET_VGPU_MEMORY_LIMIT", "value": "0"}]
    rc, out = kubectl_apply(p)
    assert rc != 0, f"kubectl apply of a vcuda pod setting GPULET_VGPU_MEMORY_LIMIT in its env fails (rc {rc})"
    assert re.search(r"env GPULET_VGPU_MEMORY_LIMIT of container.*would switch off the vGPU limits", out, re.S), \
        f"... with gpulet's message ({out[:200]})"

    # Leader election on the real API server: the replica holds the Lease and carries the label the
    # extender's Service selects.
    sched = kube.pods(NS, SCHEDULER)
    sched_pod = sched[0]["metadata"]["name"] if sched else ""

    def leads():
        lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gpulet-scheduler") or {}
        labels = ((kube.pod(sched_pod, NS) or {}).get("metadata", {}).get("labels") or {})
        return (lease.get("spec", {}).get("holderIdentity") == sched_pod
                and labels.get("gpulet.io/extender-leader") == "true")
    h.wait_until(30, f"gpulet scheduler {sched_pod} holds the Lease and carries "
                     "gpulet.io/extender-leader=true", leads)

    # kube-scheduler with the shipped configuration: the extender at the gpulet scheduler pod's
    # address (hostNetwork, 127.0.0.1; the extender Service's name is still the TLS server name),
    # this cluster's scheduler client certificate (CN system:kube-scheduler, cluster CA), the CA
    # from the Secret.
    secret = kube.get(f"/api/v1/namespaces/{NS}/secrets/gpulet-scheduler-tls")
    ca = work / "extender-ca.crt"
    ca.write_bytes(base64.b64decode(secret["data"]["ca.crt"]))
    shipped = kube.get(f"/api/v1/namespaces/{NS}/configmaps/gpulet-kube-scheduler-config")
    text = shipped["data"]["kube-scheduler-config.yaml"]
    (work / "shipped-scheduler-config.yaml").write_text(text)
    d = str(h.D)
    c = scheduler_config_here(text, "https://127.0.0.1:12345/scheduler", {
        "serverName": "gpulet-scheduler-extender.gpulet-system.svc",
        "certFile": d + "/pki/scheduler.crt", "keyFile": d + "/pki/scheduler.key", "caFile": str(ca)})
    (work / "kube-scheduler.yaml").write_text(yaml.safe_dump(c))
    rc, out = h.sh(h.CLUSTER, "scheduler", h.BUILD, work / "kube-scheduler.yaml")
    assert rc == 0, f"kube-scheduler restarted with the shipped KubeSchedulerConfiguration: {h.tail(out, 5)}"

    kube.clean_pods("vgpu-a", "vgpu-b")
    t0 = h.now()
    kube.create(h.vgpu_pod("vgpu-a", 30, 20))
    h.wait_until(60, "vcuda pod vgpu-a (30 cores, 20 units) Running", lambda: kube.running("vgpu-a"),
                 detail=lambda: kube.describe("vgpu-a", lines=8) + "\n" + scheduler_log(5))
    h.figure(f"kubectl apply -> vcuda pod Running (extender + webhook + agent): {h.elapsed(t0)} s")
    node = annotation(kube, "vgpu-a", "gpulet.io/vgpu-node")
    assert node == h.NODE, f"the extender bound it: gpulet.io/vgpu-node={h.NODE} ({node})"
    gpus_a = annotation(kube, "vgpu-a", "gpulet.io/vgpu-gpus-0")
    assert gpus_a, f"the extender chose its GPU (gpulet.io/vgpu-gpus-0={gpus_a})"
    assigned = annotation(kube, "vgpu-a", "gpulet.io/vgpu-assigned")
    assert assigned == "true", f"the agent granted it (gpulet.io/vgpu-assigned={assigned})"
    env_a = env_lines(kube.exec("vgpu-a", "env")[1])
    assert f"GPULET_VGPU_MEMORY_LIMIT={20 * UNIT}" in env_a, \
        f"limits in the container: GPULET_VGPU_MEMORY_LIMIT={20 * UNIT} ({env_a})"
    assert "GPULET_VGPU_CORE_LIMIT=30" in env_a, f"limits in the container: GPULET_VGPU_CORE_LIMIT=30 ({env_a})"
    assert "LD_PRELOAD=/usr/lib/gpulet/libgpulet-vcuda.so" in env_a, \
        f"the interposer: LD_PRELOAD=/usr/lib/gpulet/libgpulet-vcuda.so ({env_a})"
    rc, out = kube.exec("vgpu-a", "ls /usr/lib/gpulet/libgpulet-vcuda.so")
    assert rc == 0, f"the interposer library is mounted in the container ({out.strip()})"
    assert f"GPULET_VGPU_UUID={gpus_a}" in env_a, f"GPULET_VGPU_UUID names the granted GPU (the interposer's) ({env_a})"
    # The granted GPU's device node, delivered as the overlay's device plugin settings deliver
    # GPUs (device specs or CDI names): NVIDIA_VISIBLE_DEVICES alone reaches nothing through runc.
    # The fake dgx-h100's minors are its indexes (no minor in testing/profiles/dgx-h100.yaml).
    info = json.loads(h.must(h.GPULET, "info", "--simulate", "dgx-h100", "--json"))
    index_a = next((str(g["index"]) for g in info["gpus"] if g["uuid"] == gpus_a), "?")
    nodes_a = dev_nodes(kube, "vgpu-a")
    assert nodes_a == [f"nvidia{index_a}"], \
        f"the vcuda pod sees exactly its granted GPU's /dev/nvidia{index_a} ({' '.join(nodes_a)})"
    rc, _ = kube.exec("vgpu-a", "test -c /dev/nvidiactl")
    assert rc == 0, "the vcuda pod sees /dev/nvidiactl"

    # Issue 31.6: the limits the interposer reads are a read-only file, not the environment, and
    # the interposer comes through a read-only /etc/ld.so.preload (every process, whatever
    # LD_PRELOAD says).
    limits_a = env_lines(kube.exec("vgpu-a", "cat /var/run/gpulet/vgpu/limits")[1])
    assert f"GPULET_VGPU_MEMORY_LIMIT={20 * UNIT}" in limits_a, \
        f"the limits file in the container: GPULET_VGPU_MEMORY_LIMIT={20 * UNIT} ({limits_a})"
    assert f"GPULET_VGPU_UUID={gpus_a}" in limits_a, f"... and GPULET_VGPU_UUID={gpus_a} ({limits_a})"
    rc, _ = kube.exec("vgpu-a", "echo GPULET_VGPU_MEMORY_LIMIT=0 >> /var/run/gpulet/vgpu/limits")
    assert rc != 0, "the container cannot change its limits file"
    rc, out = h.kubectl("exec", "vgpu-a", "--", "cat", "/etc/ld.so.preload")
    assert out.rstrip("\n") == "/usr/lib/gpulet/libgpulet-vcuda.so", \
        f"/etc/ld.so.preload names the interposer ({out.strip()})"
    rc, _ = kube.exec("vgpu-a", ": > /etc/ld.so.preload")
    assert rc != 0, "the container cannot change /etc/ld.so.preload"
    # Issue 31.3: the accounting file is on a 16 KiB tmpfs of its own: the container cannot grow it.
    grow = kube.exec("vgpu-a", "dd if=/dev/zero bs=1024 count=4096 >> /var/run/gpulet/vgpu/accounting "
                               "2>/dev/null; wc -c < /var/run/gpulet/vgpu/accounting")[1].strip()
    assert re.fullmatch(r"[0-9]+", grow) and int(grow) <= 16384, \
        f"appending 4 MiB to the accounting file leaves it under 16 KiB ({grow} bytes)"
    return {"gpus_a": gpus_a, "sched_pod": sched_pod}


# --- the agent restarted mid-way ----------------------------------------------------------------------


def restart_checks(kube, gpus_a, capacity_ok):
    """After vgpu_checks: capacity_ok(kube) says the Node has its vGPU capacity. Deletes vgpu-a and
    vgpu-b and puts kube-scheduler back on its flags, whatever the outcome."""
    try:
        _restart_checks(kube, gpus_a, capacity_ok)
    finally:
        kube.clean_pods("vgpu-a", "vgpu-b")
        rc, out = h.sh(h.CLUSTER, "scheduler", h.BUILD)
    assert rc == 0, f"kube-scheduler back to its flags: {h.tail(out, 5)}"


def _restart_checks(kube, gpus_a, capacity_ok):
    # The agent restarted mid-way (its pod deleted; the DaemonSet makes another).
    uid_a = kube.pod("vgpu-a")["metadata"]["uid"]
    old_agent = agent_name(kube)
    t0 = h.now()
    kube.core.delete_namespaced_pod(old_agent, NS)
    h.poll(60, lambda: kube.pod(old_agent, NS) is None)

    def new_agent_up():
        n = " ".join(p["metadata"]["name"] for p in agent_pods(kube)
                     if p.get("status", {}).get("phase") == "Running")
        return bool(n) and n != old_agent and capacity_ok(kube)
    h.wait_until(90, "a new agent pod runs and the Node has its vGPU capacity again", new_agent_up,
                 detail=lambda: f"agent pods: {phases(kube, NS, AGENT)}; allocatable: "
                                f"{(kube.node() or {}).get('status', {}).get('allocatable')}")
    h.figure(f"agent pod deleted -> new agent re-registered with the real kubelet: {h.elapsed(t0)} s")
    assert kube.running("vgpu-a"), "vcuda pod A still Running after the agent restart"
    now_gpus, now_assigned = (annotation(kube, "vgpu-a", "gpulet.io/vgpu-gpus-0"),
                              annotation(kube, "vgpu-a", "gpulet.io/vgpu-assigned"))
    assert now_gpus == gpus_a and now_assigned == "true", \
        f"A keeps its grant (same GPU, assigned) ({now_gpus} vs {gpus_a}, assigned {now_assigned})"
    # The grant directory is a tmpfs of the node's mount namespace (the agent's Bidirectional mount).
    grant = f"/var/lib/gpulet/vgpu/{uid_a}/main"
    fstype = h.on_node("findmnt", "-n", "-o", "FSTYPE", grant)[1].strip()
    accounting = h.on_node("test", "-e", f"{grant}/accounting")[0] == 0
    assert fstype == "tmpfs" and accounting, \
        f"A's accounting file is still on the node, on its tmpfs ({grant}: {fstype or 'no mount'}, " \
        f"accounting {'there' if accounting else 'missing'})"
    kube.create(h.vgpu_pod("vgpu-b", 50, 40))
    h.wait_until(60, "vcuda pod B (50 cores, 40 units) placed and Running after the restart",
                 lambda: kube.running("vgpu-b"),
                 detail=lambda: kube.describe("vgpu-b", lines=8) + "\n" + h.tail(
                     h.kubectl("-n", NS, "logs", "-l", AGENT, "-c", "agent", "--tail=10")[1], 10))
    env_b = env_lines(kube.exec("vgpu-b", "env")[1])
    assert "GPULET_VGPU_CORE_LIMIT=50" in env_b, f"B got GPULET_VGPU_CORE_LIMIT=50 ({env_b})"
    # binpack: B goes on A's GPU (30 + 50 <= 100) -- only right if the new agent still counts A there.
    gpus_b = annotation(kube, "vgpu-b", "gpulet.io/vgpu-gpus-0")
    assert gpus_b == gpus_a, (
        f"binpack put B on A's GPU ({gpus_b}; A's {gpus_a})\n--- the extenders' log\n"
        f"{scheduler_log(30)}\n--- the agent's vGPU lines\n" + "\n".join(
            line for line in h.kubectl("-n", NS, "logs", "-l", AGENT, "-c", "agent", "--tail=-1")[1].splitlines()
            if "vGPU" in line or "vgpu" in line)[-3000:])
    bind_a = annotation(kube, "vgpu-a", "gpulet.io/vgpu-bind-time")
    bind_b = annotation(kube, "vgpu-b", "gpulet.io/vgpu-bind-time")
    assert bind_a and bind_b, f"the extender's bind stamped both (gpulet.io/vgpu-bind-time: {bind_a!r}, {bind_b!r})"


# --- the reboot order: kubelet first, then the agent -------------------------------------------------


def reboot_deployment():
    template = h.pod("gpu-reboot", {"nvidia.com/gpu": 1})
    spec = template["spec"]
    del spec["restartPolicy"]  # a Deployment's pods restart Always
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "gpu-reboot", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "gpu-reboot"}},
                     "template": {"metadata": {"labels": {"app": "gpu-reboot"}}, "spec": spec}}}


def delete_reboot_deployment(kube):
    kube.delete("apps/v1", "Deployment", "gpu-reboot", ns="default")
    h.poll(60, lambda: not kube.pods("default", "app=gpu-reboot"))
    left = [p["metadata"]["name"] for p in kube.pods("default", "app=gpu-reboot")]
    if left:
        kube.clean_pods(*left)


def reboot_checks(kube, work):
    try:
        _reboot_checks(kube, work)
    finally:
        delete_reboot_deployment(kube)


def _reboot_checks(kube, work):
    def pods():
        return kube.pods("default", "app=gpu-reboot")

    def phase_list():
        return [p.get("status", {}).get("phase", "") for p in pods()]

    kube.create(reboot_deployment())
    h.wait_until(60, "Deployment gpu-reboot: 2 GPU pods Running",
                 lambda: phase_list() == ["Running", "Running"], detail=lambda: f"phases {phase_list()}")
    rc, out = h.sh(h.CLUSTER, "node-down", h.BUILD)
    (work / "node-down.log").write_text(out)
    assert "every container killed" in out, \
        f"node down: kubelet stopped and every container killed (rc {rc}): {h.tail(out, 5)}"
    t_kubelet = time.time()  # wall clock: compared with the agent container's startedAt
    h.sh(h.CLUSTER, "kubelet-start", h.BUILD)

    # The kubelet's verdict reaches the API a few seconds after its start (status manager): until
    # then the pods still read Running there. Seen on the pods (phase Failed) or, if the agent was
    # quicker in deleting them, in the kubelet's events.
    events = "/api/v1/namespaces/default/events?fieldSelector=reason%3DUnexpectedAdmissionError"

    def api_rejected():
        return any(p.get("status", {}).get("reason") == "UnexpectedAdmissionError" for p in pods())

    def rejected():
        return api_rejected() or bool((kube.get(events) or {}).get("items"))
    h.poll(60, api_rejected)
    items = (kube.get(events) or {}).get("items") or []
    reasons = items[0].get("message", "") if items else ""
    assert rejected(), \
        f"the kubelet, started first, rejected the GPU pods: UnexpectedAdmissionError ({reasons[:160]})"

    def agent_started():
        a = agent_pods(kube)
        statuses = (a[0].get("status", {}).get("containerStatuses") or [{}]) if a else [{}]
        return (statuses[0].get("state", {}).get("running") or {}).get("startedAt", "")
    h.poll(60, agent_started)

    def healed():
        ps = pods()
        return sum(p.get("status", {}).get("phase") == "Running" for p in ps) == 2 and len(ps) == 2
    h.poll(120, healed)
    t_healed = time.time()
    assert healed(), \
        f"after the agent: the Deployment's 2 GPU pods Running again, no rejected pod left ({phase_list()})"
    started = agent_started()
    if started:
        t_agent = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
        h.figure(f"reboot order: kubelet start -> agent container started: {t_agent - t_kubelet:.2f} s "
                 f"(1 s resolution); agent container started -> all GPU pods Running: "
                 f"{t_healed - t_agent:.2f} s")
    # Who removed the rejected pods: the agent's service account, in the API server's audit log.
    pod_delete = re.compile(r'/pods/gpu-reboot-.*"code":200')
    deleted_by_agent = sum(
        1 for line in (h.D / "logs/audit.log").read_text(errors="replace").splitlines()
        if '"verb":"delete"' in line and '"ResponseComplete"' in line
        and "system:serviceaccount:gpulet-system:gpulet-node" in line and pod_delete.search(line))
    assert deleted_by_agent >= 1, \
        f"the agent's readiness flow deleted the rejected pods (audit log: {deleted_by_agent} deletes by gpulet-node)"
    assert validated(kube), \
        f"the node is untainted and labelled ready again (label {kube.label('gpulet.io/gpu-stack')!r}, " \
        f"taints {kube.taints()})"
