"""gpulet installed the admin's way on the real cluster, then uninstalled:
- the image: `make image`'s steps plus the test layer Containerfile.sim (the fake NVML), imported
  into the cluster's containerd (harness.gpulet_image);
- `kubectl apply -k tests/cluster/deploy` (deploy/overlays/containerd with the test cluster's
  needs, see its kustomization.yaml): the install init container configures the cluster's
  containerd (/etc/containerd/config.toml in the cluster's namespace) and restarts it; the agent
  runs as a pod on the real kubelet, registers nvidia.com/gpu (8, the host-process plugin having
  been stopped), validates the node (label gpulet.io/gpu-stack=ready, no taint left); the
  scheduler Deployment runs; a 2-GPU pod runs and sees its 2 device nodes. The driver is a
  stand-in driver container's root (/run/nvidia/driver): install finds it there and the agent's
  validation probe mounts its files (this overlay's pods get device specs, not the shim: no
  libraries; cluster.dra_daemonset checks them in a claim's container);
- the vGPU path (vgpu_support.vgpu_checks, restart_checks), and examples/05-vgpu.yaml as printed
  on the cluster's pod network: its container gets one GPU and the example's limits;
- the reboot order (vgpu_support.reboot_checks): kubelet first, then the agent;
- RBAC: every request of gpulet's service accounts while installed, from the API server's audit
  log (rbac_audit.py): none refused, the agent's pod and node reads scoped to its own node;
- uninstall as docs/install.md says: `kubectl debug node/... --profile=sysadmin -- gpulet
  uninstall --host-root /host`, then `kubectl delete -k`: containerd's config.toml is byte for
  byte what it was, nothing of gpulet is left on the node, nvidia.com/gpu is gone;
- then the product's own device-plugin settings (tests/cluster/deploy/defaults) on this
  containerd 1.6: the agent keeps the node tainted, saying GPU pods would get no GPUs (on a host
  whose containerd is 1.7 or newer, which has CDI in its CRI, it validates the node instead).
The host-process plugin is restarted at the end for the scenarios after this one.

The steps run in this file's order, each on what the one before left; a step after a failed
install skips, saying so.
"""
import ipaddress
import json
import os
import re
import shutil

import pytest

import harness as h
import vgpu_support as v

NS = h.NS
OVERLAY = h.SRC / "tests/cluster/deploy"
DEFAULTS = h.SRC / "tests/cluster/deploy/defaults"
CONFIG = h.D / "fixed/etc/containerd/config.toml"
WORK = h.BUILD / "cluster-install-test"
AUDIT = h.D / "logs/audit.log"
RESTARTER = h.D / "logs/engine-restarter.log"


class Run:
    """What the steps hand on: installed once the agent pod registered its GPUs."""
    installed = False
    version = None  # the stand-in driver's version
    audit_from = 0  # the audit log's line count before the install
    defaults_applied = False


def need_install(run):
    if not run.installed:
        pytest.skip("needs gpulet installed with its agent registered (test_install failed before that)")


def gone(kube):
    return kube.allocatable("nvidia.com/gpu") == "0"


def gpus8(kube):
    """GPUs 4-7 are shared as vGPU (the overlay's gpulet.vgpu.gpus): 4 whole GPUs, 4 x 100 cores,
    4 x 320 memory units (80 GiB in 256 MiB units)."""
    return (kube.allocatable("nvidia.com/gpu") == "4"
            and kube.allocatable("tencent.com/vcuda-core") == "400"
            and kube.allocatable("tencent.com/vcuda-memory") == "1280")


def capacity_text(kube):
    return ", ".join(kube.allocatable(r) for r in
                     ("nvidia.com/gpu", "tencent.com/vcuda-core", "tencent.com/vcuda-memory"))


def restarts():
    try:
        return RESTARTER.read_text(errors="replace").count("containerd restarted")
    except OSError:
        return 0


