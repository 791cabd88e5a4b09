"""The helm chart (deploy/helm/gpulet) on the real one-node cluster, with helm 4 and helm 3
(testing/helm/get):
 - every values set of the matrix renders to manifests the real kube-apiserver accepts in a
   server-side dry run (the Prometheus Operator and cert-manager kinds come from stand-in CRDs that
   accept any spec: only their presence is checked for those);
 - with gpulet's real image (harness.gpulet_image, as cluster.install_uninstall builds it): helm
   install configures the cluster's containerd (gpulet's drop-in imported by config.toml); helm
   upgrade with a changed value rolls the DaemonSet and does NOT restore the configuration (the old
   pod's uninstall-on-delete container says so, containerd is not restarted, install's record is
   untouched); helm rollback rolls it back the same way; helm test runs a pod that gets one
   nvidia.com/gpu from the agent and sees its device node; helm uninstall (helm 4: --cascade
   foreground --wait, helm 3: the default background deletion) restores config.toml byte for byte
   through the uninstall-on-delete container, removes the drop-in and everything install placed,
   leaves the agent's own state (/var/lib/gpulet/vgpu) as docs/install.md says, and removes every
   object of the release.
What only this cluster needs is given as chart values (as tests/cluster/deploy does for the
kustomize tree): hostNetwork (only host-network pods start here), the API server at 127.0.0.1 (no
kube-proxy: env), the fake NVML (--simulate, its sim root), containerd restarted through
gpulet-test-restart-engine (no systemd), the metrics port off 9400, GPUs as device specs."""
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

import harness as h

CHART = h.SRC / "deploy/helm/gpulet"
NS = h.NS
W = h.D / "helm"
CONFIG = h.D / "fixed/etc/containerd/config.toml"
DROPIN = h.D / "fixed/etc/containerd/conf.d/99-gpulet.toml"
RECORD = h.D / "fixed/var/lib/gpulet/install.json"
AGENT = "app.kubernetes.io/name=gpulet-node"
HELMS = ("v4", "v3")
# Host directories the agent's hostPath volumes create (DirectoryOrCreate) that were not there
# before: removed at the end if still empty (the kubelet's own paths live in the mount namespace).
HOST_DIRS = ("/etc/crio", "/etc/docker", "/lib64", "/var/lib/gpulet",
             "/etc/kubernetes/node-feature-discovery/features.d", "/var/run/cdi",
             "/etc/nvidia-device-plugin")
