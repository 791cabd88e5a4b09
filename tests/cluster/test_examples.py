"""On the real one-node cluster: the pods of examples/ as printed (`kubectl apply -f examples/`, the
same files the README and `make demo` use), on the cluster's pod network (the CNI bridge plugin,
host-local addresses; the images are the cluster's stand-ins, testing/k8s/stand-in). As the README
says of the demo: cuda-vectoradd runs to completion ("Test PASSED") and frees its GPU; the training
(2 GPUs), the LLM server (4) and the embeddings server (1) run, each container seeing as many GPUs
as it asked for; the notebook waits Pending ("Insufficient nvidia.com/gpu") until cuda-vectoradd
completes, then runs; the vGPU example waits Pending (this node offers no fractional GPUs unless
gpulet's agent is installed with a vGPU pool: cluster.install_uninstall). Each pod has an address of
the pod subnet (not the host's network), the node reaches it and it reaches the node through the
bridge; once the pods are deleted their veths and addresses are released (CNI DEL). Fails on a
cluster without a pod network: the sandboxes never start.

The tests run in this file's order on one set of pods (applied once for the module, deleted by the
last test and in any case after the module)."""
import ipaddress
import json
import re

import pytest

import harness as h

EX = h.SRC / "examples"
PODS = ("cuda-vectoradd", "pytorch-ddp-train", "llm-serving", "embeddings", "notebook",
        "vgpu-inference")
# The long-running example pods and the GPUs each asked for.
SERVING = (("pytorch-ddp-train", 2), ("llm-serving", 4), ("embeddings", 1), ("notebook", 1))


def gpus_of(pod):
    return sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
               for c in pod["spec"]["containers"])


def sched_msg(kube, name):
    return kube.condition(name, "PodScheduled", "message")


def waits_for(kube, name, resource):
    return f"Insufficient {resource}" in sched_msg(kube, name)


def veths(bridge):
    rc, out = h.sh("ip", "-o", "link", "show", "master", bridge)
    return [line for line in out.splitlines() if "veth" in line] if rc == 0 else []


