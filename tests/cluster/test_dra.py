"""gpulet as a DRA driver on the real cluster: a containerd 2 cluster of its own (the kubelet passes
CDI device IDs through CRI), where `gpulet dra-driver` replaces the device plugin on the same fake
GPUs, registers with the real kubelet through plugins_registry and publishes its ResourceSlice; the
real scheduler allocates ResourceClaims from it and the real kubelet prepares them.

The driver runs as the agent does in deploy/overlays/dra: with a token of the service account
gpulet-node bound to a pod on this node, under that overlay's RBAC and admission policies, so
gpulet-node-own-resourceslices judges every slice it writes (and refuses, with its message, the
slices of another node written with the same token), and gpulet-node-own-claim-status every claim
status it writes (and refuses another pool's device, another driver's entry, a changed reservedFor,
a claim not allocated on its node).

Scenarios: 1 GPU; 2 GPUs in one NVLink domain (matchAttribute); a CEL selector on memory; one claim
shared by two pods; a fractional claim (interposer environment and accounting file) and a CUDA
program in a fractional claim's container (vcuda_probe on the fake driver through the interposer)
that holds exactly the claimed memory; an unsatisfiable claim stays Pending with the scheduler's
reason; XID 79 -> the GPU leaves the slice (timed); a driver restart with prepared claims
(unprepare still works after it); consumable capacity (DRAConsumableCapacity on: two fractional
claims packed onto one GPU, a third that does not fit Unschedulable); a MIG device by profile on
a100-mig. Then the cluster stops and leaves nothing behind.

The tests run in the file's order, one narrative on one cluster: each pod a later step needs comes
from a module fixture (the restart step needs the five prepared claims of the steps before it)."""
import functools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import dra_support as ds
import harness as h

STATE = h.BUILD / "cluster-test-dra"
NS = h.NS
SIM = h.GPULET.parent / "gpulet-sim"
LIB = h.GPULET.parent / "../lib/libgpulet-vcuda.so"
PROBE = h.BUILD / "tests/vcuda_probe"
FAKECUDA = h.BUILD / "lib/fake_cuda/libcuda.so.1"
# DRAConsumableCapacity (alpha in 1.34) on every component, for the packing scenario.
GATES = os.environ.get("GPULET_CLUSTER_FEATURE_GATES", "DRAConsumableCapacity=true")
LOG = h.D / "logs/gpulet-dra.log"
OWNP = "gpulet-node-own-resourceslices"
CSP = "gpulet-node-own-claim-status"
NOTOWN = "the gpulet node agent may write only ResourceSlices of its own node"
CONTEXT = 536870912  # what a context holds on the fake GPU (512 MiB, as a real one)


@functools.lru_cache(maxsize=None)
def machine_uuids():
    """The fake CUDA driver in the probe's pods has the simulated machine's GPUs, by their NVML
    UUIDs, and sees only those whose device nodes the claim's CDI device gave the container, as the
    real driver does: the interposer finds its GPU by GPULET_VGPU_UUID among them."""
    info = json.loads(h.must(h.GPULET, "info", "--simulate", "dgx-h100", "--json"))
    return ",".join(g["uuid"] for g in sorted(info["gpus"], key=lambda g: g["index"]))


# --- the cluster, the agent's identity, the driver -------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    for f in (SIM, LIB, PROBE, FAKECUDA):
        assert f.exists(), f"{f} not built"
    with h.own_cluster(STATE, env={"GPULET_CLUSTER_FEATURE_GATES": GATES}) as c:
        yield c


@pytest.fixture(scope="module")
def kube(cluster):
    return cluster.kube


def overlay_subset():
    """deploy/overlays/dra's namespace, gpulet-node RBAC, admission policies and DeviceClasses (the
    agent's identity, without the DaemonSet: the driver runs as a process here)."""
    rc, out = h.kubectl("kustomize", h.SRC / "deploy/overlays/dra")
    assert rc == 0, f"kubectl kustomize deploy/overlays/dra: {h.tail(out)}"
    want = {("Namespace", NS), ("ServiceAccount", "gpulet-node"), ("ClusterRole", "gpulet-node"),
            ("ClusterRoleBinding", "gpulet-node"), ("DeviceClass", "gpu.gpulet.io"),
            ("DeviceClass", "mig.gpulet.io")}
    docs = [d for d in yaml.safe_load_all(out) if d]
    return yaml.safe_dump_all([d for d in docs if (d["kind"], d["metadata"]["name"]) in want
                               or d["kind"].startswith("ValidatingAdmissionPolicy")])


def ok(answer):
    return 200 <= answer[0] < 300


def message(answer):
    status, body = answer
    text = body.get("message", body) if isinstance(body, dict) else body
    return f"HTTP {status}: {text}"


