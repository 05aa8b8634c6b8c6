// crewwork console: plain JavaScript, no build step, nothing fetched from outside this API.
// The API key is asked for once and kept in sessionStorage (this tab only; gone when the tab closes).
"use strict";

const KEY_STORE = "crewwork.apiKey";
const STATES = ["submitted", "admitted", "running", "validating", "awaiting_review", "landing",
  "succeeded", "failed", "rejected", "cancelled", "dead"];
const KINDS = ["task", "code_change", "hotfix"];
const main = () => document.getElementById("main");
let pageAbort = null;   // aborts the current page's streams and timers when navigating away
let me = null;

// ------------------------------------------------------------------------------------------ helpers

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else if (k === "html") el.innerHTML = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}
// The forge's answer is only partly trusted: link it only when it is an http(s) URL.
const prLink = (u) => (typeof u === "string" && /^https?:\/\//.test(u) ? h("a", { href: u, target: "_blank", rel: "noopener noreferrer", id: "pull-request-link", text: u }) : "");
const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
const stateBadge = (s) => h("span", { class: `state ${s}`, "data-state": s, text: s.replace("_", " ") });
function toast(msg) {
  const t = document.getElementById("toast");
  t.textContent = msg; t.classList.add("show");
  clearTimeout(toast._t); toast._t = setTimeout(() => t.classList.remove("show"), 4000);
}
const sleep = (ms, signal) => new Promise((res) => { const t = setTimeout(res, ms); signal?.addEventListener("abort", () => { clearTimeout(t); res(); }); });

function apiKey() { return sessionStorage.getItem(KEY_STORE); }

async function api(path, opts = {}) {
  const headers = { Authorization: `Bearer ${apiKey()}`, Accept: "application/json", ...(opts.headers || {}) };
  if (opts.json !== undefined) { headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(opts.json); }
  const resp = await fetch(path, { ...opts, headers });
  if (resp.status === 401) { sessionStorage.removeItem(KEY_STORE); renderLogin("The API key was not accepted."); throw new Error("unauthorized"); }
  if (!resp.ok) {
    let problem = {};
    try { problem = await resp.json(); } catch (_) { /* not JSON */ }
    const err = new Error(problem.detail || `${resp.status} ${resp.statusText}`);
    err.status = resp.status; err.problem = problem; throw err;
  }
  const ct = resp.headers.get("content-type") || "";
  return ct.includes("json") ? resp.json() : resp.text();
}

// Server-Sent Events over fetch (EventSource cannot send an Authorization header). Reconnects with
// Last-Event-ID, so nothing is lost or repeated across reconnects.
async function streamEvents(path, onEvent, signal, onStatus) {
  let last = null;
  while (!signal.aborted) {
    try {
      const headers = { Authorization: `Bearer ${apiKey()}`, Accept: "text/event-stream" };
      if (last !== null) headers["Last-Event-ID"] = last;
      const resp = await fetch(path, { headers, signal });
      if (!resp.ok) throw new Error(`stream ${resp.status}`);
      onStatus?.("live");
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let idx;
        while ((idx = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, idx); buf = buf.slice(idx + 2);
          let id = null, data = null, type = "message";
          for (const line of block.split("\n")) {
            if (line.startsWith("id:")) id = line.slice(3).trim();
            else if (line.startsWith("event:")) type = line.slice(6).trim();
            else if (line.startsWith("data:")) data = (data ? data + "\n" : "") + line.slice(5).trimStart();
          }
          if (data !== null) { if (id !== null) last = id; onEvent(type, JSON.parse(data)); }
        }
      }
    } catch (e) {
      if (signal.aborted) return;
    }
    onStatus?.("reconnecting");
    await sleep(1500, signal);
  }
}

// ------------------------------------------------------------------------------------------ syntax highlighting

const KEYWORDS = new Set(("False None True and as assert async await break class continue def del elif else except finally for " +
  "from global if import in is lambda nonlocal not or pass raise return try while with yield " +
  "const let var function new this typeof instanceof switch case default throw catch export extends static void " +
  "fn impl pub use mod struct enum match mut func package type go defer chan interface range").split(" "));