# Stand-in CRDs (group, kind, plural): the kinds exist, any spec is accepted.
CRDS = (("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
        ("cert-manager.io", "Issuer", "issuers"),
        ("cert-manager.io", "Certificate", "certificates"))
# The server-side dry run's values matrix (the overlays' equivalents and the chart-only choices).
MATRIX = [f"-f {f}" for f in sorted((h.SRC / "tests/helm/equivalents").glob("*.yaml"))] + [
    "--set config.map.default=v1 --set config.map.t4=v1 --set config.default=default",
    "--set gfd.enabled=false --set exporter.enabled=false --set vgpu.enabled=false",
    "--set vgpu.gpus=all --set exporter.serviceMonitor.enabled=true --set exporter.prometheusRule.enabled=true",
    "--set nodeSelector.gpu=true --set imagePullSecrets={regcred} --set image.pullPolicy=Always --set runtime=docker",
]
# The chart's values for this cluster.
VALUES = [
    "--set", "image.registry=gpulet.test", "--set", "image.repository=gpulet-sim",
    "--set", "image.tag=cluster", "--set", "image.pullPolicy=Never", "--set", "hostNetwork=true",
    "--set", "exporter.port=19400", "--set", "vgpu.enabled=false",
    "--set", "compatWithCPUManager=true", "--set", "deviceListStrategy={envvar}",
    "--set-json", 'install.args=["--simulate=dgx-h100","--restart=/usr/bin/gpulet-test-restart-engine"]',
    "--set-json", 'uninstall.args=["--restart=/usr/bin/gpulet-test-restart-engine"]',
    "--set-json", 'agent.args=["--simulate=dgx-h100","--sim-root=/run/gpulet-test/sim"]',
    "--set-json", 'env=[{"name":"KUBERNETES_SERVICE_HOST","value":"127.0.0.1"},'
                  '{"name":"KUBERNETES_SERVICE_PORT","value":"6443"}]',
    "--set-json", 'extraVolumes=[{"name":"gpulet-test","hostPath":{"path":"/run/gpulet-test","type":"Directory"}}]',
    "--set-json", 'extraVolumeMounts=[{"name":"gpulet-test","mountPath":"/run/gpulet-test"}]',
    "--set", "test.image=gpulet.test/busybox:1",
    "--set-json", 'test.command=["sh","-c","set -- /dev/nvidia[0-9]*; echo GPU device nodes: $*; [ $# = 1 ] && [ -c $1 ]"]',
]
# What `kubectl get all,...` lists of a release in its namespace, and the cluster-wide kinds.
CLUSTER_KINDS = ("/apis/rbac.authorization.k8s.io/v1/clusterroles",
                 "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                 "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                 "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
                 "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings")
NS_KINDS = tuple(f"{g}/namespaces/{NS}/{k}" for g, k in (
    ("/api/v1", "pods"), ("/api/v1", "replicationcontrollers"), ("/api/v1", "services"),
    ("/apis/apps/v1", "daemonsets"), ("/apis/apps/v1", "deployments"),
    ("/apis/apps/v1", "replicasets"), ("/apis/apps/v1", "statefulsets"),
    ("/apis/autoscaling/v2", "horizontalpodautoscalers"), ("/apis/batch/v1", "jobs"),
    ("/apis/batch/v1", "cronjobs"), ("/api/v1", "configmaps"), ("/api/v1", "serviceaccounts"),
    ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    ("/apis/networking.k8s.io/v1", "networkpolicies")))


def helm(version, *args, timeout=300):
    return h.sh(h.BUILD / "helm" / version / "helm", *args, timeout=timeout,
                env={"KUBECONFIG": str(h.D / "admin.kubeconfig")})


def crd(group, kind, plural):
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object",
                                       "x-kubernetes-preserve-unknown-fields": True}}}]}}


def established(kube, name):
    obj = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in obj.get("status", {}).get("conditions", []) or [])


def create_or_keep(kube, obj):
    try:
        kube.create(obj)
    except ApiException as e:
        if e.status != 409:
            raise


def cleanup(kube, created):
    for v in HELMS:
        helm(v, "uninstall", "gpulet", "-n", NS, "--no-hooks")
    # Pods gone first: until then the kubelet recreates their DirectoryOrCreate host paths.
    try:
        kube.delete("v1", "Namespace", NS)
    except Exception as e:  # noqa: BLE001 - cleanup goes on
        print(f"cleanup: delete namespace {NS}: {e}")
    h.poll(120, lambda: kube.get(f"/api/v1/namespaces/{NS}") is None, interval=0.5)
    for group, _, plural in CRDS:
        try:
            kube.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", f"{plural}.{group}")
        except Exception as e:  # noqa: BLE001
            print(f"cleanup: delete CRD {plural}.{group}: {e}")
    h.kubectl("label", "node", h.NODE, "nvidia.com/gpu.present-", "gpulet.io/gpu-stack-")
    h.kubectl("taint", "node", h.NODE, "gpulet.io/gpu-stack-not-ready-")
    # A failed run may have left gpulet installed: undo it on the node as an admin would.
    if RECORD.exists():
        h.sh(h.GPULET, "uninstall", "--host-root", h.D / "fixed", "--restart=none")
    rc, out = h.sh(h.CLUSTER, "plugin", h.BUILD)
    if rc != 0:
        print(f"cleanup: cluster plugin: {h.tail(out, 5)}")
    # The kubelet may still be tearing the pods' volumes down: a second pass a few seconds later.
    for attempt in (1, 2):
        if attempt == 2:
            time.sleep(5)
        for d, top in created:
            d = Path(d)
            while True:
                try:
                    d.rmdir()
                except OSError:
                    break
                if str(d) == top:
                    break
                d = d.parent