def denied_by(policy, desc, msg, answer):
    """The agent's request, refused by policy with msg."""
    text = message(answer)
    assert not ok(answer) and f"ValidatingAdmissionPolicy '{policy}'" in text and msg in text, \
        f"denied by {policy}: {desc} ({text[:300]})"


def refused_status(policy, desc, answer):
    """The agent's claim-status write refused: by policy, or before it by the API server's own
    validation, which (Kubernetes 1.34) refuses a status.devices entry that is not a device of the
    claim's allocation before any admission policy is consulted; either way the write does not
    land."""
    text = message(answer)
    assert not ok(answer) and (f"ValidatingAdmissionPolicy '{policy}'" in text
                               or "must be an allocated device in the claim" in text), \
        f"refused (by {policy} or the API server's validation): {desc} ({text[:300]})"


def rslice(name, node, pool, driver):
    """A ResourceSlice with one device."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}


SLICES = f"{ds.RESOURCE}/resourceslices"


@pytest.fixture(scope="module")
def identity(kube):
    """The agent's identity: deploy/overlays/dra's namespace, RBAC, policies and device classes
    applied; the pod dra-agent (service account gpulet-node) Running on the node; a token of
    gpulet-node bound to it in D/agent.kubeconfig (the driver's); the policy in effect. Yields the
    API as the agent."""
    (STATE / "agent.yaml").write_text(overlay_subset())
    rc, out = h.kubectl("apply", "-f", STATE / "agent.yaml")
    (STATE / "apply.out").write_text(out)
    assert rc == 0, ("deploy/overlays/dra: namespace, gpulet-node RBAC, admission policies, "
                     f"DeviceClasses applied:\n{out}")
    kube.create(h.pod("dra-agent", ns=NS, nodeName=h.NODE, serviceAccountName="gpulet-node",
                      restartPolicy="Always"))
    h.wait_until(60, f"pod {NS}/dra-agent (service account gpulet-node) Running on {h.NODE}",
                 lambda: kube.running("dra-agent", NS), detail=lambda: kube.describe("dra-agent", NS))
    uid = kube.pod("dra-agent", NS)["metadata"]["uid"]
    status, body = kube.raw("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/gpulet-node/token",
                            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                             "spec": {"expirationSeconds": 3600,
                                      "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                                         "name": "dra-agent", "uid": uid}}})
    assert status == 201, f"a token of gpulet-node bound to dra-agent: HTTP {status}: {body}"
    token = body["status"]["token"]
    kubeconfig = h.D / "agent.kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{kube.api.configuration.host}", certificate-authority: "{h.D / 'pki/ca.crt'}"}}}}]
users: [{{name: gpulet-node, user: {{token: "{token}"}}}}]
contexts: [{{name: c, context: {{cluster: c, user: gpulet-node}}}}]
current-context: c
""")
    kubeconfig.chmod(0o600)
    agent = h.Kube(kubeconfig)
    # A new policy takes effect once the API server's informer has it: wait for its first refusal.
    foreign = rslice("other-node-gpu.gpulet.io", "other-node", "other-node", ds.DRIVER)
    h.wait_until(30, "the policy is in effect (a dry-run slice for other-node refused)",
                 lambda: not ok(agent.raw("POST", SLICES, foreign, query=[("dryRun", "All")])))
    return agent


def test_overlay_device_classes_and_examples(kube, identity):
    for dc in ("gpu.gpulet.io", "mig.gpulet.io"):
        assert kube.get(f"{ds.RESOURCE}/deviceclasses/{dc}") is not None, \
            "DeviceClasses gpu.gpulet.io and mig.gpulet.io exist"
    rc, out = h.kubectl("apply", "--dry-run=server", "-f", h.SRC / "examples/dra/")
    (STATE / "examples.out").write_text(out)
    assert rc == 0, ("examples/dra/ accepted by the API server (server-side dry run; the "
                     f"consumable-capacity template too):\n{out}")


def test_the_agents_token_carries_its_node(identity):
    status, body = identity.raw("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                {"apiVersion": "authentication.k8s.io/v1",
                                 "kind": "SelfSubjectReview"})
    assert status == 201, f"auth whoami as the agent: HTTP {status}: {body}"
    extra = body["status"]["userInfo"].get("extra") or {}
    node_claim = (extra.get("authentication.kubernetes.io/node-name") or [None])[0]
    assert node_claim == h.NODE, ("the agent's token carries its node: "
                                  f"userInfo.extra[authentication.kubernetes.io/node-name] = {node_claim}")


