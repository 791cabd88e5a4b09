"""What the real-cluster scenarios (tests/cluster/test_*.py) share: the cluster's paths, the API
through the official Kubernetes Python client, pods from templates, waits that say what they waited
for, commands on the node, gpulet's image, and the leftover checks.

tests/cluster/run sets GPULET_SRC and GPULET_BUILD. One cluster (testing/k8s/cluster, in
$BUILD/cluster) serves the scenarios: ctest's cluster.up starts it unless `make cluster` left one
running, cluster.down stops the one cluster.up started. A few scenarios need a cluster of their own
(own_cluster).
"""
import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import urllib3
from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes import dynamic
from kubernetes.client.rest import ApiException

SRC = Path(os.environ["GPULET_SRC"])
BUILD = Path(os.environ["GPULET_BUILD"])
CLUSTER = SRC / "testing/k8s/cluster"
D = BUILD / "cluster"
K = BUILD / "k8s/bin"
# The gpulet the cluster runs (as testing/k8s/cluster picks it).
GPULET = Path(os.environ.get("GPULET", BUILD / "bin/gpulet"))
# Written by cluster.up when it started the cluster (cluster.down then stops it): outside D, which
# `cluster down` removes.
STATE = BUILD / "cluster-test"
NODE = "gpulet-node"
NS = "gpulet-system"
API_PORT = int(os.environ.get("GPULET_CLUSTER_API_PORT", "6443"))
BUSYBOX = "gpulet.test/busybox:1"
# gpulet's image for pods on this cluster, as an admin builds it, plus the test layer (gpulet_image).
GPULET_IMG = "gpulet.test/gpulet:cluster"
SIM_IMG = "gpulet.test/gpulet-sim:cluster"

urllib3.disable_warnings()


def figure(text):
    """A measured figure, printed as the bash suite printed them (ctest's log keeps it)."""
    print(f"figure: {text}", flush=True)


def note(text):
    print(f"note: {text}", flush=True)


def now():
    return time.monotonic()


def elapsed(t0, t1=None):
    return f"{(t1 if t1 is not None else now()) - t0:.2f}"


# --- waits -----------------------------------------------------------------------------------------


def poll(seconds, fn, interval=0.1):
    """fn() until it returns something true or `seconds` pass; returns its last value (an
    exception raised by fn counts as false and is returned as the last value)."""
    end = now() + seconds
    while True:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001 - a failed read is "not yet"
            last = e
        if last and not isinstance(last, Exception):
            return last
        if now() > end:
            return last
        time.sleep(interval)


def wait_until(seconds, what, fn, interval=0.1, detail=None):
    """Like poll, but a timeout fails the test with what it waited for, fn's last value and, if
    given, detail() (a post-mortem: a pod's events, a log's last lines)."""
    last = poll(seconds, fn, interval)
    if last and not isinstance(last, Exception):
        return last
    msg = f"waited {seconds} s for {what}; last: {last!r}"
    if detail is not None:
        try:
            msg += "\n" + str(detail())
        except Exception as e:  # noqa: BLE001
            msg += f"\n(post-mortem failed: {e})"
    raise AssertionError(msg)


# --- commands --------------------------------------------------------------------------------------


def sh(*cmd, input=None, timeout=300, env=None, cwd=None):
    """Runs cmd; returns (rc, stdout and stderr together). A missing program is rc 127."""
    full_env = None if env is None else {**os.environ, **env}
    try:
        p = subprocess.run([str(c) for c in cmd], input=input, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout, env=full_env,
                           cwd=cwd)
    except FileNotFoundError as e:
        return 127, str(e)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(timed out after {timeout} s)"
    return p.returncode, p.stdout


def must(*cmd, **kw):
    """sh, failing the test with the command's output when it exits non-zero."""
    rc, out = sh(*cmd, **kw)
    assert rc == 0, f"{' '.join(str(c) for c in cmd)} exited {rc}:\n{tail(out)}"
    return out


def tail(text, n=15):
    return "\n".join((text or "").rstrip("\n").split("\n")[-n:])


def tail_file(path, n=5):
    try:
        return tail(Path(path).read_text(errors="replace"), n)
    except OSError as e:
        return f"({path}: {e})"


