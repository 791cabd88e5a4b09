"""gpulet's ValidatingAdmissionPolicies on the real API server: gpulet-node-own-node and
gpulet-node-own-events (deploy/base/node-admission-policy.yaml), gpulet-trusted-pod-annotations and
gpulet-trusted-binding-annotations (deploy/components/vgpu/scheduler.yaml) and
gpulet-mps-one-tenant-per-node (deploy/components/mps), applied with `kubectl apply -f` of the shipped
files, with the node agent's RBAC (plus the vGPU component's pods: patch, so that a denial on a pod
comes from the policy and not from RBAC).

The node agent writes with a token bound to a pod running on the cluster's node, so the token carries
the node-name claim; a second Node object, other-node, exists in the API only. The agent's, a
tenant's, gpulet-scheduler's and the admin's writes are the requests themselves (the merge patches,
deletes and creates kubectl label/annotate/taint/delete/create send), made through the official
client with each one's token alone (no client certificate), so that each check reads the API
server's own answer. Everything the test creates is removed when the module ends, pass or fail (the
cluster is shared with other scenarios)."""
import base64
import json
import re
import shutil
from types import SimpleNamespace

import pytest

import harness as h

OTHER = "other-node"
NS = h.NS
W = h.D / "admission"
# The test applies and removes deploy/'s objects: never on a cluster where gpulet was deployed.
MARK = "gpulet.test/admission-policy-test"
OWN = "gpulet-node-own-node"
EV = "gpulet-node-own-events"
TRUST = "gpulet-trusted-pod-annotations"
BIND = "gpulet-trusted-binding-annotations"
MPS = "gpulet-mps-one-tenant-per-node"
POLICIES = (OWN, EV, TRUST, BIND, MPS)
TRUST_MSG = ("gpulet.io/vgpu-node, -gpus-<i>, -bind-time, -assigned and tencent.com/vcuda-core-limit "
             "are written by gpulet only, and gpulet.io/vgpu-disable is set only at creation (where "
             "the webhook checks the namespace)")
TEST_PODS = ("vap-tenant-pod", "vap-other-pod", "vap-unbound", "vap-mps-own", "vap-mps-plain",
             "vap-mps-none", "vap-mps-other")
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


# --- what deploy/ ships ----------------------------------------------------------------------------


def docs(path, *wanted):
    """The YAML documents of path with those kinds and metadata names ("Kind/name")."""
    out = []
    for doc in re.split(r"^---[^\n]*\n", path.read_text(), flags=re.M):
        kind = re.search(r"^kind:\s*(\S+)", doc, re.M)
        name = re.search(r"^  name:\s*(\S+)", doc, re.M)
        if kind and name and f"{kind[1]}/{name[1]}" in wanted:
            out.append("---\n" + doc)
    return "".join(out)


def policies():
    """The namespace, the node agent's RBAC, both node policies, gpulet-scheduler's RBAC, the trusted
    annotation policies and the MPS tenant policy, as the files in deploy/ have them."""
    text = "".join("---\n" + (h.SRC / f"deploy/base/{f}.yaml").read_text()
                   for f in ("namespace", "rbac-node", "node-admission-policy"))
    text += docs(h.SRC / "deploy/components/vgpu/scheduler.yaml",
                 "ServiceAccount/gpulet-scheduler", "ClusterRole/gpulet-scheduler",
                 "ClusterRoleBinding/gpulet-scheduler",
                 f"ValidatingAdmissionPolicy/{TRUST}", f"ValidatingAdmissionPolicyBinding/{TRUST}",
                 f"ValidatingAdmissionPolicy/{BIND}", f"ValidatingAdmissionPolicyBinding/{BIND}")
    return text + "---\n" + (h.SRC / "deploy/components/mps/mps-tenant-policy.yaml").read_text()


