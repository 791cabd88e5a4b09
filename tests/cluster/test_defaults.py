"""A new user's first GPU pod, with the product's defaults: `kubectl apply -k` of deploy/overlays/
containerd (through tests/cluster/deploy/defaults, which adds only what this loopback cluster
lacks, not a device-plugin setting) on a containerd 2 cluster of its own, whose default runtime
stays runc (install does not make gpulet's shim the default), which injects no driver into
gpulet's own containers either: the driver is a stand-in driver container's root whose
libnvidia-ml is the fake NVML, found and loaded by install and the agent. A pod asking for 2
nvidia.com/gpu must see exactly its 2 device nodes and the driver's libcuda in its ld cache. A
ConfigMap edit to settings that reach no container taints the validated node until it is undone.
vGPU turned on in the ConfigMap (vgpu_support.vgpu_checks), the idle agent's cost to the API
server, MPS as an admin turns it on. `kubectl delete -k` restores containerd's configuration, and
the cluster's stop leaves nothing behind.

The steps run in this file's order, each on what the one before left; a step after a failed
install skips, saying so. The last one (delete, cluster down, leftovers) always runs.
"""
import os
import re
import shutil

import pytest

import harness as h
import vgpu_support as v

NS = h.NS
DEFAULTS = h.SRC / "tests/cluster/deploy/defaults"
MPS = h.SRC / "tests/cluster/deploy/defaults-mps"
CONFIG = h.D / "fixed/etc/containerd/config.toml"
CM = f"/api/v1/namespaces/{NS}/configmaps/gpulet-config"


STATE = h.BUILD / "cluster-test-defaults"


class Setup:
    """What the steps hand on: the cluster, the driver's version, whether gpulet is installed."""

    def __init__(self, cluster, version):
        self.cluster, self.kube, self.version = cluster, cluster.kube, version
        self.installed = False
        self.agent = ""


def need_install(c):
    if not c.installed:
        pytest.skip("needs gpulet installed with its agent registered (the install step failed before that)")


@pytest.fixture(scope="module")
def cluster(request):
    failed_before = request.session.testsfailed
    with h.own_cluster(STATE, overlay=DEFAULTS, image=True) as c:
        try:
            version = h.driver_container_root(STATE / "driver-root.log")
            h.driver_nvml_is_the_fake(version)
            shutil.copyfile(CONFIG, STATE / "config.before")
            h.restart_plugin("none")
            # The host-process plugin's CDI spec (the same kind and device names, a stand-in driver
            # of its own) goes with it: a node has only the spec install writes.
            (h.D / "cdi/nvidia.yaml").unlink(missing_ok=True)
            v.patch_node(c.kube, {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}}})
            yield Setup(c, version)
        finally:
            if request.session.testsfailed > failed_before:
                print("--- install log")
                print(h.tail_file(STATE / "install.log", 10**6))
                print("--- agent log (tail)")
                print(h.tail_file(STATE / "agent.log", 20))


def validate_in_pod(out):
    """What docs/install.md tells an admin to run (the same verdict as the agent's): rc of gpulet
    validate in the agent's container, its output written to out."""
    rc, text = h.kubectl("-n", NS, "exec", "ds/gpulet-node", "-c", "agent", "--", "gpulet", "validate",
                         "--host-root", "/host", "--config-file", "/etc/gpulet/config.yaml")
    out.write_text(text)
    return rc, text


def edit_config(kube, edit):
    """The shipped ConfigMap's config.yaml, edited as an admin would (edit: text -> text)."""
    cm = kube.get(CM)
    cm["data"]["config.yaml"] = edit(cm["data"]["config.yaml"])
    status, obj = kube.raw("PUT", CM, cm)
    assert status == 200, f"PUT ConfigMap gpulet-config: HTTP {status}: {obj}"


def strategy(kube, old, new):
    """Edits the shipped ConfigMap's deviceListStrategy."""
    edit_config(kube, lambda t: t.replace(f"deviceListStrategy: [{old}]", f"deviceListStrategy: [{new}]"))