def kubectl(*args, input=None, kubeconfig=None, timeout=300):
    """kubectl as the cluster admin (or with another kubeconfig): (rc, output). For what the API
    client does not do as a user would (apply -k, exec, logs, describe)."""
    return sh(K / "kubectl", "--kubeconfig", kubeconfig or D / "admin.kubeconfig", *args,
              input=input, timeout=timeout)


def holder_pid():
    """The process that holds the cluster's mount namespace."""
    return (D / "pids/holder").read_text().strip()


def on_node(*cmd, **kw):
    """cmd in the cluster's mount namespace, the node as the kubelet and containerd see it (the
    tmpfs mounts of vGPU grants are there, not on this host's D/fixed)."""
    return sh("nsenter", "-t", holder_pid(), "-m", "--", *cmd, **kw)


def ctr_k8s(*args, containerd2=False, **kw):
    """containerd's ctr in the k8s.io namespace, in the node's mount namespace; containerd 2's own
    ctr on its clusters."""
    env = ["env", f"PATH={BUILD / 'k8s/containerd2/bin'}:{os.environ['PATH']}"] if containerd2 else []
    return on_node(*env, "ctr", "--address", D / "containerd/containerd.sock", "-n", "k8s.io",
                   *args, **kw)


def restart_plugin(*args):
    """The device plugin again, on a GPU profile with arguments (`cluster plugin`)."""
    must(CLUSTER, "plugin", BUILD, *args)


def runtime():
    """The container engine the running cluster was started with."""
    try:
        return (D / "runtime").read_text().strip()
    except OSError:
        return ""


# --- the API ---------------------------------------------------------------------------------------