def test_the_slice_policy_refuses_other_nodes_slices(kube, identity):
    agent = identity
    denied_by(OWNP, "the agent creates a slice for other-node", NOTOWN,
              agent.raw("POST", SLICES, rslice("other-node-gpu.gpulet.io", "other-node",
                                               "other-node", ds.DRIVER)))
    denied_by(OWNP, "the agent creates a slice on its node in other-node's pool", NOTOWN,
              agent.raw("POST", SLICES, rslice("own-node-foreign-pool", h.NODE, "other-node",
                                               ds.DRIVER)))
    denied_by(OWNP, "the agent creates a slice of another driver on its node",
              "the gpulet node agent may write only ResourceSlices of driver gpu.gpulet.io",
              agent.raw("POST", SLICES, rslice("own-node-other-driver", h.NODE, h.NODE,
                                               "example.com")))
    kube.create(rslice("other-node-admin", "other-node", "other-node", ds.DRIVER))
    try:
        # An update as the driver writes one, PUT: the agent may not patch.
        obj = kube.get(f"{SLICES}/other-node-admin")
        denied_by(OWNP, "the agent updates a slice of other-node (made by the admin)", NOTOWN,
                  agent.raw("PUT", f"{SLICES}/other-node-admin", obj))
        denied_by(OWNP, "the agent deletes a slice of other-node", NOTOWN,
                  agent.raw("DELETE", f"{SLICES}/other-node-admin"))
        assert kube.get(f"{SLICES}/other-node-admin") is not None, "other-node's slice is still there"
    finally:
        kube.delete("resource.k8s.io/v1", "ResourceSlice", "other-node-admin")


