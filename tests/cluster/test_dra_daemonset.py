"""gpulet as a DRA driver installed the admin's way: `kubectl apply -k` of deploy/overlays/dra
(through tests/cluster/deploy/dra, which adds only what this loopback cluster lacks) on a containerd 2
cluster of its own. The agent pod, not a host process, is the driver: its install init container
configures containerd 2, it registers gpu.gpulet.io with the real kubelet from its own mounts,
publishes the node's ResourceSlice and writes claim status with its own projected token (through
the admission policies gpulet-node-own-resourceslices and gpulet-node-own-claim-status), and writes
each claim's CDI spec where containerd reads it. The driver is a driver container's root
(/run/nvidia/driver, as on GPU Operator hosts; this host has no NVIDIA driver of its own): install
and the DRA driver find it there, the agent's validation probe container mounts its files, and a
claim's container gets its libraries and an ld cache the hook made. A 1-GPU claim and a fractional
claim run; `kubectl delete -k` then restores containerd's configuration byte for byte. Then the
cluster stops and leaves nothing behind.

The tests run in the file's order, one narrative on one cluster."""
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import dra_support as ds
import harness as h

STATE = h.BUILD / "cluster-test-dra-daemonset"
OVERLAY = h.SRC / "tests/cluster/deploy/dra"
CONFIG = h.D / "fixed/etc/containerd/config.toml"
CDI = h.D / "fixed/var/run/cdi"
NS = h.NS


@pytest.fixture(scope="module")
def cluster():
    with h.own_cluster(STATE, overlay=OVERLAY, image=True) as c:
        yield c


@pytest.fixture(scope="module")
def kube(cluster):
    return cluster.kube


def logs(kube, agent):
    """The agent pod's install and agent containers' logs (also kept in STATE)."""
    install = kube.logs(agent, NS, "install")
    agent_log = kube.logs(agent, NS, "agent")
    (STATE / "install.log").write_text(install)
    (STATE / "agent.log").write_text(agent_log)
    return SimpleNamespace(install=install, agent=agent_log)


@pytest.fixture(scope="module")
def installed(cluster, kube):
    """The stand-in driver container's root; the host-process device plugin stopped; the node
    labelled as NFD would; `kubectl apply -k tests/cluster/deploy/dra`; the agent pod Running and
    its ResourceSlice holding the 8 GPUs."""
    version = h.driver_container_root(STATE / "driver-root.log")
    config_before = CONFIG.read_bytes()
    (STATE / "config.before").write_bytes(config_before)
    h.must(h.CLUSTER, "plugin", h.BUILD, "none")
    pid = (h.D / "pids/gpulet-device-plugin")
    assert not (pid.exists() and Path(f"/proc/{pid.read_text().strip()}").exists()), \
        "host-process device plugin stopped"
    status, body = kube.raw("PATCH", f"/api/v1/nodes/{h.NODE}",
                            {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}}},
                            content_type="application/merge-patch+json")
    assert status == 200, f"node labelled feature.node.kubernetes.io/pci-10de.present=true: {body}"
    t0 = h.now()
    rc, out = h.kubectl("apply", "-k", OVERLAY)
    (STATE / "apply.log").write_text(out)
    assert rc == 0, f"kubectl apply -k tests/cluster/deploy/dra:\n{h.tail(out)}"
    h.wait_until(120, "the agent DaemonSet's pod is Running on the real kubelet",
                 lambda: ds.agent_up(kube),
                 detail=lambda: (lambda a: kube.describe(a, NS) if a else "no agent pod")(
                     ds.agent_name(kube)))
    h.wait_until(60, "the agent pod published a ResourceSlice with 8 GPUs",
                 lambda: len(ds.slice_devices(kube)) == 8,
                 detail=lambda: f"{len(ds.slice_devices(kube))} devices\n"
                                f"{h.tail(kube.logs(ds.agent_name(kube), NS, 'agent'), 5)}")
    h.figure(f"kubectl apply -k -> 8 GPUs in the agent's ResourceSlice: {h.elapsed(t0)} s")
    return SimpleNamespace(version=version, config_before=config_before, agent=ds.agent_name(kube))


def test_install_configured_containerd_and_found_the_driver(kube, installed):
    log = logs(kube, installed.agent)
    assert "configured /etc/containerd/config.toml" in log.install, \
        f"install configured containerd 2's config.toml:\n{h.tail(log.install)}"
    assert "driver container's root /run/nvidia/driver" in log.install, \
        f"install found the driver in the driver container's root /run/nvidia/driver:\n{h.tail(log.install)}"


def test_the_kubelet_registered_the_agents_driver(kube, installed):
    h.wait_until(30, "the kubelet registered the agent's driver gpu.gpulet.io",
                 lambda: "registered driver gpu.gpulet.io" in logs(kube, installed.agent).agent,
                 detail=lambda: h.tail((STATE / "agent.log").read_text(), 5))


