#!/usr/bin/env python3
"""What each gpulet ServiceAccount did on the real API server, from its audit log (Metadata level).

Usage: rbac_audit.py AUDIT_LOG MANIFESTS.yaml
MANIFESTS is the applied install (`kubectl kustomize`): its (Cluster)RoleBindings say which rules each
gpulet-system ServiceAccount holds. Prints, per account, every (verb, group, resource[/sub]) it used
with the answers it got, and every granted verb it never used. Exits 1 when any request of a gpulet
account was refused with 403 (RBAC or an admission policy), or when the node agent read pods
without selecting its own node's, or listed or watched nodes without selecting its own by name
(RBAC cannot scope list/watch by field selector, so the agent's ClusterRole allows reading every
pod and node; this is the proof that it only ever asks for its node's).
"""
import collections, json, sys, urllib.parse, yaml

log, manifests = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(manifests)) if d]
roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d.get("rules", [])
         for d in docs if d["kind"] in ("ClusterRole", "Role")}
grants = collections.defaultdict(list)  # account -> [(apiGroups, resources, verbs, resourceNames)]
for d in docs:
    if d["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
        continue
    ref = d["roleRef"]
    ns = d["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
    for s in d.get("subjects", []):
        if s["kind"] == "ServiceAccount" and s.get("namespace") == "gpulet-system":
            for r in roles.get((ref["kind"], ns, ref["name"]), []):
                grants[s["name"]].append(r)

used = collections.defaultdict(collections.Counter)  # account -> (verb, group, res) -> count
span = {}  # account -> [first, last] requestReceivedTimestamp (RFC 3339, sortable as text)
codes = collections.defaultdict(collections.Counter)
refused = []
unscoped = []  # the node agent's pod (node) lists and watches without spec.nodeName= (metadata.name=)
prefix = "system:serviceaccount:gpulet-system:"
for line in open(log):
    e = json.loads(line)
    user = e.get("user", {}).get("username", "")
    if not user.startswith(prefix) or e.get("stage") != "ResponseComplete":
        continue
    sa = user[len(prefix):]
    o = e.get("objectRef") or {}
    res = o.get("resource", e.get("requestURI", "?"))
    if o.get("subresource"):
        res += "/" + o["subresource"]
    key = (e["verb"], o.get("apiGroup", ""), res)
    code = e.get("responseStatus", {}).get("code", 0)
    used[sa][key] += 1
    ts = e.get("requestReceivedTimestamp", "")
    if ts:
        first, last = span.get(sa, [ts, ts])
        span[sa] = [min(first, ts), max(last, ts)]
    codes[sa][(key, code)] += 1
    uri = e.get("requestURI", "")
    scope = {"pods": "spec.nodeName=", "nodes": "metadata.name="}.get(res)
    if sa == "gpulet-node" and scope and e["verb"] in ("list", "watch"):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(uri).query)
        selectors = ",".join(query.get("fieldSelector", [])).split(",")
        if not any(s.startswith(scope) and len(s) > len(scope) for s in selectors):
            unscoped.append(f"{sa}: {e['verb']} {uri}")
    if code == 403:
        refused.append(f"{sa}: {e['verb']} {e.get('requestURI')} -> 403 {e.get('responseStatus', {}).get('message', '')[:200]}")

def covers(rule, verb, group, res):
    return ((verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
            and group in rule.get("apiGroups", [""]) and res in rule.get("resources", []))

for sa in sorted(set(grants) | set(used)):
    print(f"== {sa}")
    for (verb, group, res), n in sorted(used[sa].items()):
        answers = ",".join(f"{c}x{m}" for (k, c), m in sorted(codes[sa].items()) if k == (verb, group, res))
        print(f"  used   {verb:6} {group or 'core'}/{res}  ({answers})")
    for rule in grants[sa]:
        for group in rule.get("apiGroups", [""]):
            for res in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    # list/watch arrive as the verbs list/watch; get with a resourceName as get.
                    if not any(v == verb and g == group and r == res for (v, g, r) in used[sa]):
                        names = rule.get("resourceNames")
                        print(f"  unused {verb:6} {group or 'core'}/{res}" + (f" {names}" if names else ""))
# What each account costs the API server: requests per minute over the span it was active (a
# watch counts once, when it starts). Times: RFC 3339 with microseconds.
from datetime import datetime
def parse(ts):
    return datetime.strptime(ts[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
for sa, (first, last) in sorted(span.items()):
    minutes = max((parse(last) - parse(first)).total_seconds() / 60, 1 / 60)
    by_verb = collections.Counter()
    for (verb, group, res), n in used[sa].items():
        by_verb[verb] += n
    total = sum(by_verb.values())
    print(f"figure: {sa}: {total} requests in {minutes:.1f} min = {total / minutes:.1f}/min (" +
          ", ".join(f"{v} {n}" for v, n in sorted(by_verb.items())) + ")")
for r in refused:
    print("REFUSED " + r)
for r in unscoped:
    print("UNSCOPED " + r)
pod_reads = sum(n for (v, g, r), n in used["gpulet-node"].items() if r == "pods" and v in ("list", "watch"))
node_reads = sum(n for (v, g, r), n in used["gpulet-node"].items() if r == "nodes" and v in ("list", "watch"))
print(f"figure: gpulet-node pod lists and watches: {pod_reads}, node lists and watches: {node_reads}, "
      f"of them without its node's field selector: {len(unscoped)}")
sys.exit(1 if refused or unscoped else 0)
