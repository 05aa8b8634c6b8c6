// crewwork console: plain JavaScript, no build step, nothing fetched from outside this API.
// The API key is asked for once and kept in sessionStorage (this tab only; gone when the tab closes).
// Pages: the review queue (#/), one work item (#/items/ID) and the workers (#/workers). The diff view is
// diffview.js (CrewDiff), the agent's trajectory trajectory.js (CrewTrajectory).
"use strict";

const KEY_STORE = "crewwork.apiKey";
const NAME_STORE = "crewwork.reviewerName";
const QUEUE_STORE = "crewwork.queue";
const STATES = ["awaiting_review", "queued", "submitted", "admitted", "running", "validating", "landing",
  "succeeded", "failed", "rejected", "cancelled", "dead"];
const TERMINAL = new Set(["succeeded", "failed", "rejected", "cancelled", "dead"]);
const AGES = [["", "any age"], ["3600", "older than 1 hour"], ["86400", "older than 1 day"], ["604800", "older than 1 week"]];
const main = () => document.getElementById("main");
let pageAbort = null;   // aborts the current page's streams and timers when navigating away
let me = null;
let pageRefresh = null; // the current page's refresh, run when the API is reachable again

// ------------------------------------------------------------------------------------------ helpers

const esc = CrewDiff.esc;
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined && c !== "") el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}
// The forge's answer is only partly trusted: link it only when it is an http(s) URL.
const prLink = (u) => (typeof u === "string" && /^https?:\/\//.test(u) ? h("a", { href: u, target: "_blank", rel: "noopener noreferrer", id: "pull-request-link", text: u }) : "");
const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
const stateName = (s) => String(s || "").replace(/_/g, " ");
const stateBadge = (s) => h("span", { class: `state ${s}`, "data-state": s, text: stateName(s) });
const mockBadge = () => h("span", { class: "badge mock", title: "A scripted mock agent made this change, not a model or a person", text: "mock" });
function ago(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}
const now = () => Date.now() / 1000;
function toast(msg) {
  const t = document.getElementById("toast");
  t.textContent = msg; t.classList.add("show");
  clearTimeout(toast._t); toast._t = setTimeout(() => t.classList.remove("show"), 5000);
}
const sleep = (ms, signal) => new Promise((res) => { const t = setTimeout(res, ms); signal?.addEventListener("abort", () => { clearTimeout(t); res(); }); });
function apiKey() { return sessionStorage.getItem(KEY_STORE); }

// ------------------------------------------------------------------------------------------ the connection
// Every request goes through `api`. When one cannot reach the API at all, the banner says so and a probe of
// /healthz retries (2 s, doubling to 15 s) until the API answers; then the page refreshes what it shows.

const conn = {
  online: true,
  failures: 0,
  probing: false,
  listeners: new Set(),
  banner() { return document.getElementById("conn"); },
  show(text, cls) { const b = this.banner(); b.textContent = text; b.className = cls; b.hidden = false; },
  lost(reason) {
    if (this.online) { this.online = false; document.body.classList.add("offline"); }
    this.notify();
    if (!this.probing) this.probe(reason);
  },
  async probe(reason) {
    this.probing = true;
    let delay = 2000;
    while (!this.online) {
      this.failures += 1;
      for (let left = Math.round(delay / 1000); left > 0 && !this.online; left--) {
        this.show(`Cannot reach the crewwork API at ${location.origin} (${reason || "no answer"}). What you see may be out of date; ` +
          `decisions cannot be sent. Retrying in ${left} s (try ${this.failures}).`, "conn offline");
        await sleep(1000);
      }
      if (this.online) break;
      try {
        // Any answer means the API is back (a 503 says Temporal or the database is down: the page tells the rest).
        await fetch("/healthz", { cache: "no-store" });
        this.ok();
      } catch (_) { delay = Math.min(delay * 2, 15000); }
    }
    this.probing = false;
  },
  ok() {
    if (this.online) return;
    this.online = true; this.failures = 0;
    document.body.classList.remove("offline");
    this.show("Connected to the crewwork API again.", "conn restored");
    setTimeout(() => { if (this.online) this.banner().hidden = true; }, 4000);
    this.notify();
    if (pageRefresh) pageRefresh().catch(() => {});
  },
  notify() { for (const f of this.listeners) f(this.online); },
};

class Offline extends Error {}

async function api(path, opts = {}) {
  const headers = { Authorization: `Bearer ${apiKey()}`, Accept: "application/json", ...(opts.headers || {}) };
  if (opts.json !== undefined) { headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(opts.json); }
  let resp;
  try { resp = await fetch(path, { ...opts, headers }); }
  catch (e) {
    if (e.name === "AbortError") throw e;
    conn.lost("the connection failed");
    throw new Offline("The crewwork API cannot be reached: nothing was sent. It is retried; try again once the banner says it is back.");
  }
  conn.ok();
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

// Server-Sent Events over fetch (EventSource cannot send an Authorization header). Reconnects with Last-Event-ID,
// so nothing is lost or repeated across reconnects; a stream the API ends on shutdown (`: close` comment) is resumed
// the same way once it is back. onStatus: "live" | "reconnecting" | "restarting" | "offline".
async function streamEvents(path, onEvent, signal, onStatus) {
  let last = null;
  let delay = 1000;
  while (!signal.aborted) {
    let closing = false;
    try {
      const headers = { Authorization: `Bearer ${apiKey()}`, Accept: "text/event-stream" };
      if (last !== null) headers["Last-Event-ID"] = last;
      let resp;
      try { resp = await fetch(path, { headers, signal }); }
      catch (e) { if (signal.aborted) return; conn.lost("the live stream failed"); onStatus?.("offline"); throw e; }
      if (!resp.ok) throw new Error(`stream ${resp.status}`);
      conn.ok();
      delay = 1000;
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
            if (line.startsWith(": close")) closing = true;  // the API is shutting down: resume when it is back
            else if (line.startsWith("id:")) id = line.slice(3).trim();
            else if (line.startsWith("event:")) type = line.slice(6).trim();
            else if (line.startsWith("data:")) data = (data ? data + "\n" : "") + line.slice(5).trimStart();
          }
          if (data === null) continue;
          if (id !== null) last = id;
          onEvent(type, JSON.parse(data));
        }
      }
    } catch (e) {
      if (signal.aborted) return;
    }
    onStatus?.(closing ? "restarting" : conn.online ? "reconnecting" : "offline");
    await sleep(delay, signal);
    delay = Math.min(delay * 2, 15000);
  }
}

const LIVE_TEXT = { live: "● live", reconnecting: "○ reconnecting…", restarting: "○ the API is restarting: reconnecting…", offline: "✕ offline: retrying" };

// ------------------------------------------------------------------------------------------ events, in words