const TOKEN = /(#[^\n]*|\/\/[^\n]*)|("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`(?:\\.|[^`\\])*`)|\b(\d+(?:\.\d+)?)\b|\b([A-Za-z_][A-Za-z0-9_]*)(\s*\()?/g;

function highlightCode(text) {
  let out = "", pos = 0, m;
  TOKEN.lastIndex = 0;
  while ((m = TOKEN.exec(text)) !== null) {
    out += esc(text.slice(pos, m.index));
    if (m[1]) out += `<span class="tok-com">${esc(m[1])}</span>`;
    else if (m[2]) out += `<span class="tok-str">${esc(m[2])}</span>`;
    else if (m[3]) out += `<span class="tok-num">${esc(m[3])}</span>`;
    else if (m[4]) {
      if (KEYWORDS.has(m[4])) out += `<span class="tok-kw">${esc(m[4])}</span>`;
      else if (m[5]) out += `<span class="tok-fn">${esc(m[4])}</span>`;
      else out += esc(m[4]);
      if (m[5]) out += esc(m[5]);
    }
    pos = TOKEN.lastIndex;
  }
  return out + esc(text.slice(pos));
}

function renderDiff(diff) {
  const box = h("div", { class: "diff mono", role: "region", "aria-label": "Diff", tabindex: "0" });
  const html = [];
  for (const line of diff.split("\n")) {
    let cls = "ln", body;
    if (line.startsWith("diff --git") || line.startsWith("index ") || line.startsWith("--- ") || line.startsWith("+++ ") ||
        line.startsWith("new file") || line.startsWith("deleted file")) { cls += " meta"; body = esc(line); }
    else if (line.startsWith("@@")) { cls += " hunk"; body = esc(line); }
    else if (line.startsWith("+")) { cls += " add"; body = "+" + highlightCode(line.slice(1)); }
    else if (line.startsWith("-")) { cls += " del"; body = "-" + highlightCode(line.slice(1)); }
    else body = highlightCode(line);
    html.push(`<span class="${cls}">${body || " "}</span>`);
  }
  box.innerHTML = html.join("");
  return box;
}

// ------------------------------------------------------------------------------------------ pages

function renderLogin(message) {
  if (pageAbort) pageAbort.abort();
  document.getElementById("signout").hidden = true;
  const input = h("input", { id: "api-key", type: "password", autocomplete: "off", required: true, "aria-describedby": "key-help" });
  const form = h("form", { class: "card login", onsubmit: async (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY_STORE, input.value.trim());
    try { await boot(); } catch (_) { /* renderLogin shown again */ }
  } },
    h("h1", { text: "Sign in to the crewwork console" }),
    message ? h("p", { class: "verdict-failed", role: "alert", text: message }) : null,
    h("label", { for: "api-key", text: "API key" }), input,
    h("p", { id: "key-help", class: "muted", text: "Create one with `crewwork keys create --tenant NAME`. " +
      "It is kept in this tab's sessionStorage only and sent as a Bearer token." }),
    h("button", { class: "primary", type: "submit", text: "Sign in" }));
  main().replaceChildren(form);
  input.focus();
}

function setNav(which) {
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === which) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
}

