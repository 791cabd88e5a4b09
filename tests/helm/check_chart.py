#!/usr/bin/env python3
"""Checks of the helm chart deploy/helm/gpulet (run by ctest, once per helm major version).

  check_chart.py lint     SRC HELM           helm lint --strict over the values matrix: no WARNING/ERROR
  check_chart.py template SRC HELM           helm template over the values matrix; each rendering
                                             parses and has what its values ask for
  check_chart.py schema   SRC HELM           a mistyped --set fails with values.schema.json's message,
                                             cross-value mistakes with the chart's own
  check_chart.py drift    SRC HELM KUBECTL   for each kustomize entry point, `helm template` with the
                                             equivalent values (tests/helm/equivalents/) gives the
                                             same objects as `kubectl kustomize`, after normalising

Exit 77 (ctest skip) when python3-yaml is missing. One line per failure, naming the case."""
import json, os, subprocess, sys

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml missing"); sys.exit(77)

NS = "gpulet-system"
RELEASE_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration",
                  "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "DeviceClass"}

failures = []


def fail(case, msg):
    failures.append(f"FAIL {case}: {msg}")
    print(failures[-1])


def helm_template(helm, chart, sets=(), values_files=(), skip_tests=True):
    cmd = [helm, "template", "gpulet", chart, "--namespace", NS]
    if skip_tests:
        cmd.append("--skip-tests")
    for f in values_files:
        cmd += ["-f", f]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def find(objs, kind, name):
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    return None


def container(ds, name):
    spec = ds["spec"]["template"]["spec"]
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(name)


def ds(o):
    return find(o, "DaemonSet", "gpulet-node")