function describeEvent(type, ev) {
  const d = ev.data || {};
  switch (type) {
    case "state_changed": return [`→ ${stateName(d.state)}`, d.reason || ""];
    case "submitted": return ["submitted", ""];
    case "attempt_recorded": return [`attempt ${d.number ?? ""} recorded`, [d.verdict, d.cause].filter(Boolean).join(": ")];
    case "review_decided": return ["review", reviewSentence(d)];
    case "landed": return ["landed", `on ${d.branch || "?"} at ${(d.commit || "").slice(0, 12)}${d.pull_request_url ? " · " + d.pull_request_url : ""}`];
    case "evidence_signed": return ["evidence signed", `attempt ${d.attempt ?? "?"}, bundle sha256 ${(d.sha256 || "").slice(0, 12)}…`];
    case "evidence_unsigned": return ["evidence not signed", d.reason || ""];
    case "agent_finished": return [`attempt ${d.attempt ?? ""}: the agent finished`, d.error ? `with an error: ${d.error}` : ""];
    case "validation_finished": return [`attempt ${d.attempt ?? ""} validated`, d.passed ? "passed" : `failed${d.cause ? ": " + d.cause : ""}`];
    case "workspace_acquired": return ["workspace lease taken", ""];
    case "workspace_released": return ["workspace lease given back", ""];
    case "stale_write_rejected": return ["a stale write was refused", "an older attempt woke late; it changed nothing"];
    case "write_after_terminal_rejected": return ["a late write was refused", "the item had ended; it changed nothing"];
    default: {
      const detail = Object.entries(d).filter(([k]) => k !== "writer")
        .map(([k, v]) => `${k.replace(/_/g, " ")}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(" · ");
      return [type.replace(/_/g, " "), detail.slice(0, 200)];
    }
  }
}

const VERB = { approve: "approved", reject: "rejected", request_changes: "requested changes to" };
function reviewer(r) {
  const key = r.api_key_id ? `API key ${r.api_key_id}` : "";
  return r.reviewer && key ? `${r.reviewer} (${key})` : (r.reviewer || key || "an unnamed reviewer");
}
function reviewSentence(r) {
  return `${reviewer(r)} ${VERB[r.action] || r.action} attempt ${r.attempt}${r.comment ? `: ${r.comment}` : ""}` +
    ((r.line_comments || []).length ? ` (+${r.line_comments.length} line comment${r.line_comments.length > 1 ? "s" : ""})` : "");
}

// ------------------------------------------------------------------------------------------ sign in

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

// ------------------------------------------------------------------------------------------ the queue

function checksCell(c) {
  if (!c) return h("span", { class: "muted", text: "no attempt yet" });
  const parts = [h("span", { class: `verdict-${c.verdict}`, text: `attempt ${c.attempt} ${c.verdict}` })];
  if (c.tests_executed) parts.push(h("div", { class: c.tests_failed ? "verdict-failed" : "", text: c.tests_failed ? `${c.tests_failed} of ${c.tests_executed} tests failed` : `${c.tests_executed} tests passed` }));
  else if (c.cause && c.verdict !== "passed") parts.push(h("div", { class: "muted", text: c.cause }));
  const probes = c.probes_passed + c.probes_failed;
  if (probes) parts.push(h("div", { class: c.probes_failed ? "verdict-failed" : "", text: `${c.probes_passed}/${probes} probes passed` }));
  return parts;
}

function diffCell(c) {
  if (!c || !c.files_changed) return h("span", { class: "muted", text: "—" });
  return [h("span", { class: "dv-plus", text: `+${c.insertions}` }), " ", h("span", { class: "dv-minus", text: `−${c.deletions}` }),
    h("div", { class: "muted", text: `${c.files_changed} file${c.files_changed > 1 ? "s" : ""}` })];
}

function waitingCell(item) {
  if (item.waiting_since) return h("span", { text: ago(now() - item.waiting_since), title: `waiting for review since ${fmtTime(item.waiting_since)}` });
  return h("span", { class: "muted", text: `${ago(now() - item.created_at)} old`, title: `created ${fmtTime(item.created_at)}` });
}

async function renderList(signal, params) {
  setNav("items");
  const q = new URLSearchParams(params);
  // What waits for a person comes first: the default view is the review queue.
  if (!q.has("state")) q.set("state", "awaiting_review");
  const state = q.get("state");
  const stateSel = h("select", { id: "f-state", name: "state" },
    h("option", { value: "any", text: "any state", selected: state === "any" }),
    STATES.map((s) => h("option", { value: s, text: stateName(s), selected: state === s })));
  const repoIn = h("input", { id: "f-repo", name: "repo", placeholder: "URL or path text", value: q.get("repo") || "" });
  const labelIn = h("input", { id: "f-label", name: "label", placeholder: "key=value", value: q.get("label") || "" });
  const agentIn = h("input", { id: "f-agent", name: "agent", placeholder: "e.g. model", value: q.get("agent") || "" });
  const ageSel = h("select", { id: "f-age", name: "age" }, AGES.map(([v, t]) => h("option", { value: v, text: t, selected: (q.get("age") || "") === v })));
  const searchIn = h("input", { id: "f-search", name: "q", type: "search", placeholder: "id, repository or instruction", value: q.get("q") || "" });
  const form = h("form", { class: "filters", role: "search", "aria-label": "Filter work items", onsubmit: (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const [k, el] of [["state", stateSel], ["repo", repoIn], ["label", labelIn], ["agent", agentIn], ["age", ageSel], ["q", searchIn]]) if (el.value) p.set(k, el.value);
    location.hash = "#/?" + p.toString();
  } },
    h("label", {}, "State", stateSel), h("label", {}, "Repository", repoIn), h("label", {}, "Label", labelIn),
    h("label", {}, "Agent", agentIn), h("label", {}, "Age", ageSel), h("label", {}, "Search", searchIn),
    h("button", { class: "primary", type: "submit", text: "Apply" }));
  const tbody = h("tbody");
  const more = h("button", { type: "button", text: "Load more", hidden: true });
  const live = h("span", { class: "muted", id: "live-status", role: "status", text: "" });
  const heading = state === "awaiting_review" ? "Awaiting review" : state === "any" ? "Work items" : `Work items: ${stateName(state)}`;
  main().replaceChildren(
    h("div", { class: "row-actions" }, h("h1", { text: heading }), live),
    form,
    h("p", { class: "muted keys" }, h("span", { class: "kbd", text: "j" }), "/", h("span", { class: "kbd", text: "k" }), " next / previous, ",
      h("span", { class: "kbd", text: "Enter" }), " open, ", h("span", { class: "kbd", text: "/" }), " search. ",
      state === "awaiting_review" ? h("a", { href: "#/?state=any", text: "Show every state" }) : h("a", { href: "#/", text: "Show what awaits review" })),
    h("div", { class: "table-scroll" }, h("table", { "aria-label": heading, id: "queue" },
      h("thead", {}, h("tr", {}, ["Work item", "State", "Checks", "Diff", "Waiting", "Repository / labels"].map((t) => h("th", { scope: "col", text: t })))),
      tbody)),
    h("p", {}, more));

  const rows = new Map();
  function rowFor(item) {
    const tr = h("tr", { "data-id": item.id },
      h("td", { class: "cell-title" },
        h("a", { href: `#/items/${item.id}`, class: "item-link", text: item.title || item.id }), " ", item.mock ? mockBadge() : "",
        h("div", { class: "muted mono small", text: `${item.id} · ${item.kind}${item.agent ? " · " + item.agent : ""}` })),
      h("td", { class: "cell-state" }, stateBadge(item.state)),
      h("td", { class: "cell-checks" }, checksCell(item.checks)),
      h("td", { class: "cell-diff" }, diffCell(item.checks)),
      h("td", { class: "cell-waiting" }, waitingCell(item)),
      h("td", {}, h("div", { class: "mono small", text: item.repo || "" }),
        h("div", { class: "muted", text: Object.entries(item.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ") })));
    rows.set(item.id, tr);
    return tr;
  }
  const query = () => {
    const p = new URLSearchParams();
    for (const k of ["repo", "label", "agent", "q"]) if (q.get(k)) p.set(k, q.get(k));
    if (state !== "any") p.set("state", state);
    if (q.get("age")) p.set("created_before", String(Math.floor(now() - Number(q.get("age")))));
    return p;
  };
  let cursor = null;
  async function load() {
    const p = query(); p.set("limit", "50"); if (cursor) p.set("cursor", cursor);
    const page = await api(`/v1/work-items?${p}`);
    for (const item of page.items) if (!rows.has(item.id)) tbody.append(rowFor(item));
    cursor = page.next_cursor; more.hidden = !cursor;
    tbody.querySelector(".empty")?.remove();
    if (!rows.size) tbody.append(h("tr", { class: "empty" }, h("td", { colspan: "6", class: "muted", text: state === "awaiting_review" ? "Nothing waits for review." : "No work items match." })));
    sessionStorage.setItem(QUEUE_STORE, JSON.stringify([...rows.keys()]));
  }
  more.addEventListener("click", () => load().catch((e) => toast(e.message)));
  pageRefresh = async () => { rows.clear(); tbody.replaceChildren(); cursor = null; await load(); };
  try { await load(); }
  catch (e) { if (!(e instanceof Offline)) throw e; }  // filled in once the API answers

  // Live state: the tenant-wide stream, starting from now.
  streamEvents("/v1/events/stream?tail=true", async (type, ev) => {
    const tr = rows.get(ev.work_item_id);
    if (type === "state_changed" && tr) {
      tr.querySelector(".cell-state").replaceChildren(stateBadge(ev.data.state));
      if (state !== "any" && ev.data.state !== state) tr.classList.add("moved-on");
      else { tr.classList.remove("moved-on"); refreshRow(ev.work_item_id); }
    } else if (type === "attempt_recorded" && tr) {
      refreshRow(ev.work_item_id);
    } else if (!tr && (type === "submitted" || (type === "state_changed" && (state === "any" || ev.data.state === state)))) {
      try {
        const item = await api(`/v1/work-items/${ev.work_item_id}?live=false`);
        if (!rows.has(item.id) && (state === "any" || item.state === state)) { tbody.querySelector(".empty")?.remove(); tbody.prepend(rowFor(item)); }
      } catch (_) { /* gone */ }
    }
  }, signal, (s) => { live.textContent = LIVE_TEXT[s] || s; });

  async function refreshRow(id) {
    try {
      const p = query(); p.set("q", id); p.set("limit", "1"); p.delete("state"); p.delete("created_before");
      const page = await api(`/v1/work-items?${p}`);
      const item = page.items.find((i) => i.id === id);
      const old = rows.get(id);
      if (item && old) { const tr = rowFor(item); if (old.classList.contains("current")) tr.classList.add("current"); old.replaceWith(tr); }
    } catch (_) { /* next event refreshes it */ }
  }
}

// j/k in the queue: move between rows (the row's link takes the focus, so Enter opens it).
function moveInQueue(step) {
  const links = [...document.querySelectorAll("#queue tbody tr[data-id] .item-link")];
  if (!links.length) return;
  const at = links.indexOf(document.activeElement);
  const next = links[Math.max(0, Math.min(links.length - 1, at < 0 ? 0 : at + step))];
  for (const tr of document.querySelectorAll("#queue tr.current")) tr.classList.remove("current");
  next.closest("tr").classList.add("current");
  next.focus();
}

function neighbour(id, step) {
  const ids = JSON.parse(sessionStorage.getItem(QUEUE_STORE) || "[]");
  const at = ids.indexOf(id);
  return at < 0 ? null : ids[at + step] || null;
}

// ------------------------------------------------------------------------------------------ evidence

// Whether the landed change is signed: an unsigned landing is said as plainly as a mock agent.
function bundleStatus(workItemId, bundle) {
  if (!bundle) return h("span", { class: "muted", text: "" });
  if (bundle.status === "signed") return h("span", { text: `signed: crewwork bundle ${workItemId}, then crewwork verify` });
  if (bundle.status === "unsigned") return h("strong", { class: "warning", text: bundle.detail });
  return h("span", { class: "muted", text: bundle.detail });
}

function evidencePanel(workItemId, ev) {
  const v = ev.validation || {}, a = ev.agent || {};
  const tests = (v.tests || []);
  const panel = h("div", { class: "card", id: `evidence-${ev.number}` },
    h("h3", { text: `Attempt ${ev.number}: ` }, h("span", { class: `verdict-${ev.verdict}`, text: ev.verdict })),
    h("dl", { class: "grid" },
      h("dt", { text: "Reason" }), h("dd", { text: ev.reason || "" }),
      h("dt", { text: "Cause" }), h("dd", { text: ev.cause || v.cause || "" }),
      h("dt", { text: "Exit code" }), h("dd", { text: v.exit_code ?? "" }),
      h("dt", { text: "Tests executed" }), h("dd", { text: v.tests_executed ?? "" }),
      h("dt", { text: "Sandbox" }), h("dd", { text: v.sandbox ? `${v.sandbox.backend}${v.sandbox.isolated ? "" : " (unsafe: no isolation)"}, ${Number(v.sandbox.duration_s).toFixed(2)} s` : "" }),
      h("dt", { text: "Agent" }), h("dd", {}, `${a.agent || ""} `, a.mock ? mockBadge() : ""),
      h("dt", { text: "Agent's claim" }), h("dd", { class: "muted", text: a.claims ? `“${a.claims}” (the agent's words, not evidence)` : "" }),
      h("dt", { text: "Fingerprint" }), h("dd", { class: "mono", text: ev.fingerprint || "" }),
      h("dt", { text: "Downloads" }), h("dd", {}, Object.entries(ev.artifacts || {}).map(([role, url]) => [h("a", { href: "#", onclick: (e) => { e.preventDefault(); download(url, `${workItemId}-${ev.number}-${role}`); }, text: role }), " "]))));
  if (tests.length) {
    panel.append(h("div", { class: "table-scroll", tabindex: "0", role: "region", "aria-label": `Tests of attempt ${ev.number}, scrollable` }, h("table", { class: "tests", "aria-label": `Tests of attempt ${ev.number}` },
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Test" }), h("th", { scope: "col", text: "Outcome" }), h("th", { scope: "col", text: "Message" }))),
      h("tbody", {}, tests.map((t) => h("tr", {}, h("td", { text: t.id }), h("td", { class: `verdict-${t.outcome === "passed" ? "passed" : t.outcome === "skipped" ? "" : "failed"}`, text: t.outcome }), h("td", {}, h("pre", { text: (t.message || "").slice(0, 800) }))))))));
  }
  // What the platform doubts or flags about the change: shown as text, whatever the change put in it.
  for (const [key, title] of [["doubts", "Why the report was not believed"], ["runner_reach", "Lines that reach into the test runner"],
    ["weakened", "Checks the change weakens instead of satisfying"], ["unlisted_failing", "Failing, but not named by the lists (not deciding)"],
    ["pre_existing", "Pre-existing: failing at the base commit too (not the change's fault)"],
    ["flaky", "Flaky: failed, then passed on the same tree (neither passes nor fails the change)"],
    ["fixed", "Fixed: failing at the base commit, passing after the change"]]) {
    const items = v[key] || [];
    if (items.length) panel.append(h("section", { class: `flags flags-${key}`, "aria-label": `${title}, attempt ${ev.number}` },
      h("h4", { text: title }), h("ul", {}, items.map((x) => h("li", { class: "mono", text: x })))));
  }
  if (v.baseline) panel.append(h("section", { class: "flags flags-baseline", "aria-label": `Baseline on the base commit, attempt ${ev.number}` },
    h("h4", { text: "Baseline on the base commit" }), h("p", { text: v.baseline }),
    h("ul", {}, (v.extra_runs || []).map((r) => h("li", {}, `${r.label}: ${r.cause}${r.usable ? "" : " (not used)"}${r.cached ? ` (cached from ${r.cached_from || "an earlier item"})` : ""} `,
      r.log_ref ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); download(`/v1/work-items/${workItemId}/artifacts/${r.log_ref.id}`, r.log_ref.name); }, text: "log" }) : "")))));
  const scan = v.scan;
  if (scan && ((scan.findings || []).length || (scan.errors || []).length)) {
    const more = (scan.total || 0) - (scan.findings || []).length;
    panel.append(h("section", { class: "flags flags-scan", "aria-label": `Security scanner findings, attempt ${ev.number}` },
      h("h4", { text: `Security scanner findings the change introduces (${scan.preexisting || 0} already at the base, not counted)` }),
      h("ul", {}, (scan.findings || []).map((f) => h("li", { class: `mono${f.blocking ? " verdict-failed" : ""}`, text: `${f.path}:${f.line}: ${f.tool} ${f.rule}${f.blocking ? " [blocks]" : ""}: ${f.message}` })),
        more > 0 ? h("li", { class: "muted", text: `… and ${more} more (in the SARIF log)` }) : "",
        (scan.errors || []).map((e) => h("li", { class: "mono", text: `scanner gave no evidence: ${e}` })))));
  }
  if ((v.checks || []).length) panel.append(checksSection(workItemId, ev.number, v.checks));
  if (v.preview) panel.append(probesSection(workItemId, ev.number, v.preview));
  if (v.diagnostics) panel.append(h("details", {}, h("summary", { text: "Diagnostics given to the next attempt" }), h("pre", { class: "log", tabindex: "0", text: v.diagnostics })));
  return panel;
}

// The live preview's acceptance probes, next to the tests: what was started, each probe's verdict, what was
// expected and seen, and its evidence (transcript, screenshot, Playwright trace). Everything here came from the
// app under test: shown as text, never as markup.
// The named checks (validation.checks): one row each, with its verdict, cause, findings and downloads; all of it
// shown as text, whatever the check's output put in it.
function checksSection(workItemId, number, checks) {
  const link = (ref, label) => ref ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); download(`/v1/work-items/${workItemId}/artifacts/${ref.id}`, ref.name); }, text: label }) : "";
  return h("section", { class: "flags flags-checks", "aria-label": `Checks, attempt ${number}` },
    h("h4", { text: `Checks (${checks.filter((c) => c.passed).length} of ${checks.length} passed)` }),
    h("div", { class: "table-scroll", tabindex: "0", role: "region", "aria-label": `Checks of attempt ${number}, scrollable` }, h("table", { class: "tests checks", "aria-label": `Checks of attempt ${number}` },
      h("thead", {}, h("tr", {}, ["Check", "Verdict", "Cause", "Why", "Files"].map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", {}, checks.map((c) => h("tr", { "data-check": c.name },
        h("td", {}, h("span", { class: "mono", text: c.name }), c.required ? "" : h("span", { class: "muted", text: " (not required)" }),
          c.environment ? h("div", { class: "muted", text: c.environment }) : ""),
        h("td", { class: `verdict-${c.passed ? "passed" : "failed"}`, text: c.passed ? "passed" : "failed" }),
        h("td", { class: "mono", text: c.cause }),
        h("td", {}, h("div", { text: c.reason }), (c.findings || []).length ? h("pre", { text: c.findings.join("\n") + (c.findings_total > c.findings.length ? `\n… and ${c.findings_total - c.findings.length} more` : "") }) : "",
          (c.pre_existing || []).length ? h("div", { class: "muted" }, h("div", { text: "Pre-existing (failing at the base commit too, not the change's):" }), h("pre", { text: c.pre_existing.join("\n") })) : ""),
        h("td", {}, link(c.log_ref, "log"), " ", link(c.report_ref, "report"))))))));
}

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
    section.append(h("div", { class: "table-scroll" }, h("table", { class: "tests probes-table", "aria-label": `Probes of attempt ${number}` },
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Probe" }), h("th", { scope: "col", text: "Outcome" }), h("th", { scope: "col", text: "Expected / seen" }), h("th", { scope: "col", text: "Evidence" }))),
      h("tbody", {}, pv.probes.map((p) => h("tr", {},
        h("td", {}, h("div", { class: "mono", text: p.id }), h("div", { class: "muted", text: p.summary || "" })),
        h("td", { class: `verdict-${p.passed ? "passed" : "failed"}`, text: p.passed ? "passed" : "failed" }),
        h("td", {}, p.failed ? h("div", { text: `expected: ${p.failed}` }) : "",
          p.seen ? h("pre", { text: p.seen.slice(0, 800) }) : "",
          (p.console_errors || []).length ? h("div", { class: "muted", text: `console errors: ${p.console_errors.join(" | ").slice(0, 800)}` }) : "",
          (p.failed_requests || []).length ? h("div", { class: "muted", text: `failed requests: ${p.failed_requests.join(" | ").slice(0, 800)}` }) : ""),
        h("td", {}, link(p.transcript_ref, "transcript"), link(p.screenshot_ref, "screenshot"), link(p.trace_ref, "trace"))))))));
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
  let resp;
  try { resp = await fetch(url, { headers: { Authorization: `Bearer ${apiKey()}` } }); }
  catch (_) { conn.lost("a download failed"); toast("The API cannot be reached: nothing was downloaded."); return; }
  if (!resp.ok) { toast(`download failed: ${resp.status}`); return; }
  const blob = await resp.blob();
  const a = h("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a); a.click(); a.remove();
}