@pytest.fixture(scope="module")
def helm_env(kube):
    """helm 4 and 3, gpulet's image in the cluster's containerd, the stand-in CRDs and the
    namespace (pod-security privileged); afterwards every trace of the releases is removed and the
    host-process plugin restarted."""
    if not shutil.which("podman"):
        pytest.skip("podman missing (the image is built with podman build)")
    if h.runtime() != "containerd":
        pytest.skip(f"the helm test runs on containerd 1.6 (this cluster: {h.runtime()})")
    rc, out = h.sh(h.SRC / "testing/helm/get", h.BUILD)
    assert rc == 0, f"testing/helm/get: {h.tail(out, 3)}"
    created = []  # (DIR, TOP): DIR is missing, TOP its highest missing ancestor (or DIR itself)
    for d in HOST_DIRS:
        if os.path.exists(d):
            continue
        top = d
        while not os.path.exists(os.path.dirname(top)):
            top = os.path.dirname(top)
        created.append((d, top))
    W.mkdir(parents=True, exist_ok=True)
    try:
        h.gpulet_image(W)
        for c in CRDS:
            create_or_keep(kube, crd(*c))
        names = [f"{p}.{g}" for g, _, p in CRDS]
        h.wait_until(60, f"the stand-in CRDs established ({' '.join(names)})",
                     lambda: all(established(kube, n) for n in names))
        create_or_keep(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        status, obj = kube.raw("PATCH", f"/api/v1/namespaces/{NS}",
                               {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}},
                               content_type="application/merge-patch+json")
        assert status == 200, f"namespace {NS} labelled pod-security privileged: HTTP {status}: {obj}"
        yield
    finally:
        cleanup(kube, created)


# helm 4's whole matrix, then helm 3's.
@pytest.mark.parametrize("values", MATRIX, ids=[re.sub(r".*/", "", m) if m.startswith("-f ") else
                                                re.sub(r"--set ", "", m).replace(" ", ",")
                                                for m in MATRIX])
@pytest.mark.parametrize("version", HELMS)
def test_every_values_set_passes_a_server_side_dry_run(kube, helm_env, version, values):
    rendered = W / "rendered.yaml"
    with open(rendered, "w") as f:
        p = subprocess.run([str(h.BUILD / "helm" / version / "helm"), "template", "gpulet", str(CHART),
                            "-n", NS, *values.split()], stdout=f, stderr=subprocess.PIPE, text=True,
                           timeout=300, env={**os.environ, "KUBECONFIG": str(h.D / "admin.kubeconfig")})
    rc, out = p.returncode, p.stderr
    if rc == 0:
        rc, out = h.kubectl("apply", "--dry-run=server", "-f", rendered)
    shown = [line for line in out.splitlines()
             if not re.search(r"unchanged|created|configured", line, re.I)][:5]
    assert rc == 0, f"helm {version}: server-side dry run accepts: {values}\n" + "\n".join(shown)


@pytest.fixture(scope="module")
def plugin_stopped(kube, helm_env):
    """The host-process plugin stopped (the chart's agent serves nvidia.com/gpu), the node labelled
    as having GPUs (restored by helm_env's cleanup)."""
    h.must(h.CLUSTER, "plugin", h.BUILD, "none")
    h.wait_until(30, "host-process plugin stopped: nvidia.com/gpu allocatable 0",
                 lambda: kube.allocatable("nvidia.com/gpu") == "0",
                 detail=lambda: f"allocatable {kube.allocatable('nvidia.com/gpu')!r}")
    rc, out = h.kubectl("label", "node", h.NODE, "nvidia.com/gpu.present=true", "--overwrite")
    assert rc == 0, f"kubectl label node {h.NODE} nvidia.com/gpu.present=true: {out}"
    kube.default_sa()


def restarts():
    try:
        return (h.D / "logs/engine-restarter.log").read_text().count("containerd restarted")
    except OSError:
        return 0


def agent_pods(kube):
    return kube.pods(NS, AGENT)


def rolled_to(kube, want):
    """The agent's pods: exactly one, not being deleted, whose install init container got runtime
    want, both containers ready."""
    pods = agent_pods(kube)
    if len(pods) != 1:
        return False
    p = pods[0]
    env = p["spec"].get("initContainers", [{}])[0].get("env", [{}])
    ready = [c.get("ready") for c in p["status"].get("containerStatuses", []) or []]
    return (not p["metadata"].get("deletionTimestamp") and env and env[0].get("value") == want
            and ready == [True, True])


