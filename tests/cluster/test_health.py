"""On the real one-node cluster, what the real kubelet makes of gpulet's device plugin:
- an XID 79 on a fake GPU (with the GPU then lost, as a GPU that fell off the bus is) takes it out of
  the Node's allocatable nvidia.com/gpu; it stays out while lost, however long; `sim fault reset`
  brings it back once it has answered normally for the health hold-down (3 s here). An XID alone
  (the GPU still answering) comes back after the hold-down with no reset: there is no reset event in
  NVML, so the hold-down is the recovery (docs/device-plugin.md).
- time-slicing (replicas: 4): nvidia.com/gpu 32; a pod asking for 1 runs with one GPU.
- MIG mixed on a100-mig: nvidia.com/gpu 1, mig-1g.5gb 8, mig-2g.10gb 1, mig-3g.20gb 3; a pod asking
  for a mig-1g.5gb runs with one MIG UUID.
The timings come from a watch of the Node (the official client's), stamped as each update arrives.
Leaves the plugin as the cluster started it (dgx-h100, 8 GPUs), and no fake GPU lost, even when a
check fails (the plugin fixture's cleanup)."""
import os
import threading
import time
from pathlib import Path

import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException

import harness as h

SIM = Path(os.environ.get("GPULET_SIM", h.GPULET.parent / "gpulet-sim"))
HOLD = 3


class AllocatableWatch:
    """The Node's allocatable nvidia.com/gpu as the API server streams it: (arrival time, count)
    for the first listing and every update after it, from a thread of its own."""

    def __init__(self):
        self.kube = h.Kube()  # a client of the thread's own
        self.seen = []
        self.errors = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        w = watch.Watch(return_type="object")  # the Node as a dict, as the API sends it
        rv = None
        while not self._stop.is_set():
            kw = {"field_selector": f"metadata.name={h.NODE}", "timeout_seconds": 5,
                  "_request_timeout": 30}
            if rv:
                kw["resource_version"] = rv
            try:
                for ev in w.stream(self.kube.core.list_node, **kw):
                    t = h.now()
                    n = ((ev["raw_object"].get("status") or {}).get("allocatable") or {}) \
                        .get("nvidia.com/gpu", "")
                    with self._lock:
                        self.seen.append((t, n))
                    if self._stop.is_set():
                        w.stop()
                rv = w.resource_version
            except ApiException as e:
                if e.status == 410:  # too old: list again
                    rv = None
                else:
                    self.errors.append(str(e))
                    time.sleep(0.5)
            except Exception as e:  # noqa: BLE001 - a dropped connection: watch again
                self.errors.append(repr(e))
                time.sleep(0.5)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)

    def seen_after(self, t, n):
        """The first arrival time after t at which the count was n (None if none yet)."""
        with self._lock:
            return next((at for at, c in self.seen if at > t and c == str(n)), None)

    def last(self, k=8):
        """The last arrivals, for a failure's message."""
        with self._lock:
            t_end = h.now()
            return [f"{at - t_end:+.2f} s: {c}" for at, c in self.seen[-k:]] + self.errors[-2:]


class Plugin:
    """The cluster's device plugin, restarted on other profiles and arguments, and the fake GPUs
    made lost; cleanup() brings back what the cluster started with."""

    def __init__(self, kube):
        self.kube = kube
        self.default = True
        self.lost = set()

    def restart(self, *args):
        self.default = False
        h.restart_plugin(*args)

    def back_to_default(self):
        h.restart_plugin()
        self.default = True

    def fault(self, *args):
        h.must(SIM, "fault", *args, "--sim-root", h.D / "sim")
        if args[0] == "lost":
            self.lost.add(args[2])
        elif args[0] == "reset":
            self.lost.discard(args[2])

    def cleanup(self):
        for gpu in sorted(self.lost):
            self.fault("reset", "--gpu", gpu)
        self.kube.delete_pods("ts-1", "mig-1")
        if not self.default:
            self.back_to_default()
            h.wait_until(30, "nvidia.com/gpu 8 allocatable again (the cluster's own plugin)",
                         lambda: self.kube.allocatable("nvidia.com/gpu") == "8")


@pytest.fixture(scope="module")
def node_watch(kube):
    w = AllocatableWatch()
    try:
        h.wait_until(10, "the Node watch's first listing", lambda: w.seen, detail=w.last)
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def plugin(kube):
    assert SIM.is_file() and os.access(SIM, os.X_OK), f"{SIM} missing (build the gpulet-sim target)"
    p = Plugin(kube)
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture(scope="module")
def held_down(kube, plugin, node_watch):
    """The plugin with a 3 s health hold-down, probing every 250 ms."""
    plugin.restart("dgx-h100", "--health-hold-down", f"{HOLD}s", "--health-probe-interval", "250ms")
    h.wait_until(30, "plugin restarted: 8 allocatable",
                 lambda: kube.allocatable("nvidia.com/gpu") == "8")
    time.sleep(1)
    return plugin


