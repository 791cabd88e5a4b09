"""The same pods on another container runtime, a cluster of its own (after cluster.down); the runtime
comes from GPULET_TEST_RUNTIME_VARIANT (ctest's cluster.runtime_<variant> sets it):
- containerd2: containerd v2.2.9 (testing/k8s/build; CDI on in its CRI). gpulet's device plugin
  answers with CDI device names (deviceListStrategy envvar,cdi-cri, no device specs) and containerd
  resolves them through the spec `gpulet cdi generate --driver-root` wrote for the fake driver root.
  The Node reports containerd 2.2.9.
- containerd-shim: Debian's containerd 1.6 with gpulet-container-runtime as its default runtime,
  configured by `gpulet runtime configure --runtime containerd` on the cluster's config file. The
  plugin passes only NVIDIA_VISIBLE_DEVICES (envvar, no device specs); the shim adds the nodes.
- containerd-shim-cdi: the same engine and shim, the plugin's cdi-annotations strategy: CRI
  container annotations cdi.k8s.io/*, which containerd 1.6 (no CDI in its CRI) copies into the OCI
  spec only because the drop-in lists them in container_annotations; the shim is told to trust
  nothing else (no NVIDIA_VISIBLE_DEVICES from unprivileged containers), so the 2 device nodes are
  the annotations' doing.
In each, test_gpu_pods.py's checks pass (the 2-GPU pod sees exactly its 2 device nodes, which only
the runtime's handling can have made) and down leaves nothing.

A cluster already running on the same runtime (make cluster with GPULET_CLUSTER_RUNTIME) is used and
left running; one on another runtime makes the scenario skip. The tests run in this file's order:
the last stops the cluster this module started (and it is stopped in any case after the module)."""
import os
import shutil

import pytest

import harness as h

RUNTIME = os.environ.get("GPULET_TEST_RUNTIME_VARIANT", "")
VARIANTS = ("containerd2", "containerd-shim", "containerd-shim-cdi")
# Its own record of the host before the start (cluster-test is the shared cluster's).
STATE = h.BUILD / f"cluster-test-{RUNTIME}"
DROPIN = h.D / "fixed/etc/containerd/conf.d/99-gpulet.toml"


@pytest.fixture(scope="module")
def variant():
    """The cluster on RUNTIME: {"started": whether this module started it}."""
    if not RUNTIME:
        pytest.skip("GPULET_TEST_RUNTIME_VARIANT is not set (ctest's cluster.runtime_<variant> sets"
                    f" it to one of {', '.join(VARIANTS)})")
    if RUNTIME not in VARIANTS:
        pytest.fail(f"GPULET_TEST_RUNTIME_VARIANT={RUNTIME}: not one of {', '.join(VARIANTS)}",
                    pytrace=False)
    state = {"started": False}
    if h.cluster_running():
        if h.runtime() != RUNTIME:
            pytest.skip(f"a cluster on {h.runtime()} is running in {h.D} (make cluster-down first)")
        print(f"using the running {RUNTIME} cluster in {h.D}")
        yield state
        return
    rc, why = h.sh(h.CLUSTER, "preflight", h.BUILD)
    if rc != 0:
        pytest.skip(why.strip())
    shutil.rmtree(STATE, ignore_errors=True)
    h.record_host(STATE)
    rc, out = h.sh(h.CLUSTER, "up", h.BUILD, env={"GPULET_CLUSTER_RUNTIME": RUNTIME}, timeout=600)
    state["started"] = True
    try:
        assert rc == 0, f"cluster up ({RUNTIME}): {h.tail(out)}"
        t0, t1 = (float(x) for x in (h.D / "startup-times").read_text().split())
        h.figure(f"cluster up ({RUNTIME}) -> nvidia.com/gpu allocatable: {t1 - t0:.2f} s")
        yield state
    finally:
        # Stopped here only when test_down_leaves_nothing did not (a failure before it).
        if h.D.exists():
            h.sh(h.CLUSTER, "down", h.BUILD, timeout=300)


def cmdline(name):
    pid = (h.D / "pids" / name).read_text().strip()
    return (h.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            .decode(errors="replace"))


def test_the_runtime_is_set_up_as_the_variant_says(variant):
    plugin = cmdline("gpulet-device-plugin")
    if RUNTIME == "containerd2":
        v = h.Kube().node()["status"]["nodeInfo"]["containerRuntimeVersion"]
        assert v == "containerd://2.2.9", f"the Node's runtime is containerd 2.2.9 ({v})"
        assert "--device-list-strategy envvar,cdi-cri" in plugin and "pass-device-specs" not in plugin, \
            f"the plugin answers with CDI names and no device specs (envvar,cdi-cri): {plugin}"
        return
    dropin = DROPIN.read_text()
    assert "default_runtime_name = 'nvidia'" in dropin, \
        f"gpulet runtime configure made the shim containerd's default runtime:\n{dropin}"
    if RUNTIME == "containerd-shim-cdi":
        assert "container_annotations = [ 'cdi.k8s.io/*' ]" in dropin, \
            f"gpulet runtime configure passes cdi.k8s.io/* container annotations to the shim:\n{dropin}"
        assert "--device-list-strategy cdi-annotations" in plugin and "pass-device-specs" not in plugin, \
            f"the plugin passes CDI annotations only (cdi-annotations, no device specs): {plugin}"
        shim = (h.D / "gpulet-runtime.json").read_text()
        assert '"accept-nvidia-visible-devices-envvar-when-unprivileged": false' in shim, \
            f"the shim does not take NVIDIA_VISIBLE_DEVICES from unprivileged containers:\n{shim}"
    else:
        assert "--device-list-strategy envvar" in plugin and "pass-device-specs" not in plugin, \
            f"the plugin passes NVIDIA_VISIBLE_DEVICES only (envvar, no device specs): {plugin}"


def test_the_gpu_pods_checks_pass(variant):
    # test_gpu_pods.py as ctest runs it (its own pytest session, on this cluster).
    rc, out = h.sh(h.SRC / "tests/cluster/run", h.SRC, h.BUILD, "test_gpu_pods.py", timeout=540)
    for line in out.rstrip("\n").splitlines():
        print(f"  gpu_pods: {line}")
    assert rc == 0, f"test_gpu_pods.py's checks pass on {RUNTIME} (exit {rc}):\n{h.tail(out, 30)}"


def test_down_leaves_nothing(variant):
    if not variant["started"]:
        print(f"the {RUNTIME} cluster was not started here: left running")
        return
    holder = h.holder_pid()
    rc, out = h.sh(h.CLUSTER, "down", h.BUILD, timeout=300)
    assert rc == 0, f"cluster down: {h.tail(out)}"
    problems = h.leftovers(f"down ({RUNTIME})", holder, state=STATE)
    assert not problems, "\n".join(problems)
    shutil.rmtree(STATE, ignore_errors=True)