class Driver:
    """gpulet's DRA driver in the cluster's mount namespace, as the agent runs it (pid in
    D/pids/gpulet-dra, which `cluster down` stops too; log appended to D/logs/gpulet-dra.log)."""

    def __init__(self):
        self.procs = []

    def start(self, profile, sim_root, *args):
        with open(LOG, "ab") as log:
            p = subprocess.Popen(
                ["nsenter", "-t", h.holder_pid(), "-m", "--", "nice", "-n", "19", str(h.GPULET),
                 "dra-driver", "--simulate", profile, "--sim-root", str(sim_root),
                 "--node-name", h.NODE, "--kubeconfig", str(h.D / "agent.kubeconfig"),
                 "--dra-cdi-dir", str(h.D / "cdi"), "--dra-state-dir", str(h.D / "dra"),
                 "--cdi-driver-root", str(h.D / "driver-root"), "--cdi-hook-path", "",
                 "--vgpu-library", str(LIB), "--health-hold-down", "60s",
                 "--unhealthy-devices-file", "", *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.procs.append(p)
        (h.D / "pids/gpulet-dra").write_text(f"{p.pid}\n")

    def stop(self):
        return stop_pid("gpulet-dra", self.procs)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def stop_pid(name, children=()):
    """TERMs the component D/pids/NAME names and waits (5 s) until it is gone: True when it is
    (or none was running)."""
    try:
        pid = int((h.D / f"pids/{name}").read_text())
    except (OSError, ValueError):
        return True
    mine = [p for p in children if p.pid == pid]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if mine:
        try:
            mine[0].wait(timeout=5)
            return True
        except subprocess.TimeoutExpired:
            return False

    def gone():
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
        except OSError:
            return True
    return bool(h.poll(5, gone, 0.05))


def dra_log():
    return LOG.read_text(errors="replace") if LOG.exists() else ""


def registrations():
    return dra_log().count("the kubelet registered driver gpu.gpulet.io")


@pytest.fixture(scope="module")
def driver(kube, identity):
    """The device plugin stopped and gpulet's DRA driver started on dgx-h100 in its place; before
    it, a slice of this driver on this node under another name, which the driver deletes at start
    (DELETE of its own node's slice, with the agent's token)."""
    kube.create(rslice(f"{h.NODE}-stale", h.NODE, h.NODE, ds.DRIVER))
    assert stop_pid("gpulet-device-plugin"), "the device plugin stops"
    d = Driver()
    d.start("dgx-h100", h.D / "sim")
    try:
        yield d
    finally:
        d.close()


def show(kube, name):
    """On a failure: the pod's events and the driver's last words."""
    return lambda: f"{kube.describe(name, lines=8)}\n{h.tail(dra_log(), 5)}"


def test_the_kubelet_registers_the_driver_and_it_publishes_8_gpus(kube, driver):
    h.wait_until(30, "the kubelet registers gpu.gpulet.io (plugins_registry)", registrations,
                 detail=lambda: h.tail(dra_log(), 5))
    h.wait_until(30, f"ResourceSlice with 8 GPUs published, written with the agent's token through {OWNP}",
                 lambda: len(ds.slice_devices(kube)) == 8, detail=lambda: h.tail(dra_log(), 5))
    h.wait_until(10, f"the driver deleted its node's stale slice (allowed by {OWNP})",
                 lambda: kube.get(f"{SLICES}/{h.NODE}-stale") is None)


# --- 1 GPU -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_gpu(kube, driver):
    """dra-1, a pod with a 1-GPU claim, Running."""
    kube.create(ds.one_gpu_template())
    t0 = h.now()
    kube.create(ds.template_pod("dra-1", "one-gpu"))
    ds.wait_pod(kube, "dra-1", 60, "1-GPU claim: pod Running", show(kube, "dra-1"))
    h.figure(f"kubectl apply -> pod Running (DRA, 1 GPU): {h.elapsed(t0)} s")
    name = ds.claim_of(kube, "dra-1")
    return SimpleNamespace(claim=name, uid=ds.claim(kube, name)["metadata"]["uid"])


def test_one_gpu_claim(kube, one_gpu):
    d1 = ds.devices_of(kube, one_gpu.claim)
    assert len(d1) == 1, f"1-GPU claim: allocated one gpu.gpulet.io device ({d1})"
    nodes = ds.gpu_nodes(kube, "dra-1")
    assert nodes == [f"nvidia{d1[0].removeprefix('gpu-')}"], \
        f"1-GPU claim: the container sees exactly /dev/nvidia{d1[0].removeprefix('gpu-')} ({nodes})"
    assert (h.D / f"cdi/gpu.gpulet.io-claim_{one_gpu.uid}.json").is_file(), \
        "1-GPU claim: its CDI spec is in the CDI directory"
    h.wait_until(10, "1-GPU claim: status.devices has Ready=True",
                 lambda: ds.ready(kube, one_gpu.claim))


# --- 2 GPUs in one NVLink domain, with a CEL selector on memory ------------------------------------


@pytest.fixture(scope="module")
def two(kube, driver):
    """dra-2: 2 GPUs of one NVLink domain with memory >= 79Gi, Running."""
    kube.create(ds.template(
        "two-nvlinked",
        [ds.request("gpus", count=2,
                    cel='device.capacity["gpu.gpulet.io"].memory.compareTo(quantity("79Gi")) >= 0')],
        constraints=[{"requests": ["gpus"], "matchAttribute": "gpu.gpulet.io/nvlinkDomain"}]))
    kube.create(ds.template_pod("dra-2", "two-nvlinked"))
    ds.wait_pod(kube, "dra-2", 60, "2 NVLinked GPUs with memory >= 79Gi (CEL): pod Running",
                show(kube, "dra-2"))


def test_two_nvlinked_gpus(kube, two):
    d2 = ds.devices_of(kube, ds.claim_of(kube, "dra-2"))
    nodes = ds.gpu_nodes(kube, "dra-2")
    assert len(d2) == 2 and len(nodes) == 2, \
        f"2 NVLinked GPUs: 2 devices allocated ({d2}), 2 device nodes ({nodes})"


# --- unsatisfiable: memory >= 100Gi stays Pending with the scheduler's reason ----------------------


@pytest.fixture(scope="module")
def big(kube, driver):
    """dra-big, whose claim no device satisfies (memory >= 100Gi), Unschedulable."""
    kube.create(ds.template(
        "too-big",
        [ds.request(cel='device.capacity["gpu.gpulet.io"].memory.compareTo(quantity("100Gi")) >= 0')]))
    kube.create(ds.template_pod("dra-big", "too-big"))
    h.wait_until(30, "dra-big PodScheduled reason Unschedulable", lambda: kube.unschedulable("dra-big"))


def test_an_unsatisfiable_claim_stays_pending(kube, big):
    msg = kube.condition("dra-big", "PodScheduled", "message")
    assert "cannot allocate all claims" in msg, \
        f"claim no device satisfies: Unschedulable, the scheduler says so ({msg})"
    time.sleep(1)
    assert kube.phase("dra-big") == "Pending", "claim no device satisfies: still Pending"


# --- the agent's claim-status writes: gpulet-node-own-claim-status ---------------------------------


def test_the_claim_status_policy(kube, identity, one_gpu, big):
    # The driver wrote the 1-GPU claim's Ready condition above with the agent's token, through this
    # policy. Each case below PUTs the claim's status as the driver does, edited.
    agent = identity
    c1 = one_gpu.claim

    def put_edited(name, edit):
        c = ds.claim(kube, name)
        edit(c)
        return agent.raw("PUT", ds.claim_path(name) + "/status", c)

    def rewrite(c):
        c["status"]["devices"][0]["conditions"][0]["message"] = "rewritten by the agent"
    answer = put_edited(c1, rewrite)
    (STATE / "own-status.out").write_text(message(answer))
    assert ok(answer), (f"allowed by {CSP}: the agent rewrites its device's condition in a claim "
                        f"allocated on its node ({message(answer)})")

    def other_pool(c):
        c["status"]["devices"][0]["pool"] = "other-node"
    refused_status(CSP, "the agent reports a device of other-node's pool", put_edited(c1, other_pool))

    def other_driver(c):
        c["status"]["devices"].append({"driver": "example.com", "pool": "p", "device": "d"})
    refused_status(CSP, "the agent adds another driver's entry", put_edited(c1, other_driver))

    def no_reservation(c):
        c["status"]["reservedFor"] = []
    denied_by(CSP, "the agent clears the claim's reservedFor", "may change only status.devices",
              put_edited(c1, no_reservation))

    cbig = ds.claim_of(kube, "dra-big")

    def unallocated(c):
        c.setdefault("status", {})["devices"] = [{"driver": ds.DRIVER, "pool": h.NODE,
                                                  "device": "gpu-0"}]
    refused_status(CSP, f"the agent writes the status of a claim not allocated ({cbig})",
                   put_edited(cbig, unallocated))

    phase, reserved = kube.phase("dra-1"), ds.reserved_for(kube, c1)
    assert phase == "Running" and reserved == ["dra-1"], \
        f"the 1-GPU pod is still Running, its claim still reserved for it ({phase}, {reserved})"


# --- one claim shared by two pods ------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(kube, driver):
    """The ResourceClaim shared-gpu, used by the pods dra-sa and dra-sb (both waited for)."""
    kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "shared-gpu", "namespace": "default"},
                 "spec": {"devices": {"requests": [ds.request()]}}})
    for name in ("dra-sa", "dra-sb"):
        kube.create(h.claim_pod(name, {"resourceClaimName": "shared-gpu"}))
    for name in ("dra-sa", "dra-sb"):
        ds.wait_pod(kube, name, 60, "shared claim: both pods Running", show(kube, name))


