// crewwork console: the diff view. Draws an attempt's diff as the API models it (GET .../diff?format=json:
// files, hunks, lines with old/new numbers) with a file list (+/- per file), line numbers, collapsible files, and
// annotations on lines: a reviewer's line comments, or anything else that points at (path, side, line). With
// `compare`, it draws the attempt's change against an earlier attempt's (what changed since then), with that
// attempt's annotations beside the lines they were about. Everything in a diff came from an agent: text only.
"use strict";

const CrewDiff = (() => {
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  const KEYWORDS = new Set(("False None True and as assert async await break class continue def del elif else except finally for " +
    "from global if import in is lambda nonlocal not or pass raise return try while with yield " +
    "const let var function new this typeof instanceof switch case default throw catch export extends static void " +
    "fn impl pub use mod struct enum match mut func package type go defer chan interface range").split(" "));
  const TOKEN = /(#[^\n]*|\/\/[^\n]*)|("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`(?:\\.|[^`\\])*`)|\b(\d+(?:\.\d+)?)\b|\b([A-Za-z_][A-Za-z0-9_]*)(\s*\()?/g;
  const HIGHLIGHT_MAX = 2000;  // longer lines are shown plain

  function highlight(text) {
    if (text.length > HIGHLIGHT_MAX) return esc(text);
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

  const SIGN = { add: "+", del: "-", context: " ", note: "" };
  const KIND_LABEL = { add: "added", del: "removed", context: "unchanged", note: "note" };
  const COLLAPSE_OVER = 800;  // files with more diff lines start collapsed

  // The key an annotation is found by: a line of a file on one side of the diff.
  const key = (path, side, line) => `${side}:${line}:${path}`;

  function annotationIndex(annotations) {
    const index = new Map();
    for (const a of annotations || []) {
      const k = key(a.path, a.side || "new", a.line);
      if (!index.has(k)) index.set(k, []);
      index.get(k).push(a);
    }
    return index;
  }

  function annotationRows(list, cols) {
    return list.map((a) => `<tr class="dv-note-row"><td colspan="${cols}"><div class="dv-note ${esc(a.kind || "comment")}" role="note"` +
      ` aria-label="${esc(a.label || "Comment")}"><div class="dv-note-head"><strong>${esc(a.author || "")}</strong>` +
      ` <span class="muted">${esc(a.meta || "")}</span>` +
      (a.removable ? ` <button type="button" class="dv-remove" data-note-id="${esc(a.id)}">Remove</button>` : "") +
      `</div><div class="dv-note-body">${esc(a.body)}</div></div></td></tr>`).join("");
  }

  function lineRow(file, ln, fileIndex, opts, index, extraClass = "", nums = null) {
    const old = nums ? nums.old : ln.old, nw = nums ? nums.new : ln.new;
    const side = ln.kind === "del" ? "old" : "new";
    const number = side === "old" ? old : nw;
    const commentable = opts.commentable && ln.kind !== "note" && number;
    const button = commentable
      ? `<button type="button" class="dv-add-comment" data-file="${fileIndex}" data-side="${side}" data-line="${number}"` +
        ` aria-label="Comment on ${esc(file.path)} ${side === "old" ? "removed " : ""}line ${number}">+</button>` : "";
    const body = ln.kind === "note" ? esc(ln.text) : highlight(ln.text);
    const row = `<tr class="dv-line ${ln.kind}${extraClass}" data-side="${side}" data-line="${number || ""}">` +
      `<td class="dv-num">${old ?? ""}</td><td class="dv-num">${nw ?? ""}</td>` +
      `<td class="dv-code"><span class="dv-gutter">${button}</span><span class="dv-sign" aria-hidden="true">${SIGN[ln.kind]}</span>${ln.kind === "context" ? "" : `<span class="sr-only">${KIND_LABEL[ln.kind]}: </span>`}${body || " "}</td></tr>`;
    const notes = number ? index.get(key(file.path, side, number)) : null;
    return row + (notes ? annotationRows(notes, 3) : "");
  }

  function fileTable(file, fileIndex, opts, index) {
    const rows = [];
    for (const h of file.hunks) {
      rows.push(`<tr class="dv-hunk"><td colspan="3">${esc(h.header)}</td></tr>`);
      for (const ln of h.lines) rows.push(lineRow(file, ln, fileIndex, opts, index));
    }
    return rows.join("");
  }

  const tableHead = (first = "Old", second = "New") => `<thead class="sr-only"><tr><th scope="col">${first} line</th><th scope="col">${second} line</th><th scope="col">Change</th></tr></thead>`;

  function counts(f) {
    return `<span class="dv-plus">+${f.additions}</span> <span class="dv-minus">−${f.deletions}</span>`;
  }

  function fileSummary(f) {
    const status = f.status !== "modified" ? ` <span class="dv-status">${esc(f.status)}${f.status === "renamed" && f.old_path ? ` from ${esc(f.old_path)}` : ""}</span>` : "";
    return `<span class="dv-path mono">${esc(f.path)}</span>${status} ${counts(f)}` +
      (f.binary ? ' <span class="dv-status">binary</span>' : "") + (f.truncated ? ' <span class="dv-status">cut to size</span>' : "");
  }

  // The whole view. `model`: the API's DiffView. `opts`: {annotations, commentable, label, compare: {model, attempt,
  // annotations}}. Returns an element; line-comment buttons call opts.onComment(path, side, line, rowElement).
  function render(model, opts = {}) {
    const box = document.createElement("div");
    box.className = "dv";
    const files = model.files || [];
    const compare = opts.compare ? comparison(opts.compare.model, model) : null;
    const index = annotationIndex(opts.annotations);
    const prevIndex = compare ? annotationIndex(opts.compare.annotations) : null;
    const shownFiles = compare ? compare.files : files;
    const total = compare
      ? `${compare.changedFiles} of ${shownFiles.length} file(s) changed since attempt ${opts.compare.attempt}`
      : `${files.length} file(s) changed, <span class="dv-plus">+${model.additions}</span> <span class="dv-minus">−${model.deletions}</span>`;
    let html = `<div class="dv-summary"><span>${total}</span>` +
      `<span class="dv-tools"><button type="button" class="dv-expand-all">Expand all</button> <button type="button" class="dv-collapse-all">Collapse all</button></span></div>`;
    if (model.note) html += `<p class="muted">${esc(model.note)}</p>`;
    html += `<nav class="dv-files" aria-label="${esc(opts.label || "Files changed")}"><ul>` +
      shownFiles.map((f, i) => `<li><button type="button" class="linklike dv-jump" data-file="${i}">${fileSummary(compare ? f.file : f)}</button>` +
        (compare ? ` <span class="muted">${f.changed ? "changed since" : "same as"} attempt ${opts.compare.attempt}</span>` : "") + "</li>").join("") +
      "</ul></nav>";
    shownFiles.forEach((entry, i) => {
      const f = compare ? entry.file : entry;
      const lines = f.hunks.reduce((n, h) => n + h.lines.length, 0);
      const open = compare ? entry.changed : lines <= COLLAPSE_OVER;
      const body = compare ? comparisonRows(entry, i, opts, index, prevIndex, opts.compare.attempt) : fileTable(f, i, opts, index);
      const empty = f.binary ? "Binary file: not shown." : (!f.hunks.length ? "No line changes (mode or name only)." : "");
      html += `<details class="dv-file" id="dv-file-${i}" data-path="${esc(f.path)}"${open ? " open" : ""}>` +
        `<summary>${fileSummary(f)}${!open && lines > COLLAPSE_OVER ? ` <span class="muted">(${lines} lines: collapsed)</span>` : ""}</summary>` +
        (empty ? `<p class="muted dv-empty">${empty}</p>` :
          `<div class="dv-scroll" tabindex="0" role="region" aria-label="Lines of ${esc(f.path)}"><table class="dv-table">${compare ? tableHead(`Attempt ${opts.compare.attempt} / old`, "New") : tableHead()}<tbody>${body}</tbody></table></div>`) +
        "</details>";
    });
    if (!shownFiles.length) html += '<p class="muted">The diff changes no file.</p>';
    box.innerHTML = html;
    box.addEventListener("click", (e) => {
      const t = e.target.closest("button");
      if (!t || !box.contains(t)) return;
      if (t.classList.contains("dv-jump")) {
        const d = box.querySelector(`#dv-file-${t.dataset.file}`);
        d.open = true; d.scrollIntoView({ block: "start" }); d.querySelector("summary").focus();
      } else if (t.classList.contains("dv-expand-all") || t.classList.contains("dv-collapse-all")) {
        const open = t.classList.contains("dv-expand-all");
        for (const d of box.querySelectorAll("details.dv-file")) d.open = open;
      } else if (t.classList.contains("dv-add-comment") && opts.onComment) {
        const f = shownFiles[Number(t.dataset.file)];
        opts.onComment((compare ? f.file : f).path, t.dataset.side, Number(t.dataset.line), t.closest("tr"));
      } else if (t.classList.contains("dv-remove") && opts.onRemove) {
        opts.onRemove(t.dataset.noteId);
      }
    });
    return box;
  }

  // ------------------------------------------------------------------------------------ comparing two attempts

  const COMPARE_MAX = 4000;  // lines per file side; past it, lines are matched by content only (no alignment)

  function flat(file) {
    const out = [];
    for (const h of (file ? file.hunks : [])) for (const ln of h.lines) if (ln.kind !== "note") out.push(ln);
    return out;
  }

  // Longest common subsequence of two line lists (by kind and text), as an alignment: [a|null, b|null] pairs.
  function align(a, b) {
    const same = (x, y) => x.kind === y.kind && x.text === y.text;
    if (a.length > COMPARE_MAX || b.length > COMPARE_MAX) {
      const waiting = new Map();
      for (const x of a) { const k = x.kind + x.text; if (!waiting.has(k)) waiting.set(k, []); waiting.get(k).push(x); }
      const pairs = b.map((y) => [(waiting.get(y.kind + y.text) || []).shift() || null, y]);
      for (const rest of waiting.values()) for (const x of rest) pairs.push([x, null]);
      return pairs;
    }
    const n = a.length, m = b.length;
    const dp = Array.from({ length: n + 1 }, () => new Uint16Array(m + 1));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) {
      dp[i][j] = same(a[i], b[j]) ? dp[i + 1][j + 1] + 1 : Math.max(dp[i + 1][j], dp[i][j + 1]);
    }
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (same(a[i], b[j])) { out.push([a[i], b[j]]); i++; j++; }
      else if (dp[i + 1][j] >= dp[i][j + 1]) { out.push([a[i], null]); i++; }
      else { out.push([null, b[j]]); j++; }
    }
    while (i < n) out.push([a[i++], null]);
    while (j < m) out.push([null, b[j++]]);
    return out;
  }

  // Per file: the current attempt's diff lines aligned with the earlier attempt's.
  function comparison(prev, cur) {
    const prevFiles = new Map((prev.files || []).map((f) => [f.path, f]));
    const files = [];
    for (const f of cur.files || []) {
      const before = prevFiles.get(f.path);
      prevFiles.delete(f.path);
      const pairs = align(flat(before), flat(f));
      files.push({ file: f, before, pairs, changed: pairs.some(([x, y]) => !x || !y) });
    }
    for (const before of prevFiles.values()) {
      // In the earlier attempt's change only: the new attempt leaves the file as it was.
      files.push({ file: { ...before, additions: 0, deletions: 0 }, before, pairs: flat(before).map((x) => [x, null]), changed: true, dropped: true });
    }
    return { files, changedFiles: files.filter((f) => f.changed).length };
  }

  function comparisonRows(entry, fileIndex, opts, index, prevIndex, attempt) {
    const rows = [];
    const f = entry.file;
    for (const [was, now] of entry.pairs) {
      if (now) {
        rows.push(lineRow(f, now, fileIndex, opts, index, was ? "" : " since-new"));
        if (was) rows.push(prevNotes(f, was, prevIndex));
      } else {
        const side = was.kind === "del" ? "old" : "new";
        rows.push(`<tr class="dv-line ${was.kind} since-gone" title="in attempt ${attempt}'s change, not in this one">` +
          `<td class="dv-num">${was.old ?? ""}</td><td class="dv-num">${was.new ?? ""}</td>` +
          `<td class="dv-code"><span class="dv-gutter"></span><span class="dv-sign" aria-hidden="true">×</span><span class="sr-only">dropped since attempt ${attempt}: </span>${highlight(was.text) || " "}</td></tr>`);
        rows.push(prevNotes(f, was, prevIndex, side));
      }
    }
    return rows.join("");
  }

  // The earlier attempt's annotations on a line of its own diff, beside the line as it is aligned now.
  function prevNotes(file, was, prevIndex, side) {
    const s = side || (was.kind === "del" ? "old" : "new");
    const number = s === "old" ? was.old : was.new;
    const list = number ? prevIndex.get(key(file.path, s, number)) : null;
    return list ? annotationRows(list, 3) : "";
  }

  return { render, comparison, highlight, esc };
})();
