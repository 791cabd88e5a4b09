// Security properties of the rendered default install (stdin: `kubectl kustomize deploy/`), the
// ones docs/security.md promises. Exits 1 naming each property that does not hold.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const docs = parseAllDocuments(readFileSync(0, "utf8")).map((d) => d.toJSON()).filter(Boolean);
const find = (kind, name) => docs.find((o) => o.kind === kind && o.metadata?.name === name);
const failures = [];
const check = (ok, what) => { if (!ok) failures.push(what); };

// Webhook: fails closed, but only for pods that concern gpulet.
const vwc = find("ValidatingWebhookConfiguration", "gpulet-vgpu");
for (const w of vwc?.webhooks ?? [undefined]) {
  check(w?.failurePolicy === "Fail", "webhook failurePolicy is Fail");
  check((w?.matchConditions ?? []).length > 0, "webhook narrows its pods with matchConditions");
}

// Scheduler: extender behind client certificates, no insecure flags, probes off the extender port.
const dep = find("Deployment", "gpulet-scheduler");
const c = dep?.spec?.template?.spec?.containers?.find((x) => x.name === "scheduler");
const args = c?.args ?? [];
check(args.some((a) => a.startsWith("--extender-client-ca-file=")), "extender requires client certificates");
check(!args.includes("--extender-insecure"), "no --extender-insecure");
check(!args.includes("--extender-debug-endpoints"), "no /state or /workload endpoints");
check(c?.readinessProbe?.httpGet?.port === "health", "readiness probe on the plain health port");
check(find("NetworkPolicy", "gpulet-scheduler") !== undefined, "NetworkPolicy for the scheduler");

// kube-scheduler talks HTTPS and sends node names only.
const cm = find("ConfigMap", "gpulet-kube-scheduler-config");
const ksc = cm ? parseAllDocuments(cm.data["kube-scheduler-config.yaml"])[0].toJSON() : {};
for (const e of ksc.extenders ?? [undefined]) {
  check(e?.enableHTTPS === true && e?.urlPrefix?.startsWith("https://"), "extender called over HTTPS");
  check(e?.tlsConfig?.certFile && e?.tlsConfig?.caFile && !e?.tlsConfig?.insecure,
        "kube-scheduler presents a client certificate and verifies the server");
  check(e?.nodeCacheCapable === true, "nodeCacheCapable: true");
}

// The TLS Secret: read and update by name only.
const role = find("Role", "gpulet-scheduler-tls");
for (const r of role?.rules ?? []) {
  if (r.verbs.some((v) => v !== "create")) {
    check((r.resourceNames ?? []).length > 0, `secret verbs ${r.verbs} restricted by resourceNames`);
  }
}

// Node agent: its cluster-wide writes are confined by a bound admission policy on the token's
// node-name claim; only the install init container is privileged.
const nodeRole = find("ClusterRole", "gpulet-node");
const writes = (nodeRole?.rules ?? []).filter((r) => r.verbs.some((v) => ["patch", "update", "delete"].includes(v)));
const vap = find("ValidatingAdmissionPolicy", "gpulet-node-own-node");
const vapb = docs.find((o) => o.kind === "ValidatingAdmissionPolicyBinding" && o.spec?.policyName === "gpulet-node-own-node");
check(writes.length === 0 || (vap && vapb), "node agent writes confined by ValidatingAdmissionPolicy");
check(JSON.stringify(vap ?? {}).includes("authentication.kubernetes.io/node-name"), "policy keys on the node-name claim");
check(find("ValidatingAdmissionPolicy", "gpulet-trusted-pod-annotations") !== undefined,
      "gpulet-trusted pod annotations guarded on update");
const ds = find("DaemonSet", "gpulet-node");
const agent = ds?.spec?.template?.spec?.containers?.find((x) => x.name === "agent");
const hostRoot = agent?.volumeMounts?.find((m) => m.mountPath === "/host");
check(!hostRoot || hostRoot.readOnly === true, "agent mounts the host root read-only");

if (failures.length) {
  for (const f of failures) console.error(`policy: ${f}: does not hold`);
  process.exit(1);
}
console.log(`${docs.length} objects, security properties hold`);
