// The tandem search page: POST /search from the browser, render hits, timings and the index version.
// The mode selector and the filter box come from GET /index: the bundle's modes and its fields with their types.
// With several collections, the collection selector lists those the key may see (GET /collections); the page then
// searches the chosen one (POST /collections/{name}/search) and reads its fields (GET /collections/{name}).
// No framework and no build step. An API key, when the server needs one, lives only in `apiKey` below:
// never in localStorage, sessionStorage or a cookie, so it is gone when the tab closes.
"use strict";

const SNIPPET_CHARS = 240;
let apiKey = null;
let config = { api_key_required: false, default_top_k: 10, max_top_k: 1000, max_query_chars: 2048 };
let index = null; // GET /index: modes and fields, once read
let collections = null; // GET /collections, once read with a key that works
let collection = null; // the chosen one; null: the server's default (POST /search, GET /index)

const PRESENCE = [["exists", "is present"], ["missing", "is missing"]];
const ORDERED = [["eq", "="], ["gte", "≥"], ["lte", "≤"], ["gt", ">"], ["lt", "<"], ["between", "between"], ...PRESENCE];
// The operators each field type offers (null: a key the payload index does not type).
const OPERATORS = {
  keyword: [["eq", "is"], ["in", "is one of"], ...PRESENCE],
  "keyword-list": [["eq", "contains"], ["in", "contains any of"], ...PRESENCE],
  integer: ORDERED, float: ORDERED, datetime: ORDERED,
  boolean: [["true", "is true"], ["false", "is false"], ...PRESENCE],
  null: [["eq", "is"], ...PRESENCE],
};
const HINTS = { datetime: "2020-01-31 or 2020-01-31T12:00:00Z", "keyword-list": "a value", keyword: "a value" };

const $ = (id) => document.getElementById(id);

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function snippet(text) {
  return text.length <= SNIPPET_CHARS ? text : text.slice(0, SNIPPET_CHARS).trimEnd() + "…";
}

function showKeyField(message) {
  $("key-row").hidden = false;
  $("api-key").focus();
  if (message) setStatus(message, true);
}

function fieldType(name) {
  const field = index && index.fields.find((f) => f.name === name);
  return field ? field.type : null;
}

function setOperators(row) {
  const type = fieldType(row.querySelector(".f-field").value);
  const ops = row.querySelector(".f-op");
  ops.replaceChildren(...OPERATORS[type].map(([value, label]) => new Option(label, value)));
  updateInputs(row);
}

function updateInputs(row) {
  const type = fieldType(row.querySelector(".f-field").value);
  const op = row.querySelector(".f-op").value;
  const value = row.querySelector(".f-value");
  value.hidden = ["exists", "missing", "true", "false"].includes(op);
  value.placeholder = op === "in" ? "values, comma-separated" : HINTS[type] || "a value";
  row.querySelector(".f-value2").hidden = op !== "between";
  row.querySelector(".f-value2").placeholder = "up to";
}

function addFilter() {
  const row = $("filter-template").content.firstElementChild.cloneNode(true);
  const fields = row.querySelector(".f-field");
  fields.replaceChildren(...index.fields.map((f) => new Option(`${f.name}${f.type ? " (" + f.type + ")" : ""}`, f.name)));
  fields.addEventListener("change", () => setOperators(row));
  row.querySelector(".f-op").addEventListener("change", () => updateInputs(row));
  row.querySelector(".f-remove").addEventListener("click", () => row.remove());
  $("filters").appendChild(row);
  setOperators(row);
  return row;
}

// One value as the field's type wants it in JSON; an Error names what is wrong.
function typedValue(type, text, name) {
  const raw = text.trim();
  if (!raw) throw new Error(`the filter on ${name} needs a value`);
  if (type === "integer" || type === "float") {
    const number = Number(raw);
    if (!Number.isFinite(number) || (type === "integer" && !Number.isInteger(number))) {
      throw new Error(`${name} takes ${type === "integer" ? "a whole number" : "a number"}, not "${raw}"`);
    }
    return number;
  }
  if (type === null) {  // untyped: a number or a boolean when it reads as one, else the text
    if (raw === "true" || raw === "false") return raw === "true";
    if (raw !== "" && Number.isFinite(Number(raw))) return Number(raw);
  }
  return raw;
}

function condition(row) {
  const name = row.querySelector(".f-field").value;
  const type = fieldType(name);
  const op = row.querySelector(".f-op").value;
  const value = row.querySelector(".f-value").value;
  if (op === "exists" || op === "missing") return { field: name, exists: op === "exists" };
  if (op === "true" || op === "false") return { field: name, eq: op === "true" };
  if (op === "in") return { field: name, in: value.split(",").map((v) => typedValue(type, v, name)) };
  if (op === "between") {
    return { field: name, gte: typedValue(type, value, name), lte: typedValue(type, row.querySelector(".f-value2").value, name) };
  }
  return { field: name, [op]: typedValue(type, value, name) };
}

function filterOf() {
  const conditions = [...$("filters").querySelectorAll(".filter")].map(condition);
  if (!conditions.length) return null;
  return conditions.length === 1 ? conditions[0] : { and: conditions };
}

