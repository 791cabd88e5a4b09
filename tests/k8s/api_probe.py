#!/usr/bin/env python3
"""The same API scenarios against the fake API server (testing/apiserver) and kube-apiserver.

Each scenario prints one line, `name: what the server answered`, with nothing that changes from run
to run (no uids, resource versions or times), so the two servers' transcripts can be compared with
one expected file: tests/k8s/api_probe.expected is what kube-apiserver v1.34 answered on the real
cluster (tests/cluster/test_api_probe.py checks that it still does) and what the fake must answer
(ctest k8s_api_probe_fake). Only what gpulet's clients (src/k8s, the agent, the extender, the DRA
driver) or the unit tests depend on is probed.

usage: api_probe.py (--fake BINARY | --url URL [--ca F --cert F --key F]) [--expect FILE]
  --fake BINARY  starts BINARY (gpulet-fake-apiserver), which prints its URL, and stops it after
  --expect FILE  compares the transcript with FILE: exit 1 and a diff when they differ
"""
import argparse, difflib, json, socket, ssl, subprocess, sys, time, urllib.error, urllib.parse
import urllib.request

NS = "default"
NODE = "probe-node"
PODS = ["probe-a", "probe-b", "probe-c", "probe-d"]


class Api:
    def __init__(self, url, ca=None, cert=None, key=None):
        self.url = url.rstrip("/")
        self.ctx = None
        if url.startswith("https"):
            self.ctx = ssl.create_default_context(cafile=ca)
            if cert:
                self.ctx.load_cert_chain(cert, key)

    def call(self, method, path, body=None, ctype="application/json"):
        """(code, decoded JSON body or None)"""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", ctype)
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=20) as r:
                code, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            code, raw = e.code, e.read()
        try:
            return code, json.loads(raw) if raw else None
        except ValueError:
            return code, {"raw": raw.decode(errors="replace")[:200]}

    def watch(self, path):
        """An open watch: a response whose readline() gives one event per line."""
        req = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        return urllib.request.urlopen(req, context=self.ctx, timeout=10)


def status(code, body):
    """A Status answer as `code reason "message"`."""
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return str(code)
    return '%d %s "%s"' % (code, body.get("reason", ""), body.get("message", ""))


def pod(name, labels, node=None, containers=True):
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "labels": labels},
         # A scheduler that does not exist: the real scheduler leaves these pods alone.
         "spec": {"schedulerName": "probe-none", "automountServiceAccountToken": False,
                  "containers": [{"name": "c", "image": "gpulet.test/busybox:1"}] if containers else []}}
    if node:
        p["spec"]["nodeName"] = node
    return p


def next_event(w):
    """The type of the next watch event ("" when the stream ends or goes quiet)."""
    try:
        line = w.readline()
    except (socket.timeout, TimeoutError):
        return "timeout"
    if not line:
        return "end"
    ev = json.loads(line)
    if ev["type"] == "ERROR":
        return "ERROR " + status(ev["object"].get("code", 0), ev["object"])
    return ev["type"] + " " + ev["object"]["metadata"]["name"]


def cleanup(api):
    for p in PODS:
        api.call("DELETE", "/api/v1/namespaces/%s/pods/%s?gracePeriodSeconds=0" % (NS, p))
    api.call("DELETE", "/api/v1/nodes/" + NODE)
    api.call("DELETE", "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims/probe-claim" % NS)
    # Forced deletes of pods are asynchronous only in name: wait until they are gone.
    for _ in range(100):
        if all(api.call("GET", "/api/v1/namespaces/%s/pods/%s" % (NS, p))[0] == 404 for p in PODS):
            return
        time.sleep(0.1)