def append_config(kube, text):
    """text added to the end of the ConfigMap's config.yaml."""
    edit_config(kube, lambda t: t + text)


def test_install_with_the_product_defaults(cluster):
    kube = cluster.kube
    rc, out = h.kubectl("apply", "-k", DEFAULTS)
    (STATE / "apply.log").write_text(out)
    assert rc == 0, f"kubectl apply -k tests/cluster/deploy/defaults (rc {rc}): {h.tail(out)}"
    h.wait_until(120, "the agent DaemonSet's pod is Running", lambda: v.agent_up(kube),
                 detail=lambda: f"agent pods: {v.phases(kube, NS, v.AGENT)!r}")
    h.wait_until(60, "the agent registered nvidia.com/gpu 8", lambda: kube.allocatable("nvidia.com/gpu") == "8",
                 detail=lambda: f"nvidia.com/gpu {kube.allocatable('nvidia.com/gpu')!r}")
    cluster.installed = True
    cluster.agent = v.agent_name(kube)
    install_log = kube.logs(cluster.agent, ns=NS, container="install")
    (STATE / "install.log").write_text(install_log)
    agent_log = kube.logs(cluster.agent, ns=NS, container="agent")
    (STATE / "agent.log").write_text(agent_log)
    nvml = ("NVML: the host's /host/run/nvidia/driver/usr/lib/x86_64-linux-gnu/"
            f"libnvidia-ml.so.{cluster.version}")
    assert nvml in install_log, "install loaded the host driver's NVML from under /host (no --simulate)"
    assert nvml in agent_log, "the agent loaded the host driver's NVML from under /host (no --simulate)"
    h.wait_until(60, "the agent validated the node (no gpulet.io/gpu-stack-not-ready taint)",
                 lambda: v.untainted(kube), detail=lambda: f"taints {kube.taints()}")
    rc, text = validate_in_pod(STATE / "validate.out")
    oks = sum(1 for line in text.splitlines() if line.startswith("ok "))
    assert rc == 0 and oks == 3, \
        f"kubectl exec ... gpulet validate --config-file: rc 0, driver, runtime and device-plugin ok " \
        f"(rc {rc})" + ("" if rc == 0 else f"\n{text}")
    takeover = []
    for root, _, files in os.walk(h.D / "fixed/etc/containerd"):
        for name in files:
            p = os.path.join(root, name)
            try:
                if re.search(r"default_runtime_name = .nvidia.", open(p, errors="replace").read()):
                    takeover.append(p)
            except OSError:
                pass
    assert not takeover, f"containerd's default runtime is still runc (install did not take it over) ({takeover})"


def test_first_gpu_pod(cluster):
    need_install(cluster)
    kube = cluster.kube
    kube.clean_pods("first-gpu")
    t0 = h.now()
    kube.create(h.pod("first-gpu", {"nvidia.com/gpu": 2}))
    try:
        kube.wait_running("first-gpu")
        h.figure(f"kubectl apply -> pod Running (2 GPUs, product defaults, containerd 2): {h.elapsed(t0)} s")
        nodes = v.dev_nodes(kube, "first-gpu")
        assert len(nodes) == 2, f"the pod sees exactly 2 /dev/nvidiaN ({' '.join(nodes)})"
        if not h.driver_in_pod(kube, "first-gpu", cluster.version):
            # What the pod got, and the spec install wrote.
            got = kube.exec("first-gpu", "ls -la /usr/lib/x86_64-linux-gnu/ /etc/ld.so.cache 2>&1 | head -n 20")[1]
            spec = h.sh("sh", "-c", f"grep -n -A3 'libcuda\\|hooks' {h.D}/fixed/var/run/cdi/gpulet-nvidia.yaml"
                                    " | head -n 30")[1]
            pytest.fail(f"the pod has the driver's libcuda.so.{cluster.version} mounted and in its ld cache\n"
                        f"{got}\n--- gpulet-nvidia.yaml\n{spec}", pytrace=False)
        rc, _ = kube.exec("first-gpu", "test -c /dev/nvidiactl")
        assert rc == 0, "the pod sees /dev/nvidiactl"
    finally:
        kube.clean_pods("first-gpu")


