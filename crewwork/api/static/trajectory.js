// crewwork console: an agent's transcript as a readable trajectory. The model agent's transcript (JSON: messages and
// calls) becomes its turns, with the edits it proposed (SEARCH/REPLACE blocks) and the tokens each call used; a
// command agent's (JSON: argv, exit code, output tails) the command it ran and what it printed; anything else (the
// scripted agent's notes) is shown as the text it is. All of it came from an agent or a model: text only.
"use strict";

const CrewTrajectory = (() => {
  const el = (tag, attrs = {}, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") e.textContent = v; else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) if (c !== null && c !== undefined && c !== "") e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  };
  const TEXT_MAX = 20000;  // characters of one message shown before "show all"
  const EDIT = /^(.*?)\n?<{5,7} SEARCH\n([\s\S]*?)\n={5,7}\n([\s\S]*?)\n>{5,7} REPLACE/gm;

  function bounded(text, cls) {
    const s = String(text ?? "");
    const pre = el("pre", { class: cls || "traj-text", tabindex: "0" });
    pre.textContent = s.length > TEXT_MAX ? s.slice(0, TEXT_MAX) : s;
    if (s.length <= TEXT_MAX) return pre;
    const more = el("button", { type: "button", class: "linklike", text: `show all ${s.length} characters` });
    more.addEventListener("click", () => { pre.textContent = s; more.remove(); });
    return el("div", {}, pre, more);
  }

  function contentText(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) return content.map((p) => (typeof p === "string" ? p : p && (p.text || p.content || JSON.stringify(p)))).join("\n");
    return content == null ? "" : JSON.stringify(content, null, 2);
  }

  // The edits a model's reply proposes, as file + before/after.
  function edits(text) {
    const out = [];
    let m;
    EDIT.lastIndex = 0;
    while ((m = EDIT.exec(text)) !== null) out.push({ path: (m[1] || "").trim().split("\n").pop().replace(/[`*]/g, "").trim(), search: m[2], replace: m[3] });
    return out;
  }

  function modelSteps(doc) {
    const steps = [];
    const calls = Array.isArray(doc.calls) ? doc.calls : [];
    let turn = 0;
    for (const msg of Array.isArray(doc.messages) ? doc.messages : []) {
      const role = String(msg.role || "message");
      const text = contentText(msg.content);
      if (role === "system") { steps.push(el("details", { class: "traj-step system" }, el("summary", { text: "System prompt" }), bounded(text))); continue; }
      if (role === "assistant") {
        const call = calls[turn++] || {};
        const used = call.usage || call;
        const tokens = used.total_tokens ?? used.tokens ?? null;
        const found = edits(text);
        steps.push(el("li", { class: "traj-step assistant" },
          el("div", { class: "traj-head" }, el("strong", { text: `Model turn ${turn}` }),
            call.model ? el("span", { class: "muted", text: ` ${call.model}` }) : "", tokens != null ? el("span", { class: "muted", text: ` · ${tokens} tokens` }) : "",
            found.length ? el("span", { class: "traj-badge", text: `${found.length} edit(s)` }) : ""),
          found.map((e) => el("div", { class: "traj-edit" }, el("div", { class: "mono", text: `edit ${e.path || "(file not named)"}` }),
            el("div", { class: "traj-edit-pair" }, bounded(e.search, "traj-search"), bounded(e.replace, "traj-replace")))),
          el("details", {}, el("summary", { text: "Full reply" }), bounded(text))));
        continue;
      }
      if (role === "tool") { steps.push(el("li", { class: "traj-step tool" }, el("div", { class: "traj-head" }, el("strong", { text: "Tool result" })), bounded(text))); continue; }
      steps.push(el("li", { class: "traj-step user" }, el("div", { class: "traj-head" }, el("strong", { text: role === "user" ? "Prompt to the model" : role })),
        el("details", {}, el("summary", { text: text.split("\n")[0].slice(0, 160) || "(empty)" }), bounded(text))));
    }
    const head = el("p", { class: "muted", text: `Model agent: ${calls.length} call(s), ${doc.tokens_used ?? "?"} tokens, $${Number(doc.cost_usd || 0).toFixed(4)}` });
    return [head, el("ol", { class: "traj" }, steps)];
  }

  function commandSteps(doc) {
    const argv = Array.isArray(doc.argv) ? doc.argv.join(" ") : String(doc.command || "");
    const flags = ["timed_out", "oom_killed", "pids_limited"].filter((k) => doc[k]).join(", ");
    return [el("ol", { class: "traj" },
      el("li", { class: "traj-step command" }, el("div", { class: "traj-head" }, el("strong", { text: "Command" }),
        el("span", { class: "muted", text: ` exit ${doc.exit_code ?? "?"} · ${doc.duration_s ?? "?"} s${doc.backend ? " · " + doc.backend : ""}${flags ? " · " + flags : ""}` })),
      el("pre", { class: "traj-cmd mono", text: `$ ${argv}` }),
      doc.stdout_tail ? el("details", { open: true }, el("summary", { text: "Output (tail)" }), bounded(doc.stdout_tail)) : "",
      doc.stderr_tail ? el("details", {}, el("summary", { text: "Errors (tail)" }), bounded(doc.stderr_tail)) : ""))];
  }

  // The transcript's text as a trajectory element.
  function render(text) {
    const box = el("div", { class: "trajectory" });
    let doc = null;
    const s = String(text ?? "").trim();
    if (s.startsWith("{")) { try { doc = JSON.parse(s); } catch (_) { doc = null; } }
    if (doc && Array.isArray(doc.messages)) box.append(...modelSteps(doc));
    else if (doc && (doc.argv || doc.command)) box.append(...commandSteps(doc));
    else box.append(el("p", { class: "muted", text: "The agent's notes, as it wrote them:" }), bounded(s, "log"));
    return box;
  }

  return { render, edits };
})();