def test_one_claim_shared_by_two_pods(kube, shared):
    a, b = ds.gpu_nodes(kube, "dra-sa"), ds.gpu_nodes(kube, "dra-sb")
    assert a and a == b and len(a) == 1, f"shared claim: both see the same one GPU ({a} / {b})"
    reserved = ds.reserved_for(kube, "shared-gpu")
    assert len(reserved) == 2, f"shared claim: reserved for 2 pods ({reserved})"


# --- a fractional claim: the interposer's limits through opaque config -----------------------------


@pytest.fixture(scope="module")
def frac(kube, driver):
    """The template frac and the pod dra-frac using it (created; test_fractional_claim waits)."""
    kube.create(ds.frac_template())
    kube.create(ds.template_pod("dra-frac", "frac"))


def test_fractional_claim(kube, frac):
    ds.frac_pod_checks(kube, "dra-frac", 60, show(kube, "dra-frac"))


# --- a CUDA program in a fractional claim's container: exactly the claimed 4Gi ---------------------


@pytest.fixture(scope="module")
def cuda_image(cluster):
    """The image gpulet.test/cuda-probe:1: busybox, vcuda_probe, the fake CUDA driver (it answers
    NVML too) in /opt/fake-cuda, and the C/C++ runtime of those and of the interposer (which the
    claim's CDI device mounts) at the host's paths, imported into containerd 2."""
    r = STATE / "cuda-image"
    for d in ("bin", "opt/probe", "opt/fake-cuda", "dev", "proc", "sys", "etc", "tmp"):
        (r / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(shutil.which("busybox"), r / "bin/busybox")
    for tool in ("sh", "sleep", "cat", "env"):
        (r / "bin" / tool).symlink_to("busybox")
    shutil.copy(PROBE, r / "opt/probe/")
    shutil.copy(FAKECUDA, r / "opt/fake-cuda/libcuda.so.1")
    (r / "opt/fake-cuda/libnvidia-ml.so.1").symlink_to("libcuda.so.1")
    out = h.must("env", f"LD_LIBRARY_PATH={FAKECUDA.parent}", "ldd", PROBE, FAKECUDA, LIB)
    libs = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) > 2 and f[1] == "=>" and f[2].startswith("/"):
            libs.add(f[2])
        elif f and f[0].startswith("/") and "ld-linux" in f[0]:
            libs.add(f[0])
    for lib in sorted(libs):
        if not lib.startswith(f"{h.BUILD}/"):
            h.must("cp", "-L", "--parents", lib, r)
    h.must(h.SRC / "testing/k8s/mkimage", STATE / "cuda.tar", ds.CUDA_IMG, r, "/bin/sh")
    rc, out = h.ctr_k8s("images", "import", "--all-platforms", STATE / "cuda.tar", containerd2=True)
    (STATE / "import.log").write_text(out)
    assert rc == 0, (f"image {ds.CUDA_IMG} (vcuda_probe on the fake CUDA driver) imported:\n"
                     f"{h.tail(out)}")