def tenant_rbac():
    """A tenant: the service account vap-tenant in default, allowed to patch and update pods there."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "vap-tenant", "namespace": "default"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "vap-tenant", "namespace": "default"},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "list", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "vap-tenant", "namespace": "default"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vap-tenant"},
         "subjects": [{"kind": "ServiceAccount", "name": "vap-tenant", "namespace": "default"}]},
    ]


def apod(name, ns, node, sa="default"):
    """A busybox pod bound to node (no scheduler involved), with gpulet's assignment annotations as
    the extender would have written them."""
    p = h.pod(name, ns=ns, nodeName=node, serviceAccountName=sa)
    p["metadata"]["labels"] = {"app": "vap"}
    p["metadata"]["annotations"] = {"gpulet.io/vgpu-node": node, "gpulet.io/vgpu-assigned": "false",
                                    "team": "a"}
    return p


def event(name, kind, obj, instance):
    """An Event about kind/obj reported as node instance."""
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": kind, "name": obj, "apiVersion": "v1"}, "type": "Normal",
            "reason": "VapTest", "message": "admission policy test",
            "source": {"component": "gpulet-agent", "host": instance},
            "reportingComponent": "gpulet-agent", "reportingInstance": instance}


# --- requests and their answers --------------------------------------------------------------------


def node_path(name):
    return f"/api/v1/nodes/{name}"


def pod_path(name, ns="default"):
    return f"/api/v1/namespaces/{ns}/pods/{name}"


def meta_patch(k, path, field, key, value):
    """kubectl label/annotate (--overwrite): a merge patch of one label or annotation (None removes
    it)."""
    return k.raw("PATCH", path, {"metadata": {field: {key: value}}}, content_type=MERGE)


def taint(k, node, key, value=None, effect=None):
    """kubectl taint: the node's taints read as the user, then written with key's taint added
    (value and effect given) or all of key's removed."""
    status, obj = k.raw("GET", node_path(node))
    if status != 200:
        return status, obj
    taints = [t for t in obj.get("spec", {}).get("taints", []) or [] if t["key"] != key]
    if effect:
        taints.append({"key": key, "value": value, "effect": effect})
    return k.raw("PATCH", node_path(node), {"spec": {"taints": taints}}, content_type=MERGE)


def message(answer):
    status, body = answer
    text = body.get("message", body) if isinstance(body, dict) else body
    return f"HTTP {status}: {text}"


def ok(answer):
    return 200 <= answer[0] < 300


def allowed(desc, answer):
    assert ok(answer), f"allowed: {desc} ({message(answer)})"


def denied(desc, policy, msg, answer):
    """Refused by policy with msg (after the policy's name, as the API server words it)."""
    text = message(answer)
    print(f"      answer: {text}", flush=True)
    where = text.find(f"ValidatingAdmissionPolicy '{policy}'")
    assert not ok(answer) and where >= 0 and msg in text[where:], \
        f"denied by {policy}: {desc} ({text})"


# --- fixtures --------------------------------------------------------------------------------------


def cleanup(kube, cordoned_before):
    kube.delete_pods(*TEST_PODS)
    kube.delete_pods("vap-agent", ns=NS)
    for ev in ("vap-ev-own", "vap-ev-pod", "vap-ev-other", "vap-ev-forged", "vap-ev-secret"):
        kube.delete("v1", "Event", ev, ns="default")
    kube.delete("v1", "Node", OTHER)
    node = kube.node() or {}
    kube.raw("PATCH", node_path(h.NODE),
             {"metadata": {"labels": {"gpulet.io/vap-test": None},
                           "annotations": {"gpulet.io/vap-test": None}}}, content_type=MERGE)
    # What a denial that failed to deny would have left on the shared node (the bash script left it):
    # a kubernetes.io label, a cordon, taints that are not the cluster's.
    if "node-role.kubernetes.io/gpu" in node.get("metadata", {}).get("labels", {}):
        meta_patch(kube, node_path(h.NODE), "labels", "node-role.kubernetes.io/gpu", None)
    taints = node.get("spec", {}).get("taints", []) or []
    kept = [t for t in taints if t["key"] not in ("gpulet.io/vap-test", "example.com/evil")]
    if kept != taints:
        kube.raw("PATCH", node_path(h.NODE), {"spec": {"taints": kept}}, content_type=MERGE)
    if node.get("spec", {}).get("unschedulable") and not cordoned_before:
        kube.raw("PATCH", node_path(h.NODE), {"spec": {"unschedulable": None}}, content_type=MERGE)
    for obj in reversed(tenant_rbac()):
        kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], ns="default")
    h.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=60s",
              input=policies())
    shutil.rmtree(W, ignore_errors=True)


