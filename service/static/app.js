// The tandem search page: POST /search from the browser, render hits, timings and the index version.
// No framework and no build step. An API key, when the server needs one, lives only in `apiKey` below:
// never in localStorage, sessionStorage or a cookie, so it is gone when the tab closes.
"use strict";

const SNIPPET_CHARS = 240;
let apiKey = null;
let config = { api_key_required: false, default_top_k: 10, max_top_k: 1000, max_query_chars: 2048 };

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
  for (const stage of ["queue", "encode", "search"]) {
    $("t-" + stage).textContent = body.timing_ms[stage].toFixed(1);
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
  }
  const topK = Math.min(Math.max(parseInt($("top-k").value, 10) || config.default_top_k, 1), config.max_top_k);
  const headers = { "Content-Type": "application/json" };
  if (apiKey) headers["Authorization"] = "Bearer " + apiKey;
  $("go").disabled = true;
  setStatus("Searching…");
  try {
    const response = await fetch(new URL("search", document.baseURI), {
      method: "POST", headers, body: JSON.stringify({ query, top_k: topK }),
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
  document.body.dataset.ready = "true";
}

init();