def diag():
    """After a failed wait: where the agent's pods stand."""
    pods = h.kubectl("-n", NS, "get", "pods", "-o", "wide")[1].splitlines()[:5]
    events = h.kubectl("-n", NS, "get", "events", "--sort-by=.lastTimestamp")[1].splitlines()[-6:]
    return "\n".join(pods + events)


def generation(kube):
    return (kube.get(f"/apis/apps/v1/namespaces/{NS}/daemonsets/gpulet-node") or {}).get(
        "metadata", {}).get("generation")


class Follow:
    """Streams the current agent pod's uninstall-on-delete log into a file until that container
    ends (kubectl logs -f)."""

    def __init__(self, kube, path):
        self.path = path
        name = agent_pods(kube)[0]["metadata"]["name"]
        self.out = open(path, "w")
        self.p = subprocess.Popen([str(h.K / "kubectl"), "--kubeconfig", str(h.D / "admin.kubeconfig"),
                                   "-n", NS, "logs", "-f", name, "-c", "uninstall-on-delete"],
                                  stdout=self.out, stderr=subprocess.STDOUT)

    def done(self, seconds=60):
        """Waits for the container's end; the log's text ('' and a note when it did not end)."""
        try:
            self.p.wait(timeout=seconds)
            ended = ""
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            ended = f" (kubectl logs -f had not ended after {seconds} s)"
        self.out.close()
        return self.path.read_text(errors="replace"), ended


