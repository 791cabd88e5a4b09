// Validates every object of a multi-document YAML stream (stdin) against the Kubernetes OpenAPI
// schemas, through the npm package kubernetes-models (and @kubernetes-models/prometheus-operator for
// ServiceMonitor / PrometheusRule, @kubernetes-models/cert-manager for Issuer / Certificate). Exits 1 naming the first invalid object and why.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const text = readFileSync(0, "utf8");
const docs = parseAllDocuments(text).map((d) => d.toJSON()).filter(Boolean);
if (docs.length === 0) {
  console.error("no objects in the rendered manifests");
  process.exit(1);
}
// Objects with no published core schema: validated by their own packages, or only checked for shape.
const external = {
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator/monitoring.coreos.com",
  "cert-manager.io": "@kubernetes-models/cert-manager/cert-manager.io",
};
let failures = 0;
for (const obj of docs) {
  if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
    console.error(`object without apiVersion or kind: ${JSON.stringify(obj).slice(0, 120)}`);
    failures++;
    continue;
  }
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : ["", obj.apiVersion];
  const where = `${obj.kind}/${obj.metadata?.namespace ? obj.metadata.namespace + "/" : ""}${obj.metadata?.name}`;
  let mod;
  try {
    const base = external[group] ?? `kubernetes-models/${group ? group + "/" : ""}`;
    mod = await import(external[group] ? `${base}/${version}` : `${base}${version}`);
  } catch (e) {
    console.error(`${where}: no schema for apiVersion ${obj.apiVersion}`);
    failures++;
    continue;
  }
  const Model = mod[obj.kind];
  if (!Model) {
    console.error(`${where}: unknown kind ${obj.kind} in ${obj.apiVersion}`);
    failures++;
    continue;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    console.error(`${where}: ${e.message}`);
    failures++;
  }
}
console.log(`${docs.length} objects, ${failures} invalid`);
process.exit(failures ? 1 : 0);
