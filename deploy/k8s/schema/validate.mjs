// Validates Prometheus Operator resources offline with the validators that
// @kubernetes-models/prometheus-operator generates from the operator's API types.
// Input: a JSON array of resources on stdin. Output: one JSON line per resource,
// {"kind", "name", "ok", "error"}. Exit code 1 when any resource is invalid or unknown.
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const resources = JSON.parse(Buffer.concat(chunks).toString("utf8"));

let failed = false;
for (const resource of resources) {
  const name = resource?.metadata?.name ?? null;
  const Model = resource?.apiVersion === "monitoring.coreos.com/v1" ? v1[resource.kind] : undefined;
  let error = null;
  if (typeof Model !== "function") {
    error = `no schema for ${resource?.apiVersion} ${resource?.kind}`;
  } else {
    try {
      new Model(resource).validate();
    } catch (e) {
      error = e.message;
    }
  }
  failed ||= error !== null;
  console.log(JSON.stringify({ kind: resource?.kind ?? null, name, ok: error === null, error }));
}
process.exit(failed ? 1 : 0);