def cuda_pod(name, tmpl):
    """A pod of the CUDA probe image with a claim from tmpl. The fake GPU has the H100's 80 GiB
    (only the interposer makes it less), and a context holds 512 MiB on it as a real one does (518
    MiB on an H200): a claim's limit covers both."""
    p = ds.template_pod(name, tmpl, image=ds.CUDA_IMG)
    p["spec"]["containers"][0]["env"] = [
        {"name": "LD_LIBRARY_PATH", "value": "/opt/fake-cuda"},
        {"name": "FAKE_CUDA_DEVICE_MEMORY", "value": "85899345920"},
        {"name": "FAKE_CUDA_CONTEXT_BYTES", "value": str(CONTEXT)},
        {"name": "FAKE_CUDA_UUIDS", "value": machine_uuids()},
        {"name": "FAKE_CUDA_DEVICE_NODES", "value": "/dev"}]
    return p


def probe(pod_name, command):
    """vcuda_probe's answer in the pod: {first word: the rest} (one line a key)."""
    rc, out = h.kubectl("exec", pod_name, "--", *command)
    fields = {}
    for line in out.splitlines():
        f = line.split()
        if f:
            fields.setdefault(f[0], f[1:])
    return out, fields


def field(fields, key, i):
    """The i-th value (from 1) after key ("" when none), as `awk '$1 == k {print $(i + 1)}'`."""
    values = fields.get(key, [])
    return values[i - 1] if len(values) >= i else ""


@pytest.fixture(scope="module")
def cuda(kube, frac, cuda_image):
    """dra-cuda: the CUDA probe image with a claim from frac, Running."""
    kube.create(cuda_pod("dra-cuda", "frac"))
    ds.wait_pod(kube, "dra-cuda", 60, "fractional claim, CUDA program: pod Running",
                show(kube, "dra-cuda"))


def test_a_cuda_program_holds_exactly_the_claimed_4gi(kube, cuda):
    # 256 MiB allocations until the first refusal: with the context's 512 MiB, 14 succeed (3.5 GiB),
    # the 15th is CUDA_ERROR_OUT_OF_MEMORY (2), and the process then holds exactly 4 GiB.
    out, f = probe("dra-cuda", ["/opt/probe/vcuda_probe", "limit", "268435456"])
    print(f"      vcuda_probe limit 256MiB under the interposer: {' '.join(out.splitlines())}")
    assert (field(f, "meminfo", 1), field(f, "meminfo", 2)) == ("3758096384", "4294967296"), \
        ("fractional claim, CUDA program: cuMemGetInfo = 3.5Gi free of the claimed 4Gi total "
         f"({field(f, 'meminfo', 1)} / {field(f, 'meminfo', 2)})")
    assert field(f, "held", 1) == "3758096384", \
        ("fractional claim, CUDA program: allocations up to the limit succeed "
         f"({field(f, 'held', 1)} bytes + the 512Mi context)")
    assert field(f, "refused", 1) == "2", \
        ("fractional claim, CUDA program: the next one is refused with CUDA_ERROR_OUT_OF_MEMORY "
         f"(CUresult {field(f, 'refused', 1)})")
    assert (field(f, "meminfo_full", 1), field(f, "meminfo_full", 2)) == ("0", "4294967296"), \
        ("fractional claim, CUDA program: then cuMemGetInfo reports 0 free of 4Gi "
         f"({field(f, 'meminfo_full', 1)} / {field(f, 'meminfo_full', 2)})")
    # The same program with LD_PRELOAD cleared and the opt-out and a bigger limit in its environment
    # (what an entrypoint can do): still the claim's 4Gi. The interposer comes through the read-only
    # /etc/ld.so.preload and reads its limits from the read-only limits file (issue 31.6); before,
    # it saw the fake GPU's whole 80 GiB and held 19 x 4Gi.
    out, f = probe("dra-cuda", ["env", "LD_PRELOAD=", "GPULET_VGPU_DISABLE=1",
                                      "GPULET_VGPU_MEMORY_LIMIT=85899345920",
                                      "/opt/probe/vcuda_probe", "limit", "4294967296"])
    assert (field(f, "meminfo", 2), field(f, "held", 1)) == ("4294967296", "0"), \
        ("fractional claim, CUDA program with LD_PRELOAD cleared and the limit lifted in its env: "
         f"still 4Gi (total {field(f, 'meminfo', 2)}, 4Gi chunks held: {field(f, 'held', 1)})")


# --- XID 79 on the shared claim's GPU: it leaves the slice, the claim's device turns not Ready -----


