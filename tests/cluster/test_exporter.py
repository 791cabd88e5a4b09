"""gpulet's exporter on the real kubelet's PodResources API and device-manager checkpoint: started in
the cluster's mount namespace (where /var/lib/kubelet is the kubelet's) on the cluster's fake GPUs, it
attributes a pod's 2 GPUs to the pod: the first scrape after the pod is Running carries
pod/namespace/container labels on the metrics of exactly those 2 GPUs (the UUIDs in the pod's
NVIDIA_VISIBLE_DEVICES), and after the pod is deleted the labels go away."""
import os
import re
import subprocess
import urllib.request

import pytest

import harness as h

PORT = int(os.environ.get("GPULET_CLUSTER_EXPORTER_PORT", "19400"))


def scrape():
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def exporter(kube):
    log = open(h.D / "logs/exporter.log", "w")
    p = subprocess.Popen(["nsenter", "-t", h.holder_pid(), "-m", "--", "nice", "-n", "19",
                          str(h.GPULET), "exporter", "--simulate", "dgx-h100", "--sim-root",
                          str(h.D / "sim"), "--address", f"127.0.0.1:{PORT}", "--interval", "1s",
                          "--no-hostname", "--pod-resources-socket",
                          "/var/lib/kubelet/pod-resources/kubelet.sock", "--kubelet-checkpoint",
                          "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
                          "--vgpu-accounting-dir", ""], stdout=log, stderr=subprocess.STDOUT)
    try:
        h.wait_until(20, "the exporter serving /metrics", scrape,
                     detail=lambda: h.tail_file(h.D / "logs/exporter.log"))
        yield p
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()


def test_a_pods_gpus_carry_its_labels_until_it_is_deleted(kube, exporter):
    assert 'pod="exp-2"' not in scrape(), "before the pod: no metric names pod exp-2"
    kube.clean_pods("exp-2")
    kube.create(h.pod("exp-2", {"nvidia.com/gpu": 2}))
    kube.wait_running("exp-2")
    t_run = h.now()
    first = scrape()
    h.figure(f"pod Running seen -> first scrape done: {h.elapsed(t_run)} s")
    uuids = sorted(kube.exec("exp-2", "echo $NVIDIA_VISIBLE_DEVICES")[1].strip().split(","))
    mine = [line for line in first.splitlines()
            if 'pod="exp-2"' in line and 'namespace="default"' in line and 'container="main"' in line]
    labelled = sorted({u for line in mine for u in re.findall(r"GPU-[0-9a-f-]*", line)})
    assert labelled and labelled == uuids, \
        f"first scrape after Running: metrics naming exp-2 name its 2 GPUs ({labelled} = {uuids})"
    n = sum('pod="exp-2"' in line for line in first.splitlines())
    h.figure(f'{n} series carry pod="exp-2" in the first scrape')

    kube.clean_pods("exp-2")
    h.wait_until(30, "no metric naming pod exp-2 after its deletion",
                 lambda: (lambda body: body and 'pod="exp-2"' not in body)(scrape()))
