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
// node-name claim.
const nodeRole = find("ClusterRole", "gpulet-node");
const writes = (nodeRole?.rules ?? []).filter((r) => r.verbs.some((v) => ["patch", "update", "delete"].includes(v)));
const vap = find("ValidatingAdmissionPolicy", "gpulet-node-own-node");
const vapb = docs.find((o) => o.kind === "ValidatingAdmissionPolicyBinding" && o.spec?.policyName === "gpulet-node-own-node");
check(writes.length === 0 || (vap && vapb), "node agent writes confined by ValidatingAdmissionPolicy");
check(JSON.stringify(vap ?? {}).includes("authentication.kubernetes.io/node-name"), "policy keys on the node-name claim");
// Events: RBAC grants create in every namespace; a bound policy keeps them to its own node's.
const eventWrites = (nodeRole?.rules ?? []).some((r) => (r.resources ?? []).includes("events") &&
  r.verbs.some((v) => ["create", "*"].includes(v)));
const eventVap = find("ValidatingAdmissionPolicy", "gpulet-node-own-events");
const eventVapb = docs.find((o) => o.kind === "ValidatingAdmissionPolicyBinding" &&
  o.spec?.policyName === "gpulet-node-own-events");
check(!eventWrites || (eventVapb && JSON.stringify(eventVap ?? {}).includes("authentication.kubernetes.io/node-name")),
      "node agent's events confined to its own node by ValidatingAdmissionPolicy");
// DRA (deploy/components/dra): RBAC cannot limit the agent's ResourceSlice writes to its node's
// slices; a bound policy on the same node-name claim does.
const sliceWrites = (nodeRole?.rules ?? []).some((r) => (r.resources ?? []).includes("resourceslices") &&
  r.verbs.some((v) => ["create", "patch", "update", "delete", "deletecollection", "*"].includes(v)));
const sliceVap = find("ValidatingAdmissionPolicy", "gpulet-node-own-resourceslices");
const sliceVapb = docs.find((o) => o.kind === "ValidatingAdmissionPolicyBinding" &&
  o.spec?.policyName === "gpulet-node-own-resourceslices");
check(!sliceWrites || (sliceVapb && JSON.stringify(sliceVap ?? {}).includes("authentication.kubernetes.io/node-name")),
      "node agent's ResourceSlice writes confined to its own node by ValidatingAdmissionPolicy");
// ... and its ResourceClaim status writes to claims allocated on its node.
const claimStatusWrites = (nodeRole?.rules ?? []).some((r) => (r.resources ?? []).includes("resourceclaims/status") &&
  r.verbs.some((v) => ["patch", "update", "*"].includes(v)));
const claimVap = find("ValidatingAdmissionPolicy", "gpulet-node-own-claim-status");
const claimVapb = docs.find((o) => o.kind === "ValidatingAdmissionPolicyBinding" &&
  o.spec?.policyName === "gpulet-node-own-claim-status");
check(!claimStatusWrites || (claimVapb && JSON.stringify(claimVap ?? {}).includes("authentication.kubernetes.io/node-name")),
      "node agent's ResourceClaim status writes confined to its own node's claims by ValidatingAdmissionPolicy");
check(find("ValidatingAdmissionPolicy", "gpulet-trusted-pod-annotations") !== undefined,
      "gpulet-trusted pod annotations guarded on update");
const ds = find("DaemonSet", "gpulet-node");
const pod = ds?.spec?.template?.spec ?? {};
const agent = pod.containers?.find((x) => x.name === "agent");
check(agent !== undefined, "DaemonSet gpulet-node has an agent container");

// Node agent: only the host paths it needs (docs/security.md, "Node agent privileges"). The
// agent container does not mount the host's root; the agent writes only the host directories
// it owns and reads the rest through read-only mounts; its own image is read-only.
const hostPathOf = (mount) => pod.volumes?.find((v) => v.name === mount.name)?.hostPath?.path;
const clean = (p) => (p ?? "").replace(/\/+$/, "") || "/";
const agentHostMounts = (agent?.volumeMounts ?? []).filter((m) => hostPathOf(m) !== undefined)
  .map((m) => ({ ...m, host: clean(hostPathOf(m)) }));
