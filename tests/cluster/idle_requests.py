#!/usr/bin/env python3
"""What one node's agent asks of the API server while nothing changes, from an audit-log window.

Usage: idle_requests.py AUDIT_LOG_WINDOW SECONDS MAX_PER_MINUTE
AUDIT_LOG_WINDOW holds the audit events (Metadata level, JSON lines) of a window of SECONDS in
which no pod or config of the node changed. Counts the requests of the node agent's
ServiceAccount received in it (stage ResponseComplete; a watch that stays open the whole window is
not a request of the window, and one the agent reopened is) and prints them per verb and resource,
with the rate per minute: the per-node steady-state cost, which a thousand nodes multiply.
Prints "OVER" for any verb and resource asked for more than MAX_PER_MINUTE times a minute.
"""
import collections, json, sys

log, seconds, cap = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
agent = "system:serviceaccount:gpulet-system:gpulet-node"
count = collections.Counter()
for line in open(log):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("user", {}).get("username") != agent or e.get("stage") != "ResponseComplete":
        continue
    o = e.get("objectRef") or {}
    res = o.get("resource", "?") + ("/" + o["subresource"] if o.get("subresource") else "")
    count[(e["verb"], res)] += 1
total = sum(count.values())
detail = ", ".join(f"{v} {r} {n}" for (v, r), n in sorted(count.items())) or "none"
print(f"figure: idle agent, one node: {total} API requests in {seconds:.0f} s = "
      f"{total * 60 / seconds:.1f}/min ({detail})")
for (v, r), n in sorted(count.items()):
    if n * 60 / seconds > cap:
        print(f"OVER: {v} {r} {n * 60 / seconds:.1f}/min (at most {cap:g})")