// ------------------------------------------------------------------------------------------ one work item

async function renderItem(signal, id) {
  setNav("items");
  let cur = await api(`/v1/work-items/${encodeURIComponent(id)}`);
  const header = h("div", { class: "card", id: "item-header" });
  const notice = h("div");
  const timeline = h("ol", { class: "story", id: "timeline", "aria-label": "Timeline" });
  const tabs = h("ol", { class: "timeline", "aria-label": "Attempts" });
  const evidenceBox = h("div");
  const changeHead = h("div", { class: "row-actions change-head" });
  const diffBox = h("div", { id: "diff", "aria-live": "off" });
  const review = h("div", { id: "review-slot" });
  const logBox = h("div");
  const trajectoryBox = h("div");
  const eventsList = h("ol", { class: "events", id: "events", "aria-label": "Live events" });
  const live = h("span", { class: "muted", id: "live-status", role: "status" });
  const prev = neighbour(id, -1), next = neighbour(id, 1);
  main().replaceChildren(
    h("p", { class: "row-actions" }, h("a", { href: "#/", text: "← Review queue" }), h("span", { class: "muted" }, "(", h("span", { class: "kbd", text: "Esc" }), ")"),
      prev ? h("a", { href: `#/items/${prev}`, id: "prev-item", text: "previous (p)" }) : "",
      next ? h("a", { href: `#/items/${next}`, id: "next-item", text: "next in queue (n)" }) : "", live),
    header, notice,
    h("h2", { text: "Timeline" }), timeline,
    h("h2", { text: "Attempts" }), tabs, evidenceBox,
    changeHead, diffBox, review,
    h("h2", { text: "Validation log" }), logBox,
    h("h2", { text: "Agent's trajectory" }), trajectoryBox,
    h("h2", { text: "Live events" }), h("div", { class: "card events-box", tabindex: "0", role: "region", "aria-label": "Live events of this work item" }, eventsList));

  let selected = null;
  let evidence = [];
  const models = new Map();     // attempt -> Promise of its DiffView (or {error})
  const texts = new Map();      // artifact url -> Promise of its text
  const compareOn = new Map();  // attempt -> whether its change is shown against the attempt reviewers sent back
  const pendingKey = `crewwork.pending.${id}`;
  let pending = JSON.parse(sessionStorage.getItem(pendingKey) || "[]");  // line comments not sent yet
  const savePending = () => sessionStorage.setItem(pendingKey, JSON.stringify(pending));
  let shown = 0;
  let draft = "";  // the review comment being written

  const diffOf = (n) => {
    if (!models.has(n)) models.set(n, api(`/v1/work-items/${id}/diff?attempt=${n}&format=json`).catch((e) => ({ error: e.status === 404 ? "No diff for this attempt." : e.message })));
    return models.get(n);
  };
  const textOf = (url) => {
    if (!texts.has(url)) texts.set(url, api(url, { headers: { Accept: "text/plain" } }).catch((e) => ({ error: e.message })));
    return texts.get(url);
  };
  const waitingAttempt = () => (cur.state === "awaiting_review" && cur.under_review ? cur.under_review.attempt : null);
  // The latest attempt before `n` that reviewers sent back (its change is what `n` answers).
  const sentBack = (n) => [...(cur.reviews || [])].reverse().find((r) => r.action === "request_changes" && r.attempt < n) || null;

  async function showAttempt(n, { focusTab = false } = {}) {
    selected = n;
    const ticket = ++shown;
    for (const b of tabs.querySelectorAll("button")) b.setAttribute("aria-pressed", String(Number(b.dataset.n) === n));
    if (focusTab) tabs.querySelector(`button[data-n="${n}"]`)?.focus();
    const ev = evidence.find((e) => e.number === n);
    evidenceBox.replaceChildren(ev ? evidencePanel(id, ev) : h("p", { class: "muted", text: "No evidence yet." }));
    if (diffBox.dataset.n !== String(n)) diffBox.replaceChildren(h("p", { class: "muted", text: "Loading the change…" }));
    const back = sentBack(n);
    const [model, prevModel, log, transcript] = await Promise.all([
      diffOf(n), back && compareOn.get(n) !== false ? diffOf(back.attempt) : null,
      ev?.artifacts?.log ? textOf(ev.artifacts.log) : { error: "No validation log for this attempt." },
      ev?.artifacts?.transcript ? textOf(ev.artifacts.transcript) : { error: "No transcript for this attempt." }]);
    if (ticket !== shown) return;
    drawChange(n, model, back, prevModel);
    logBox.replaceChildren(typeof log === "string" ? h("pre", { class: "log", tabindex: "0", "aria-label": `Validation log of attempt ${n}`, text: log }) : h("p", { class: "muted", text: log.error }));
    trajectoryBox.replaceChildren(typeof transcript === "string" ? CrewTrajectory.render(transcript) : h("p", { class: "muted", text: transcript.error }));
    renderReview();
  }

  // The change of attempt `n`: its diff, with the line comments made on it (recorded and not yet sent), or, against
  // the attempt reviewers sent back, what changed since, with their comments beside the lines they were about.
  function drawChange(n, model, back, prevModel) {
    const comparing = back && compareOn.get(n) !== false && prevModel && !prevModel.error;
    changeHead.replaceChildren(h("h2", { id: "change-heading", text: comparing ? `Change of attempt ${n}, against attempt ${back.attempt}` : `Change of attempt ${n}` }),
      back ? h("button", { type: "button", id: "compare-toggle", "aria-pressed": String(Boolean(comparing)), onclick: () => { compareOn.set(n, !comparing); showAttempt(n); },
        text: comparing ? `Show attempt ${n}'s whole change` : `Show what changed since attempt ${back.attempt}` }) : "",
      model && model.sha256 ? h("span", { class: "muted mono small", text: `diff sha256 ${model.sha256.slice(0, 12)}…` }) : "");
    if (!model || model.error) { diffBox.replaceChildren(h("p", { class: "muted", text: model ? model.error : "No diff." })); diffBox.dataset.n = String(n); delete diffBox.dataset.drawn; return; }
    const recorded = (cur.reviews || []).filter((r) => r.attempt === n).flatMap((r) => noteOf(r));
    const mine = pending.filter((c) => c.attempt === n).map((c) => ({ ...c, kind: "pending", author: "Your comment (not sent yet)", meta: `${c.path}:${c.line}`, removable: true, label: `Your comment on ${c.path} line ${c.line}` }));
    // What the security scanners found that the change introduces, on the lines they are about (docs/scanners.md).
    const scanned = ((evidence.find((e) => e.number === n)?.validation?.scan?.findings) || []).filter((f) => f.line > 0).map((f) => ({
      path: f.path, side: "new", line: f.line, body: `${f.rule}: ${f.message}`, kind: f.blocking ? "scanner blocking" : "scanner",
      author: f.blocking ? `Scanner ${f.tool} (blocks)` : `Scanner ${f.tool}`, meta: `${f.level}${f.severity ? `, ${f.severity} severity` : ""}`,
      label: `Scanner finding on ${f.path} line ${f.line}` }));
    // A live refresh that changes nothing here keeps the view as it is: a comment being written stays open.
    const drawn = JSON.stringify([n, model.sha256, comparing ? back.attempt : 0, waitingAttempt() === n, recorded.length, (cur.reviews || []).length, mine.map((c) => c.id), scanned.length]);
    if (diffBox.dataset.drawn === drawn) return;
    const y = window.scrollY;
    const view = CrewDiff.render(model, {
      annotations: [...scanned, ...recorded, ...mine],
      commentable: waitingAttempt() === n,
      label: `Files changed in attempt ${n}`,
      compare: comparing ? { model: prevModel, attempt: back.attempt, annotations: (cur.reviews || []).filter((r) => r.attempt === back.attempt).flatMap((r) => noteOf(r)) } : null,
      onComment: (path, side, line, tr) => openCommentForm(n, path, side, line, tr),
      onRemove: (noteId) => { pending = pending.filter((c) => c.id !== noteId); savePending(); drawChange(n, model, back, prevModel); renderReview(); },
    });
    diffBox.replaceChildren(view);
    diffBox.dataset.n = String(n);
    diffBox.dataset.sha = model.sha256;
    diffBox.dataset.drawn = drawn;
    window.scrollTo(0, y);
  }

  const noteOf = (r) => (r.line_comments || []).map((c) => ({ path: c.path, side: c.side, line: c.line, body: c.body, kind: "review", author: reviewer(r),
    meta: `${VERB[r.action] || r.action} attempt ${r.attempt} · ${fmtTime(r.decided_at)}`, label: `Comment by ${reviewer(r)} on ${c.path} line ${c.line}` }));

  function openCommentForm(n, path, side, line, tr) {
    if (tr.nextElementSibling?.classList.contains("dv-form-row")) { tr.nextElementSibling.querySelector("textarea").focus(); return; }
    const text = h("textarea", { "aria-label": `Your comment on ${path} ${side === "old" ? "removed " : ""}line ${line}`, rows: "3" });
    const row = h("tr", { class: "dv-form-row" }, h("td", { colspan: "3" }, h("form", { class: "dv-form", onsubmit: (e) => {
      e.preventDefault();
      if (!text.value.trim()) { text.focus(); return; }
      pending.push({ id: `c${Date.now()}${Math.random().toString(36).slice(2, 6)}`, attempt: n, path, side, line, body: text.value.trim() });
      savePending();
      showAttempt(n);
    } }, h("div", { class: "muted small", text: `${path}, ${side === "old" ? "removed " : ""}line ${line}: sent with your decision` }), text,
      h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", text: "Add comment" }),
        h("button", { type: "button", text: "Cancel", onclick: () => row.remove() })))));
    tr.after(row);
    text.focus();
  }

  // The review box: after the change, so it is where a reviewer ends up; the notice at the top links to it.
  function renderReview() {
    const waiting = waitingAttempt();
    const focusedId = document.activeElement && review.contains(document.activeElement) ? document.activeElement.id : null;
    if (waiting === null) {
      review.replaceChildren(); notice.replaceChildren();
      if (cur.state !== "awaiting_review" && pending.length) { pending = []; savePending(); }
      return;
    }
    notice.replaceChildren(h("p", { class: "card notice", id: "review-notice" }, `Attempt ${waiting} awaits your review. `,
      h("a", { href: "#", onclick: (e) => { e.preventDefault(); document.getElementById("review-box")?.scrollIntoView({ block: "center" }); document.getElementById("review-comment")?.focus(); }, text: "Go to the review box (r)" }),
      h("span", { class: "muted", text: " · approve: a, reject: x, next item: n" })));
    const looking = selected;
    const model = diffBox.dataset.n === String(looking) ? diffBox.dataset.sha : null;
    const stale = looking !== waiting;
    const mine = pending.filter((c) => c.attempt === waiting);
    const comment = h("textarea", { id: "review-comment", rows: "3", "aria-describedby": "review-help", oninput: (e) => { draft = e.target.value; } });
    comment.value = draft;  // a live refresh redraws the box: what the reviewer was writing stays
    const name = me && me.review_names ? h("input", { id: "reviewer-name", autocomplete: "name", value: localStorage.getItem(NAME_STORE) || "", oninput: (e) => localStorage.setItem(NAME_STORE, e.target.value.trim()) }) : null;
    const result = h("div", { id: "review-result", role: "alert" });
    const buttons = [];
    const send = async (action, reason) => {
      const text = action === "reject" ? reason : comment.value;
      if (action === "request_changes" && !text.trim() && !mine.length) { result.replaceChildren(h("p", { class: "verdict-failed", text: "Say what should change: a comment, or comments on lines of the diff." })); comment.focus(); return; }
      for (const b of buttons) b.disabled = true;
      result.replaceChildren(h("p", { class: "muted", text: "Sending…" }));
      const body = { action, attempt: looking, diff_sha256: model || null, comment: text.trim() || null,
        reviewer: name && name.value.trim() ? name.value.trim() : null,
        line_comments: mine.map((c) => ({ path: c.path, side: c.side, line: c.line, body: c.body })) };
      try {
        const res = await api(`/v1/work-items/${id}/review`, { method: "POST", json: body });
        pending = pending.filter((c) => c.attempt !== waiting); savePending(); draft = "";
        result.replaceChildren(h("p", { class: "verdict-passed", text: res.message || `${action} sent` }));
        toast(res.message || `${action} sent`);
        await refresh();
      } catch (e) {
        const staleView = e.problem && e.problem.code === "review_stale";
        result.replaceChildren(h("div", { class: "card refused", id: "review-refused" },
          h("strong", { text: staleView ? "Not sent: you were looking at a stale change." : e instanceof Offline ? "Not sent: the API cannot be reached." : "Not sent." }),
          h("p", { text: e.message }),
          staleView ? h("button", { type: "button", class: "primary", id: "show-waiting", text: "Reload and show the attempt that waits", onclick: () => refresh({ follow: true }) }) : ""));
        for (const b of buttons) b.disabled = stale;
      }
    };
    const approve = h("button", { type: "button", class: "approve", id: "approve", disabled: stale || !model, onclick: () => send("approve"), text: `Approve attempt ${looking}` });
    const changes = h("button", { type: "button", id: "request-changes", disabled: stale || !model, onclick: () => send("request_changes"), text: "Request changes" });
    const reject = h("button", { type: "button", class: "reject", id: "reject", disabled: stale, onclick: () => askReject(waiting, (reason) => send("reject", reason)), text: "Reject…" });
    buttons.push(approve, changes, reject);
    review.replaceChildren(h("section", { class: "card review", id: "review-box", "aria-labelledby": "review-heading" },
      h("h2", { id: "review-heading", text: `Review attempt ${waiting}` }),
      h("p", { id: "review-what" }, "You decide on ", h("strong", { text: `attempt ${waiting}` }),
        model ? [", diff sha256 ", h("span", { class: "mono", text: `${model.slice(0, 12)}…` })] : "",
        cur.base_commit ? [" on base commit ", h("span", { class: "mono", text: cur.base_commit.slice(0, 12) })] : "",
        ". Approve lands exactly this change on ", h("span", { class: "mono", text: `crewwork/${id}` }), "."),
      stale ? h("p", { class: "card refused", id: "review-stale" }, `You are looking at attempt ${looking}; attempt ${waiting} is the one awaiting review. `,
        h("button", { type: "button", class: "primary", onclick: () => showAttempt(waiting, { focusTab: true }), text: `Show attempt ${waiting}` })) : "",
      mine.length ? h("div", { id: "pending-comments" }, h("p", { text: `${mine.length} line comment${mine.length > 1 ? "s" : ""} go${mine.length > 1 ? "" : "es"} with your decision:` }),
        h("ul", {}, mine.map((c) => h("li", {}, h("span", { class: "mono", text: `${c.path}:${c.line}` }), ` ${c.body}`)))) : "",
      h("p", { id: "review-help", class: "muted", text: "Approve lands the change; request changes sends your comment and line comments to the agent as the next attempt's input (quoted as reviewer input); reject ends the work item and needs a reason. Comment on a line with the + beside it." }),
      name ? h("label", { class: "stack" }, "Your name (shown beside your API key)", name) : "",
      h("label", { class: "stack", for: "review-comment", text: "Comment (required to request changes unless you commented on lines)" }), comment,
      h("div", { class: "actions" }, approve, changes, reject), result));
    if (focusedId) document.getElementById(focusedId)?.focus();
  }

  function askReject(attempt, confirm) {
    const reason = h("textarea", { id: "reject-reason", rows: "3", "aria-required": "true", "aria-describedby": "reject-help" });
    const error = h("p", { class: "verdict-failed", role: "alert" });
    const dialog = h("dialog", { id: "reject-dialog", "aria-labelledby": "reject-title" },
      h("form", { method: "dialog", onsubmit: (e) => {
        e.preventDefault();
        if (!reason.value.trim()) { error.textContent = "A rejection needs a reason: it is what everyone reads about this item."; reason.focus(); return; }
        dialog.close(); dialog.remove(); confirm(reason.value.trim());
      } },
        h("h2", { id: "reject-title", text: `Reject attempt ${attempt}?` }),
        h("p", { id: "reject-help", text: "The work item ends rejected: nothing lands and no further attempt runs. Say why." }),
        h("label", { class: "stack", for: "reject-reason", text: "Reason (required)" }), reason, error,
        h("div", { class: "actions" }, h("button", { type: "submit", class: "reject", id: "confirm-reject", text: `Reject attempt ${attempt}` }),
          h("button", { type: "button", text: "Cancel", onclick: () => { dialog.close(); dialog.remove(); document.getElementById("reject")?.focus(); } }))));
    document.body.append(dialog);
    dialog.addEventListener("cancel", () => dialog.remove());
    dialog.showModal();
    reason.focus();
  }

  function drawHeader() {
    header.replaceChildren(
      h("h1", {}, h("span", { id: "item-title", text: cur.title || cur.id }), " ", stateBadge(cur.state), cur.mock ? [" ", mockBadge()] : ""),
      h("dl", { class: "grid" },
        h("dt", { text: "Work item" }), h("dd", { class: "mono", text: `${cur.id} (${cur.kind}${cur.agent ? ", agent " + cur.agent : ""})` }),
        h("dt", { text: "Reason" }), h("dd", { id: "item-reason", text: cur.reason || "" }),
        h("dt", { text: "Instruction" }), h("dd", {}, h("details", {}, h("summary", { text: (cur.title || "").slice(0, 120) || "input" }), h("pre", { text: (cur.spec.instruction || JSON.stringify(cur.spec.input || {}, null, 2)).slice(0, 4000) }))),
        h("dt", { text: "Repository" }), h("dd", { class: "mono", text: `${cur.repo || ""} ${cur.base_commit ? "@ " + cur.base_commit.slice(0, 12) : ""}` }),
        h("dt", { text: "Labels" }), h("dd", { text: Object.entries(cur.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ") }),
        h("dt", { text: "Delivery branch" }), h("dd", { class: "mono", text: cur.delivery_branch ? `${cur.delivery_branch} ${cur.landed_commit ? "(" + cur.landed_commit.slice(0, 12) + ")" : ""}` : "" }),
        h("dt", { text: "Pull request" }), h("dd", {}, prLink(cur.pull_request_url)),
        h("dt", { text: "Evidence bundle" }), h("dd", { id: "evidence-bundle" }, bundleStatus(id, cur.evidence_bundle)),
        h("dt", { text: "Workflow" }), h("dd", {},
          h("a", { href: cur.links.temporal_ui, target: "_blank", rel: "noopener", id: "temporal-workflow-link", text: `${cur.workflow_id} in the Temporal UI` }),
          // A queued item's workflow starts when a place is handed to it (docs/operations.md): until then the link
          // finds nothing. (A queued item sent back by reviewers has a running workflow, which answers the live query.)
          cur.state === "queued" && !cur.live ? h("span", { class: "muted", id: "workflow-not-started", text: " (not started yet: it starts when its place in the queue comes)" }) : null),
        // The worker build it runs on, as Temporal reports it (docs/operations.md, "Deploying a new build").
        h("dt", { text: "Build" }), h("dd", { class: "mono", id: "item-build", text: cur.build ? `${cur.build.deployment}:${cur.build.build_id} (${cur.build.behavior}${cur.build.override ? ", " + cur.build.override : ""})` : "unversioned workers" }),
        cur.legal_hold ? h("dt", { text: "Legal hold" }) : null,
        cur.legal_hold ? h("dd", { id: "item-legal-hold", text: `${cur.legal_hold.reason} (since ${fmtTime(cur.legal_hold.set_at)})` }) : null,
        cur.retained_at ? h("dt", { text: "Retention" }) : null,
        cur.retained_at ? h("dd", { id: "item-retained", text: `details removed ${fmtTime(cur.retained_at)}; the record, verdicts, digests and evidence bundle are kept` }) : null,
        h("dt", { text: "Created / updated" }), h("dd", { text: `${fmtTime(cur.created_at)} / ${fmtTime(cur.updated_at)}` })));
  }

  // What happened, in order: attempts and their verdicts, every review decision with its comments, the outcome.
  function drawTimeline() {
    const entries = evidence.map((e) => ({ t: e.created_at, el: h("li", { class: `story-attempt verdict-${e.verdict}` },
      h("strong", { text: `Attempt ${e.number} ${e.verdict}` }), e.cause && e.verdict !== "passed" ? h("span", { class: "muted", text: ` (${e.cause})` }) : "",
      h("span", { class: "muted small", text: ` · ${fmtTime(e.created_at)}` })) }));
    for (const r of cur.reviews || []) {
      entries.push({ t: r.decided_at, el: h("li", { class: `story-review ${r.action}` },
        h("strong", { class: "review-who", text: `${reviewer(r)} ${VERB[r.action] || r.action} attempt ${r.attempt}` }),
        h("span", { class: "muted small", text: ` · ${fmtTime(r.decided_at)}` }),
        r.comment ? h("blockquote", { class: "review-comment", text: r.comment }) : "",
        (r.line_comments || []).length ? h("ul", { class: "review-lines" }, r.line_comments.map((c) => h("li", {}, h("span", { class: "mono", text: `${c.path}:${c.line}${c.side === "old" ? " (removed)" : ""}` }), " ", c.body))) : "") });
    }
    if (cur.state === "awaiting_review" && cur.under_review) entries.push({ t: cur.waiting_since || cur.updated_at, el: h("li", { class: "story-waiting" }, h("strong", { text: `Awaiting review of attempt ${cur.under_review.attempt}` }), h("span", { class: "muted small", text: ` · for ${ago(now() - (cur.waiting_since || cur.updated_at))}` })) });
    if (TERMINAL.has(cur.state)) entries.push({ t: cur.updated_at + 1e-3, el: h("li", { class: `story-end ${cur.state}` }, h("strong", { text: stateName(cur.state) }), `: ${cur.reason}`) });
    entries.sort((a, b) => a.t - b.t);
    timeline.replaceChildren(...(entries.length ? entries.map((e) => e.el) : [h("li", { class: "muted", text: "Nothing has happened yet." })]));
  }

  async function refresh({ follow = false } = {}) {
    cur = await api(`/v1/work-items/${id}`);
    drawHeader();
    const fresh = await api(`/v1/work-items/${id}/evidence`);
    // Re-render the attempt tabs only when the evidence changed, and keep the keyboard focus on the same attempt's
    // button when it is rebuilt: a live refresh must never swallow a key press aimed at the old button.
    const changed = JSON.stringify(fresh) !== JSON.stringify(evidence) || !tabs.childElementCount;
    const newAttempt = fresh.length > evidence.length;
    evidence = fresh;
    drawTimeline();
    if (changed) {
      const focused = document.activeElement && tabs.contains(document.activeElement) ? document.activeElement.dataset.n : null;
      tabs.replaceChildren(...evidence.map((e) => h("li", {}, h("button", { type: "button", "data-n": String(e.number), "aria-pressed": "false", onclick: () => showAttempt(e.number) },
        h("strong", { text: `Attempt ${e.number}` }), h("span", { class: `verdict-${e.verdict}`, text: e.verdict }),
        h("span", { class: "muted", text: e.cause || "" })))));
      if (!evidence.length) tabs.replaceChildren(h("li", { class: "muted", text: "No attempts recorded yet." }));
      const again = focused && tabs.querySelector(`button[data-n="${focused}"]`);
      if (again) again.focus();
    }
    // Follow the attempt that awaits review (or the newest) unless the reviewer chose another one; a new attempt
    // never leaves the old one on screen under a review box for the new one (the box would say so anyway).
    const waiting = waitingAttempt();
    const latest = evidence.length ? evidence[evidence.length - 1].number : null;
    let n = selected && evidence.some((e) => e.number === selected) ? selected : (waiting || latest);
    if (follow || (newAttempt && selected === n && n !== latest)) n = waiting || latest;
    if (n !== null) await showAttempt(n);
    else renderReview();
  }

  let pendingRefresh = null;
  pageRefresh = () => refresh();
  const refreshing = refresh();
  streamEvents(`/v1/work-items/${id}/events/stream`, (type, ev) => {
    const [what, detail] = describeEvent(type, ev);
    eventsList.append(h("li", { class: `ev ev-${type}` }, h("span", { class: "muted mono small", text: new Date(ev.created_at * 1000).toLocaleTimeString() }), " ",
      h("strong", { text: what }), detail ? [" ", h("span", { text: String(detail).slice(0, 300) })] : ""));
    eventsList.parentElement.scrollTop = eventsList.parentElement.scrollHeight;
    if (type === "state_changed" || type === "attempt_recorded" || type === "review_decided" || type === "landed") {
      clearTimeout(pendingRefresh);
      pendingRefresh = setTimeout(() => refresh().catch((e) => { if (!(e instanceof Offline)) toast(e.message); }), 150);
    }
  }, signal, (s) => { live.textContent = LIVE_TEXT[s] || s; });
  try { await refreshing; }
  catch (e) { if (!(e instanceof Offline)) throw e; }  // the page stays; it refreshes once the API answers
}

// ------------------------------------------------------------------------------------------ workers

async function renderWorkers(signal) {
  setNav("workers");
  pageRefresh = null;
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
  main().replaceChildren(h("h1", { text: `Workers (namespace ${data.namespace})` }), h("div", { class: "table-scroll" }, table),
    h("p", { class: "muted", text: "From Temporal's task-queue descriptions; refreshed every 5 s." }));
  await sleep(5000, signal);
  if (!signal.aborted) route();
}

// ------------------------------------------------------------------------------------------ routing

async function route() {
  if (!apiKey()) { renderLogin(); return; }
  if (pageAbort) pageAbort.abort();
  pageAbort = new AbortController();
  pageRefresh = null;
  const signal = pageAbort.signal;
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  try {
    if (!me || me.key !== apiKey()) { await whoami(); me.key = apiKey(); }
    if (path.startsWith("/items/")) await renderItem(signal, decodeURIComponent(path.slice(7)));
    else if (path === "/workers") await renderWorkers(signal);
    else await renderList(signal, query || "");
    main().focus({ preventScroll: true });
  } catch (e) {
    if (e.message === "unauthorized") return;
    main().replaceChildren(h("p", { class: "card verdict-failed", role: "alert", text: e.message }));
    // Shown again once the API answers.
    if (e instanceof Offline) pageRefresh = () => route();
  }
}

// Who the key is (tenant, key id, whether reviewer names are taken), once per key.
async function whoami() {
  me = await api("/v1/me");
  document.getElementById("whoami").textContent = `tenant ${me.tenant_id} · key ${me.key_id}${me.admin ? " · admin" : ""}`;
  document.getElementById("temporal-link").href = me.temporal_ui;
  document.getElementById("signout").hidden = false;
}

async function boot() {
  me = null;
  await route();
}

function onKey(e) {
  if (e.ctrlKey || e.metaKey || e.altKey || document.querySelector("dialog[open]")) return;
  const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement?.tagName);
  if (typing) return;
  const onItem = location.hash.startsWith("#/items/");
  const click = (sel) => { const el = document.querySelector(sel); if (el && !el.disabled) { e.preventDefault(); el.click(); return true; } return false; };
  if (e.key === "/") { const s = document.getElementById("f-search"); if (s) { e.preventDefault(); s.focus(); } }
  else if (e.key === "Escape" && onItem) { location.hash = "#/"; }
  else if (!onItem && (e.key === "j" || e.key === "ArrowDown") && document.getElementById("queue")) { e.preventDefault(); moveInQueue(1); }
  else if (!onItem && (e.key === "k" || e.key === "ArrowUp") && document.getElementById("queue")) { e.preventDefault(); moveInQueue(-1); }
  else if (onItem && e.key === "n") click("#next-item");
  else if (onItem && e.key === "p") click("#prev-item");
  else if (onItem && e.key === "a") { const b = document.getElementById("approve"); if (b && !b.disabled) { e.preventDefault(); b.scrollIntoView({ block: "center" }); b.focus(); } }
  else if (onItem && e.key === "r") { const c = document.getElementById("review-comment"); if (c) { e.preventDefault(); c.scrollIntoView({ block: "center" }); c.focus(); } }
  else if (onItem && e.key === "x") click("#reject");
}

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("hashchange", route);
  // The skip link moves the focus; as a hash link it would be taken for a page of the console.
  document.querySelector(".skip").addEventListener("click", (e) => { e.preventDefault(); main().focus(); });
  document.getElementById("signout").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); me = null; renderLogin("Signed out."); });
  document.addEventListener("keydown", onKey);
  if (apiKey()) boot().catch((e) => { if (e instanceof Offline) pageRefresh = () => boot(); }); else renderLogin();
});