class Kube:
    """The cluster's API as the admin (or another kubeconfig's user), through the official client.
    Objects are plain dicts of the API's JSON (camelCase, as kubectl's jsonpath sees them)."""

    def __init__(self, kubeconfig=None):
        self.kubeconfig = Path(kubeconfig or D / "admin.kubeconfig")
        self.api = kconfig.new_client_from_config(config_file=str(self.kubeconfig))
        self.core = kclient.CoreV1Api(self.api)
        self._dyn = None

    @property
    def dyn(self):
        if self._dyn is None:
            self._dyn = dynamic.DynamicClient(self.api)
        return self._dyn

    def resource(self, api_version, kind):
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def raw(self, method, path, body=None, content_type="application/json", query=None):
        """One request to the API server: (HTTP status, decoded JSON body or text)."""
        try:
            r = self.api.call_api(path, method, query_params=query or [], body=body,
                                  header_params={"Content-Type": content_type,
                                                 "Accept": "application/json"},
                                  auth_settings=["BearerToken"], _preload_content=False,
                                  _return_http_data_only=False)
            status, data = r[1], r[0].data
        except ApiException as e:
            status, data = e.status, e.body
        try:
            return status, json.loads(data)
        except (TypeError, ValueError):
            return status, data.decode(errors="replace") if isinstance(data, bytes) else data

    def get(self, path):
        """GET path: the object, or None when it is not there (404)."""
        status, obj = self.raw("GET", path)
        if status == 404:
            return None
        assert status == 200, f"GET {path}: HTTP {status}: {obj}"
        return obj

    def ready(self):
        status, _ = self.raw("GET", "/readyz")
        return status == 200

    # Nodes and pods, the scenarios' daily bread.
    def node(self, name=NODE):
        return self.get(f"/api/v1/nodes/{name}")

    def allocatable(self, resource, node=NODE):
        """The Node's allocatable count of resource ("" when absent, as kubectl's jsonpath)."""
        return ((self.node(node) or {}).get("status", {}).get("allocatable", {})).get(resource, "")

    def capacity(self, resource, node=NODE):
        return ((self.node(node) or {}).get("status", {}).get("capacity", {})).get(resource, "")

    def label(self, key, node=NODE):
        return ((self.node(node) or {}).get("metadata", {}).get("labels", {})).get(key, "")

    def taints(self, node=NODE):
        return [t["key"] for t in (self.node(node) or {}).get("spec", {}).get("taints", []) or []]

    def pod(self, name, ns="default"):
        return self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def pods(self, ns="default", selector=None):
        q = f"?labelSelector={selector}" if selector else ""
        return self.get(f"/api/v1/namespaces/{ns}/pods{q}")["items"]

    def phase(self, name, ns="default"):
        return ((self.pod(name, ns) or {}).get("status", {})).get("phase", "")

    def running(self, name, ns="default"):
        return self.phase(name, ns) == "Running"

    def condition(self, name, ctype, field="reason", ns="default"):
        """A pod condition's field (reason, message, status), "" when absent."""
        for c in ((self.pod(name, ns) or {}).get("status", {})).get("conditions", []) or []:
            if c.get("type") == ctype:
                return c.get(field, "")
        return ""

    def unschedulable(self, name, ns="default"):
        return self.condition(name, "PodScheduled", ns=ns) == "Unschedulable"

    def create(self, obj):
        """Creates obj (a dict) through the dynamic client; the created object."""
        r = self.resource(obj["apiVersion"], obj["kind"])
        ns = obj.get("metadata", {}).get("namespace")
        return r.create(body=obj, namespace=ns).to_dict()

    def delete(self, api_version, kind, name, ns=None, grace=None):
        """Deletes an object; absent is fine."""
        body = {"gracePeriodSeconds": grace} if grace is not None else None
        try:
            self.resource(api_version, kind).delete(name=name, namespace=ns, body=body)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_pods(self, *names, ns="default"):
        """Deletes the pods at once (grace 0) without waiting."""
        for n in names:
            try:
                self.core.delete_namespaced_pod(n, ns, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise

    def clean_pods(self, *names, ns="default", timeout=60):
        """Before a scenario re-creates a pod of the same name: gone for good, not merely
        terminating."""
        self.delete_pods(*names, ns=ns)
        wait_until(timeout, f"pods {' '.join(names)} gone",
                   lambda: all(self.pod(n, ns) is None for n in names))

    def default_sa(self, ns="default"):
        """Pods need the namespace's default ServiceAccount (made by the controller-manager)."""
        wait_until(30, f"the default ServiceAccount in {ns}",
                   lambda: self.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"))

    def exec(self, pod, script, ns="default", container=None):
        """sh -c script in the pod's container, as `kubectl exec` does: (rc, output)."""
        c = ["-c", container] if container else []
        return kubectl("exec", "-n", ns, pod, *c, "--", "sh", "-c", script)

    def describe(self, pod, ns="default", lines=15):
        return tail(kubectl("describe", "pod", "-n", ns, pod)[1], lines)

    def logs(self, pod, ns="default", container=None, previous=False):
        args = ["logs", "-n", ns, pod] + (["-c", container] if container else [])
        return kubectl(*args, *(["--previous"] if previous else []))[1]

    def wait_running(self, name, seconds=60, ns="default"):
        """Waits for the pod to run; on a timeout the failure carries its description."""
        wait_until(seconds, f"pod {ns}/{name} Running", lambda: self.running(name, ns),
                   detail=lambda: self.describe(name, ns))


# --- templates -------------------------------------------------------------------------------------


def pod(name, limits=None, ns="default", image=BUSYBOX, command=("sleep", "3600"), **spec):
    """A hostNetwork busybox pod asking for limits (a dict of resource: quantity); spec's entries
    are added to (or replace) the pod's spec."""
    container = {"name": "main", "image": image, "imagePullPolicy": "Never",
                 "command": list(command)}
    if limits:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    body = {"hostNetwork": True, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
            "containers": [container]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": body}


def vgpu_pod(name, cores, memory_units, **kw):
    """A pod asking for a fraction of a GPU the TKE GPU Manager way."""
    return pod(name, {"tencent.com/vcuda-core": cores, "tencent.com/vcuda-memory": memory_units}, **kw)


def claim_pod(name, claim_source, ns="default", **kw):
    """A pod whose container uses one ResourceClaim, `gpu`, from claim_source:
    {"resourceClaimTemplateName": X} or {"resourceClaimName": Y}."""
    p = pod(name, ns=ns, resourceClaims=[{"name": "gpu", **claim_source}], **kw)
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return p


# --- gpulet's image --------------------------------------------------------------------------------


def node_ctr(node, *args):
    """ctr -n k8s.io ARGS on node's containerd (`testing/k8s/cluster ctr`): (rc, output)."""
    return sh(CLUSTER, "ctr", BUILD, "-n", "k8s.io", *args, env={"GPULET_CLUSTER_NODE": node})


def gpulet_image(work, containerd2=False, nodes=()):
    """gpulet's image for pods on this cluster, as an admin builds it (`make image`'s steps:
    deploy/image/stage-rootfs.sh, podman build of Containerfile), plus the test layer
    Containerfile.sim (the fake NVML, the engine restart helper), saved as an OCI archive and
    imported into the cluster's containerd as SIM_IMG, and into each of the other nodes' (names in
    nodes). Once per cluster: a later scenario finds it there."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    if SIM_IMG in ctr_k8s("images", "ls", "-q", containerd2=containerd2)[1]:
        note(f"{SIM_IMG} already in the cluster's containerd")
        return
    t0 = now()
    must(SRC / "deploy/image/stage-rootfs.sh", BUILD, work)
    must("podman", "build", "-q", "-f", SRC / "Containerfile", "-t", GPULET_IMG, work)
    # The test layer: the fake NVML at <gpulet's dir>/../lib/fake and the libraries it loads that
    # the image lacks (copied at the paths ldd resolves, as stage-rootfs.sh does), the restart
    # helper.
    sim = work / "sim/rootfs"
    (sim / "usr/lib/fake").mkdir(parents=True, exist_ok=True)
    (sim / "usr/bin").mkdir(parents=True, exist_ok=True)
    fake = BUILD / "lib/fake/libnvidia-ml.so.1"
    must("cp", fake, sim / "usr/lib/fake/")
    for line in must("ldd", fake).splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) > 2 and parts[2].startswith("/"):
            lib = parts[2]
            if not (work / ("rootfs" + lib)).exists():
                (sim / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                must("cp", "-L", lib, sim / lib.lstrip("/"))
    must("install", "-m", "0755", SRC / "tests/cluster/deploy/restart-engine.sh",
         sim / "usr/bin/gpulet-test-restart-engine")
    must("podman", "build", "-q", "-f", SRC / "tests/cluster/deploy/Containerfile.sim",
         "--build-arg", f"BASE={GPULET_IMG}", "-t", SIM_IMG, work / "sim")
    must("podman", "save", "--format", "oci-archive", "-o", work / "gpulet.tar", SIM_IMG)
    sh("podman", "rmi", "-f", SIM_IMG, GPULET_IMG)
    rc, out = ctr_k8s("images", "import", work / "gpulet.tar", containerd2=containerd2)
    assert rc == 0, f"image import into the cluster's containerd: {tail(out)}"
    listed = ctr_k8s("images", "ls", "-q", containerd2=containerd2)[1]
    assert SIM_IMG in listed, f"containerd lists {SIM_IMG}: {listed}"
    for node in nodes:
        if node != NODE:
            rc, out = node_ctr(node, "images", "import", work / "gpulet.tar")
            assert rc == 0, f"image import into {node}'s containerd: {tail(out)}"
    figure(f"make image steps + test layer + import: {elapsed(t0)} s")


# --- a stand-in NVIDIA driver container ------------------------------------------------------------


def driver_version():
    """The fake dgx-h100's driver version."""
    return json.loads(must(GPULET, "info", "--simulate", "dgx-h100", "--json"))["driverVersion"]


def driver_container_root(log):
    """A stand-in NVIDIA driver container's root at /run/nvidia/driver in the cluster's namespace
    (D/fixed/run/nvidia/driver, tests/compat/make-driver-root), for the fake dgx-h100's driver
    version, as GPU Operator hosts have one (the host here has no NVIDIA driver of its own, so
    install uses it). Returns the version."""
    version = driver_version()
    rc, out = sh(SRC / "tests/compat/make-driver-root", D / "fixed/run/nvidia/driver", version, "8")
    Path(log).write_text(out)
    assert rc == 0, f"make-driver-root: {tail(out, 5)}"
    return version


def driver_nvml_is_the_fake(version):
    """That driver's libnvidia-ml becomes the fake NVML (for tests/cluster/deploy/host-nvml, where
    nothing passes --simulate and install and the agent must find and load the host's NVML as on a
    real node)."""
    root = D / "fixed/run/nvidia/driver"
    must("cp", BUILD / "lib/fake/libnvidia-ml.so.1",
         root / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}")
    must("ldconfig", "-r", root)


def driver_in_pod(kube, pod_name, version):
    """The pod's container has the driver's libcuda mounted and listed in its ld cache (the hook's
    ldconfig)."""
    rc, _ = kube.exec(pod_name, f"test -s /usr/lib/x86_64-linux-gnu/libcuda.so.{version} && "
                                "grep -q libcuda.so.1 /etc/ld.so.cache")
    return rc == 0


# --- leftovers -------------------------------------------------------------------------------------


def links():
    return sorted(line.split(": ")[1] for line in must("ip", "-o", "link").splitlines()
                  if ": " in line)


def kube_rules():
    rules = []
    for prog in ("iptables-save", "ip6tables-save"):
        rc, out = sh(prog)
        if rc == 0:
            # The kubelet's KUBE-* chains, and the cluster's own rules for the kubernetes Service
            # (testing/k8s/cluster SERVICE_RULE_TAG).
            rules += [line for line in out.splitlines() if "KUBE-" in line or "gpulet test cluster" in line]
    return sorted(rules)


def check_idle_agent(state, seconds, cap, what):
    """What the node agent asks of the API server while nothing changes (issue 30.5): a window of
    seconds of the audit log, counted per verb and resource by idle_requests.py (kept in state,
    its figure printed); fails, naming what idles, if any is asked for more than cap times a
    minute."""
    audit = D / "logs/audit.log"
    start = len(audit.read_text(errors="replace").splitlines())
    time.sleep(seconds)
    window = audit.read_text(errors="replace").splitlines(keepends=True)[start:]
    (state / "idle-audit.log").write_text("".join(window))
    rc, report = sh("/usr/bin/python3", SRC / "tests/cluster/idle_requests.py",
                    state / "idle-audit.log", str(seconds), str(cap))
    (state / "idle.txt").write_text(report)
    print(report, end="")
    lines = report.splitlines()
    assert rc == 0 and any(line.startswith("figure: idle agent") for line in lines), \
        f"idle_requests.py (rc {rc}):\n{report}"
    assert not any(line.startswith("OVER") for line in lines), \
        f"{what} asks for nothing more than {cap:g} times a minute:\n{report}"


def record_host(state=STATE):
    """What leftovers() compares with: the host's network devices and KUBE-* rules now."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "host.before.json").write_text(json.dumps({"links": links(), "rules": kube_rules()}))


def cluster_processes():
    """The pids whose command line names the cluster directory (the same binaries may run
    elsewhere: tests/scale's harness)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            args = p.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"{D}/" in args:
            found.append(p.name)
    return found


def holder_pids():
    """Every node's mount namespace holder (gpulet-node's first)."""
    return [p.read_text().strip() for p in sorted((D / "pids").glob("holder*"))]


def leftovers(what, holder=None, state=STATE):
    """After a stop, what of the cluster is left on the host (compared with record_host's
    record): one line a problem, [] when nothing is. holder: a namespace holder's pid, or a list
    of them (one a node)."""
    problems = []
    for pid in ([holder] if isinstance(holder, str) else holder or []):
        if Path(f"/proc/{pid}").exists():
            problems.append(f"{what}: the mount namespace holder ({pid}) is still there")
    left = cluster_processes()
    if left:
        problems.append(f"{what}: cluster processes left: {' '.join(left)}")
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if f" {D}/" in line or " /var/lib/kubelet" in line or " /var/log/pods" in line]
    if mounts:
        problems.append(f"{what}: mounts left under {D} or /var/lib/kubelet: {mounts[:3]}")
    before = json.loads((state / "host.before.json").read_text())
    if links() != before["links"]:
        problems.append(f"{what}: network devices {links()}, before {before['links']}")
    # The pod network (testing/k8s/cluster pod_network_up): its bridge, and libcni's cache, which
    # the mount namespace keeps off the host's /var/lib/cni.
    if sh("ip", "link", "show", "gpulet-cni0")[0] == 0:
        problems.append(f"{what}: the pod network's bridge gpulet-cni0 is still there")
    if sh("grep", "-rqs", "gpulet-pods", "/var/lib/cni")[0] == 0:
        problems.append(f"{what}: the pod network left state in the host's /var/lib/cni")
    if kube_rules() != before["rules"]:
        problems.append(f"{what}: KUBE-* or the cluster's own iptables rules differ from before")
    # The kubelets' pod cgroups, and the cgroup roots of the nodes after the first (gpulet-node-<i>).
    cg = Path("/sys/fs/cgroup")
    cgroups = [str(p) for pattern in ("*/kubepods", "kubepods", "*/gpulet-node-*", "gpulet-node-*")
               for p in cg.glob(pattern)]
    if cgroups:
        problems.append(f"{what}: kubepods cgroups left: {cgroups}")
    if D.exists():
        problems.append(f"{what}: {D} not removed")
    return problems


def cluster_running():
    """A cluster answers in D (the one `make cluster` or cluster.up left)."""
    if not (D / "admin.kubeconfig").exists():
        return False
    try:
        return Kube().ready()
    except Exception:  # noqa: BLE001 - a kubeconfig of a stopped cluster
        return False


class OwnCluster:
    """A cluster of the scenario's own: its Kube, the namespace holder's pid, and down(), which stops
    it once (deleting the overlay first while one is set) so that the scenario's last test can check
    its exit status and what it left; own_cluster's exit stops it when no test did."""

    def __init__(self, state, kube, overlay):
        self.state, self.kube, self.overlay = state, kube, overlay
        self.holder = holder_pids()
        self.stopped = None

    def down(self):
        if self.stopped is None:
            if self.overlay:
                kubectl("delete", "-k", self.overlay, "--ignore-not-found", "--wait=true",
                        "--timeout=60s")
            self.stopped = sh(CLUSTER, "down", BUILD, timeout=300)
        return self.stopped

    def down_problems(self, what):
        """Stops the cluster; what is wrong after it (`cluster down` failed, or something of the
        cluster is left on the host, compared with what was recorded before it started)."""
        rc, out = self.down()
        problems = [] if rc == 0 else [f"cluster down: {tail(out)}"]
        return problems + leftovers(what, self.holder, state=self.state)

    def down_leaves_nothing(self, what):
        problems = self.down_problems(what)
        assert not problems, "\n".join(problems)
        shutil.rmtree(self.state, ignore_errors=True)


@contextlib.contextmanager
def own_cluster(state, env=None, overlay=None, image=False):
    """A containerd 2 cluster of the scenario's own (the shared one runs containerd 1.6; the kubelet
    passes CDI device IDs through CRI only on containerd 2), started with env (feature gates):
    skips while another cluster runs (and, for image, without podman); records in state (not the
    shared cluster's STATE) what leftovers() compares with; with image, imports gpulet's image
    through containerd 2's own ctr. Yields an OwnCluster; on exit stops the cluster unless a test
    did."""
    if image and not shutil.which("podman"):
        pytest.skip("podman missing (the image is built with podman build)")
    if cluster_running():
        pytest.skip(f"a cluster is running in {D} (make cluster-down first; this test needs its own)")
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    record_host(state)
    rc, out = sh(CLUSTER, "up", BUILD, env={"GPULET_CLUSTER_RUNTIME": "containerd2", **(env or {})},
                 timeout=600)
    cluster = None
    try:
        assert rc == 0, f"cluster up (containerd2): {tail(out)}"
        kube = Kube()
        cluster = OwnCluster(state, kube, overlay)
        kube.default_sa()
        if image:
            gpulet_image(state, containerd2=True)
        yield cluster
    finally:
        if cluster is not None:
            cluster.down()
        else:
            sh(CLUSTER, "down", BUILD, timeout=300)