def test_xid_79_takes_the_gpu_out_of_the_slice(kube, shared):
    xg = " ".join(ds.devices_of(kube, "shared-gpu")).removeprefix("gpu-")
    t0 = h.now()
    h.must(SIM, "fault", "xid", "--gpu", xg, "--code", "79", "--sim-root", h.D / "sim")

    def gone():
        return f"gpu-{xg}" not in ds.slice_devices(kube)
    h.poll(10, gone)
    t1 = h.now()
    assert gone(), (f"XID 79 on GPU {xg}: it leaves the ResourceSlice "
                    f"({len(ds.slice_devices(kube))} devices left)")
    h.figure("XID injected -> ResourceSlice without the GPU (kubectl polled every 0.1 s): "
             f"{h.elapsed(t0, t1)} s")
    h.wait_until(10, f"XID 79 on GPU {xg}: the shared claim's device condition Ready=False",
                 lambda: ds.device_condition(kube, "shared-gpu") == "False",
                 detail=lambda: ds.device_condition(kube, "shared-gpu", "reason"))
    print(f"      the shared claim's device condition: Ready=False "
          f"({ds.device_condition(kube, 'shared-gpu', 'reason')})")


# --- a driver restart with prepared claims ---------------------------------------------------------


def test_a_driver_restart_keeps_the_prepared_claims(kube, driver, one_gpu, two, shared, frac, cuda):
    before = registrations()
    assert driver.stop(), "the DRA driver stops (TERM)"
    driver.start("dgx-h100", h.D / "sim")
    h.wait_until(30, "restart: the driver is back and registered",
                 lambda: "prepared claims from" in dra_log() and registrations() > before,
                 detail=lambda: h.tail(dra_log(), 5))
    assert "DRA: 5 prepared claims from" in dra_log(), \
        ("restart: 5 prepared claims restored from the checkpoint (1 GPU, 2 GPUs, shared, 2 "
         f"fractional): {[l for l in dra_log().splitlines() if 'prepared claims from' in l][-1:]}")
    phases = (kube.phase("dra-1"), kube.phase("dra-2"))
    assert phases == ("Running", "Running"), f"restart: the pods keep running ({phases})"
    kube.clean_pods("dra-1")
    h.wait_until(30, "restart: deleting a pod prepared before it unprepares its claim (CDI spec removed)",
                 lambda: not (h.D / f"cdi/gpu.gpulet.io-claim_{one_gpu.uid}.json").exists())


# --- consumable capacity: fractional claims packed onto one GPU by the scheduler -------------------


def cap_template(name, memory, cores, free):
    return ds.template(name, [ds.request(
        cel=f'device.attributes["gpu.gpulet.io"].index == {free}',
        capacity={"requests": {"memory": memory, "cores": cores}})])