@pytest.mark.parametrize("version", HELMS)
def test_install_upgrade_rollback_test_uninstall(kube, plugin_stopped, version):
    v = version

    def gpus(n):
        return kube.allocatable("nvidia.com/gpu") == str(n)

    shutil.copyfile(CONFIG, W / "config.before")
    r0 = restarts()
    t0 = h.now()
    rc, out = helm(v, "install", "gpulet", CHART, "-n", NS, *VALUES)
    assert rc == 0, f"helm {v} install: {h.tail(out, 5)}"
    h.wait_until(120, f"helm {v} install: the agent pod runs, agent and uninstall-on-delete ready",
                 lambda: rolled_to(kube, "auto"), detail=diag)
    h.wait_until(60, f"helm {v} install: the agent registered nvidia.com/gpu 8", lambda: gpus(8),
                 detail=lambda: f"allocatable {kube.allocatable('nvidia.com/gpu')!r}")
    h.figure(f"helm {v} install -> nvidia.com/gpu allocatable: {h.elapsed(t0)} s")
    assert "/etc/containerd/conf.d/99-gpulet.toml" in CONFIG.read_text(), \
        f"helm {v} install: config.toml imports gpulet's drop-in"
    assert "/usr/local/gpulet/bin/gpulet-container-runtime" in DROPIN.read_text(), \
        f"helm {v} install: the drop-in names gpulet's runtime"
    assert restarts() == r0 + 1, f"helm {v} install: containerd restarted once ({r0} -> {restarts()})"

    for step in ("upgrade", "rollback"):
        shutil.copyfile(CONFIG, W / "config.installed")
        shutil.copyfile(RECORD, W / "record.installed")
        r1 = restarts()
        gen = generation(kube)
        follow = Follow(kube, W / f"{v}-{step}.log")
        if step == "upgrade":
            want = "containerd"
            rc, out = helm(v, "upgrade", "gpulet", CHART, "-n", NS, *VALUES, "--set", "runtime=containerd")
        else:
            want = "auto"
            rc, out = helm(v, "rollback", "gpulet", "1", "-n", NS)
        assert rc == 0, f"helm {v} {step} (runtime {want}): {h.tail(out, 5)}"
        h.wait_until(120, f"helm {v} {step}: the DaemonSet rolled, its new pod has runtime {want}",
                     lambda: rolled_to(kube, want),
                     detail=lambda: f"generation {gen} -> {generation(kube)}\n{diag()}")
        log, ended = follow.done()
        kept = next((line for line in log.splitlines() if "kept" in line), "")
        assert f"kept the engine configuration: DaemonSet {NS}/gpulet-node stays" in log, \
            f"helm {v} {step}: the old pod's uninstall-on-delete kept the configuration ({kept}){ended}"
        assert (W / "config.installed").read_bytes() == CONFIG.read_bytes() and DROPIN.is_file(), \
            f"helm {v} {step}: config.toml unchanged, the drop-in in place"
        assert (W / "record.installed").read_bytes() == RECORD.read_bytes(), \
            f"helm {v} {step}: install's record untouched (not uninstalled and installed again)"
        assert restarts() == r1, f"helm {v} {step}: containerd not restarted ({r1} -> {restarts()})"

    stack = h.poll(60, lambda: kube.label("gpulet.io/gpu-stack") == "ready")
    rc, out = helm(v, "test", "gpulet", "-n", NS, "--logs")
    shown = [line for line in out.splitlines() if re.search(r"GPU device nodes|Phase|Error", line)][:4]
    print("\n".join(shown))
    assert rc == 0, (f"helm {v} test: the test pod got one GPU and saw its device node\n"
                     + h.tail(out, 8) + "\n" + kube.describe("gpulet-test-gpu", NS, 8)
                     + ("" if stack is True else
                        f"\n(the Node's gpulet.io/gpu-stack: {kube.label('gpulet.io/gpu-stack')!r})"))

    r2 = restarts()
    follow = Follow(kube, W / f"{v}-uninstall.log")
    t0 = h.now()
    how = ["--cascade", "foreground", "--wait", "--timeout", "2m"] if v == "v4" else ["--wait"]
    rc, out = helm(v, "uninstall", "gpulet", "-n", NS, *how)
    assert rc == 0, f"helm {v} uninstall {' '.join(how)}: {h.tail(out, 5)}"
    if v == "v4":
        h.figure("helm v4 uninstall --cascade foreground --wait (returns once the node is restored):"
                 f" {h.elapsed(t0)} s")
    # helm 3's background deletion returns before the garbage collector has deleted the pods.
    h.wait_until(90, f"helm {v} uninstall: the agent pod is gone", lambda: not agent_pods(kube),
                 detail=diag)
    log, ended = follow.done()
    print("\n".join([f"    {line}" for line in log.splitlines() if line.strip()][:12]))
    assert re.search(rf"DaemonSet {NS}/gpulet-node (was deleted|is being deleted|is gone): uninstalling", log), \
        f"helm {v} uninstall: uninstall-on-delete saw the DaemonSet deleted and uninstalled{ended}"
    assert (W / "config.before").read_bytes() == CONFIG.read_bytes(), \
        f"helm {v} uninstall: containerd's config.toml is byte for byte as before the install"
    assert not DROPIN.exists(), f"helm {v} uninstall: gpulet's drop-in removed"
    assert restarts() == r2 + 1, f"helm {v} uninstall: containerd restarted once ({r2} -> {restarts()})"
    # What install placed is gone; the agent's own state stays (docs/install.md, "Uninstall").
    fixed = h.D / "fixed"
    vgpu = str(fixed / "var/lib/gpulet/vgpu")
    left = [str(p) for top in ("usr/local/gpulet", "var/lib/gpulet", "var/run/cdi")
            for p in (fixed / top).rglob("*") if not str(p).startswith(vgpu)]
    assert not left, (f"helm {v} uninstall: nothing install placed is left in /usr/local/gpulet,"
                      f" /var/lib/gpulet, /var/run/cdi ({' '.join(left)})")
    agent_state = sorted(str(p.relative_to(fixed)) for p in (fixed / "var/lib/gpulet/vgpu").rglob("*")
                         if p.is_file())
    h.note(f"left by the agent (not by install): {' '.join(agent_state)}")
    left = [f"{path.rsplit('/', 1)[1]}/{o['metadata']['name']}"
            for path in CLUSTER_KINDS + NS_KINDS for o in (kube.get(path) or {}).get("items", [])
            if "gpulet" in o["metadata"]["name"]]
    left = [x for x in left if x not in ("configmaps/kube-root-ca.crt", "pods/gpulet-test-gpu")]
    assert not left, f"helm {v} uninstall: nothing of the release is left ({' '.join(left)})"
    kube.clean_pods("gpulet-test-gpu", ns=NS)
    if h.poll(30, lambda: gpus(0)) is not True:
        h.note(f"nvidia.com/gpu allocatable {kube.allocatable('nvidia.com/gpu')!r} 30 s after"
               " the uninstall (0 expected before the next release)")