function authHeaders() {
  return apiKey ? { Authorization: "Bearer " + apiKey } : {};
}

function collectionPath(suffix) {
  return collection === null ? suffix || "index" : `collections/${encodeURIComponent(collection)}${suffix ? "/" + suffix : ""}`;
}

// The collections the key may see: a selector when there is a choice (several, or none the default).
async function loadCollections() {
  let body;
  try {
    const response = await fetch(new URL("collections", document.baseURI), { headers: authHeaders() });
    if (!response.ok) return;
    body = await response.json();
  } catch (err) {
    return;
  }
  collections = body.collections;
  const only = collections.length === 1 && collections[0].default;
  const select = $("collection");
  select.hidden = select.labels[0].hidden = only || !collections.length;
  if (only || !collections.length) return;
  select.replaceChildren(...collections.map((c) => new Option(c.state === "ready" ? c.name : `${c.name} (${c.state})`, c.name)));
  const chosen = collections.find((c) => c.default) || collections[0];
  select.value = collection = chosen.name;
}

function chooseCollection() {
  collection = $("collection").value;
  index = null;
  $("filters").replaceChildren();  // the fields are the collection's
  $("results").replaceChildren();
  $("meta").hidden = true;
  loadIndex();
}

async function loadIndex() {
  const headers = authHeaders();
  try {
    const response = await fetch(new URL(collectionPath(""), document.baseURI), { headers });
    if (!response.ok) return;
    index = await response.json();
  } catch (err) {
    return;
  }
  for (const option of $("mode").options) option.disabled = !index.modes.includes(option.value);
  $("add-filter").hidden = index.fields.length === 0;
  document.body.dataset.index = "loaded";
  document.body.dataset.indexOf = collection || "";
}

function render(body) {
  const list = $("results");
  list.replaceChildren();
  for (const hit of body.results) {
    const item = $("hit-template").content.firstElementChild.cloneNode(true);
    item.dataset.id = hit.id;
    item.querySelector(".title").textContent = hit.title || hit.id;
    item.querySelector(".score").textContent = hit.score.toFixed(3);
    item.querySelector(".snippet").textContent = snippet(hit.text);
    item.querySelector(".doc-id").textContent = hit.id;
    list.appendChild(item);
  }
  $("index-version").textContent = body.index.version;
  $("index-count").textContent = body.index.count;
  for (const stage of ["queue", "encode", "search", "lexical", "filter"]) {
    $("t-" + stage).textContent = (body.timing_ms[stage] || 0).toFixed(1);
  }
  $("meta").hidden = false;
  setStatus(body.results.length ? "" : "No results.");
}

async function search(event) {
  event.preventDefault();
  const query = $("query").value;
  if (!query.trim()) return;
  if (config.api_key_required) {
    apiKey = $("api-key").value.trim() || null;
    if (!apiKey) return showKeyField("Enter an API key to search.");
    if (collections === null) await loadCollections();  // what this key may see, before the first search
  }
  const topK = Math.min(Math.max(parseInt($("top-k").value, 10) || config.default_top_k, 1), config.max_top_k);
  const request = { query, top_k: topK, mode: $("mode").value };
  try {
    const filter = filterOf();
    if (filter) request.filter = filter;
  } catch (err) {
    return setStatus(err.message, true);
  }
  const headers = { "Content-Type": "application/json" };
  if (apiKey) headers["Authorization"] = "Bearer " + apiKey;
  $("go").disabled = true;
  setStatus("Searching…");
  try {
    const response = await fetch(new URL(collectionPath("search"), document.baseURI), {
      method: "POST", headers, body: JSON.stringify(request),
    });
    const body = await response.json().catch(() => ({}));
    if (response.status === 401 || response.status === 403) {
      config.api_key_required = true;
      return showKeyField(body.message || "This server needs a valid API key.");
    }
    if (!response.ok) {
      const id = response.headers.get("X-Request-ID");
      return setStatus(`${response.status}: ${body.message || response.statusText}` + (id ? ` (request ${id})` : ""), true);
    }
    render(body);
    if (!index) loadIndex();  // a key was needed: now that one works, read the index's fields
  } catch (err) {
    setStatus("The server did not answer: " + err, true);
  } finally {
    $("go").disabled = false;
  }
}

async function init() {
  try {
    const response = await fetch(new URL("ui/config", document.baseURI));
    if (response.ok) config = await response.json();
  } catch (err) {
    setStatus("Could not read the page's configuration: " + err, true);
  }
  $("top-k").value = config.default_top_k;
  $("top-k").max = config.max_top_k;
  $("query").maxLength = config.max_query_chars;
  if (config.api_key_required) $("key-row").hidden = false;
  $("search-form").addEventListener("submit", search);
  $("add-filter").addEventListener("click", addFilter);
  $("collection").addEventListener("change", chooseCollection);
  if (!config.api_key_required) {
    await loadCollections();
    await loadIndex();
  }
  document.body.dataset.ready = "true";
}

init();
