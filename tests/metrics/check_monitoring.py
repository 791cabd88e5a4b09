#!/usr/bin/env python3
"""Static checks of deploy/monitoring (run by ctest):
  * the PrometheusRule's spec.groups equal the plain rules file's groups;
  * every PromQL expression of the Grafana dashboard parses (promtool check rules on a generated
    rules file, one recording rule per expression, template variables replaced by a regex);
  * the dashboard has the cluster, node, GPU and pod rows.
Exit 77 when promtool or python3-yaml is missing (ctest SKIP_RETURN_CODE)."""
import json, os, shutil, subprocess, sys, tempfile

src = sys.argv[1]
mon = os.path.join(src, "deploy", "monitoring")
try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml missing"); sys.exit(77)
if not shutil.which("promtool"):
    print("SKIP: promtool missing"); sys.exit(77)

plain = yaml.safe_load(open(os.path.join(mon, "gpulet-rules.yml")))["groups"]
crd = yaml.safe_load(open(os.path.join(mon, "prometheusrule.yaml")))["spec"]["groups"]
if plain != crd:
    print("FAIL: prometheusrule.yaml spec.groups differ from gpulet-rules.yml"); sys.exit(1)

dash = json.load(open(os.path.join(mon, "dashboards", "gpulet-gpu.json")))
rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
if rows != ["Cluster", "Node", "GPU", "Pod"]:
    print("FAIL: dashboard rows are", rows); sys.exit(1)
exprs = []
for p in dash["panels"]:
    for t in p.get("targets", []):
        exprs.append((p["title"], t["expr"]))
rules = {"groups": [{"name": "dashboard", "rules": [
    {"record": "dashboard:expr_%d" % i,
     "expr": e.replace("$node", ".*").replace("$gpu", ".*").replace("$namespace", ".*").replace("$pod", ".*")}
    for i, (_, e) in enumerate(exprs)]}]}
with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
    yaml.safe_dump(rules, f)
r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
os.unlink(f.name)
if r.returncode != 0:
    print("FAIL: dashboard expressions do not parse:\n" + r.stdout + r.stderr); sys.exit(1)
print("ok: rules in sync; %d dashboard expressions parse" % len(exprs))