def test_every_gpu_is_dras(kube, installed):
    gpus = kube.allocatable("nvidia.com/gpu")
    assert gpus in ("", "0"), \
        ("nvidia.com/gpu is not offered by the device plugin (every GPU is DRA's): "
         f"allocatable '{gpus}'")


def test_the_agent_validated_the_node(kube, installed):
    def why():
        lines = [line for line in logs(kube, installed.agent).agent.splitlines()
                 if re.search(r"valid|taint|readiness|not ready", line, re.I)]
        return "\n".join(lines[-5:])
    h.wait_until(60, "the agent validated the node (label gpulet.io/gpu-stack=ready, no "
                     "gpulet.io/gpu-stack-not-ready taint)",
                 lambda: ds.validated(kube), detail=why)


# --- claims ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def templates(kube, installed):
    kube.create(ds.one_gpu_template())
    kube.create(ds.frac_template())


def show(kube, name, agent):
    """On a failure: the pod's events, the agent's last words, the claim CDI specs, containerd on
    CDI."""
    def detail():
        parts = [kube.describe(name, lines=8), h.tail(logs(kube, agent).agent, 5)]
        for f in sorted(CDI.glob("gpu.gpulet.io-claim_*")):
            parts.append(f"--- {f}\n{f.read_text(errors='replace')[:3000]}")
        try:
            cdi = [line for line in (h.D / "logs/containerd.log").read_text(errors="replace")
                   .splitlines() if "cdi" in line.lower()]
            parts.append("\n".join(cdi[-5:]))
        except OSError:
            pass
        return "\n".join(parts)
    return detail


def test_one_gpu_claim(kube, installed, templates):
    t0 = h.now()
    kube.create(ds.template_pod("ds-1", "one-gpu"))
    ds.wait_pod(kube, "ds-1", 90, "1-GPU claim: pod Running", show(kube, "ds-1", installed.agent))
    h.figure(f"kubectl apply -> pod Running (DRA through the agent pod, 1 GPU): {h.elapsed(t0)} s")
    c1 = ds.claim_of(kube, "ds-1")
    d1 = ds.devices_of(kube, c1)
    n = d1[0].removeprefix("gpu-") if d1 else "?"
    nodes = ds.gpu_nodes(kube, "ds-1")
    assert nodes == [f"nvidia{n}"], f"1-GPU claim: the container sees exactly /dev/nvidia{n} ({nodes})"
    uid1 = ds.claim(kube, c1)["metadata"]["uid"]
    assert (CDI / f"gpu.gpulet.io-claim_{uid1}.json").is_file(), \
        "1-GPU claim: its CDI spec is in the node's /var/run/cdi"
    assert h.driver_in_pod(kube, "ds-1", installed.version), \
        (f"1-GPU claim: the driver container's libcuda.so.{installed.version} is mounted and in "
         "the container's ld cache (the hook)")
    h.wait_until(15, "1-GPU claim: the agent pod wrote status.devices Ready=True (through "
                     "gpulet-node-own-claim-status)", lambda: ds.ready(kube, c1))


def test_the_idle_agent_with_a_claim_prepared(kube, installed):
    """Issue 30.5, the DRA agent: what it asks of the API server at rest (a claim prepared and its
    pod running, nothing changing): a 30 s window of the audit log, per verb and resource
    (idle_requests.py). The slice is re-published only when it changed, so the driver itself
    should ask nothing; the readiness controller's node watch stays open, and in the two minutes
    after validating it lists the node's pods every 10 s."""
    h.check_idle_agent(STATE, 30, 7, "the idle DRA agent")


def test_fractional_claim_and_both_unprepared(kube, installed, templates):
    kube.create(ds.template_pod("ds-frac", "frac"))
    # The interposer there is the one the init container installed.
    ds.frac_pod_checks(kube, "ds-frac", 90, show(kube, "ds-frac", installed.agent))
    kube.clean_pods("ds-1", "ds-frac")
    h.wait_until(30, "both claims unprepared: their CDI specs are gone",
                 lambda: not list(CDI.glob("gpu.gpulet.io-claim_*")),
                 detail=lambda: sorted(p.name for p in CDI.glob("*")))


# --- uninstall -------------------------------------------------------------------------------------


def test_uninstall_restores_containerds_config(cluster, installed):
    rc, out = h.kubectl("delete", "-k", OVERLAY, "--wait=true", "--timeout=90s")
    (STATE / "delete.log").write_text(out)
    assert rc == 0, f"kubectl delete -k:\n{h.tail(out)}"
    cluster.overlay = None
    assert CONFIG.read_bytes() == installed.config_before, \
        "containerd 2's config.toml is byte for byte as before the install"
    left = sorted(p.name for p in (h.D / "fixed/usr/local/gpulet").glob("*")) \
        if (h.D / "fixed/usr/local/gpulet").is_dir() else []
    assert not left, f"the installed shim, hook and interposer are gone from /usr/local/gpulet ({left})"


# --- the stop --------------------------------------------------------------------------------------


def test_cluster_down_leaves_nothing(cluster):
    cluster.down_leaves_nothing("down (dra daemonset)")