def uninstall_on_delete(o):
    """The agent pod's uninstall-on-delete container: `gpulet uninstall --on-owner-delete` with the
    host's root, its pod's name and namespace from the downward API, the extra arguments and
    environment given; the Role lets the agent's account read only its own DaemonSet; no hooks."""
    un = container(ds(o), "uninstall-on-delete")
    if un["command"] != ["gpulet", "uninstall"] or un["args"] != [
            "--on-owner-delete", "--host-root=/host", "--pod-name=$(POD_NAME)",
            "--pod-namespace=$(POD_NAMESPACE)", "--restart=none"]:
        return f"uninstall-on-delete command: {un['command']} {un['args']}"
    if un["volumeMounts"] != [{"name": "host-root", "mountPath": "/host"}]:
        return f"uninstall-on-delete mounts: {un['volumeMounts']}"
    env = {e["name"]: e.get("valueFrom", e.get("value")) for e in un["env"]}
    if env != {"POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
               "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}}, "X": "a"}:
        return f"uninstall-on-delete env: {env}"
    rules = find(o, "Role", "gpulet-node")["rules"]
    if rules != [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                  "resourceNames": ["gpulet-node"], "verbs": ["get", "list", "watch"]}]:
        return f"the agent's Role grants more than reading its DaemonSet: {rules}"
    binding = find(o, "RoleBinding", "gpulet-node")
    if binding["subjects"] != [{"kind": "ServiceAccount", "name": "gpulet-node", "namespace": NS}]:
        return f"RoleBinding gpulet-node: {binding['subjects']}"
    hooks = [x["kind"] + "/" + x["metadata"]["name"] for x in o
             if x["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-delete"]
    if hooks:
        return f"pre-delete hooks remain: {hooks}"
    return None


def extra_values(o):
    """install.args, agent.args, env, extraVolumes/extraVolumeMounts and exporter.port reach the
    containers they are for."""
    spec = ds(o)["spec"]["template"]["spec"]
    inst, agent = container(ds(o), "install"), container(ds(o), "agent")
    if inst["args"][-1] != "--simulate=x" or agent["args"][-2:] != ["--metrics-address=:19400", "--a=b"]:
        return f"extra args: install {inst['args']}, agent {agent['args']}"
    if agent["ports"] != [{"name": "metrics", "containerPort": 19400, "protocol": "TCP"}]:
        return f"agent ports: {agent['ports']}"
    for c in (inst, agent, container(ds(o), "uninstall-on-delete")):
        if {"name": "X", "value": "a"} not in c["env"]:
            return f"env X not in container {c['name']}"
    if {"name": "t", "hostPath": {"path": "/t"}} not in spec["volumes"] or \
            agent["volumeMounts"][-1] != {"name": "t", "mountPath": "/t"}:
        return "extra volume t not mounted at /t in the agent"
    return None


# The values matrix: (case name, --set list, check(objs) -> error message or None).
def matrix():
    def agent_args(o):
        return container(find(o, "DaemonSet", "gpulet-node"), "agent")["args"]

    def node_rules(o):
        return find(o, "ClusterRole", "gpulet-node")["rules"]

    def has_rule(rules, res, verb):
        return any(res in r["resources"] and verb in r["verbs"] for r in rules)

    def scheduler_args(o):
        return container(find(o, "Deployment", "gpulet-scheduler"), "scheduler")["args"]

    def scheduler_config(o):
        return find(o, "ConfigMap", "gpulet-kube-scheduler-config")["data"]["kube-scheduler-config.yaml"]

    return [
        ("defaults", [], lambda o: None if ds(o) and find(o, "Deployment", "gpulet-scheduler")
         and find(o, "ConfigMap", "gpulet-config") and not find(o, "Namespace", NS)
         else "missing the agent, the scheduler or the config, or renders the Namespace"),
        ("runtime=crio", ["runtime=crio"], lambda o: None if container(ds(o), "install")["env"][0]
         == {"name": "GPULET_RUNTIME", "value": "crio"} else "install env is not crio"),
        ("migStrategy=mixed", ["migStrategy=mixed"], lambda o: None if yaml.safe_load(
            find(o, "ConfigMap", "gpulet-config")["data"]["config.yaml"])["flags"]["migStrategy"]
         == "mixed" else "config migStrategy is not mixed"),
        ("deviceListStrategy", ["deviceListStrategy={envvar,cdi-cri}", "compatWithCPUManager=true",
                                "deviceIDStrategy=index"],
         lambda o: None if yaml.safe_load(find(o, "ConfigMap", "gpulet-config")["data"]["config.yaml"])
         ["flags"]["plugin"] == {"passDeviceSpecs": True, "deviceListStrategy": ["envvar", "cdi-cri"],
                                 "deviceIDStrategy": "index"} else "plugin flags not as set"),
        ("config.map", ["config.map.default=version: v1", "config.map.a100=version: v1",
                        "config.default=default"],
         lambda o: None if "--config-dir=/etc/gpulet/configs" in agent_args(o)
         and "--config-default=default" in agent_args(o)
         and "--config-node-label=nvidia.com/device-plugin.config" in agent_args(o)
         and sorted(find(o, "ConfigMap", "gpulet-device-plugin-configs")["data"]) == ["a100", "default"]
         and not find(o, "ConfigMap", "gpulet-config")
         and has_rule(node_rules(o), "nodes", "watch") else "per-node config not wired"),
        ("config.map as mappings", ["config.map.t4.version=v1", "config.map.t4.flags.migStrategy=mixed"],
         lambda o: None if yaml.safe_load(find(o, "ConfigMap", "gpulet-device-plugin-configs")["data"]["t4"])
         == {"version": "v1", "flags": {"migStrategy": "mixed"}}
         and not any(a.startswith("--config-default") for a in agent_args(o))
         else "a config given as a mapping is not its YAML text"),
        ("config.name", ["config.name=my-configs", "config.default=t4"],
         lambda o: None if {v["name"]: v for v in ds(o)["spec"]["template"]["spec"]["volumes"]}
         ["config"]["configMap"] == {"name": "my-configs"} and "--config-default=t4" in agent_args(o)
         and not find(o, "ConfigMap", "gpulet-device-plugin-configs") else "config.name not mounted"),
        ("gfd off", ["gfd.enabled=false"], lambda o: None if "--labels-output=/tmp/gpulet-features"
         in agent_args(o) and "nfd-features" not in str(ds(o)) else "labels still reach NFD"),
        ("vgpu off", ["vgpu.enabled=false"], lambda o: None if not find(o, "Deployment", "gpulet-scheduler")
         and not find(o, "ValidatingWebhookConfiguration", "gpulet-vgpu")
         and not has_rule(node_rules(o), "pods", "patch") else "vGPU objects or pod patch remain"),
        ("vgpu gpus", ["vgpu.gpus=4\\,5", "vgpu.policy=spread"],
         lambda o: None if yaml.safe_load(find(o, "ConfigMap", "gpulet-config")["data"]["config.yaml"])
         ["gpulet"]["vgpu"]["gpus"] == "4,5" and "--policy=spread" in
         container(find(o, "Deployment", "gpulet-scheduler"), "scheduler")["args"] else "vgpu.gpus/policy"),
        ("vgpu pods alone by default", [], lambda o: None if "--extender-all-pods" not in
         scheduler_args(o) and "managedResources" in scheduler_config(o)
         else "the extender is sent every pod by default"),
        ("vgpu allPods", ["vgpu.allPods=true"], lambda o: None if "--extender-all-pods" in
         scheduler_args(o) and "managedResources" not in scheduler_config(o)
         else "allPods: no flag, or managedResources still in the extender entry"),
        ("exporter off", ["exporter.enabled=false"],
         lambda o: None if not find(o, "Service", "gpulet-metrics")
         and not find(o, "NetworkPolicy", "gpulet-metrics") else "metrics Service or policy remains"),
        ("exporter policy by default", [],
         lambda o: None if (find(o, "NetworkPolicy", "gpulet-metrics") or {}).get("spec", {}).get("ingress")
         == [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
              "ports": [{"port": "metrics", "protocol": "TCP"}]}] else "no NetworkPolicy for :9400 by default"),
        ("exporter policy off", ["exporter.networkPolicy.enabled=false"],
         lambda o: None if not find(o, "NetworkPolicy", "gpulet-metrics") else "policy remains"),
        ("monitoring", ["exporter.serviceMonitor.enabled=true", "exporter.prometheusRule.enabled=true",
                        "exporter.serviceMonitor.interval=30s",
                        "exporter.serviceMonitor.additionalLabels.release=prom"],
         lambda o: None if find(o, "ServiceMonitor", "gpulet-metrics")["spec"]["endpoints"][0]["interval"]
         == "30s" and find(o, "ServiceMonitor", "gpulet-metrics")["metadata"]["labels"]["release"] == "prom"
         and find(o, "PrometheusRule", "gpulet-gpu-alerts")["spec"]["groups"] else "monitoring objects"),
        ("cert-manager", ["certificates.source=cert-manager"],
         lambda o: None if find(o, "Certificate", "gpulet-scheduler") and not find(o, "Role", "gpulet-scheduler-tls")
         and "cert-manager.io/inject-ca-from" in find(o, "ValidatingWebhookConfiguration", "gpulet-vgpu")
         ["metadata"]["annotations"] else "cert-manager objects"),
        ("image", ["image.registry=registry.example", "image.repository=gpu/gpulet", "image.tag=1.2.3",
                   "image.pullPolicy=Always", "imagePullSecrets={regcred}"],
         lambda o: None if container(ds(o), "agent")["image"] == "registry.example/gpu/gpulet:1.2.3"
         and container(ds(o), "agent")["imagePullPolicy"] == "Always"
         and ds(o)["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
         and container(find(o, "Deployment", "gpulet-scheduler"), "scheduler")["image"]
         == "registry.example/gpu/gpulet:1.2.3" else "image fields"),
        ("numeric image.tag", ["image.tag=2"],
         lambda o: None if container(ds(o), "agent")["image"] == "ghcr.io/gpulet/gpulet:2"
         else "a tag given as a number is not used as written"),
        ("placement", ["nodeSelector.gpu=true", "nodeSelector.zone=1", "priorityClassName=gpu-critical", "tolerations=null",
                       "resources.limits.memory=256Mi", "scheduler.nodeSelector.role=infra"],
         lambda o: None if ds(o)["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "true", "zone": "1"}
         and ds(o)["spec"]["template"]["spec"]["priorityClassName"] == "gpu-critical"
         and "tolerations" not in ds(o)["spec"]["template"]["spec"]
         and container(ds(o), "agent")["resources"]["limits"]["memory"] == "256Mi"
         and find(o, "Deployment", "gpulet-scheduler")["spec"]["template"]["spec"]["nodeSelector"]
         == {"role": "infra"} else "placement fields"),
        ("hostNetwork", ["hostNetwork=true"],
         lambda o: None if ds(o)["spec"]["template"]["spec"]["hostNetwork"] is True
         and ds(o)["spec"]["template"]["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
         and find(o, "Pod", "gpulet-test-gpu")["spec"]["hostNetwork"] is True else "hostNetwork not set"),
        ("uninstall on delete", ["uninstall.args={--restart=none}", "env[0].name=X", "env[0].value=a"],
         uninstall_on_delete),
        ("uninstall off", ["uninstall.enabled=false"],
         lambda o: None if not any(c["name"] == "uninstall-on-delete"
                                   for c in ds(o)["spec"]["template"]["spec"]["containers"])
         and not find(o, "Role", "gpulet-node") else "uninstall-on-delete container or its Role remains"),
        ("extra args, env, volumes, port", ["install.args={--simulate=x}", "agent.args={--a=b}",
                                            "env[0].name=X", "env[0].value=a", "extraVolumes[0].name=t",
                                            "extraVolumes[0].hostPath.path=/t", "extraVolumeMounts[0].name=t",
                                            "extraVolumeMounts[0].mountPath=/t", "exporter.port=19400"],
         extra_values),
    ]


def cmd_lint(src, helm):
    chart = os.path.join(src, "deploy/helm/gpulet")
    for case, sets, _ in matrix():
        cmd = [helm, "lint", "--strict", chart]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True)
        out = p.stdout + p.stderr
        bad = [l for l in out.splitlines() if "[WARNING]" in l or "[ERROR]" in l]
        if p.returncode != 0 or bad:
            fail(f"lint {case}", "; ".join(bad) or out.strip())
        else:
            print(f"ok   lint {case}")


def cmd_template(src, helm):
    chart = os.path.join(src, "deploy/helm/gpulet")
    for case, sets, check in matrix():
        rc, out, err = helm_template(helm, chart, sets, skip_tests=False)
        if rc != 0:
            fail(f"template {case}", err.strip()); continue
        try:
            objs = docs(out)
            msg = check(objs)
        except Exception as e:  # a missing object or field is a failure of this case
            msg = f"{type(e).__name__}: {e}"
        if msg:
            fail(f"template {case}", msg)
        elif not find(objs, "Pod", "gpulet-test-gpu"):
            fail(f"template {case}", "no helm test pod")
        else:
            print(f"ok   template {case}: {len(objs)} objects")


# (--set, text the error must contain) -- helm 3 and helm 4 word schema errors differently, so
# the expected text is the part both name: the value's path and what is wrong.
BAD = [
    ("runtime=containerdd", ["runtime", "containerd", "crio", "docker"]),
    ("migStrateggy=mixed", ["migStrateggy", "not allowed"]),
    ("migStrategy=both", ["migStrategy", "mixed"]),
    ("gfd.enabled=yes", ["gfd", "enabled", "boolean"]),
    ("vgpu.gpus=all;rm", ["vgpu", "gpus"]),
    ("certificates.source=vault", ["certificates", "source", "cert-manager"]),
    ("exporter.serviceMonitor.interval=15", ["interval"]),
    ("image.pullPolicy=Sometimes", ["pullPolicy", "IfNotPresent"]),
    ("config.name=My_Configs", ["config", "name"]),
    ("deviceListStrategy={envvars}", ["deviceListStrategy"]),
    ("exporter.port=94000", ["exporter", "port"]),
    ("uninstall.kubectlImage=x", ["kubectlImage", "not allowed"]),
    # cross-value rules, from the templates' fail
    ("config.name=a,config.map.x=y", ["config.name and config.map are exclusive"]),
    ("config.map.a=x,config.default=b", ['config.default "b" is not a key of config.map (a)']),
    ("vgpu.enabled=false,vgpu.gpus=all", ["vgpu.gpus needs vgpu.enabled=true"]),
    ("exporter.enabled=false,exporter.serviceMonitor.enabled=true",
     ["exporter.serviceMonitor.enabled needs exporter.enabled=true"]),
]


def cmd_schema(src, helm):
    chart = os.path.join(src, "deploy/helm/gpulet")
    for s, want in BAD:
        rc, out, err = helm_template(helm, chart, [s])
        if rc == 0:
            fail(f"schema {s}", "rendered without an error"); continue
        missing = [w for w in want if w not in err]
        if missing:
            fail(f"schema {s}", f"error lacks {missing}: {err.strip()}")
        else:
            print(f"ok   schema {s}: {err.strip().splitlines()[-1]}")


def squeeze_cel(o):
    """CEL ignores whitespace; kustomize re-emits the more-indented lines of folded (>-) scalars
    with doubled newlines, so expressions and messages are compared with whitespace runs as one."""
    if isinstance(o, dict):
        return {k: " ".join(v.split()) if k in ("expression", "message") and isinstance(v, str)
                else squeeze_cel(v) for k, v in o.items()}
    if isinstance(o, list):
        return [squeeze_cel(x) for x in o]
    return o


def normalise(objs):
    """Objects keyed by kind/namespace/name, without what only one of the tools adds."""
    out = {}
    for o in objs:
        md = o.setdefault("metadata", {})
        if "helm.sh/hook" in md.get("annotations", {}):
            continue  # helm-only (the helm test pod)
        labels = md.get("labels", {})
        for k in RELEASE_LABELS:
            labels.pop(k, None)
        if not labels:
            md.pop("labels", None)
        if o["kind"] in CLUSTER_SCOPED:
            md.pop("namespace", None)
        if o["kind"] == "ConfigMap":
            for k, v in list(o.get("data", {}).items()):
                if k.endswith((".yaml", ".yml")):
                    o["data"][k] = yaml.safe_load(v)
                elif k.endswith(".json"):
                    o["data"][k] = json.loads(v)
        out[f'{o["kind"]} {md.get("namespace", "")}/{md["name"]}'] = squeeze_cel(o)
    return out


def differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                yield f"{path}.{k}: only in helm: {json.dumps(b[k])[:160]}"
            elif k not in b:
                yield f"{path}.{k}: only in kustomize: {json.dumps(a[k])[:160]}"
            else:
                yield from differences(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: kustomize {json.dumps(a)[:160]} != helm {json.dumps(b)[:160]}"


def cmd_drift(src, helm, kubectl):
    chart = os.path.join(src, "deploy/helm/gpulet")
    eq = os.path.join(src, "tests/helm/equivalents")
    entries = {"deploy": os.path.join(src, "deploy")}
    for d in sorted(os.listdir(os.path.join(src, "deploy/overlays"))):
        entries[d] = os.path.join(src, "deploy/overlays", d)
    for name, path in entries.items():
        values = os.path.join(eq, f"{name}.yaml")
        if not os.path.exists(values):
            fail(f"drift {name}", f"no equivalent values file tests/helm/equivalents/{name}.yaml"); continue
        k = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
        if k.returncode != 0:
            fail(f"drift {name}", f"kubectl kustomize: {k.stderr.strip()}"); continue
        rc, out, err = helm_template(helm, chart, values_files=[values])
        if rc != 0:
            fail(f"drift {name}", f"helm template: {err.strip()}"); continue
        a, b = normalise(docs(k.stdout)), normalise(docs(out))
        diffs = [f"{key}: missing from the chart" for key in sorted(set(a) - set(b))]
        diffs += [f"{key}: only in the chart" for key in sorted(set(b) - set(a))]
        for key in sorted(set(a) & set(b)):
            diffs += [f"{key} {d}" for d in differences(a[key], b[key])]
        if diffs:
            fail(f"drift {name}", f"{len(diffs)} differences:\n  " + "\n  ".join(diffs))
        else:
            print(f"ok   drift {name}: {len(a)} objects identical")


def main():
    if len(sys.argv) < 4:
        print(__doc__); sys.exit(2)
    what, src, helm = sys.argv[1:4]
    for tool in [helm] + sys.argv[4:5]:
        if not os.access(tool, os.X_OK):
            print(f"SKIP: {tool} missing (testing/helm/get BUILD puts it there)"); sys.exit(77)
    if what == "lint":
        cmd_lint(src, helm)
    elif what == "template":
        cmd_template(src, helm)
    elif what == "schema":
        cmd_schema(src, helm)
    elif what == "drift":
        cmd_drift(src, helm, sys.argv[4])
    else:
        print(__doc__); sys.exit(2)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