@pytest.fixture(scope="module")
def deployed(kube):
    """What deploy/ ships applied (kubectl apply -f), the vGPU component's pods: patch for the agent,
    the tenant's RBAC; everything removed after the module."""
    ns = kube.get(f"/api/v1/namespaces/{NS}")
    if ns is not None and not (ns["metadata"].get("labels") or {}).get(MARK):
        pytest.fail(f"namespace {NS} exists (gpulet deployed?); this test would replace and delete "
                    "its policies and RBAC", pytrace=False)
    cordoned_before = bool((kube.node() or {}).get("spec", {}).get("unschedulable"))
    cleanup(kube, cordoned_before)
    try:
        W.mkdir(parents=True, exist_ok=True)
        rc, out = h.kubectl("apply", "-f", "-", input=policies())
        (W / "apply.out").write_text(out)
        assert rc == 0, ("kubectl apply: namespace, node agent RBAC, both policies and bindings, "
                         f"gpulet-scheduler RBAC:\n{out}")
        # The vGPU component (deploy/components/vgpu/kustomization.yaml) lets the agent patch pods.
        answer = kube.raw("PATCH", "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpulet-node",
                          [{"op": "add", "path": "/rules/-",
                            "value": {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}}],
                          content_type=JSON_PATCH)
        assert ok(answer), f"clusterrole gpulet-node: pods patch added ({message(answer)})"
        for obj in tenant_rbac():
            kube.create(obj)
        answer = meta_patch(kube, f"/api/v1/namespaces/{NS}", "labels", MARK, "1")
        assert ok(answer), f"namespace {NS} labelled {MARK} ({message(answer)})"
        yield kube
    finally:
        cleanup(kube, cordoned_before)


