"""The kubelet emulator's reference, checked on the real kubelet: gpulet-kubelet-probe
(testing/kubelet/probe.h) registers a device plugin for probe.gpulet.io/dev (4 devices,
GetPreferredAllocation and PreStartContainer asked for) and records every call the kubelet makes;
this scenario takes the same steps as tests/kubelet_emulator/kubelet_probe_test.cc does on the
emulator (bad registrations, a pod of 2, a device turning unhealthy, a pod of 1 for which the plugin
prefers an unknown device, a pod bound to the node directly that does not fit, a kubelet restart,
the plugin gone) and notes what the API and the PodResources API show in between. The transcript
must be tests/kubelet_emulator/kubelet_probe.expected, which the emulator must also write: a
difference here means the kubelet changed.

The waits between the steps do not fail the scenario by themselves: the transcript is the check (a
step that never came shows as a difference); the waits that ran out are named with it."""
import difflib
import signal
import subprocess
import time

import pytest

import harness as h

PROBE = h.BUILD / "bin/gpulet-kubelet-probe"
DP = h.D / "fixed/var/lib/kubelet/device-plugins"
PR = h.D / "fixed/var/lib/kubelet/pod-resources/kubelet.sock"
LOG = h.BUILD / "kubelet-probe.transcript"
ERR = h.BUILD / "kubelet-probe.err"
DIFF = h.BUILD / "kubelet-probe.diff"
EXPECTED = h.SRC / "tests/kubelet_emulator/kubelet_probe.expected"
R = "probe.gpulet.io/dev"
PODS = ("probe-kp-1", "probe-kp-2", "probe-kp-3")


def note(text):
    """A line of the transcript, between the probe's own (it appends to the same file)."""
    with open(LOG, "a") as f:
        f.write(text + "\n")


def transcript():
    return LOG.read_text().splitlines()


@pytest.fixture(scope="module")
def run(kube):
    """The probe's steps on the real kubelet; returns what the checks compare: the transcript, the
    waits that ran out, and nvidia.com/gpu before and after the kubelet restart. The probe is stopped
    and the pods deleted however it ends."""
    assert PROBE.exists(), f"{PROBE} is not built (cmake --build --target gpulet-kubelet-probe)"
    LOG.write_text("")
    kube.clean_pods(*PODS)
    missed = []

    def wait(seconds, what, fn):
        last = h.poll(seconds, fn)
        if not last or isinstance(last, Exception):
            missed.append(f"{what} (waited {seconds} s)")

    def node_line():
        note(f"node: capacity={kube.capacity(R) or 0} allocatable={kube.allocatable(R) or 0}")

    def pod_line(name):
        status = (kube.pod(name) or {}).get("status", {})
        reason = status.get("reason", "")
        note(f"pod {name}: {status.get('phase', '')}"
             + (f" {reason} \"{status.get('message', '')}\"" if reason else ""))

    def settled(name):
        return kube.phase(name) in ("Running", "Failed")

    def podres():
        with open(LOG, "a") as f:
            rc = subprocess.run([str(PROBE), "podresources", str(PR)], stdout=f,
                                stderr=subprocess.STDOUT, timeout=60).returncode
        if rc != 0:
            missed.append(f"gpulet-kubelet-probe podresources exited {rc}")

    def want_alloc(n):
        return lambda: kube.allocatable(R) == str(n)

    result = {"missed": missed}
    err = open(ERR, "w")
    probe = subprocess.Popen([str(PROBE), "serve", str(DP), str(LOG)], stderr=err)
    try:
        wait(30, f"{R} allocatable 4", want_alloc(4))
        node_line()
        kube.create(h.pod("probe-kp-1", {R: 2}))
        wait(60, "probe-kp-1 Running or Failed", lambda: settled("probe-kp-1"))
        pod_line("probe-kp-1")
        podres()
        probe.send_signal(signal.SIGUSR1)
        wait(30, f"{R} allocatable 3 (dev-0 unhealthy)", want_alloc(3))
        node_line()
        podres()
        kube.create(h.pod("probe-kp-2", {R: 1}))
        wait(60, "probe-kp-2 Running or Failed", lambda: settled("probe-kp-2"))
        pod_line("probe-kp-2")
        kube.create(h.pod("probe-kp-3", {R: 2}, nodeName=h.NODE))
        wait(60, "probe-kp-3 Running or Failed", lambda: settled("probe-kp-3"))
        pod_line("probe-kp-3")
        podres()

        n = len(transcript())
        gpus = kube.allocatable("nvidia.com/gpu")
        result["gpus"] = gpus
        t0 = h.now()
        h.sh(h.CLUSTER, "kubelet-restart", h.BUILD)
        wait(30, "the probe's 'register: OK' with the restarted kubelet",
             lambda: any(line.startswith("register: OK") for line in transcript()[n:]))
        time.sleep(2)  # the restarted kubelet's first calls settle (the bash scenario's 2 s)
        wait(30, f"{R} allocatable 3 after the kubelet restart", want_alloc(3))
        node_line()
        podres()
        # gpulet's own plugin (the cluster's host process) registers again with the restarted
        # kubelet too.
        if gpus and gpus != "0":
            back = h.poll(30, lambda: kube.allocatable("nvidia.com/gpu") == gpus)
            result["gpus_back"] = (back is True, kube.allocatable("nvidia.com/gpu"), h.elapsed(t0))
        probe.send_signal(signal.SIGTERM)
        probe.wait(timeout=30)
        wait(30, f"{R} allocatable 0 once the probe is gone", want_alloc(0))
        node_line()
        result["transcript"] = transcript()
        return result
    finally:
        if probe.poll() is None:
            probe.terminate()
            try:
                probe.wait(timeout=30)
            except subprocess.TimeoutExpired:
                probe.kill()
        err.close()
        kube.delete_pods(*PODS)


def test_the_real_kubelets_transcript_is_the_emulators_reference(run):
    got = run["transcript"]
    for line in got:
        print(f"  {line}")
    want = [line for line in EXPECTED.read_text().splitlines()
            if not line.startswith("#") and line != ""]
    diff = list(difflib.unified_diff(want, got, str(EXPECTED), str(LOG), lineterm=""))
    DIFF.write_text("\n".join(diff) + ("\n" if diff else ""))
    missed = "".join(f"\n  wait ran out: {m}" for m in run["missed"])
    assert not diff, ("the real kubelet's transcript is tests/kubelet_emulator/kubelet_probe.expected"
                      " (the emulator's reference):\n" + "\n".join(f"  {d}" for d in diff) + missed
                      + f"\n  the probe's stderr: {h.tail_file(ERR)}")


def test_gpulets_plugin_registers_again_after_the_kubelet_restart(run):
    gpus = run["gpus"]
    if not gpus or gpus == "0":
        pytest.skip(f"nvidia.com/gpu allocatable was {gpus or 'absent'} before the kubelet restart:"
                    " no gpulet plugin to watch")
    back, now, seconds = run["gpus_back"]
    assert back, (f"after the kubelet restart gpulet's plugin registered again: nvidia.com/gpu"
                  f" {gpus} allocatable (now {now!r})")
    h.figure(f"kubelet restart -> nvidia.com/gpu allocatable again (gpulet re-registered), at most:"
             f" {seconds} s (seen after the probe's own checks)")
