"""What the DRA scenarios (test_dra.py, test_dra_daemonset.py) share: ResourceClaimTemplates and
pods using them, what the ResourceSlices and ResourceClaims say, and the fractional claim's
checks. Each runs on a cluster of its own (harness.own_cluster)."""
import harness as h

DRIVER = "gpu.gpulet.io"
RESOURCE = "/apis/resource.k8s.io/v1"
CUDA_IMG = "gpulet.test/cuda-probe:1"


# --- claims and pods -------------------------------------------------------------------------------


def template(name, requests, constraints=None, config=None):
    """A ResourceClaimTemplate in default whose claims ask for requests (a list of DeviceRequests)."""
    devices = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": devices}}}


def request(name="gpu", device_class=DRIVER, cel=None, **exactly):
    """One DeviceRequest of exactly: a device of device_class, matching the CEL expression when
    given; exactly's other fields (count, capacity) as given."""
    req = {"deviceClassName": device_class, **exactly}
    if cel:
        req["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": req}


def one_gpu_template():
    return template("one-gpu", [request()])


def frac_template():
    """The fractional claim of the scenarios: one GPU, 4Gi and 30 % through the interposer."""
    return template("frac", [request()], config=[{
        "requests": ["gpu"],
        "opaque": {"driver": DRIVER,
                   "parameters": {"apiVersion": "gpu.gpulet.io/v1alpha1", "kind": "VgpuConfig",
                                  "memory": "4Gi", "cores": 30}}}])


def template_pod(name, tmpl, **kw):
    """A pod whose container uses a claim from the template."""
    return h.claim_pod(name, {"resourceClaimTemplateName": tmpl}, **kw)


def claim_path(name, ns="default"):
    return f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}"


def claim(kube, name, ns="default"):
    return kube.get(claim_path(name, ns)) or {}


def claim_of(kube, pod_name):
    """The name of the pod's (first) ResourceClaim ("" before the controller made it)."""
    statuses = ((kube.pod(pod_name) or {}).get("status", {})).get("resourceClaimStatuses") or [{}]
    return statuses[0].get("resourceClaimName", "")


def allocation(c):
    return (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []


def devices_of(kube, name):
    """The devices allocated to the claim."""
    return [r["device"] for r in allocation(claim(kube, name))]


def device_condition(kube, name, field="status"):
    """The field of the claim's first status.devices entry's first condition ("" when none)."""
    devices = (claim(kube, name).get("status") or {}).get("devices") or [{}]
    conditions = devices[0].get("conditions") or [{}]
    return conditions[0].get(field, "")


def ready(kube, name):
    """The driver reported the claim's (first) device Ready=True in status.devices."""
    return device_condition(kube, name) == "True"


def reserved_for(kube, name):
    return [r.get("name") for r in (claim(kube, name).get("status") or {}).get("reservedFor") or []]


def slice_devices(kube):
    """The names of gpu.gpulet.io devices in all ResourceSlices, sorted."""
    slices = kube.get(f"{RESOURCE}/resourceslices")["items"]
    return sorted(d["name"] for s in slices if s["spec"]["driver"] == DRIVER
                  for d in s["spec"].get("devices", []) or [])


def gpu_nodes(kube, pod_name):
    """The GPU device nodes (/dev/nvidiaN) in the pod's container, sorted as `sort` does; the exec's
    output when it fails."""
    rc, out = kube.exec(pod_name, 'ls /dev/ | grep "^nvidia[0-9][0-9]*$" | sort')
    return out.split() if rc == 0 else [f"(exec failed: {out.strip()})"]


def wait_pod(kube, name, seconds, what, show):
    """Waits for the pod to run; on a timeout the failure says what (the bash check) and show()'s
    post-mortem."""
    h.wait_until(seconds, f"{what} (pod {name} Running)", lambda: kube.running(name), detail=show)


def frac_pod_checks(kube, pod_name, seconds, show):
    """The pod (of frac_template's claim) Running within seconds, with the interposer's environment
    for 4Gi / 30 %, its library and the claim's accounting file mounted."""
    wait_pod(kube, pod_name, seconds, "fractional claim: pod Running", show)
    env = kube.exec(pod_name, "echo $GPULET_VGPU_MEMORY_LIMIT $GPULET_VGPU_CORE_LIMIT $LD_PRELOAD "
                              "$GPULET_VGPU_UUID")[1].strip()
    assert env.startswith("4294967296 30 /usr/lib/gpulet/libgpulet-vcuda.so GPU-"), \
        f"fractional claim: interposer environment 4Gi / 30 % / LD_PRELOAD / its GPU's UUID ({env})"
    rc, out = kube.exec(pod_name, "test -f /var/run/gpulet/vgpu/accounting && "
                                  "test -s /usr/lib/gpulet/libgpulet-vcuda.so")
    assert rc == 0, ("fractional claim: the accounting file and the interposer (not empty) are "
                     f"mounted ({out.strip()})")


# --- the agent DaemonSet (test_dra_daemonset.py) ---------------------------------------------------

AGENT = "app.kubernetes.io/name=gpulet-node"
TAINT = "gpulet.io/gpu-stack-not-ready"


def agent_name(kube):
    """The first agent pod's name ("" when none)."""
    pods = kube.pods(h.NS, AGENT)
    return pods[0]["metadata"]["name"] if pods else ""


def agent_up(kube):
    """The agent DaemonSet's one pod is Running."""
    return " ".join(p.get("status", {}).get("phase", "") for p in kube.pods(h.NS, AGENT)) == "Running"


def validated(kube):
    """The agent validated the node: label gpulet.io/gpu-stack=ready and no
    gpulet.io/gpu-stack-not-ready taint (it labels first, then lifts the taint)."""
    return kube.label("gpulet.io/gpu-stack") == "ready" and TAINT not in kube.taints()