def token(kube, sa, ns, bound_pod=None):
    """kubectl create token SA (bound to the pod when given)."""
    spec = {}
    if bound_pod:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1",
                                  "name": bound_pod["metadata"]["name"],
                                  "uid": bound_pod["metadata"]["uid"]}
    status, body = kube.raw("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                             "spec": spec})
    assert status == 201, f"a token for {ns}/{sa}: HTTP {status}: {body}"
    return body["status"]["token"]


def as_token(kube, name, tok):
    """The API authenticated by the token alone (no client certificate)."""
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": name,
           "clusters": [{"name": name, "cluster": {"server": kube.api.configuration.host,
                                                   "certificate-authority": str(h.D / "pki/ca.crt")}}],
           "users": [{"name": name, "user": {"token": tok}}],
           "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}
    path = W / f"{name}.kubeconfig"
    path.write_text(json.dumps(cfg))
    path.chmod(0o600)
    return h.Kube(path)


def claims(tok):
    part = tok.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def whoami(k):
    """kubectl auth whoami: a SelfSubjectReview (v1, else v1beta1 on an older API server)."""
    for version in ("v1", "v1beta1"):
        status, body = k.raw("POST", f"/apis/authentication.k8s.io/{version}/selfsubjectreviews",
                             {"apiVersion": f"authentication.k8s.io/{version}",
                              "kind": "SelfSubjectReview"})
        if status != 404:
            break
    assert status == 201, f"auth whoami: HTTP {status}: {body}"
    return body


@pytest.fixture(scope="module")
def users(deployed):
    """Node other-node in the API only; the agent's pod (service account gpulet-node) Running on the
    cluster's node; tokens of the agent (bound to that pod), gpulet-scheduler and the tenant; the
    policies in effect."""
    kube = deployed
    kube.create({"apiVersion": "v1", "kind": "Node",
                 "metadata": {"name": OTHER, "labels": {"kubernetes.io/hostname": OTHER}}})
    assert kube.node(OTHER) is not None, f"Node {OTHER} exists"
    kube.create(apod("vap-agent", NS, h.NODE, "gpulet-node"))
    kube.wait_running("vap-agent", 60, ns=NS)
    agent_pod = kube.pod("vap-agent", NS)
    where = f"{agent_pod['status'].get('phase')}/{agent_pod['spec'].get('nodeName')}"
    assert where == f"Running/{h.NODE}", \
        f"pod {NS}/vap-agent (service account gpulet-node) is Running on {h.NODE} ({where})"
    agent_token = token(kube, "gpulet-node", NS, agent_pod)
    u = SimpleNamespace(
        admin=kube, agent_token=agent_token,
        agent=as_token(kube, "agent", agent_token),
        scheduler=as_token(kube, "scheduler", token(kube, "gpulet-scheduler", NS)),
        tenant=as_token(kube, "tenant", token(kube, "vap-tenant", "default")))
    # A new policy takes effect once the API server's informer has it: wait for the first denial.
    h.wait_until(30, f"the agent's label of {OTHER} refused (the policies in effect)",
                 lambda: not ok(meta_patch(u.agent, node_path(OTHER), "labels",
                                           "gpulet.io/vap-test", "1")))
    return u


# --- tests -----------------------------------------------------------------------------------------


def test_policies_are_type_checked(deployed):
    # The API server type-checks the CEL when it stores a policy; an error shows in
    # status.typeChecking.
    for p in POLICIES:
        path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{p}"
        obj = h.poll(20, lambda: (lambda o: o if o and o.get("status", {}).get("observedGeneration")
                                  else None)(deployed.get(path)))
        status = obj.get("status", {}) if isinstance(obj, dict) else {}
        tc = (status.get("typeChecking") or {}).get("expressionWarnings")
        assert status.get("observedGeneration") and not tc, \
            (f"policy {p}: type-checked, no CEL warnings ({json.dumps(tc) if tc else 'none'}"
             f"{'' if status.get('observedGeneration') else '; unchecked'})")


def test_the_agent_token_names_its_node(users):
    c = claims(users.agent_token)
    shown = {"sub": c.get("sub"), "kubernetes.io": c.get("kubernetes.io")}
    print(f"agent token claims: {json.dumps(shown, separators=(',', ':'))}")
    node = ((c.get("kubernetes.io") or {}).get("node") or {}).get("name")
    assert node == h.NODE, f"the agent token's node claim names {h.NODE} ({node})"
    info = whoami(users.agent)["status"]["userInfo"]
    print(f"agent as the API server sees it: {json.dumps(info, separators=(',', ':'))}")
    seen = ((info.get("extra") or {}).get("authentication.kubernetes.io/node-name") or [None])[0]
    assert seen == h.NODE, ("the API server puts the node name in "
                            f"userInfo.extra[authentication.kubernetes.io/node-name] ({seen})")


def test_own_node_nodes(users):
    a, own = users.agent, node_path(h.NODE)
    allowed("the agent labels its own Node (gpulet.io/vap-test=1)",
            meta_patch(a, own, "labels", "gpulet.io/vap-test", "1"))
    allowed("the agent annotates its own Node",
            meta_patch(a, own, "annotations", "gpulet.io/vap-test", "1"))
    allowed("the agent sets a gpulet.io taint on its own Node",
            taint(a, h.NODE, "gpulet.io/vap-test", "1", "PreferNoSchedule"))
    allowed("the agent removes that taint", taint(a, h.NODE, "gpulet.io/vap-test"))
    label = users.admin.label("gpulet.io/vap-test")
    assert label == "1", f"its own Node carries the label ({label!r})"
    only_own = "the gpulet node agent may write only its own Node"
    denied(f"the agent labels {OTHER}", OWN, only_own,
           meta_patch(a, node_path(OTHER), "labels", "gpulet.io/vap-test", "1"))
    denied(f"the agent annotates {OTHER}", OWN, only_own,
           meta_patch(a, node_path(OTHER), "annotations", "gpulet.io/vap-test", "1"))
    only_meta = "the gpulet node agent may change only labels, annotations and gpulet.io taints of its Node"
    denied("the agent sets a kubernetes.io label on its own Node", OWN, only_meta,
           meta_patch(a, own, "labels", "node-role.kubernetes.io/gpu", ""))
    denied("the agent cordons its own Node", OWN, only_meta,
           a.raw("PATCH", own, {"spec": {"unschedulable": True}}, content_type=MERGE))
    denied("the agent sets a non-gpulet taint on its own Node", OWN, only_meta,
           taint(a, h.NODE, "example.com/evil", "1", "NoSchedule"))


def test_own_node_pods(users):
    admin, a = users.admin, users.agent
    admin.create(apod("vap-other-pod", "default", OTHER))
    bound = (admin.pod("vap-other-pod") or {}).get("spec", {}).get("nodeName")
    assert bound == OTHER, f"pod default/vap-other-pod is bound to {OTHER} ({bound})"
    only_bound = "the gpulet node agent may write only pods bound to its own node"
    denied(f"the agent annotates a pod bound to {OTHER}", OWN, only_bound,
           meta_patch(a, pod_path("vap-other-pod"), "annotations", "gpulet.io/vgpu-assigned", "true"))
    denied(f"the agent deletes a pod bound to {OTHER}", OWN, only_bound,
           a.raw("DELETE", pod_path("vap-other-pod")))
    agent_pod = pod_path("vap-agent", NS)
    allowed("the agent sets gpulet.io/vgpu-assigned on a pod bound to its node",
            meta_patch(a, agent_pod, "annotations", "gpulet.io/vgpu-assigned", "true"))
    only_vgpu = "the gpulet node agent may change only gpulet.io/vgpu-* annotations of pods"
    denied("the agent changes another annotation of a pod bound to its node", OWN, only_vgpu,
           meta_patch(a, agent_pod, "annotations", "team", "b"))
    denied("the agent changes a label of a pod bound to its node", OWN, only_vgpu,
           meta_patch(a, agent_pod, "labels", "app", "other"))
    denied("the agent changes the image of a pod bound to its node", OWN, only_vgpu,
           a.raw("PATCH", agent_pod, [{"op": "replace", "path": "/spec/containers/0/image",
                                       "value": "gpulet.test/evil:1"}], content_type=JSON_PATCH))


def test_own_events(users):
    a, admin = users.agent, users.admin
    events = "/api/v1/namespaces/default/events"
    try:
        allowed("the agent records an event about its own Node",
                a.raw("POST", events, event("vap-ev-own", "Node", h.NODE, h.NODE)))
        allowed("the agent records an event about a pod, as its node",
                a.raw("POST", events, event("vap-ev-pod", "Pod", "some-pod", h.NODE)))
        denied(f"the agent records an event about {OTHER}", EV, "only about pods and its own Node",
               a.raw("POST", events, event("vap-ev-other", "Node", OTHER, h.NODE)))
        denied(f"the agent records an event as {OTHER}", EV, "only as its own node",
               a.raw("POST", events, event("vap-ev-forged", "Pod", "some-pod", OTHER)))
        denied("the agent records an event about a Secret", EV, "only about pods and its own Node",
               a.raw("POST", events, event("vap-ev-secret", "Secret", "some-secret", h.NODE)))
    finally:
        for ev in ("vap-ev-own", "vap-ev-pod"):
            admin.delete("v1", "Event", ev, ns="default")


def test_trusted_pod_annotations(users):
    admin, t = users.admin, users.tenant
    admin.create(apod("vap-tenant-pod", "default", OTHER))
    p = pod_path("vap-tenant-pod")
    denied("a tenant changes gpulet.io/vgpu-assigned", TRUST, TRUST_MSG,
           meta_patch(t, p, "annotations", "gpulet.io/vgpu-assigned", "true"))
    denied("a tenant removes gpulet.io/vgpu-node", TRUST, TRUST_MSG,
           meta_patch(t, p, "annotations", "gpulet.io/vgpu-node", None))
    denied("a tenant adds gpulet.io/vgpu-gpus-0", TRUST, TRUST_MSG,
           meta_patch(t, p, "annotations", "gpulet.io/vgpu-gpus-0", "GPU-0"))
    denied("a tenant adds tencent.com/vcuda-core-limit", TRUST, TRUST_MSG,
           meta_patch(t, p, "annotations", "tencent.com/vcuda-core-limit", "100"))
    # The vGPU opt-out added after creation (the pod waiting behind a scheduling gate, say): the
    # webhook sees CREATE only, so the policy must refuse it, for a tenant and for the cluster admin
    # alike.
    denied("a tenant adds the vGPU opt-out gpulet.io/vgpu-disable after creation", TRUST, TRUST_MSG,
           meta_patch(t, p, "annotations", "gpulet.io/vgpu-disable", "true"))
    allowed("a tenant changes an annotation of its own (team=b)",
            meta_patch(t, p, "annotations", "team", "b"))
    # The extender writes its assignment in the Binding (pods/binding), so its service account has
    # no pod patch outside gpulet-system at all: RBAC refuses before any policy runs.
    answer = meta_patch(users.scheduler, p, "annotations", "gpulet.io/vgpu-gpus-0", "GPU-0")
    print(f"      answer (gpulet-scheduler): {message(answer)}")
    assert not ok(answer) and 'cannot patch resource "pods"' in message(answer), \
        ("forbidden by RBAC: the gpulet-scheduler service account annotates a tenant's pod "
         f"({message(answer)})")
    # The policy binds every user but gpulet's two, cluster administrators (system:masters)
    # included.
    answer = meta_patch(admin, p, "annotations", "gpulet.io/vgpu-assigned", "true")
    print(f"      answer (admin): {message(answer)}")
    assert not ok(answer) and TRUST_MSG in message(answer), \
        f"denied by {TRUST}: the cluster admin changes gpulet.io/vgpu-assigned ({message(answer)})"


def test_trusted_binding_annotations(users):
    # A Binding copies its annotations onto the pod.
    admin = users.admin
    unbound = h.pod("vap-unbound", schedulerName="no-such-scheduler")
    admin.create(unbound)

    def binding(annotations):
        return admin.raw("POST", pod_path("vap-unbound") + "/binding",
                         {"apiVersion": "v1", "kind": "Binding",
                          "metadata": {"name": "vap-unbound", "annotations": annotations},
                          "target": {"kind": "Node", "name": OTHER}})

    answer = binding({"gpulet.io/vgpu-gpus-0": "GPU-0", "gpulet.io/vgpu-node": OTHER})
    text = message(answer)
    print(f"      binding (admin): {text}")
    assert not ok(answer) and re.search(f"{BIND}.*only from gpulet", text), \
        ("denied by gpulet-trusted-binding-annotations: a Binding carrying gpulet.io/vgpu-gpus-0 "
         f"from the cluster admin ({text})")
    node = (admin.pod("vap-unbound") or {}).get("spec", {}).get("nodeName")
    assert not node, f"... and the pod stays unbound ({node})"
    answer = binding({"team": "b"})
    assert ok(answer), f"allowed: a Binding with annotations of its own binds ({message(answer)})"
    p = admin.pod("vap-unbound") or {}
    got = f"{p.get('spec', {}).get('nodeName')}/{(p.get('metadata', {}).get('annotations') or {}).get('team')}"
    assert got == f"{OTHER}/b", f"... its annotation is on the pod with the node ({got})"


def test_mps_one_tenant_per_node(users):
    # MPS clients of a node share /dev/shm (deploy/components/mps).
    admin = users.admin

    def mpod(name, resource, tenant=None):
        """A pod asking resource: 1, selecting gpulet.io/mps-tenant=tenant."""
        spec = {"schedulerName": "no-such-scheduler"}
        if tenant:
            spec["nodeSelector"] = {"gpulet.io/mps-tenant": tenant}
        return admin.raw("POST", "/api/v1/namespaces/default/pods", h.pod(name, {resource: 1}, **spec))

    answer = mpod("vap-mps-none", "nvidia.com/gpu.shared")
    print(f"      answer: {message(answer)}")
    assert not ok(answer) and re.search(f"{MPS}.*gpulet.io/mps-tenant: default", message(answer)), \
        f"denied by {MPS}: a pod asking nvidia.com/gpu.shared without gpulet.io/mps-tenant ({message(answer)})"
    answer = mpod("vap-mps-other", "nvidia.com/gpu.shared", "team-b")
    assert not ok(answer) and MPS in message(answer), \
        f"denied by {MPS}: a pod of default selecting team-b's MPS nodes ({message(answer)})"
    answer = mpod("vap-mps-own", "nvidia.com/gpu.shared", "default")
    assert ok(answer), f"allowed: a pod of default selecting default's MPS nodes ({message(answer)})"
    answer = mpod("vap-mps-plain", "example.com/widget")
    assert ok(answer), f"allowed: a pod asking a resource that is not MPS-shared ({message(answer)})"
