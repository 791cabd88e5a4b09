"""On the real one-node cluster: the real kubelet's device manager takes the 8 fake H100s gpulet's
device plugin registers; a pod asking for 2 runs and, through `kubectl exec`, sees exactly its 2
device nodes (containerd 1.6 made them from the plugin's device specs: nodes made with mknod under the
fake driver root) and the matching 2 UUIDs in NVIDIA_VISIBLE_DEVICES (on containerd 2 the nodes come
through CDI and the variable is void), both the GPUs the kubelet's checkpoint allocated to the pod;
a pod asking for 9 stays Pending with the real scheduler's reason."""
import json
import re
import time

import pytest

import harness as h


@pytest.fixture(scope="module")
def gpu2(kube):
    """The pod asking for 2 GPUs, Running; deleted (with gpu-9) after the module."""
    kube.clean_pods("gpu-2", "gpu-9")
    t0 = h.now()
    kube.create(h.pod("gpu-2", {"nvidia.com/gpu": 2}))
    kube.wait_running("gpu-2")
    h.figure(f"kubectl apply -> pod Running (2 GPUs): {h.elapsed(t0)} s")
    yield kube.pod("gpu-2")
    kube.delete_pods("gpu-2", "gpu-9")


def allocated_to(uid):
    """The GPUs the kubelet allocated to the pod: its device-manager checkpoint (inside the
    namespace, /var/lib/kubelet is D/fixed/var/lib/kubelet)."""
    ckpt = json.loads((h.D / "fixed/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
                      .read_text())
    return sorted(i for e in ckpt["Data"]["PodDeviceEntries"]
                  if e["PodUID"] == uid and e["ResourceName"] == "nvidia.com/gpu"
                  for ids in e["DeviceIDs"].values() for i in ids)


def test_node_shows_eight_gpus(kube):
    assert kube.allocatable("nvidia.com/gpu") == "8"
    assert kube.capacity("nvidia.com/gpu") == "8"


def test_the_pods_gpus_are_the_ones_the_kubelet_allocated(kube, gpu2):
    allocated = allocated_to(gpu2["metadata"]["uid"])
    assert len(allocated) == 2, f"the kubelet's checkpoint: 2 GPUs allocated to the pod ({allocated})"
    visible = kube.exec("gpu-2", "echo $NVIDIA_VISIBLE_DEVICES")[1].strip()
    engine = h.runtime()
    if engine == "containerd2":
        # CDI: the devices come by name through CRI; the plugin sets the variable to void (as
        # NVIDIA's does) so that no NVIDIA runtime hook injects GPUs a second time.
        assert visible == "void", f"NVIDIA_VISIBLE_DEVICES is void under CDI ({visible})"
    elif engine == "containerd-shim-cdi":
        # cdi-annotations alone: the plugin sets no variable; the devices are named only by the
        # cdi.k8s.io/* annotation, which containerd 1.6 copied into the container's OCI spec.
        assert visible == "", f"NVIDIA_VISIBLE_DEVICES is unset under cdi-annotations ({visible})"
        cid = gpu2["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        info = json.loads(h.must("ctr", "--address", h.D / "containerd/containerd.sock", "-n",
                                 "k8s.io", "containers", "info", cid))
        ann = {k: v for k, v in info["Spec"].get("annotations", {}).items()
               if k.startswith("cdi.k8s.io/")}
        value = ann.get("cdi.k8s.io/gpulet-device-plugin_gpu", "")
        named = [d for d in value.split(",") if d.startswith("nvidia.com/gpu=")]
        assert len(named) == 2, f"the OCI spec carries the plugin's annotation, naming 2 GPUs ({ann})"
    else:
        assert sorted(visible.split(",")) == allocated, \
            f"NVIDIA_VISIBLE_DEVICES holds the 2 allocated GPU UUIDs ({visible})"

    # The device nodes in the container: `ls -l` prints "195, MINOR ... /dev/nvidiaN".
    listing = kube.exec("gpu-2", "ls -l /dev/")[1]
    nodes = [line for line in listing.splitlines() if re.search(r" nvidia[0-9]+$", line)]
    assert len(nodes) == 2, f"exactly 2 GPU device nodes in /dev ({nodes})"
    # Their minors are the fake GPUs' minors (= indices); gpulet info maps the indices to UUIDs.
    info = h.must(h.GPULET, "info", "--simulate", "dgx-h100", "--sim-root", h.D / "sim")
    uuid_of = dict(re.findall(r"^GPU (\d+): .*\(UUID: (GPU-[^)]*)\)", info, re.M))
    minors = [line.split()[5] for line in nodes]
    assert sorted(uuid_of.get(m, "?") for m in minors) == allocated, \
        f"the device nodes' minors {minors} are the allocated GPUs {allocated}"
    assert kube.allocatable("nvidia.com/gpu") == "8", \
        "Node still shows nvidia.com/gpu: 8 allocatable with the pod running"


def test_a_pod_asking_for_nine_stays_pending(kube, gpu2):
    kube.create(h.pod("gpu-9", {"nvidia.com/gpu": 9}))
    h.wait_until(30, "gpu-9 PodScheduled reason Unschedulable", lambda: kube.unschedulable("gpu-9"))
    msg = kube.condition("gpu-9", "PodScheduled", "message")
    assert "Insufficient nvidia.com/gpu" in msg, f"the scheduler says 'Insufficient nvidia.com/gpu' ({msg})"
    time.sleep(2)
    assert kube.phase("gpu-9") == "Pending"
