// Validate Kubernetes custom resources with the JSON-schema validators that npm's @kubernetes-models packages
// compile from each project's CRDs, and report fields those schemas do not declare (strict field validation).
//
// Called by helpers/fleet/validate.py:  node crd_validate.mjs NODE_MODULES_DIR  < [objects as JSON]  > [results]
//
// The compiled validators (ajv standalone code) check types, enums and required fields, but a CRD schema does not
// forbid unknown fields (the API server prunes them, or rejects them under fieldValidation=Strict). To report
// them, every object is wrapped in a Proxy that records which property names the validator reads: a validator
// reads each property its schema declares, and lists the keys of maps (additionalProperties) and of free-form
// objects. So a key of an object whose schema declares properties, that was never read, is an unknown field.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const PACKAGES = {
  "keda.sh": "@kubernetes-models/keda",
  "gateway.networking.k8s.io": "@kubernetes-models/gateway-api",
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
};

function escape(key) {
  return key.replace(/~/g, "~0").replace(/\//g, "~1");
}

function track(value, path, seen) {
  if (value === null || typeof value !== "object") return value;
  const record = { read: new Set(), listed: false, isArray: Array.isArray(value), value };
  seen.push([path, record]);
  const copy = Array.isArray(value)
    ? value.map((v, i) => track(v, `${path}/${i}`, seen))
    : Object.fromEntries(Object.entries(value).map(([k, v]) => [k, track(v, `${path}/${escape(k)}`, seen)]));
  return new Proxy(copy, {
    get(target, prop, receiver) {
      if (typeof prop === "string") record.read.add(prop);
      return Reflect.get(target, prop, receiver);
    },
    has(target, prop) {
      if (typeof prop === "string") record.read.add(prop);
      return Reflect.has(target, prop);
    },
    ownKeys(target) {
      record.listed = true;
      return Reflect.ownKeys(target);
    },
  });
}

async function validate(nodeModules, doc) {
  const [group, version] = String(doc.apiVersion || "").split("/");
  const pkg = PACKAGES[group];
  if (!pkg || !version || !doc.kind) {
    return [`/apiVersion: no @kubernetes-models package here for ${doc.apiVersion} ${doc.kind}`];
  }
  let mod;
  try {
    mod = await import(pathToFileURL(join(nodeModules, pkg, group, version, `${doc.kind}.js`)).href);
  } catch (e) {
    return [`/kind: ${pkg} has no model for ${doc.apiVersion} ${doc.kind} (${e.code || e.message})`];
  }
  const model = mod[doc.kind];
  const seen = [];
  const proxy = track(doc, "", seen);
  const messages = [];
  try {
    model.prototype.validate.call(proxy);
  } catch (e) {
    if (!Array.isArray(e.errors)) throw e;
    for (const err of e.errors) {
      let where = err.instancePath || "";
      if (err.keyword === "required") where += `/${err.params.missingProperty}`;
      else if (err.keyword === "additionalProperties") where += `/${err.params.additionalProperty}`;
      messages.push(`${where || "/"}: ${err.message}${err.keyword === "enum" ? " " + JSON.stringify(err.params.allowedValues) : ""}`);
    }
  }
  for (const [path, rec] of seen) {
    if (rec.isArray || rec.listed || rec.read.size === 0) continue;
    for (const key of Object.keys(rec.value)) {
      if (!rec.read.has(key)) messages.push(`${path}/${escape(key)}: unknown field "${key}" (not in the schema)`);
    }
  }
  return messages;
}

const nodeModules = process.argv[2];
let input = "";
for await (const chunk of process.stdin) input += chunk;
const results = [];
for (const doc of JSON.parse(input)) results.push(await validate(nodeModules, doc));
process.stdout.write(JSON.stringify(results));