async function renderList(signal, params) {
  setNav("items");
  const q = new URLSearchParams(params);
  const stateSel = h("select", { id: "f-state", name: "state" }, h("option", { value: "", text: "any state" }),
    STATES.map((s) => h("option", { value: s, text: s, selected: q.get("state") === s })));
  const kindSel = h("select", { id: "f-kind", name: "kind" }, h("option", { value: "", text: "any kind" }),
    KINDS.map((k) => h("option", { value: k, text: k, selected: q.get("kind") === k })));
  const labelIn = h("input", { id: "f-label", name: "label", placeholder: "key=value", value: q.get("label") || "" });
  const searchIn = h("input", { id: "f-search", name: "q", type: "search", placeholder: "id prefix or repo", value: q.get("q") || "" });
  const form = h("form", { class: "filters", role: "search", onsubmit: (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const [k, el] of [["state", stateSel], ["kind", kindSel], ["label", labelIn], ["q", searchIn]]) if (el.value) p.set(k, el.value);
    location.hash = "#/?" + p.toString();
  } },
    h("label", {}, "State", stateSel), h("label", {}, "Kind", kindSel), h("label", {}, "Label", labelIn),
    h("label", {}, "Search", searchIn), h("button", { class: "primary", type: "submit", text: "Apply" }),
    h("span", { class: "muted" }, "Press ", h("span", { class: "kbd", text: "/" }), " to search"));
  const tbody = h("tbody");
  const more = h("button", { type: "button", text: "Load more", hidden: true });
  const live = h("span", { class: "muted", id: "live-status", text: "" });
  main().replaceChildren(
    h("div", { class: "row-actions" }, h("h1", { text: "Work items" }), live),
    form,
    h("table", { "aria-label": "Work items" },
      h("thead", {}, h("tr", {}, ["Work item", "State", "Kind", "Attempts", "Repository / labels", "Created"].map((t) => h("th", { scope: "col", text: t })))),
      tbody),
    h("p", {}, more));

  const rows = new Map();
  function rowFor(item) {
    const tr = h("tr", { "data-id": item.id },
      h("td", {}, h("a", { href: `#/items/${item.id}`, class: "mono", text: item.id })),
      h("td", { class: "cell-state" }, stateBadge(item.state)),
      h("td", { text: item.kind }),
      h("td", { class: "cell-attempts", text: String(item.attempt_count) }),
      h("td", {}, h("div", { class: "mono", text: item.repo || "" }),
        h("div", { class: "muted", text: Object.entries(item.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ") })),
      h("td", { text: fmtTime(item.created_at) }));
    rows.set(item.id, tr);
    return tr;
  }
  let cursor = null;
  async function load() {
    const p = new URLSearchParams(q); p.set("limit", "50"); if (cursor) p.set("cursor", cursor);
    const page = await api(`/v1/work-items?${p}`);
    for (const item of page.items) if (!rows.has(item.id)) tbody.append(rowFor(item));
    cursor = page.next_cursor; more.hidden = !cursor;
    if (!page.items.length && !rows.size) tbody.append(h("tr", {}, h("td", { colspan: "6", class: "muted", text: "No work items match." })));
  }
  more.addEventListener("click", () => load().catch((e) => toast(e.message)));
  await load();

  // Live state: the tenant-wide stream, starting from now.
  streamEvents("/v1/events/stream?tail=true", async (type, ev) => {
    const tr = rows.get(ev.work_item_id);
    if (type === "state_changed" && tr) {
      tr.querySelector(".cell-state").replaceChildren(stateBadge(ev.data.state));
    } else if (type === "attempt_recorded" && tr) {
      tr.querySelector(".cell-attempts").textContent = String(ev.data.number);
    } else if (type === "submitted" && !tr && !q.toString()) {
      try { const item = await api(`/v1/work-items/${ev.work_item_id}?live=false`); tbody.prepend(rowFor(item)); } catch (_) { /* gone */ }
    }
  }, signal, (s) => { live.textContent = s === "live" ? "● live" : "reconnecting…"; });
}

function evidencePanel(workItemId, ev) {
  const v = ev.validation || {}, a = ev.agent || {};
  const tests = (v.tests || []);
  const panel = h("div", { class: "card", id: `evidence-${ev.number}` },
    h("h2", { text: `Attempt ${ev.number}: ` }, h("span", { class: `verdict-${ev.verdict}`, text: ev.verdict })),
    h("dl", { class: "grid" },
      h("dt", { text: "Reason" }), h("dd", { text: ev.reason || "" }),
      h("dt", { text: "Cause" }), h("dd", { text: ev.cause || v.cause || "" }),
      h("dt", { text: "Exit code" }), h("dd", { text: v.exit_code ?? "" }),
      h("dt", { text: "Tests executed" }), h("dd", { text: v.tests_executed ?? "" }),
      h("dt", { text: "Sandbox" }), h("dd", { text: v.sandbox ? `${v.sandbox.backend}${v.sandbox.isolated ? "" : " (unsafe: no isolation)"}, ${Number(v.sandbox.duration_s).toFixed(2)} s` : "" }),
      h("dt", { text: "Agent" }), h("dd", { text: `${a.agent || ""}${a.mock ? " (mock)" : ""}` }),
      h("dt", { text: "Agent's claim" }), h("dd", { class: "muted", text: a.claims ? `“${a.claims}” (the agent's words, not evidence)` : "" }),
      h("dt", { text: "Fingerprint" }), h("dd", { class: "mono", text: ev.fingerprint || "" }),
      h("dt", { text: "Artifacts" }), h("dd", {}, Object.entries(ev.artifacts || {}).map(([role, url]) => [h("a", { href: "#", onclick: (e) => { e.preventDefault(); download(url, `${workItemId}-${ev.number}-${role}`); }, text: role }), " "]))));
  if (tests.length) {
    panel.append(h("table", { class: "tests", "aria-label": `Tests of attempt ${ev.number}` },
      h("thead", {}, h("tr", {}, h("th", { text: "Test" }), h("th", { text: "Outcome" }), h("th", { text: "Message" }))),
      h("tbody", {}, tests.map((t) => h("tr", {}, h("td", { text: t.id }), h("td", { class: `verdict-${t.outcome === "passed" ? "passed" : t.outcome === "skipped" ? "" : "failed"}`, text: t.outcome }), h("td", {}, h("pre", { text: (t.message || "").slice(0, 800) })))))));
  }
  if (v.preview) panel.append(probesSection(workItemId, ev.number, v.preview));
  if (v.diagnostics) panel.append(h("details", {}, h("summary", { text: "Diagnostics given to the next attempt" }), h("pre", { class: "log", text: v.diagnostics })));
  return panel;
}

// The live preview's acceptance probes, next to the tests: what was started, each probe's verdict, what was
// expected and seen, and its evidence (transcript, screenshot, Playwright trace). Everything here came from the
// app under test: shown as text, never as markup.
function probesSection(workItemId, number, pv) {
  const art = (ref) => `/v1/work-items/${workItemId}/artifacts/${ref.id}`;
  const link = (ref, label) => (ref ? [h("a", { href: "#", onclick: (e) => { e.preventDefault(); download(art(ref), ref.name); }, text: label }), " "] : "");
  const started = `${(pv.command || []).join(" ")}${pv.detected ? ` (detected: ${pv.detected})` : ""}${pv.backend ? ` in ${pv.backend}` : ""}`;
  const ready = pv.ready_after_s !== null && pv.ready_after_s !== undefined ? `, ready after ${Number(pv.ready_after_s).toFixed(2)} s` : "";
  const section = h("section", { class: "probes", "aria-label": `Acceptance probes of attempt ${number}` },
    h("h3", {}, "Acceptance probes: ", h("span", { class: `verdict-${pv.passed ? "passed" : "failed"}`, text: pv.passed ? "passed" : pv.cause })),
    h("p", { text: pv.reason }),
    h("p", { class: "muted" }, "Preview: ", h("span", { class: "mono", text: started }), ready, " ", link(pv.log_ref, "app log"), link(pv.evidence_ref, "evidence")));
  if ((pv.probes || []).length) {
    section.append(h("table", { class: "tests probes-table", "aria-label": `Probes of attempt ${number}` },
      h("thead", {}, h("tr", {}, h("th", { text: "Probe" }), h("th", { text: "Outcome" }), h("th", { text: "Expected / seen" }), h("th", { text: "Evidence" }))),
      h("tbody", {}, pv.probes.map((p) => h("tr", {},
        h("td", {}, h("div", { class: "mono", text: p.id }), h("div", { class: "muted", text: p.summary || "" })),
        h("td", { class: `verdict-${p.passed ? "passed" : "failed"}`, text: p.passed ? "passed" : "failed" }),
        h("td", {}, p.failed ? h("div", { text: `expected: ${p.failed}` }) : "",
          p.seen ? h("pre", { text: p.seen.slice(0, 800) }) : "",
          (p.console_errors || []).length ? h("div", { class: "muted", text: `console errors: ${p.console_errors.join(" | ").slice(0, 800)}` }) : "",
          (p.failed_requests || []).length ? h("div", { class: "muted", text: `failed requests: ${p.failed_requests.join(" | ").slice(0, 800)}` }) : ""),
        h("td", {}, link(p.transcript_ref, "transcript"), link(p.screenshot_ref, "screenshot"), link(p.trace_ref, "trace")))))));
    for (const p of pv.probes) {
      if (p.screenshot_ref) section.append(h("figure", { class: "shot" }, artifactImage(art(p.screenshot_ref), `Screenshot of ${p.id} at its end`), h("figcaption", { class: "muted", text: `${p.id}: the page at the end of the flow` })));
    }
  }
  return section;
}

// Screenshots never change once stored: each is fetched once per page, so a re-render shows it at once.
const imageCache = new Map();
function artifactImage(url, alt) {
  const img = h("img", { alt });
  if (!imageCache.has(url)) {
    imageCache.set(url, fetch(url, { headers: { Authorization: `Bearer ${apiKey()}` } })
      .then((r) => (r.ok ? r.blob() : null))
      .then((b) => (b ? new Promise((resolve) => {
        // A data: URL of type image/png (the console's policy allows data: images, nothing else from outside).
        const reader = new FileReader();
        reader.onload = () => resolve(reader.result);
        reader.readAsDataURL(new Blob([b], { type: "image/png" }));
      }) : null))
      .catch(() => null));
  }
  imageCache.get(url).then((src) => { if (src) img.src = src; });
  return img;
}

async function download(url, name) {
  const resp = await fetch(url, { headers: { Authorization: `Bearer ${apiKey()}` } });
  if (!resp.ok) { toast(`download failed: ${resp.status}`); return; }
  const blob = await resp.blob();
  const a = h("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a); a.click(); a.remove();
}

async function renderItem(signal, id) {
  setNav("items");
  const item = await api(`/v1/work-items/${encodeURIComponent(id)}`);
  const header = h("div", { class: "card" });
  const review = h("div");
  const timeline = h("ol", { class: "timeline", "aria-label": "Attempts timeline" });
  const evidenceBox = h("div");
  const diffBox = h("div");
  const logBox = h("div");
  const eventsList = h("ul", { class: "events", "aria-live": "polite" });
  main().replaceChildren(
    h("p", {}, h("a", { href: "#/", text: "← Work items" }), " ", h("span", { class: "muted" }, "(", h("span", { class: "kbd", text: "Esc" }), ")")),
    header, review,
    h("h2", { text: "Attempts" }), timeline, evidenceBox,
    h("h2", { text: "Change" }), diffBox,
    h("h2", { text: "Validation log" }), logBox,
    h("h2", { text: "Live events" }), h("div", { class: "card" }, eventsList));

  let selected = null;
  let evidence = [];
  // An attempt's diff and log never change once recorded: fetch each once, and never let a slow, older request
  // overwrite what a newer selection shows.
  const cache = new Map();
  let shown = 0;
  async function showAttempt(n) {
    selected = n;
    const ticket = ++shown;
    for (const b of timeline.querySelectorAll("button")) b.setAttribute("aria-pressed", String(Number(b.dataset.n) === n));
    const ev = evidence.find((e) => e.number === n);
    evidenceBox.replaceChildren(ev ? evidencePanel(id, ev) : h("p", { class: "muted", text: "No evidence yet." }));
    if (!cache.has(n)) {
      if (diffBox.dataset.n !== String(n)) diffBox.replaceChildren(h("p", { class: "muted", text: "Loading diff…" }));
      const diff = api(`/v1/work-items/${id}/diff?attempt=${n}`, { headers: { Accept: "text/x-diff" } })
        .catch((e) => ({ error: e.status === 404 ? "No diff for this attempt." : e.message }));
      const log = ev && ev.artifacts && ev.artifacts.log
        ? api(ev.artifacts.log, { headers: { Accept: "text/plain" } }).catch((e) => ({ error: e.message }))
        : Promise.resolve({ error: "No log for this attempt." });
      cache.set(n, Promise.all([diff, log]));
    }
    const [diff, log] = await cache.get(n);
    if (ticket !== shown) return;
    if (diffBox.dataset.n !== String(n)) {
      diffBox.replaceChildren(typeof diff === "string" ? renderDiff(diff) : h("p", { class: "muted", text: diff.error }));
      logBox.replaceChildren(typeof log === "string" ? h("pre", { class: "log", tabindex: "0", text: log }) : h("p", { class: "muted", text: log.error }));
      diffBox.dataset.n = String(n);
    }
  }

  async function refresh() {
    const cur = await api(`/v1/work-items/${id}`);
    header.replaceChildren(
      h("h1", {}, h("span", { class: "mono", text: cur.id }), " ", stateBadge(cur.state)),
      h("dl", { class: "grid" },
        h("dt", { text: "Kind" }), h("dd", { text: cur.kind + (cur.mock ? " (mock agent)" : "") }),
        h("dt", { text: "Reason" }), h("dd", { id: "item-reason", text: cur.reason || "" }),
        h("dt", { text: "Instruction" }), h("dd", {}, h("pre", { text: (cur.spec.instruction || JSON.stringify(cur.spec.input || {})).slice(0, 2000) })),
        h("dt", { text: "Repository" }), h("dd", { class: "mono", text: `${cur.repo || ""} ${cur.base_commit ? "@ " + cur.base_commit.slice(0, 12) : ""}` }),
        h("dt", { text: "Labels" }), h("dd", { text: Object.entries(cur.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ") }),
        h("dt", { text: "Delivery branch" }), h("dd", { class: "mono", text: cur.delivery_branch ? `${cur.delivery_branch} ${cur.landed_commit ? "(" + cur.landed_commit.slice(0, 12) + ")" : ""}` : "" }),
        h("dt", { text: "Pull request" }), h("dd", {}, prLink(cur.pull_request_url)),
        h("dt", { text: "Workflow" }), h("dd", {},
          h("a", { href: cur.links.temporal_ui, target: "_blank", rel: "noopener", id: "temporal-workflow-link", text: `${cur.workflow_id} in the Temporal UI` }),
          // A queued item's workflow starts when a place is handed to it (docs/operations.md): until then the link
          // finds nothing. (A queued item sent back by reviewers has a running workflow, which answers the live query.)
          cur.state === "queued" && !cur.live ? h("span", { class: "muted", id: "workflow-not-started", text: " (not started yet: it starts when its place in the queue comes)" }) : null),
        h("dt", { text: "Created / updated" }), h("dd", { text: `${fmtTime(cur.created_at)} / ${fmtTime(cur.updated_at)}` })));
    renderReview(cur);
    const fresh = await api(`/v1/work-items/${id}/evidence`);
    // Re-render the timeline only when the evidence changed, and keep the keyboard focus on the same attempt's
    // button when it is rebuilt: a live refresh must never swallow a key press aimed at the old button.
    const changed = JSON.stringify(fresh) !== JSON.stringify(evidence) || !timeline.childElementCount;
    evidence = fresh;
    if (changed) {
      const focused = document.activeElement && timeline.contains(document.activeElement) ? document.activeElement.dataset.n : null;
      timeline.replaceChildren(...evidence.map((e) => h("li", {}, h("button", { type: "button", "data-n": String(e.number), "aria-pressed": "false", onclick: () => showAttempt(e.number) },
        h("strong", { text: `Attempt ${e.number}` }), h("span", { class: `verdict-${e.verdict}`, text: e.verdict }),
        h("span", { class: "muted", text: e.cause || "" })))));
      if (!evidence.length) timeline.replaceChildren(h("li", { class: "muted", text: "No attempts recorded yet." }));
      const again = focused && timeline.querySelector(`button[data-n="${focused}"]`);
      if (again) again.focus();
    }
    const n = selected && evidence.some((e) => e.number === selected) ? selected : evidence.length ? evidence[evidence.length - 1].number : null;
    if (n !== null) await showAttempt(n);
  }

  function renderReview(cur) {
    if (cur.state !== "awaiting_review") { review.replaceChildren(); return; }
    const comment = h("textarea", { id: "review-comment", "aria-label": "Review comment", placeholder: "Comment (required to request changes)" });
    const act = (action) => async () => {
      if (action === "request_changes" && !comment.value.trim()) { toast("Write what should change first."); comment.focus(); return; }
      for (const b of review.querySelectorAll("button")) b.disabled = true;
      try {
        const res = await api(`/v1/work-items/${id}/review`, { method: "POST", json: { action, comment: comment.value || null, reviewer: me ? me.key_id : null } });
        toast(res.message || `${action} sent`);
      } catch (e) { toast(e.message); for (const b of review.querySelectorAll("button")) b.disabled = false; }
    };
    review.replaceChildren(h("section", { class: "card review", "aria-label": "Review" },
      h("h2", { text: "This change is waiting for your review" }),
      h("p", { class: "muted", text: "Approve lands it on its delivery branch; reject ends the work item; request changes sends your comment to the agent as the next attempt's diagnostics." }),
      comment,
      h("div", { class: "actions" },
        h("button", { type: "button", class: "approve", id: "approve", onclick: act("approve"), text: "Approve" }),
        h("button", { type: "button", id: "request-changes", onclick: act("request_changes"), text: "Request changes" }),
        h("button", { type: "button", class: "reject", id: "reject", onclick: act("reject"), text: "Reject" }))));
  }

  let pending = null;
  const refreshing = refresh();
  streamEvents(`/v1/work-items/${id}/events/stream`, (type, ev) => {
    eventsList.append(h("li", {}, h("span", { class: "muted mono", text: `#${ev.id} ${fmtTime(ev.created_at)} ` }), h("strong", { text: type }), " ",
      h("span", { class: "mono", text: JSON.stringify(ev.data).slice(0, 300) })));
    eventsList.scrollTop = eventsList.scrollHeight;
    if (type === "state_changed" || type === "attempt_recorded") {
      clearTimeout(pending);
      pending = setTimeout(() => refresh().catch((e) => toast(e.message)), 150);
    }
  }, signal);
  await refreshing;
}

async function renderWorkers(signal) {
  setNav("workers");
  main().replaceChildren(h("h1", { text: "Workers" }), h("p", { class: "muted", text: "Loading…" }));
  let data;
  try { data = await api("/v1/admin/workers"); }
  catch (e) {
    main().replaceChildren(h("h1", { text: "Workers" }), h("p", { class: "card", text: e.status === 403 ? "The workers view needs an API key with the admin scope (crewwork keys create --tenant T --admin)." : e.message }));
    return;
  }
  const table = h("table", { "aria-label": "Task queues" },
    h("thead", {}, h("tr", {}, ["Pool", "Task queue", "Type", "Pollers", "Backlog", "Backlog age", "Add / dispatch rate"].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, data.queues.map((q) => h("tr", {},
      h("td", {}, h("strong", { text: q.pool })), h("td", { class: "mono", text: q.task_queue }), h("td", { text: q.kind }),
      h("td", {}, q.pollers.length ? h("ul", {}, q.pollers.map((p) => h("li", { class: "mono", text: `${p.identity} (${p.last_access_time ? fmtTime(p.last_access_time) : "?"})` }))) : h("span", { class: "verdict-failed", text: "no pollers" })),
      h("td", { text: q.backlog ?? "?" }), h("td", { text: q.backlog_age_s != null ? `${q.backlog_age_s.toFixed(1)} s` : "" }),
      h("td", { text: q.add_rate != null ? `${q.add_rate.toFixed(2)} / ${q.dispatch_rate.toFixed(2)} per s` : "" })))));
  main().replaceChildren(h("h1", { text: `Workers (namespace ${data.namespace})` }), table,
    h("p", { class: "muted", text: "From Temporal's task-queue descriptions; refreshed every 5 s." }));
  await sleep(5000, signal);
  if (!signal.aborted) route();
}

// ------------------------------------------------------------------------------------------ routing

async function route() {
  if (!apiKey()) { renderLogin(); return; }
  if (pageAbort) pageAbort.abort();
  pageAbort = new AbortController();
  const signal = pageAbort.signal;
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  try {
    if (path.startsWith("/items/")) await renderItem(signal, decodeURIComponent(path.slice(7)));
    else if (path === "/workers") await renderWorkers(signal);
    else await renderList(signal, query || "");
    main().focus({ preventScroll: true });
  } catch (e) {
    if (e.message !== "unauthorized") main().replaceChildren(h("p", { class: "card verdict-failed", role: "alert", text: e.message }));
  }
}

async function boot() {
  me = await api("/v1/me");
  document.getElementById("whoami").textContent = `tenant ${me.tenant_id}${me.admin ? " · admin" : ""}`;
  document.getElementById("temporal-link").href = me.temporal_ui;
  document.getElementById("signout").hidden = false;
  await route();
}

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("hashchange", route);
  document.getElementById("signout").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); renderLogin("Signed out."); });
  document.addEventListener("keydown", (e) => {
    const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement?.tagName);
    if (e.key === "/" && !typing) { const s = document.getElementById("f-search"); if (s) { e.preventDefault(); s.focus(); } }
    else if (e.key === "Escape" && location.hash.startsWith("#/items/")) { location.hash = "#/"; }
  });
  if (apiKey()) boot().catch(() => {}); else renderLogin();
});