def test_settings_that_reach_no_container_taint_the_node(cluster):
    """A settings change within the validated boot (a ConfigMap edit; a helm upgrade restarts the
    agent, which checks its settings on start) is checked against this engine: volume-mounts alone
    reach no container while runc is the default runtime, so the node is tainted until the
    settings are fixed."""
    need_install(cluster)
    kube = cluster.kube
    strategy(kube, "volume-mounts, cdi-cri", "volume-mounts")
    try:
        text = kube.get(CM)["data"]["config.yaml"]
        assert "deviceListStrategy: [volume-mounts]" in text, "deviceListStrategy [volume-mounts] in the ConfigMap"
        t0 = h.now()
        h.wait_until(120, "settings that reach no container taint the validated node", lambda: v.tainted(kube))
        h.figure(f"ConfigMap edit -> node tainted: {h.elapsed(t0)} s")
        log = kube.logs(cluster.agent, ns=NS, container="agent")
        (STATE / "agent.log").write_text(log)
        assert re.search("no longer validates with the current settings.*not the engine's default runtime", log), \
            "the agent says why (the shim is not the default runtime)"
        rc, out = validate_in_pod(STATE / "validate-bad.out")
        assert rc == 1 and re.search(
            r"^FAIL runtime: GPU containers would start without their GPUs.*set-as-default", out, re.M), \
            f"gpulet validate --config-file in the pod agrees: rc 1, the runtime step names the fix (rc {rc})\n{out}"
    finally:
        strategy(kube, "volume-mounts", "volume-mounts, cdi-cri")
    h.wait_until(120, "the shipped settings again: the node validates and is untainted", lambda: v.untainted(kube))


def test_vgpu_and_the_idle_agent(cluster):
    """vGPU turned on as an admin does (gpulet.vgpu.gpus in the ConfigMap): a vcuda pod's granted
    GPU reaches it the way whole GPUs do here, through CDI in CRI, with the driver's libraries."""
    need_install(cluster)
    kube = cluster.kube
    append_config(kube, 'gpulet:\n  vgpu:\n    gpus: "4,5,6,7"\n')

    def vgpu_up():
        return kube.allocatable("nvidia.com/gpu") == "4" and kube.allocatable("tencent.com/vcuda-core") == "400"
    h.wait_until(120, "GPUs 4-7 as vGPU after the ConfigMap edit", vgpu_up,
                 detail=lambda: f"nvidia.com/gpu {kube.allocatable('nvidia.com/gpu')}, "
                                f"vcuda-core {kube.allocatable('tencent.com/vcuda-core')}")
    assert v.untainted(kube), f"the node is still validated (no gpulet.io/gpu-stack-not-ready taint) ({kube.taints()})"
    try:
        v.vgpu_checks(kube, STATE)
        assert h.driver_in_pod(kube, "vgpu-a", cluster.version), \
            f"the vcuda pod has the driver's libcuda.so.{cluster.version} mounted and in its ld cache"
        # Issue 30.5: what the agent costs the API server at rest (vGPU on, a vcuda pod running,
        # nothing changing). Watches stay open (the vGPU part's pods, the readiness controller's
        # Node); in the two minutes after validating, the readiness controller lists the node's
        # pods for rejected ones every 10 s: at most 7 of anything a minute (before: 60 GETs of
        # the Node and 30 lists).
        h.check_idle_agent(STATE, 60, 7, "the idle agent")
    finally:
        kube.clean_pods("vgpu-a")
        rc, out = h.sh(h.CLUSTER, "scheduler", h.BUILD)
    assert rc == 0, f"kube-scheduler back to its flags: {h.tail(out, 5)}"


