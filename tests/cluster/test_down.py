"""cluster.down (ctest fixture cleanup): stops the cluster cluster.up started (one that `make cluster`
left running stays) and checks that nothing is left behind: no process, mount, network device,
KUBE-* iptables rule or kubepods cgroup, and the cluster directory removed. Prints the suite's wall
time (cluster.up's start to here)."""
import shutil

import pytest

import harness as h


def test_down_leaves_nothing():
    cannot = h.STATE / "cannot-run"
    if cannot.exists():
        why = cannot.read_text().strip()
        shutil.rmtree(h.STATE, ignore_errors=True)
        pytest.skip(why)
    if not (h.STATE / "started").exists():
        print("the cluster was not started by cluster.up: left running")
        return
    try:
        holder = h.holder_pid()
    except OSError:
        holder = None
    rc, out = h.sh(h.CLUSTER, "down", h.BUILD)
    assert rc == 0, f"cluster down: {h.tail(out)}"
    problems = h.leftovers("down", holder)
    assert not problems, "\n".join(problems)
    start = float((h.STATE / "suite-start").read_text())
    h.figure(f"the cluster suite, cluster.up start -> cluster.down done: {h.elapsed(start)} s")
    shutil.rmtree(h.STATE, ignore_errors=True)
