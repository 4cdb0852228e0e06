// Renders the OpenAPI schema as a list of operations, parameters, request and response
// bodies. Text only (textContent), never innerHTML: descriptions come from the schema.
(function () {
  "use strict";
  const root = document.getElementById("api-docs");
  if (!root) return;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function resolve(schema, spec) {
    if (schema && schema.$ref) {
      const name = schema.$ref.split("/").pop();
      return { name, schema: spec.components.schemas[name] };
    }
    return { name: null, schema };
  }

  function typeText(schema, spec) {
    if (!schema) return "";
    if (schema.$ref) return schema.$ref.split("/").pop();
    if (schema.allOf) return schema.allOf.map((s) => typeText(s, spec)).join(" & ");
    if (schema.oneOf) return schema.oneOf.map((s) => typeText(s, spec)).join(" | ");
    if (schema.enum) return schema.enum.filter((v) => v !== null && v !== "").join(" | ");
    if (schema.type === "array") return typeText(schema.items, spec) + "[]";
    return (schema.type || "object") + (schema.format ? ` (${schema.format})` : "");
  }

  function fieldsTable(schema, spec) {
    const { name, schema: s } = resolve(schema, spec);
    if (!s || !s.properties) return el("p", {}, typeText(schema, spec));
    const required = new Set(s.required || []);
    const body = el("tbody");
    for (const [field, prop] of Object.entries(s.properties)) {
      const desc = prop.description || (prop.readOnly ? "" : "");
      body.append(el("tr", {}, el("td", {}, el("code", {}, field)), el("td", {}, typeText(prop, spec)),
        el("td", {}, required.has(field) ? "required" : ""), el("td", {}, desc)));
    }
    return el("div", { class: "table-wrap" }, name ? el("p", {}, el("strong", {}, name)) : null,
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Field"), el("th", {}, "Type"), el("th", {}, ""),
        el("th", {}, "Description"))), body));
  }

  function operation(path, method, op, spec) {
    const section = el("section", { class: "panel", id: op.operationId || `${method}-${path}` });
    section.append(el("h3", { style: "text-transform: none" }, el("code", {}, method.toUpperCase() + " " + path), " ", op.summary || ""));
    if (op.description) section.append(el("p", {}, op.description));
    const params = op.parameters || [];
    if (params.length) {
      const body = el("tbody");
      for (const p of params) {
        body.append(el("tr", {}, el("td", {}, el("code", {}, p.name)), el("td", {}, p.in),
          el("td", {}, typeText(p.schema, spec)), el("td", {}, p.description || "")));
      }
      section.append(el("h4", {}, "Parameters"), el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "Name"), el("th", {}, "In"), el("th", {}, "Type"),
          el("th", {}, "Description"))), body)));
    }
    const req = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
    if (req) section.append(el("h4", {}, "Request body (JSON)"), fieldsTable(req.schema, spec));
    const ok = Object.entries(op.responses || {}).filter(([code]) => code.startsWith("2"));
    for (const [code, resp] of ok) {
      const content = resp.content && resp.content["application/json"];
      section.append(el("h4", {}, `Response ${code}`), content ? fieldsTable(content.schema, spec) : el("p", {}, resp.description || ""));
    }
    const errors = Object.keys(op.responses || {}).filter((c) => !c.startsWith("2"));
    if (errors.length) section.append(el("p", { class: "muted" }, "Errors: " + errors.join(", ")));
    return section;
  }

  fetch(root.dataset.schemaUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then((r) => { if (!r.ok) throw new Error(`the schema answered ${r.status}`); return r.json(); })
    .then((spec) => {
      root.textContent = "";
      const byTag = {};
      for (const [path, item] of Object.entries(spec.paths)) {
        for (const [method, op] of Object.entries(item)) {
          if (!["get", "post", "put", "patch", "delete"].includes(method)) continue;
          const tag = (op.tags && op.tags[0]) || "other";
          (byTag[tag] = byTag[tag] || []).push([path, method, op]);
        }
      }
      const nav = el("ul", { class: "tabs" });
      root.append(el("p", {}, `${spec.info.title} ${spec.info.version}`), nav);
      for (const [tag, ops] of Object.entries(byTag)) {
        nav.append(el("li", {}, el("a", { href: `#tag-${tag}` }, tag)));
        root.append(el("h2", { id: `tag-${tag}` }, tag));
        for (const [path, method, op] of ops) root.append(operation(path, method, op, spec));
      }
    })
    .catch((err) => { root.textContent = "Could not load the schema: " + err.message; });
})();