def test_xid_79_and_lost_stays_out_until_reset_and_hold_down(kube, held_down, node_watch):
    w = node_watch
    t0 = h.now()
    held_down.fault("xid", "--gpu", "3", "--code", "79")
    held_down.fault("lost", "--gpu", "3")
    t_out = h.wait_until(10, "XID 79 on GPU 3: the Node's allocatable nvidia.com/gpu drops to 7",
                         lambda: w.seen_after(t0, 7), detail=w.last)
    h.figure(f"XID injected -> Node allocatable 7: {h.elapsed(t0, t_out)} s")
    time.sleep(HOLD + 2)
    n = kube.allocatable("nvidia.com/gpu")
    assert n == "7", f"GPU 3 lost: still out after the hold-down + 2 s (allocatable {n})"
    t1 = h.now()
    held_down.fault("reset", "--gpu", "3")
    t_back = h.wait_until(HOLD + 10, "reset of GPU 3: allocatable back to 8",
                          lambda: w.seen_after(t1, 8), detail=w.last)
    h.figure(f"reset -> Node allocatable 8: {h.elapsed(t1, t_back)} s (hold-down {HOLD} s)")
    assert t_back - t1 >= HOLD, \
        f"reset: back no sooner than the hold-down ({t_back - t1:.2f} s, hold-down {HOLD} s)"


def test_xid_alone_comes_back_after_the_hold_down(kube, held_down, node_watch):
    w = node_watch
    t2 = h.now()
    held_down.fault("xid", "--gpu", "5", "--code", "79")
    t_out2 = h.wait_until(10, "XID 79 on GPU 5 (still answering): allocatable drops to 7",
                          lambda: w.seen_after(t2, 7), detail=w.last)
    # Back: an 8 after the drop (not a Node update that came between the XID and the drop).
    t_back2 = h.wait_until(HOLD + 10, "XID alone: back to 8 without a reset",
                           lambda: w.seen_after(t_out2, 8), detail=w.last)
    h.figure(f"XID alone -> out {h.elapsed(t2, t_out2)} s, back without reset "
             f"{h.elapsed(t2, t_back2)} s")


def test_time_slicing_four_replicas(kube, plugin):
    cfg = h.D / "time-slicing.yaml"
    cfg.write_text("version: v1\n"
                   "sharing:\n"
                   "  timeSlicing:\n"
                   "    resources:\n"
                   "    - name: nvidia.com/gpu\n"
                   "      replicas: 4\n")
    plugin.restart("dgx-h100", "--config-file", cfg)
    h.poll(30, lambda: kube.allocatable("nvidia.com/gpu") == "32")
    n = kube.allocatable("nvidia.com/gpu")
    assert n == "32", f"time-slicing replicas 4: nvidia.com/gpu 32 allocatable ({n})"
    c = kube.capacity("nvidia.com/gpu")
    assert c == "32", f"time-slicing: capacity 32 ({c})"
    kube.clean_pods("ts-1")
    try:
        kube.create(h.pod("ts-1", {"nvidia.com/gpu": 1}))
        kube.wait_running("ts-1", 60)
        v = kube.exec("ts-1", "echo $NVIDIA_VISIBLE_DEVICES")[1].strip()
        assert v.startswith("GPU-") and "," not in v, f"time-slicing: the pod sees one GPU UUID ({v})"
    finally:
        kube.delete_pods("ts-1")


def test_mig_mixed_on_a100_mig(kube, plugin):
    plugin.restart("a100-mig", "--mig-strategy", "mixed")
    h.poll(30, lambda: kube.allocatable("nvidia.com/mig-1g.5gb") == "8"
           and kube.allocatable("nvidia.com/gpu") == "1")
    for r, want in (("gpu", "1"), ("mig-1g.5gb", "8"), ("mig-2g.10gb", "1"), ("mig-3g.20gb", "3")):
        n = kube.allocatable(f"nvidia.com/{r}")
        assert n == want, f"MIG mixed: nvidia.com/{r} {want} allocatable ({n})"
    kube.clean_pods("mig-1")
    try:
        kube.create(h.pod("mig-1", {"nvidia.com/mig-1g.5gb": 1}))
        h.wait_until(60, "MIG mixed: a pod asking for nvidia.com/mig-1g.5gb: 1 is Running",
                     lambda: kube.running("mig-1"),
                     detail=lambda: f"phase {kube.phase('mig-1')}\n{kube.describe('mig-1', lines=6)}")
        v = kube.exec("mig-1", "echo $NVIDIA_VISIBLE_DEVICES")[1].strip()
        assert v.startswith("MIG-") and "," not in v, f"MIG mixed: the pod sees one MIG UUID ({v})"
    finally:
        kube.clean_pods("mig-1")


def test_back_to_the_clusters_own_plugin(kube, plugin):
    plugin.back_to_default()
    h.poll(30, lambda: kube.allocatable("nvidia.com/gpu") == "8")
    n = kube.allocatable("nvidia.com/gpu")
    assert n == "8", f"plugin as the cluster started it: nvidia.com/gpu 8 again ({n})"
