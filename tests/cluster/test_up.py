"""cluster.up (ctest fixture setup): uses the cluster `make cluster` left running, else starts one for
the scenarios (cluster.down stops it). Before starting, two failed starts: a port in use, and a
component failing once the others run (the device plugin on an unknown GPU profile); each exits 1
with one message naming the problem and leaves nothing behind."""
import shutil
import socket

import pytest

import harness as h

STARTED = h.STATE / "started"


@pytest.fixture(scope="module")
def fresh():
    """True when this run starts the cluster (no running one to use)."""
    shutil.rmtree(h.STATE, ignore_errors=True)
    if h.cluster_running():
        print(f"using the running cluster in {h.D} (cluster.down will leave it running)")
        return False
    h.STATE.mkdir(parents=True)
    # A machine that cannot run a cluster at all (CI without root or cgroup controllers): every
    # test skips with the reason instead of failing (the kube fixture reads it).
    rc, why = h.sh(h.CLUSTER, "preflight", h.BUILD)
    if rc != 0:
        (h.STATE / "cannot-run").write_text(why)
        pytest.skip(why.strip())
    (h.STATE / "suite-start").write_text(str(h.now()))
    h.record_host()
    return True


def test_port_in_use_is_one_message_and_leaves_nothing(fresh):
    if not fresh:
        pytest.skip("a running cluster is used")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, out = h.sh(h.CLUSTER, "up", h.BUILD, env={"GPULET_CLUSTER_API_PORT": str(port)})
    lines = out.rstrip("\n").split("\n")
    assert rc == 1, f"port {port} in use: cluster up exits 1, got {rc}: {out}"
    assert len(lines) == 1 and f"port {port} " in out and "in use" in out, \
        f"port in use: one message naming the port: {out}"
    assert not h.D.exists(), "port in use: no cluster directory left"


def test_a_failed_component_is_named_and_all_of_it_stopped(fresh):
    if not fresh:
        pytest.skip("a running cluster is used")
    rc, out = h.sh(h.CLUSTER, "up", h.BUILD, env={"GPULET_CLUSTER_PROFILE": "no-such-machine"},
                   timeout=600)
    assert rc == 1, f"failed start (bad GPU profile): cluster up exits 1, got {rc}"
    assert "gpulet-device-plugin exited while waiting for nvidia.com/gpu" in out, \
        f"failed start: the message names the device plugin: {h.tail(out, 5)}"
    problems = h.leftovers("failed start")
    assert not problems, "\n".join(problems)


def test_the_cluster_the_scenarios_share(fresh):
    if not fresh:
        assert h.cluster_running()
        return
    rc, out = h.sh(h.CLUSTER, "up", h.BUILD, timeout=600)
    assert rc == 0, f"cluster up: {h.tail(out)}"
    STARTED.touch()
    t0, t1 = (float(x) for x in (h.D / "startup-times").read_text().split())
    h.figure(f"cluster up -> nvidia.com/gpu allocatable: {t1 - t0:.2f} s")