def test_mps(cluster):
    """MPS as an admin turns it on: deploy/overlays/mps (its MPS root on the host) and sharing.mps in
    the ConfigMap. The agent's container has no driver (runc injects none), so it must run the host
    driver's nvidia-cuda-mps-control (here the fake one, at the driver root's /usr/bin) itself."""
    need_install(cluster)
    kube = cluster.kube
    shutil.copy(h.BUILD / "testing/gpulet-fake-mps-control",
                h.D / "fixed/run/nvidia/driver/usr/bin/nvidia-cuda-mps-control")
    cluster.cluster.overlay = MPS
    rc, out = h.kubectl("apply", "-k", MPS)
    (STATE / "apply-mps.log").write_text(out)
    assert rc == 0, f"kubectl apply -k tests/cluster/deploy/defaults-mps (rc {rc}): {h.tail(out)}"
    append_config(kube, "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n")

    def mps_up():
        return kube.allocatable("nvidia.com/gpu") == "16"
    h.poll(120, mps_up)
    # The overlay rolled the DaemonSet: the log to read is the new pod's, once the old one is gone.
    h.kubectl("-n", NS, "rollout", "status", "ds/gpulet-node", "--timeout=120s")
    agent = v.agent_name(kube)
    log = kube.logs(agent, ns=NS, container="agent")
    (STATE / "agent-mps.log").write_text(log)
    mps_lines = "\n".join([line for line in log.splitlines() if "mps" in line.lower()][-5:])
    assert mps_up(), \
        f"sharing.mps: nvidia.com/gpu 16 (8 GPUs x 2 replicas; {kube.allocatable('nvidia.com/gpu')})\n{mps_lines}"
    assert "driver programs for sharing.mps: the host's, from /host/run/nvidia/driver" in log, \
        "the agent runs the host driver's programs (no driver in its container)"
    pid = h.D / "fixed/run/nvidia/mps/nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid"
    assert pid.exists() and pid.stat().st_size > 0, \
        "the host driver's MPS control daemon runs (its pid file on the host)"
    # One tenant per MPS node (gpulet-mps-one-tenant-per-node, in the overlay): without the node
    # selector the pod is refused; the node is default's, so default's pod selecting it runs.
    rc, out = v.kubectl_apply(h.pod("mps-gpu", {"nvidia.com/gpu": 1}))
    assert rc != 0 and "gpulet-mps-one-tenant-per-node" in out, \
        f"an MPS client pod without gpulet.io/mps-tenant is refused ({out.strip()})"
    v.patch_node(kube, {"metadata": {"labels": {"gpulet.io/mps-tenant": "default"}}})
    try:
        kube.create(h.pod("mps-gpu", {"nvidia.com/gpu": 1}, nodeSelector={"gpulet.io/mps-tenant": "default"}))
        kube.wait_running("mps-gpu")
        rc, out = kube.exec("mps-gpu", 'test -S "$CUDA_MPS_PIPE_DIRECTORY/control"')
        assert rc == 0, f"the pod reaches the daemon: CUDA_MPS_PIPE_DIRECTORY and its control socket ({out.strip()})"
    finally:
        kube.clean_pods("mps-gpu")
        v.patch_node(kube, {"metadata": {"labels": {"gpulet.io/mps-tenant": None}}})


def test_delete_and_down_leave_nothing(cluster):
    """Every check here runs, whatever the one before found (the stop and the leftovers matter
    most after a failure)."""
    problems = []
    overlay = cluster.cluster.overlay
    rc, out = h.kubectl("delete", "-k", overlay, "--wait=true", "--timeout=90s")
    (STATE / "delete.log").write_text(out)
    if rc != 0:
        problems.append(f"kubectl delete -k {overlay.relative_to(h.SRC)} (rc {rc}): {h.tail(out)}")
    if (STATE / "config.before").read_bytes() != CONFIG.read_bytes():
        problems.append("containerd 2's config.toml is byte for byte as before the install: it differs")
    problems += cluster.cluster.down_problems("down (defaults)")
    assert not problems, "\n".join(problems)
    shutil.rmtree(STATE, ignore_errors=True)