def best_effort(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - cleanup goes on
        print(f"cleanup: {getattr(fn, '__name__', fn)}: {e}")


def cleanup(kube):
    for overlay in (DEFAULTS, OVERLAY):
        h.kubectl("delete", "-k", overlay, "--ignore-not-found", "--wait=true", "--timeout=90s")
    best_effort(v.patch_node, kube, {"metadata": {"labels": {
        "feature.node.kubernetes.io/pci-10de.present": None, "gpulet.io/gpu-stack": None}}})
    best_effort(v.untaint, kube)
    best_effort(kube.delete, "apps/v1", "Deployment", "gpu-reboot", ns="default")
    try:
        kubelet_alive = os.path.exists(f"/proc/{(h.D / 'pids/kubelet').read_text().strip()}")
    except OSError:
        kubelet_alive = False
    if not kubelet_alive:
        h.sh(h.CLUSTER, "kubelet-start", h.BUILD)
    best_effort(kube.delete_pods, "vgpu-a", "vgpu-b", "vgpu-inference", "gpu-installed")
    if (h.D / "kube-scheduler-config.yaml").exists():
        h.sh(h.CLUSTER, "scheduler", h.BUILD)
    rc, out = h.sh(h.CLUSTER, "plugin", h.BUILD)
    if rc != 0:
        print(f"cleanup: the host-process plugin did not start again: {h.tail(out, 5)}")
    shutil.rmtree(h.D / "fixed/run/nvidia/driver", ignore_errors=True)


@pytest.fixture(scope="module")
def run(kube, request):
    if not shutil.which("podman"):
        pytest.skip("podman missing (the image is built with podman build)")
    if h.runtime() != "containerd":
        pytest.skip("the install test runs on containerd 1.6")
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    failed_before = request.session.testsfailed
    try:
        yield Run()
    finally:
        cleanup(kube)
        if request.session.testsfailed > failed_before:
            print("--- install log")
            print(h.tail_file(WORK / "install.log", 10**6))
            print("--- agent log (tail)")
            print(h.tail_file(WORK / "agent.log", 20))
            print("--- uninstall log")
            print(h.tail_file(WORK / "uninstall.log", 10**6))


def agent_logs(kube, container, path):
    """The first agent pod's log of container, written to path; its text."""
    text = kube.logs(v.agent_name(kube), ns=NS, container=container)
    path.write_text(text)
    return text


# --- install ---------------------------------------------------------------------------------------


def test_install(kube, run):
    h.gpulet_image(WORK)
    run.version = h.driver_container_root(WORK / "driver-root.log")  # removed by cleanup
    shutil.copyfile(CONFIG, WORK / "config.before")
    # The audit log from here to the uninstall is what gpulet's accounts did while installed
    # (earlier scenarios use gpulet-node tokens to be refused on purpose; kubectl delete -k removes
    # the RBAC while the agent is still stopping).
    run.audit_from = len(AUDIT.read_text(errors="replace").splitlines())
    h.restart_plugin("none")
    h.wait_until(30, "host-process plugin stopped: nvidia.com/gpu allocatable 0", lambda: gone(kube))
    # What NFD would say of a node with an NVIDIA PCI device (the DaemonSet's node affinity).
    v.patch_node(kube, {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}}})
    restarts_before = restarts()
    t0 = h.now()
    rc, out = h.kubectl("apply", "-k", OVERLAY)
    (WORK / "apply.log").write_text(out)
    assert rc == 0, f"kubectl apply -k tests/cluster/deploy (rc {rc}): {h.tail(out)}"
    h.wait_until(120, "the agent DaemonSet's pod is Running on the real kubelet", lambda: v.agent_up(kube),
                 detail=lambda: f"agent pods: {v.phases(kube, NS, v.AGENT)!r}")
    h.wait_until(60, "the agent pod registered nvidia.com/gpu 4, vcuda-core 400, vcuda-memory 1280",
                 lambda: gpus8(kube), detail=lambda: f"allocatable: {capacity_text(kube)}")
    h.figure(f"kubectl apply -k -> nvidia.com/gpu allocatable from the agent pod: {h.elapsed(t0)} s")
    run.installed = True

    install_log = agent_logs(kube, "install", WORK / "install.log")
    agent_log = agent_logs(kube, "agent", WORK / "agent.log")
    assert "driver container's root /run/nvidia/driver" in install_log, \
        "install found the driver in the driver container's root /run/nvidia/driver"
    n = sum(1 for line in install_log.splitlines() if line)
    assert "configured /etc/containerd/config.toml" in install_log, \
        f"install configured /etc/containerd/config.toml ({n} lines of output)"
    assert "restarted containerd" in install_log, "install restarted containerd through --restart"
    assert restarts() == restarts_before + 1, \
        f"containerd was restarted once by the cluster ({restarts()} restarts, {restarts_before} before)"
    assert "/etc/containerd/conf.d/99-gpulet.toml" in CONFIG.read_text(), \
        "config.toml imports gpulet's drop-in"
    dropin = h.D / "fixed/etc/containerd/conf.d/99-gpulet.toml"
    assert "/usr/local/gpulet/bin/gpulet-container-runtime" in dropin.read_text(), \
        "the drop-in names gpulet's runtime"
    shim = h.D / "fixed/usr/local/gpulet/bin/gpulet-container-runtime"
    assert os.access(shim, os.X_OK), "the shim is on the node (/usr/local/gpulet/bin)"

    h.poll(60, lambda: v.validated(kube))
    why = "\n".join([line for line in agent_log.splitlines()
                     if re.search("valid|taint|readiness", line, re.I)][-5:])
    assert v.ready(kube), f"the agent validated the node: label gpulet.io/gpu-stack=ready\n{why}"
    assert v.untainted(kube), f"no gpulet.io/gpu-stack-not-ready taint left ({kube.taints()})"

    def image():
        d = kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/gpulet-scheduler") or {}
        return d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("image")
    h.wait_until(60, f"the scheduler Deployment's pod is Running (image {image()})",
                 lambda: v.scheduler_up(kube),
                 detail=lambda: f"scheduler pods: {v.phases(kube, NS, v.SCHEDULER)!r}")

    kube.default_sa()
    kube.clean_pods("gpu-installed")
    kube.create(h.pod("gpu-installed", {"nvidia.com/gpu": 2}))
    kube.wait_running("gpu-installed")
    nodes = v.dev_nodes(kube, "gpu-installed")
    assert len(nodes) == 2, f"kubectl exec: the pod sees exactly 2 /dev/nvidiaN ({' '.join(nodes)})"
    kube.clean_pods("gpu-installed")