@pytest.fixture(scope="module")
def net():
    """The pod network the cluster writes for containerd's CRI (testing/k8s/cluster pod_network_up):
    (bridge, subnet, gateway)."""
    conflist = h.D / "cni/10-gpulet-pods.conflist"
    try:
        p = json.loads(conflist.read_text())["plugins"][0]
        r = p["ipam"]["ranges"][0][0]
        bridge = p["type"] == "bridge" and p["bridge"]
        subnet, gateway = r["subnet"], r["gateway"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        pytest.fail(f"the cluster's CNI network {conflist}: {e}")
    assert bridge and gateway, (f"the cluster's CNI network is the bridge plugin on {bridge},"
                                f" subnet {subnet}, gateway {gateway}")
    return bridge, subnet, gateway


@pytest.fixture(scope="module")
def applied(kube):
    """kubectl apply -f examples/, once no pod of examples/ is left from before and no other pod
    holds a GPU; the pods are deleted after the module. Yields apply's start time."""
    kube.clean_pods(*PODS)
    left = [p["metadata"]["name"] for p in kube.pods() if p["metadata"]["name"] in PODS]
    assert not left, f"no pod of examples/ left from before ({left})"

    # The examples fill the 8 GPUs as the README says only when no other pod holds one (the
    # scenario before may have left a pod terminating).
    def gpus_in_use():
        return sum(gpus_of(p) for p in kube.get("/api/v1/pods")["items"]
                   if p["spec"].get("nodeName")
                   and p["status"].get("phase") not in ("Succeeded", "Failed"))
    h.wait_until(90, "no other pod holds a GPU", lambda: gpus_in_use() == 0,
                 detail=lambda: f"{gpus_in_use()} in use")
    t0 = h.now()
    rc, out = h.kubectl("apply", "-f", f"{EX}/")
    try:
        assert rc == 0, f"kubectl apply -f examples/ (rc {rc}): {';'.join(out.splitlines())}"
        yield t0
    finally:
        kube.delete_pods(*PODS)


def test_the_bridge_is_up_on_the_host(net):
    bridge, _, gateway = net
    out = h.sh("ip", "-o", "-4", "addr", "show", "dev", bridge)[1]
    assert f" {gateway}/" in out, f"the bridge {bridge} is up on the host with {gateway} ({out.strip()})"


def test_every_image_the_examples_name_is_a_stand_in():
    # Every image the examples name is in the cluster's containerd, under the full name the CRI
    # looks up (a name without a registry is docker.io's, library/ for one element).
    have = set(h.ctr_k8s("images", "ls", "-q")[1].split())
    images = sorted({m.group(1).strip() for f in EX.glob("*.yaml")
                     for m in re.finditer(r"^ *image: *(.*)$", f.read_text(), re.M)})
    assert images, "examples/*.yaml name images"
    missing = []
    for img in images:
        full = f"docker.io/library/{img}"
        if "/" in img:
            first = img.split("/")[0]
            full = img if ("." in first or ":" in first or first == "localhost") else f"docker.io/{img}"
        if full not in have:
            missing.append(full)
    assert not missing, f"the cluster's containerd has every example's image (a stand-in); missing: {missing}"


def test_vectoradd_completes_and_its_gpu_goes_to_the_waiting_notebook(kube, applied):
    t0 = applied
    h.wait_until(30, "notebook PodScheduled 'Insufficient nvidia.com/gpu'",
                 lambda: waits_for(kube, "notebook", "nvidia.com/gpu"),
                 detail=lambda: sched_msg(kube, "notebook"))
    vectoradd_then = kube.phase("cuda-vectoradd")
    assert vectoradd_then != "Succeeded", \
        (f"notebook waits Pending while cuda-vectoradd holds a GPU ({sched_msg(kube, 'notebook')};"
         f" cuda-vectoradd: {vectoradd_then})")
    h.wait_until(60, "cuda-vectoradd Succeeded", lambda: kube.phase("cuda-vectoradd") == "Succeeded",
                 detail=lambda: f"phase: {kube.phase('cuda-vectoradd')}\n{kube.describe('cuda-vectoradd')}")
    t1 = h.now()
    h.figure(f"kubectl apply -f examples/ -> cuda-vectoradd Succeeded: {h.elapsed(t0, t1)} s")
    # The README's and docs/cluster.md's command for it.
    rc, out = h.kubectl("wait", "pod/cuda-vectoradd", "--for=jsonpath={.status.phase}=Succeeded",
                        "--timeout=10s")
    assert rc == 0, \
        f"kubectl wait pod/cuda-vectoradd --for=jsonpath='{{.status.phase}}'=Succeeded, as printed: {out}"
    logs = kube.logs("cuda-vectoradd")
    assert "GPUs: 1 " in logs and "Test PASSED" in logs, \
        f"kubectl logs cuda-vectoradd: 1 GPU, \"Test PASSED\" ({';'.join(logs.splitlines())})"
    h.wait_until(120, "notebook Running once cuda-vectoradd freed its GPU",
                 lambda: kube.running("notebook"),
                 detail=lambda: (f"phase: {kube.phase('notebook')}; {h.elapsed(t1)} s after\n"
                                 + kube.describe("notebook")))
    print(f"notebook Running {h.elapsed(t1)} s after cuda-vectoradd Succeeded")


@pytest.mark.parametrize("name,gpus", SERVING, ids=[n for n, _ in SERVING])
def test_a_long_running_example_sees_its_gpus_and_serves(kube, applied, name, gpus):
    kube.wait_running(name)
    logs = kube.logs(name)
    assert f"GPUs: {gpus} " in logs and "running until the pod is deleted" in logs, \
        f"{name}: its container sees {gpus} GPU(s) and serves ({';'.join(logs.splitlines())[:300]})"


def test_all_eight_gpus_go_to_the_examples_running_pods(kube, applied):
    held = sum(gpus_of(p) for p in kube.pods() if p["status"].get("phase") == "Running")
    assert held == 8, f"Node {h.NODE}: all 8 GPUs allocated to the examples' running pods ({held})"


def test_the_vgpu_example_waits_pending(kube, applied):
    h.wait_until(30, "vgpu-inference PodScheduled 'Insufficient tencent.com/vcuda'",
                 lambda: waits_for(kube, "vgpu-inference", "tencent.com/vcuda"),
                 detail=lambda: sched_msg(kube, "vgpu-inference"))
    phase, msg = kube.phase("vgpu-inference"), sched_msg(kube, "vgpu-inference")
    assert phase == "Pending" and "Insufficient tencent.com/vcuda" in msg, \
        f"vgpu-inference waits Pending: no fractional GPUs on this node ({phase}: {msg})"


def test_each_pod_is_on_the_pod_network(kube, applied, net):
    bridge, subnet, gateway = net
    ips = []
    for name in PODS[:5]:
        p = kube.pod(name)
        ip, hn = p["status"].get("podIP", ""), p["spec"].get("hostNetwork", False)
        # A pod not on the host's network, at an address of the subnet other than the gateway's.
        try:
            ok = not hn and ipaddress.ip_address(ip) in ipaddress.ip_network(subnet) and ip != gateway
        except ValueError:
            ok = False
        assert ok, f"{name}: on the pod network, address {ip} in {subnet} (hostNetwork: {hn})"
        if name != "cuda-vectoradd":
            ips.append(ip)
    assert len(set(ips)) == 4, f"the running pods' addresses are distinct ({ips})"
    n = len(veths(bridge))
    assert n == 4, f"4 pod veths on {bridge} (the running pods; cuda-vectoradd's sandbox is gone: {n})"

    ip = kube.pod("embeddings")["status"]["podIP"]
    rc, out = h.sh("busybox", "ping", "-c", "1", "-W", "2", ip)
    assert rc == 0, f"the node reaches embeddings at {ip} through {bridge}: {out}"
    rc, out = kube.exec("embeddings", f"ip -4 -o addr show eth0; ip route; ping -c 1 -W 2 {gateway}")
    assert f"inet {ip}/" in out and f"default via {gateway}" in out and "1 packets received" in out, \
        (f"embeddings: eth0 has {ip}, the default route is {gateway}, which answers"
         f" ({';'.join(out.splitlines())})")


def test_deleted_pods_release_their_veths_and_addresses(kube, applied, net):
    bridge = net[0]
    ips = [ip for ip in (((kube.pod(n) or {}).get("status", {})).get("podIP", "") for n in PODS[1:5])
           if ip]
    h.kubectl("delete", "-f", f"{EX}/", "--grace-period=0", "--force", "--wait=true", "--timeout=60s")
    h.wait_until(30, f"pods deleted: no veth left on {bridge}", lambda: not veths(bridge),
                 detail=lambda: veths(bridge))

    # The bridge plugin deletes the veth first, then asks host-local to release the address.
    def held():
        return [str(f.relative_to(h.D / "cni-state")) for ip in ips
                for f in (h.D / "cni-state").glob(f"*/{ip}")]
    h.wait_until(30, f"pods deleted: host-local released their addresses {ips}", lambda: not held(),
                 detail=lambda: f"still held: {held()}")