def test_consumable_capacity_packs_two_claims_onto_one_gpu(kube, driver, cuda_image):
    # The driver again, publishing its GPUs with allowMultipleAllocations and memory/cores request
    # policies; three claims pinned to one free GPU (index == N): 48Gi/25 and 24Gi/50 fit its
    # 81559Mi together, a third of 16Gi does not. Each container holds exactly its share
    # (vcuda_probe).
    assert driver.stop(), "consumable capacity: the DRA driver stops (TERM)"
    driver.start("dgx-h100", h.D / "sim", "--dra-consumable-capacity", "true")

    def shareable():
        return any(d.get("allowMultipleAllocations")
                   for s in kube.get(SLICES)["items"] for d in s["spec"].get("devices", []) or [])
    h.wait_until(30, f"consumable capacity: the API server keeps allowMultipleAllocations (gate {GATES})",
                 shareable, detail=lambda: ([line for line in dra_log().splitlines()
                                             if "resourceslices" in line] or [""])[-1][:600])
    claims = kube.get(f"{ds.RESOURCE}/resourceclaims")["items"]
    taken = {r["device"] for c in claims for r in ds.allocation(c)}
    free = next((g.removeprefix("gpu-") for g in ds.slice_devices(kube) if g not in taken), "")
    assert free, f"consumable capacity: a GPU no claim holds (gpu-{free}; taken: {sorted(taken)})"

    for name, memory, cores in (("cap-48", "48Gi", "25"), ("cap-24", "24Gi", "50"),
                                ("cap-16", "16Gi", "10")):
        kube.create(cap_template(name, memory, cores, free))
    kube.create(cuda_pod("dra-cap-a", "cap-48"))
    h.poll(60, lambda: kube.running("dra-cap-a"))
    kube.create(cuda_pod("dra-cap-b", "cap-24"))
    h.poll(60, lambda: kube.running("dra-cap-b"))
    phases = (kube.phase("dra-cap-a"), kube.phase("dra-cap-b"))
    assert phases == ("Running", "Running"), \
        (f"consumable capacity: 48Gi and 24Gi claims on gpu-{free} both Running ({phases})\n"
         f"{show(kube, 'dra-cap-a')() if phases[0] != 'Running' else show(kube, 'dra-cap-b')()}")
    ca, cb = ds.claim_of(kube, "dra-cap-a"), ds.claim_of(kube, "dra-cap-b")
    da, db = ds.devices_of(kube, ca), ds.devices_of(kube, cb)
    sa, sb = ((ds.allocation(ds.claim(kube, c)) or [{}])[0].get("shareID", "") for c in (ca, cb))
    assert da == [f"gpu-{free}"] and db == [f"gpu-{free}"] and sa and sa != sb, \
        (f"consumable capacity: both allocated gpu-{free} ({da} / {db}), each with its shareID "
         f"({sa} / {sb})")
    h.wait_until(10, "consumable capacity: both claims' status.devices Ready=True (each entry with its shareID)",
                 lambda: ds.ready(kube, ca) and ds.ready(kube, cb))
    na, nb = ds.gpu_nodes(kube, "dra-cap-a"), ds.gpu_nodes(kube, "dra-cap-b")
    assert na == [f"nvidia{free}"] and nb == [f"nvidia{free}"], \
        f"consumable capacity: both containers see /dev/nvidia{free} ({na} / {nb})"
    for pod_name, limit, cores in (("dra-cap-a", 51539607552, 25), ("dra-cap-b", 25769803776, 50)):
        lim = kube.exec(pod_name, "echo $GPULET_VGPU_MEMORY_LIMIT $GPULET_VGPU_CORE_LIMIT")[1].strip()
        assert lim == f"{limit} {cores}", \
            f"consumable capacity: {pod_name}'s consumedCapacity is its interposer limit ({lim})"
        _, f = probe(pod_name, ["/opt/probe/vcuda_probe", "limit", "268435456"])
        got = (field(f, "meminfo", 2), field(f, "held", 1), field(f, "refused", 1),
               field(f, "meminfo_full", 1))
        assert got == (str(limit), str(limit - CONTEXT), "2", "0"), \
            (f"consumable capacity: {pod_name}'s CUDA program holds exactly {limit} bytes (total "
             f"{got[0]}, held {got[1]} + 512Mi context, refused {got[2]}, then {got[3]} free)")

    kube.create(cuda_pod("dra-cap-c", "cap-16"))
    h.poll(30, lambda: kube.unschedulable("dra-cap-c"))
    assert kube.unschedulable("dra-cap-c"), \
        (f"consumable capacity: a third claim of 16Gi does not fit gpu-{free}'s rest: Unschedulable "
         f"({kube.condition('dra-cap-c', 'PodScheduled', 'message')})")


# --- a MIG device by profile (a100-mig) ------------------------------------------------------------


def test_a_mig_device_by_profile(kube, driver):
    kube.delete_pods("dra-2", "dra-big", "dra-sa", "dra-sb", "dra-frac", "dra-cuda", "dra-cap-a",
                     "dra-cap-b", "dra-cap-c")
    kube.raw("DELETE", ds.claim_path("shared-gpu"))
    # The cluster's plugin start makes the a100-mig sim root and its MIG capability nodes.
    h.restart_plugin("a100-mig", "--mig-strategy", "mixed")
    stop_pid("gpulet-device-plugin")
    driver.stop()
    driver.start("a100-mig", h.D / "sim-a100-mig")
    h.wait_until(30, "a100-mig: the slice holds MIG devices",
                 lambda: any("mig" in d for d in ds.slice_devices(kube)),
                 detail=lambda: f"{len(ds.slice_devices(kube))} devices\n{h.tail(dra_log(), 5)}")
    kube.create(ds.template("mig-1g", [ds.request(
        "mig", "mig.gpulet.io", cel='device.attributes["gpu.gpulet.io"].profile == "1g.5gb"')]))
    kube.create(ds.template_pod("dra-mig", "mig-1g"))
    ds.wait_pod(kube, "dra-mig", 60, "MIG 1g.5gb claim: pod Running", show(kube, "dra-mig"))
    dm = ds.devices_of(kube, ds.claim_of(kube, "dra-mig"))
    assert len(dm) == 1 and dm[0].startswith("gpu-") and "-mig-" in dm[0], \
        f"MIG 1g.5gb claim: a MIG device allocated ({dm})"
    nodes = ds.gpu_nodes(kube, "dra-mig")
    caps = kube.exec("dra-mig", "ls /dev/nvidia-caps 2>/dev/null | wc -l")[1].strip()
    assert len(nodes) == 1 and caps == "2", \
        f"MIG 1g.5gb claim: the container has its GPU and 2 MIG capability nodes ({nodes} / {caps} caps)"


# --- the stop ----------------------------------------------------------------------------------------


def test_cluster_down_leaves_nothing(cluster):
    cluster.down_leaves_nothing("down (dra)")