def run(api):
    out = []

    def say(name, what):
        out.append("%s: %s" % (name, what))

    pods = "/api/v1/namespaces/%s/pods" % NS
    cleanup(api)
    code, body = api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                    "metadata": {"name": NODE, "labels": {"probe": "api"}}})
    say("node_create", code)

    # Create: the stored object, a second create, an invalid one.
    code, a = api.call("POST", pods, pod("probe-a", {"probe": "api", "slot": "a"}))
    spec = a.get("spec", {}) if isinstance(a, dict) else {}
    say("pod_create", "%d phase=%s nodeName=%s" % (code, a.get("status", {}).get("phase"),
                                                   "absent" if "nodeName" not in spec else repr(spec["nodeName"])))
    say("pod_create_again", status(*api.call("POST", pods, pod("probe-a", {"probe": "api"}))))
    say("pod_create_no_containers", status(*api.call("POST", pods, pod("probe-d", {}, containers=False))))
    api.call("POST", pods, pod("probe-b", {"probe": "api", "slot": "b"}))
    api.call("POST", pods, pod("probe-c", {"probe": "api", "slot": "c"}, node=NODE))
    say("pod_get_missing", status(*api.call("GET", pods + "/probe-missing")))

    # Lists and selectors.
    def names(q, coll=pods):
        code, body = api.call("GET", coll + "?" + urllib.parse.urlencode(q))
        if code != 200:
            return status(code, body)
        return "%d %s" % (code, ",".join(sorted(i["metadata"]["name"] for i in body["items"])) or "-")
    say("list_label_eq", names({"labelSelector": "probe=api"}))
    say("list_label_set", names({"labelSelector": "probe in (api),slot notin (b)"}))
    say("list_label_exists", names({"labelSelector": "probe,!slot"}))
    say("list_field_nodeName", names({"labelSelector": "probe=api", "fieldSelector": "spec.nodeName=" + NODE}))
    say("list_field_nodeName_empty", names({"labelSelector": "probe=api", "fieldSelector": "spec.nodeName="}))
    say("list_field_ne", names({"labelSelector": "probe=api", "fieldSelector": "metadata.name!=probe-a"}))
    say("list_field_pod_unsupported", names({"fieldSelector": "spec.foo=x"}))
    say("list_field_set_syntax", names({"fieldSelector": "metadata.name in (probe-a)"}))
    say("list_nodes_field_name", names({"fieldSelector": "metadata.name=" + NODE}, "/api/v1/nodes"))
    say("list_nodes_field_nodeName", names({"fieldSelector": "spec.nodeName=x"}, "/api/v1/nodes"))
    code, body = api.call("GET", pods + "?labelSelector=probe%3Dapi")
    say("list_has_resource_version", "%d %s" % (code, bool(body.get("metadata", {}).get("resourceVersion"))))

    # Patches: conflicts, content types, what the main resource and /status may change.
    code, a = api.call("GET", pods + "/probe-a")
    rv = a["metadata"]["resourceVersion"]
    merge = "application/merge-patch+json"
    stale = {"metadata": {"resourceVersion": "1", "labels": {"x": "1"}}}
    say("patch_stale_rv", status(*api.call("PATCH", pods + "/probe-a", stale, merge)))
    code, body = api.call("PATCH", pods + "/probe-a", {"metadata": {"resourceVersion": rv, "labels": {"x": "1"}}}, merge)
    say("patch_current_rv", "%d rv_changed=%s" % (code, body["metadata"]["resourceVersion"] != rv))
    code, body = api.call("PATCH", pods + "/probe-a", {"metadata": {"annotations": {"probe": "1"}}},
                          "application/strategic-merge-patch+json")
    say("patch_strategic", "%d annotation=%s" % (code, body.get("metadata", {}).get("annotations", {}).get("probe")))
    jp = [{"op": "test", "path": "/metadata/labels/x", "value": "2"},
          {"op": "replace", "path": "/metadata/labels/x", "value": "3"}]
    say("patch_json_test_fails", status(*api.call("PATCH", pods + "/probe-a", jp, "application/json-patch+json")))
    jp = [{"op": "add", "path": "/metadata/labels/y", "value": "1"}]
    code, body = api.call("PATCH", pods + "/probe-a", jp, "application/json-patch+json")
    say("patch_json", "%d y=%s" % (code, body["metadata"]["labels"].get("y")))
    say("patch_bad_content_type", status(*api.call("PATCH", pods + "/probe-a", {"metadata": {}}, "application/json")))
    say("patch_missing", status(*api.call("PATCH", pods + "/probe-missing", {"metadata": {}}, merge)))
    code, body = api.call("PATCH", pods + "/probe-a", {"status": {"phase": "Running"}}, merge)
    say("patch_main_sets_status", "%d phase=%s" % (code, body.get("status", {}).get("phase")))
    code, body = api.call("PATCH", pods + "/probe-a/status",
                          {"metadata": {"labels": {"z": "1"}}, "spec": {"schedulerName": "other"},
                           "status": {"phase": "Running"}}, merge)
    say("patch_status", "%d phase=%s label_z=%s schedulerName=%s" % (
        code, body["status"].get("phase"), body["metadata"]["labels"].get("z"), body["spec"]["schedulerName"]))
    code, body = api.call("GET", pods + "/probe-b")
    body["metadata"].pop("resourceVersion")
    body["metadata"]["labels"]["put"] = "1"
    code, body = api.call("PUT", pods + "/probe-b", body)
    say("put_without_rv", "%d put=%s" % (code, body.get("metadata", {}).get("labels", {}).get("put")))
    code, body = api.call("GET", "/api/v1/nodes/" + NODE)
    code, body = api.call("PATCH", "/api/v1/nodes/" + NODE, {"status": {"capacity": {"probe.gpulet.io/x": "1"}}}, merge)
    say("node_patch_main_sets_status", "%d capacity=%s" % (code, body.get("status", {}).get("capacity", {}).get("probe.gpulet.io/x")))
    code, body = api.call("PATCH", "/api/v1/nodes/%s/status" % NODE, {"status": {"capacity": {"probe.gpulet.io/x": "1"}}}, merge)
    say("node_patch_status", "%d capacity=%s" % (code, body.get("status", {}).get("capacity", {}).get("probe.gpulet.io/x")))

    # Binding.
    code, b = api.call("GET", pods + "/probe-b")
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "probe-b", "uid": b["metadata"]["uid"],
                            "annotations": {"probe.gpulet.io/bound": "yes"}},
               "target": {"kind": "Node", "name": NODE}}
    code, body = api.call("POST", pods + "/probe-b/binding", binding)
    say("bind", "%d %s" % (code, body.get("kind") if isinstance(body, dict) else body))
    code, body = api.call("GET", pods + "/probe-b")
    cond = [c["type"] + "=" + c["status"] for c in body["status"].get("conditions", [])]
    say("bind_result", "nodeName=%s conditions=%s annotation=%s" % (
        body["spec"].get("nodeName"), ",".join(cond),
        body["metadata"].get("annotations", {}).get("probe.gpulet.io/bound")))
    say("bind_again", status(*api.call("POST", pods + "/probe-b/binding", binding)))
    code, a = api.call("GET", pods + "/probe-a")
    wrong = dict(binding, metadata={"name": "probe-a", "uid": "00000000-0000-0000-0000-000000000000"})
    msg = status(*api.call("POST", pods + "/probe-a/binding", wrong))
    say("bind_wrong_uid", msg.replace(a["metadata"]["uid"], "UID"))

    # Watches.
    code, body = api.call("GET", pods + "?labelSelector=probe%3Dapi")
    rv = body["metadata"]["resourceVersion"]
    w = api.watch(pods + "?watch=true&labelSelector=probe%3Dapi&resourceVersion=" + rv)
    api.call("PATCH", pods + "/probe-a", {"metadata": {"labels": {"w": "1"}}}, merge)
    say("watch_from_list_rv", next_event(w))
    w.close()
    w = api.watch(pods + "?watch=true&fieldSelector=metadata.name%3Dprobe-a")
    say("watch_without_rv_first", next_event(w))
    w.close()
    w = api.watch(pods + "?watch=true&fieldSelector=metadata.name%3Dprobe-a&resourceVersion=0")
    say("watch_rv0_first", next_event(w))
    w.close()
    code, body = api.call("GET", pods + "?labelSelector=slot%3Da")
    w = api.watch(pods + "?watch=true&labelSelector=slot%3Da&resourceVersion=" + body["metadata"]["resourceVersion"])
    api.call("PATCH", pods + "/probe-a", {"metadata": {"labels": {"slot": "e"}}}, merge)
    api.call("PATCH", pods + "/probe-a", {"metadata": {"labels": {"slot": "a"}}}, merge)
    say("watch_selector_leave_enter", next_event(w) + ", " + next_event(w))
    w.close()
    t0 = time.monotonic()
    w = api.watch(pods + "?watch=true&labelSelector=probe%3Dnone&timeoutSeconds=1&resourceVersion=" + rv)
    ev = next_event(w)
    say("watch_timeout_seconds", "%s within_5s=%s" % (ev, time.monotonic() - t0 < 5))
    w.close()
    code, body = api.call("GET", "/api/v1/namespaces/%s/events?watch=true&timeoutSeconds=1" % NS)
    say("watch_events", code)

    # Deletes: a bound pod that is not terminal, a terminal one, an unbound one.
    code, body = api.call("GET", pods + "?labelSelector=probe%3Dapi")
    w = api.watch(pods + "?watch=true&fieldSelector=metadata.name%3Dprobe-b&resourceVersion=" + body["metadata"]["resourceVersion"])
    code, body = api.call("DELETE", pods + "/probe-b")
    say("delete_bound_running", "%d deletionTimestamp=%s" % (code, "deletionTimestamp" in body.get("metadata", {})))
    code, body = api.call("GET", pods + "/probe-b")
    say("delete_bound_running_after", "%d gracePeriod=%s" % (code, (body or {}).get("metadata", {}).get("deletionGracePeriodSeconds")))
    say("delete_bound_running_watch", next_event(w))
    w.close()
    api.call("PATCH", pods + "/probe-c/status", {"status": {"phase": "Failed"}}, merge)
    code, body = api.call("DELETE", pods + "/probe-c")
    say("delete_bound_failed", code)
    time.sleep(0.5)
    say("delete_bound_failed_after", status(*api.call("GET", pods + "/probe-c")))
    api.call("POST", pods, pod("probe-d", {"probe": "api"}))
    api.call("DELETE", pods + "/probe-d")
    time.sleep(0.5)
    say("delete_unbound_after", status(*api.call("GET", pods + "/probe-d")))
    say("delete_missing", status(*api.call("DELETE", pods + "/probe-missing")))

    # Events.
    ev = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "probe-"},
          "involvedObject": {"kind": "Pod", "namespace": NS, "name": "probe-a"},
          "reason": "Probe", "message": "probe", "type": "Normal", "source": {"component": "probe"}}
    code, body = api.call("POST", "/api/v1/namespaces/%s/events" % NS, ev)
    say("event_create_generate_name", "%d prefixed=%s" % (code, body["metadata"]["name"].startswith("probe-")))
    say("event_list_field", names({"fieldSelector": "involvedObject.name=probe-a,reason=Probe"},
                                  "/api/v1/namespaces/%s/events" % NS).split(" ")[0])
    say("event_list_field_unsupported", names({"fieldSelector": "spec.nodeName=x"}, "/api/v1/namespaces/%s/events" % NS))
    other = dict(ev, metadata={"name": "probe-ns", "namespace": "other"})
    say("event_create_other_namespace", status(*api.call("POST", "/api/v1/namespaces/%s/events" % NS, other)))

    # resource.k8s.io/v1 claims: names in messages are qualified by the group.
    claims = "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims" % NS
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "probe-claim"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "probe.gpulet.io"}}]}}}
    code, body = api.call("POST", claims, claim)
    say("claim_create", code)
    say("claim_create_again", status(*api.call("POST", claims, claim)))
    say("claim_get_missing", status(*api.call("GET", claims + "/probe-missing")))
    say("claim_patch_stale_rv", status(*api.call("PATCH", claims + "/probe-claim", stale, merge)))
    code, body = api.call("PATCH", claims + "/probe-claim", {"status": {"allocation": {"devices": {"results": []}}}}, merge)
    say("claim_patch_main_sets_status", "%d status=%s" % (code, "allocation" in body.get("status", {})))

    cleanup(api)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fake")
    ap.add_argument("--url")
    ap.add_argument("--ca")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--expect")
    a = ap.parse_args()
    proc = None
    if a.fake:
        proc = subprocess.Popen([a.fake], stdout=subprocess.PIPE, text=True)
        a.url = proc.stdout.readline().strip()
        if not a.url.startswith("http"):
            sys.exit("api_probe: %s printed no URL" % a.fake)
    if not a.url:
        sys.exit("api_probe: give --fake BINARY or --url URL")
    try:
        lines = run(Api(a.url, a.ca, a.cert, a.key))
    finally:
        if proc:
            proc.terminate()
            proc.wait(10)
    print("\n".join(lines))
    if a.expect:
        want = [l for l in open(a.expect).read().splitlines() if l and not l.startswith("#")]
        diff = list(difflib.unified_diff(want, lines, a.expect, "this server", lineterm=""))
        if diff:
            print("\n".join(diff))
            sys.exit("api_probe: the server's answers differ from %s" % a.expect)


if __name__ == "__main__":
    main()