# --- vGPU: the real API server calls the webhook, the real kube-scheduler the extender ------------


def pod_network_subnet():
    conf = json.loads((h.D / "cni/10-gpulet-pods.conflist").read_text())
    return ipaddress.ip_network(conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"])


def example_vgpu(kube):
    """examples/05-vgpu.yaml as printed (on the pod network; its image is the cluster's vectoradd
    stand-in, which lists the GPU and limits it got and exits 0, so the pod, restartPolicy Always,
    runs it again): 30 cores and 20 units of one GPU of the vGPU pool. Deleted before the restart
    checks, whose binpack expectation counts only their own pods."""
    kube.clean_pods("vgpu-inference")
    rc, out = h.kubectl("apply", "-f", h.SRC / "examples/05-vgpu.yaml")
    assert out.strip() == "pod/vgpu-inference created", f"kubectl apply -f examples/05-vgpu.yaml ({out.strip()})"

    def vlogs():
        return (kube.logs("vgpu-inference") if kube.pod("vgpu-inference") else "") + \
            h.kubectl("logs", "vgpu-inference", "--previous")[1]

    def passed():
        return "Test PASSED" in vlogs()
    h.poll(60, passed)
    logs = vlogs()
    post = "" if passed() else "\n" + kube.describe("vgpu-inference", lines=10)
    gpus_line = next((line for line in logs.splitlines() if line.startswith("GPUs")), "")
    assert "Test PASSED" in logs and "GPUs: 1 " in logs, \
        f'vgpu-inference ran: "Test PASSED" on 1 GPU ({gpus_line}){post}'
    lines = logs.splitlines()
    assert "GPULET_VGPU_CORE_LIMIT=30" in lines and f"GPULET_VGPU_MEMORY_LIMIT={20 * v.UNIT}" in lines, \
        f"... with GPULET_VGPU_CORE_LIMIT=30 and a 5 GiB memory limit{post}\n{h.tail(logs)}"
    p = kube.pod("vgpu-inference") or {}
    vip = p.get("status", {}).get("podIP", "")
    host_network = p.get("spec", {}).get("hostNetwork", "")
    subnet = pod_network_subnet()
    assert vip and ipaddress.ip_address(vip) in subnet, \
        f"vgpu-inference is on the pod network ({vip}, hostNetwork: {host_network}; subnet {subnet}){post}"
    kube.clean_pods("vgpu-inference")


def test_vgpu_path_and_agent_restart(kube, run):
    need_install(run)
    try:
        state = v.vgpu_checks(kube, WORK)
        example_vgpu(kube)
    except BaseException:
        kube.delete_pods("vgpu-a", "vgpu-b", "vgpu-inference")
        h.sh(h.CLUSTER, "scheduler", h.BUILD)
        raise
    v.restart_checks(kube, state["gpus_a"], gpus8)


# --- the reboot order: kubelet first, then the agent -------------------------------------------------


def test_reboot_order(kube, run):
    need_install(run)
    v.reboot_checks(kube, WORK)


# --- RBAC, from the API server's audit log while installed -------------------------------------------


def test_no_request_of_gpulets_accounts_refused(kube, run):
    """Every request of gpulet's service accounts in the API server's audit log, from the install to
    here (before the uninstall); none refused."""
    need_install(run)
    lines = AUDIT.read_text(errors="replace").splitlines(keepends=True)[run.audit_from:]
    (WORK / "audit.log").write_text("".join(lines))
    manifests = h.must(h.K / "kubectl", "kustomize", OVERLAY)
    (WORK / "manifests.yaml").write_text(manifests)
    rc, report = h.sh("/usr/bin/python3", h.SRC / "tests/cluster/rbac_audit.py", WORK / "audit.log",
                      WORK / "manifests.yaml")
    (WORK / "rbac.txt").write_text(report)
    print(report, end="")
    out = report.splitlines()
    assert not any(line.startswith("REFUSED ") for line in out), \
        "no request of a gpulet service account was refused (403) in the audit log"
    # Issue 31.9: RBAC cannot scope list/watch by field selector; the audit log proves that the
    # agent only ever lists and watches its own node's pods.
    assert not any(line.startswith("UNSCOPED ") for line in out) and \
        any(re.match(r"figure: gpulet-node pod lists and watches: [1-9]", line) for line in out), \
        "the node agent listed and watched only its own node's pods (fieldSelector spec.nodeName)"
    assert rc == 0, f"rbac_audit.py exited 0 (rc {rc})"
    assert any(line.startswith("== gpulet-node") for line in out) and \
        any(line.startswith("== gpulet-scheduler") for line in out) and "used " in report, \
        "the audit log shows both accounts at work"


# --- uninstall (docs/install.md) -------------------------------------------------------------------


def test_uninstall(kube, run):
    need_install(run)
    rc, out = h.kubectl("debug", f"node/{h.NODE}", "--profile=sysadmin", f"--image={h.SIM_IMG}",
                        "--image-pull-policy=Never", "--", "gpulet", "uninstall", "--host-root", "/host",
                        "--restart=/usr/bin/gpulet-test-restart-engine")
    m = re.search(r"debugging pod (\S+)", out)
    dbg = m.group(1) if m else ""
    assert dbg, f"kubectl debug node started the uninstall pod ({dbg}): {h.tail(out, 5)}"
    h.poll(90, lambda: kube.phase(dbg) in ("Succeeded", "Failed"))
    # The pod can read Succeeded before containerd has written its last output to the container's
    # log (CI once read an empty log from a pod whose uninstall had worked), so the log is read
    # until it shows the end of uninstall's report or 20 s pass.
    log = WORK / "uninstall.log"

    def uninstall_logged():
        rc, text = h.kubectl("logs", dbg)
        log.write_text(text)
        return rc == 0 and "restored /etc/containerd/config.toml" in text
    h.poll(20, uninstall_logged)
    phase = kube.phase(dbg)
    assert phase == "Succeeded", f"gpulet uninstall succeeded in the debug pod ({phase})"
    assert "restored /etc/containerd/config.toml" in log.read_text(), \
        f"uninstall restored /etc/containerd/config.toml: {h.tail_file(log, 10)}"
    kube.delete_pods(dbg)
    rc, out = h.kubectl("delete", "-k", OVERLAY, "--wait=true", "--timeout=90s")
    (WORK / "delete.log").write_text(out)
    assert rc == 0, f"kubectl delete -k (rc {rc}): {h.tail(out)}"
    assert (WORK / "config.before").read_bytes() == CONFIG.read_bytes(), \
        "containerd's config.toml is byte for byte as before the install"
    # What install placed is gone. The agent's own state stays (its vGPU checkpoint and accounting
    # in /var/lib/gpulet/vgpu, the NFD feature file): uninstall removes only what install recorded.
    fixed = h.D / "fixed"
    left = []
    for top in ("usr/local/gpulet", "var/lib/gpulet", "var/run/cdi"):
        for root, dirs, files in os.walk(fixed / top):
            for name in dirs + files:
                p = os.path.join(root, name)
                if not p.startswith(f"{fixed}/var/lib/gpulet/vgpu"):
                    left.append(p)
    assert not left, f"nothing install placed is left in /usr/local/gpulet, /var/lib/gpulet, /var/run/cdi ({left})"
    agents = [os.path.relpath(os.path.join(root, name), fixed)
              for top in ("var/lib/gpulet/vgpu", "etc/kubernetes")
              for root, _, files in os.walk(fixed / top) for name in files
              if os.path.isfile(os.path.join(root, name)) and not os.path.islink(os.path.join(root, name))]
    h.note(f"left by the agent (not by install): {' '.join(agents)}")
    assert kube.get(f"/api/v1/namespaces/{NS}") is None, f"namespace {NS} gone"
    h.wait_until(30, "nvidia.com/gpu no longer allocatable", lambda: gone(kube))


# --- the shipped device-plugin settings on containerd 1.6 --------------------------------------------


def test_shipped_defaults_on_containerd_1_6(kube, run):
    """tests/cluster/deploy/defaults (the product's own settings, NVML from the host driver: the fake
    as the driver container's libnvidia-ml) on this cluster's containerd 1.6, whose default runtime
    is runc and whose CRI has no CDI: GPU pods would start without their GPUs, so the agent must
    keep the node tainted and say why (docs/install.md, "How a pod gets its GPUs")."""
    need_install(run)
    h.driver_nvml_is_the_fake(run.version)
    # A node gpulet has not validated yet (validation runs once per boot: forget this boot's).
    v.patch_node(kube, {"metadata": {"annotations": {"gpulet.io/validated-boot-id": None},
                                     "labels": {"gpulet.io/gpu-stack": None}}})
    run.defaults_applied = True
    rc, out = h.kubectl("apply", "-k", DEFAULTS)
    (WORK / "apply-defaults.log").write_text(out)
    assert rc == 0, f"kubectl apply -k tests/cluster/deploy/defaults on containerd 1.6 (rc {rc}): {h.tail(out)}"
    # The engine as the kubelet reports it: the verdict depends on it. Debian's containerd is 1.6;
    # a host whose containerd is 1.7 or newer (CDI in its CRI) rightly gets the node validated
    # instead.
    engine = (kube.node() or {}).get("status", {}).get("nodeInfo", {}).get("containerRuntimeVersion", "")
    h.figure(f"the node's engine: {engine}")
    log = WORK / "agent-defaults.log"

    def agent_log():
        a = v.agent_name(kube)
        if not a:
            return None
        rc, text = h.kubectl("-n", NS, "logs", a, "-c", "agent")
        log.write_text(text)
        return text if rc == 0 else None

    def said():
        text = agent_log()
        return bool(text) and re.search(
            r"GPU containers would start without their GPUs: containerd://v?1\.[0-6]\.", text) is not None

    def judged():
        text = agent_log()
        return bool(text) and re.search(
            "validated for boot .*delivery checked against " + re.escape(engine), text) is not None

    def postmortem():
        # What the agent judged, on what (its validation summary names the engine version).
        print("--- the defaults agent's log")
        print(h.tail_file(log, 10**6))
        print("--- the agent's config:")
        rc, text = h.kubectl("-n", NS, "exec", v.agent_name(kube), "-c", "agent", "--",
                             "cat", "/etc/gpulet/config.yaml")
        print("\n".join(text.splitlines()[:30]))

    if re.match(r"containerd://v?1\.[0-6]\.", engine):
        h.poll(120, said)
        ok = said()
        if not ok:
            postmortem()
        assert ok, "the agent says GPU containers would start without their GPUs " \
                   "(no CDI in containerd 1.6's CRI, runc the default)"
        assert v.tainted(kube), f"the node keeps the gpulet.io/gpu-stack-not-ready taint ({kube.taints()})"
    else:
        h.poll(120, judged)
        ok = judged()
        if not ok:
            postmortem()
        assert ok, f"on {engine} (CDI in its CRI) the agent validates the node, judging delivery by that version"
        assert v.validated(kube), \
            f"... and the node is labelled ready and untainted (label {kube.label('gpulet.io/gpu-stack')!r}, " \
            f"taints {kube.taints()})"


def test_defaults_deleted_config_as_before(kube, run):
    need_install(run)
    if not run.defaults_applied:
        pytest.skip("tests/cluster/deploy/defaults was not applied (the step before failed first)")
    rc, out = h.kubectl("delete", "-k", DEFAULTS, "--wait=true", "--timeout=90s")
    (WORK / "delete-defaults.log").write_text(out)
    assert rc == 0, f"kubectl delete -k tests/cluster/deploy/defaults (rc {rc}): {h.tail(out)}"
    assert (WORK / "config.before").read_bytes() == CONFIG.read_bytes(), \
        "containerd's config.toml is byte for byte as before, again"
