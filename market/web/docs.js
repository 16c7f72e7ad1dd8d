// The API reference: renders /openapi.json with DOM calls only (no CDN, no inline code, no
// innerHTML), so the page runs under the market's Content-Security-Policy.
"use strict";

function node(tag, text, className) {
  const n = document.createElement(tag);
  if (text !== undefined) n.textContent = String(text);
  if (className) n.className = className;
  return n;
}

function refName(schema) {
  return schema && schema.$ref ? schema.$ref.split("/").pop() : null;
}

function describe(schema) {
  if (!schema) return "";
  const ref = refName(schema);
  if (ref) return ref;
  if (schema.anyOf) return schema.anyOf.map(describe).join(" | ");
  if (schema.type === "array") return `array of ${describe(schema.items)}`;
  const bounds = [];
  if (schema.pattern) bounds.push(`pattern ${schema.pattern}`);
  if (schema.minimum !== undefined) bounds.push(`>= ${schema.minimum}`);
  if (schema.maximum !== undefined) bounds.push(`<= ${schema.maximum}`);
  if (schema.maxLength !== undefined) bounds.push(`length <= ${schema.maxLength}`);
  return (schema.type || "any") + (bounds.length ? ` (${bounds.join(", ")})` : "");
}

function operation(path, method, op) {
  const card = node("section", undefined, "card wide");
  const title = node("h2");
  title.appendChild(node("code", method.toUpperCase() + " " + path));
  if (op.summary) title.appendChild(node("span", "  " + op.summary, "muted"));
  card.appendChild(title);
  if (op.description) card.appendChild(node("p", op.description));
  const params = op.parameters || [];
  if (params.length) {
    const table = node("table");
    const head = node("tr");
    for (const h of ["parameter", "in", "schema", "required"]) head.appendChild(node("th", h, "l"));
    table.appendChild(head);
    for (const p of params) {
      const tr = node("tr");
      for (const v of [p.name, p.in, describe(p.schema), p.required ? "yes" : "no"]) {
        tr.appendChild(node("td", v, "l"));
      }
      table.appendChild(tr);
    }
    card.appendChild(table);
  }
  const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
  if (body) card.appendChild(node("p", "JSON body: " + describe(body.schema)));
  const codes = Object.keys(op.responses || {}).join(", ");
  if (codes) card.appendChild(node("p", "responses: " + codes, "muted"));
  return card;
}

async function main() {
  const response = await fetch("/openapi.json");
  const spec = await response.json();
  document.getElementById("version").textContent = `${spec.info.title} ${spec.info.version}`;
  document.getElementById("description").textContent = spec.info.description || "";
  const operations = document.getElementById("operations");
  for (const [path, methods] of Object.entries(spec.paths || {})) {
    for (const [method, op] of Object.entries(methods)) {
      operations.appendChild(operation(path, method, op));
    }
  }
  const schemas = document.getElementById("schemas");
  const all = (spec.components && spec.components.schemas) || {};
  for (const name of Object.keys(all).sort()) {
    const details = node("details");
    details.appendChild(node("summary", name));
    details.appendChild(node("pre", JSON.stringify(all[name], null, 2)));
    schemas.appendChild(details);
  }
}

main().catch((error) => {
  document.getElementById("operations").appendChild(node("p", "could not load: " + error));
});