const agentWritable = ["/var/lib/kubelet/device-plugins", "/var/lib/gpulet",
                       "/etc/kubernetes/node-feature-discovery/features.d"];
// The DRA driver (GPULET_DRA_GPUS set) also writes its registration socket, its own endpoint
// directory (not the whole plugins/) and the per-claim CDI specs.
if ((agent?.env ?? []).some((e) => e.name === "GPULET_DRA_GPUS")) {
  agentWritable.push("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.gpulet.io", "/var/run/cdi");
}
for (const m of agentHostMounts) {
  check(m.host !== "/", `agent does not mount the host root (volume ${m.name} at ${m.mountPath})`);
  check(m.readOnly === true || agentWritable.includes(m.host),
        `agent mounts host ${m.host} read-only (only ${agentWritable.join(", ")} writable)`);
  // Broad trees hold other pods' volumes and secrets, the kubelet's credentials, engine sockets.
  check(!["/etc", "/var", "/run", "/var/run", "/var/lib", "/var/lib/kubelet", "/root", "/home"].includes(m.host),
        `agent does not mount the whole host ${m.host}`);
  check(!/\.sock$|^\/(var\/)?run\/(containerd|crio|docker)/.test(m.host),
        `agent does not mount a container engine socket (${m.host})`);
  // Bidirectional only for the agent's own state directory: the per-grant accounting tmpfs
  // mounts must reach the container runtime (docs/security.md); nothing else propagates back.
  check(!m.mountPropagation || m.mountPropagation === "None" || m.mountPropagation === "HostToContainer" ||
        (m.mountPropagation === "Bidirectional" && m.mountPath === "/var/lib/gpulet" && m.host === "/var/lib/gpulet"),
        `agent mount ${m.mountPath} does not propagate mounts to the host (Bidirectional: only /var/lib/gpulet)`);
}
check((agent?.args ?? []).includes("--host-root=/host") === agentHostMounts.some((m) => m.mountPath.startsWith("/host/")),
      "agent --host-root=/host comes with read-only host mounts under /host");
check(agent?.securityContext?.readOnlyRootFilesystem === true, "agent has readOnlyRootFilesystem");
// Privileged only where docs/security.md says why; then the capability and seccomp settings are
// void, so an unprivileged agent must drop every capability, keep seccomp and forbid escalation.
const asc = agent?.securityContext ?? {};
if (!asc.privileged) {
  check((asc.capabilities?.drop ?? []).includes("ALL"), "unprivileged agent drops ALL capabilities");
  check(asc.allowPrivilegeEscalation === false, "unprivileged agent sets allowPrivilegeEscalation: false");
  check((asc.seccompProfile ?? pod.securityContext?.seccompProfile)?.type === "RuntimeDefault",
        "unprivileged agent uses the RuntimeDefault seccomp profile");
}
// The host's root: the install init container, and the uninstall-on-delete container, which only
// waits for SIGTERM (`gpulet uninstall --on-owner-delete`: no port, no other mount) and then
// restores the engine configuration if its DaemonSet is being deleted.
const isUninstallOnDelete = (c) => c.name === "uninstall-on-delete" && pod.containers.includes(c) &&
  JSON.stringify(c.command) === JSON.stringify(["gpulet", "uninstall"]) &&
  (c.args ?? [])[0] === "--on-owner-delete" && !(c.ports ?? []).length && (c.volumeMounts ?? []).length === 1;
for (const c of [...(pod.containers ?? []), ...(pod.initContainers ?? [])]) {
  const hostRoot = (c.volumeMounts ?? []).some((m) => hostPathOf(m) !== undefined && clean(hostPathOf(m)) === "/");
  check(!hostRoot || (c.name === "install" && pod.initContainers.includes(c)) || isUninstallOnDelete(c),
        `only the install init container and the idle uninstall-on-delete container mount the host root (not ${c.name})`);
}
check(pod.hostPID !== true && pod.hostIPC !== true && pod.hostNetwork !== true,
      "node agent shares no host PID, IPC or network namespace");

if (failures.length) {
  for (const f of failures) console.error(`policy: ${f}: does not hold`);
  process.exit(1);
}
console.log(`${docs.length} objects, security properties hold`);
