"""Plain-text rendering of a work item, shared by the CLI (`crewwork status`) and the demo's summary.

Everything shown here may come from a tenant, an agent or the app under test (a reason quoting the page a probe saw,
a reviewer's comment): `terminal_text` makes each one line of plain text first, so no markup or control sequence
reaches the terminal."""

from __future__ import annotations

import json
import re
from typing import Any

REVIEW_EVENT = "review_decided"
"""The event a reviewer's decision is stored as (crewwork/store/fencing.py)."""

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_TAG = re.compile(r"</?[A-Za-z!][^<>]{0,400}>")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f]")
_ENTITIES = {"&lt;": "<", "&gt;": ">", "&quot;": '"', "&#39;": "'", "&nbsp;": " ", "&amp;": "&"}


def terminal_text(text: Any, limit: int = 300) -> str:
    """`text` as one line fit for a terminal: escape sequences removed, HTML tags dropped (a page's markup quoted
    in a probe's reason), control, line-break and bidirectional characters made spaces, runs of space one, cut at
    `limit` characters with `…`."""
    s = "" if text is None else str(text)
    s = _ANSI.sub("", s)
    s = _TAG.sub(" ", s)
    for entity, char in _ENTITIES.items():
        s = s.replace(entity, char)
    s = _CONTROL.sub(" ", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


FLAGS = (
    ("doubts", "not believed"),
    ("runner_reach", "reaches into the test runner"),
    ("weakened", "weakens a check"),
    ("unlisted_failing", "failing, not listed"),
    ("pre_existing", "pre-existing (failing at the base too)"),
    ("flaky", "flaky"),
    ("fixed", "fixed (failing at the base)"),
)
"""What a validation outcome flags about a change, and the label each list is shown under (docs/lifecycle.md)."""


def flag_lines(validation: dict[str, Any], limit: int = 10) -> list[str]:
    """The outcome's doubts, runner-reaching lines, weakened checks and unlisted failing tests, one line each (at most
    `limit` of each, then a count), as plain text: the change wrote all of them."""
    out = []
    if validation.get("baseline"):
        out.append(f"    baseline: {terminal_text(validation['baseline'])}")
    for key, label in FLAGS:
        items = validation.get(key) or []
        out += [f"    {label}: {terminal_text(x)}" for x in items[:limit]]
        if len(items) > limit:
            out.append(f"    {label}: … and {len(items) - limit} more")
    scan = validation.get("scan")
    if isinstance(scan, dict):
        findings = [f for f in scan.get("findings") or [] if isinstance(f, dict)]
        for f in findings[:limit]:
            label = "scanner (blocks)" if f.get("blocking") else "scanner"
            text = f"{f.get('path')}:{f.get('line')}: {f.get('tool')} {f.get('rule')}: {f.get('message')}"
            out.append(f"    {label}: {terminal_text(text)}")
        total = scan["total"] if isinstance(scan.get("total"), int) else 0
        if total > min(limit, len(findings)):
            out.append(f"    scanner: … and {total - min(limit, len(findings))} more")
        out += [f"    scanner gave no evidence: {terminal_text(e)}" for e in (scan.get("errors") or [])[:limit]]
    return out


def review_line(r: dict[str, Any]) -> str:
    """A recorded decision (`review_decided`, or the API's `reviews`) in one line: who decided what, on which
    attempt, and the comment."""
    if r.get("summary"):
        return terminal_text(r["summary"], 400)
    verb = {"approve": "approved", "reject": "rejected", "request_changes": "requested changes to"}.get(
        str(r.get("action")), str(r.get("action"))
    )
    name, key = r.get("reviewer"), r.get("api_key_id")
    who = f"{name} (API key {key})" if name and key else (name or (f"API key {key}" if key else "a reviewer"))
    notes = len(r.get("line_comments") or [])
    return terminal_text(
        f"{who} {verb} attempt {r.get('attempt')}"
        + (f": {r['comment']}" if r.get("comment") else "")
        + (f" (+{notes} line comments)" if notes else ""),
        400,
    )


def render_item(item: dict[str, Any], *, temporal_link: bool = True) -> str:
    """`temporal_link`: end with the workflow's Temporal Web UI link (False where the UI is not up to follow it)."""
    title = item.get("title") or ""
    lines = [
        f"work item   {item['id']}  ({item['kind']}{', MOCK agent' if item.get('mock') else ''})",
        *([f"title       {terminal_text(title, 200)}"] if title else []),
        f"state       {item['state']}  {terminal_text(item['reason'], 300)}",
        f"attempts    {item['attempt_count']}",
    ]
    under = item.get("under_review")
    if under:
        sha = (under.get("diff_sha256") or "")[:12]
        lines.append(
            f"awaiting    review of attempt {under['attempt']}{f' (diff sha256 {sha}…)' if sha else ''}: "
            f"crewwork review {item['id']} --attempt {under['attempt']} --approve | --reject --comment … | "
            "--request-changes …"
        )
    if item.get("delivery_branch"):
        lines.append(f"delivered   {item['delivery_branch']} @ {(item.get('landed_commit') or '')[:12]}")
    if item.get("pull_request_url"):
        lines.append(f"pull req.   {terminal_text(item['pull_request_url'], 300)}")
    bundle = item.get("evidence_bundle")
    if bundle and bundle.get("status") != "not_landed":
        lines.append(f"evidence    {terminal_text(bundle_line(bundle), 500)}")
    for a in item.get("attempts") or []:
        val = a.get("validation") or {}
        tests = val.get("tests") or []
        # Counted from the tests that ran, not from the listed ones: without a JUnit report only failing tests are
        # named (the terminal summary counts the rest), which read as `1 test of 2 failed ... [0/1 tests passed]`.
        # Failing tests are listed first, so they are all here.
        executed = int(val.get("tests_executed") or 0) or len(tests)
        failing = sum(1 for t in tests if t["outcome"] in ("failed", "error"))
        lines.append(
            f"  attempt {a['number']}: {a['verdict']:7} {terminal_text(a['reason'], 200)}"
            + (f"  [{executed - failing}/{executed} tests passed, exit {val.get('exit_code')}]" if executed else "")
        )
    reviews = item.get("reviews") or []
    for n, r in enumerate(reviews):
        lines.append(f"{'reviews' if n == 0 else '':11} {review_line(r)}")
        for c in (r.get("line_comments") or [])[:20]:
            where = (
                f"{terminal_text(c.get('path'), 120)}:{c.get('line')}{' (removed)' if c.get('side') == 'old' else ''}"
            )
            lines.append(f"{'':14}{where}  {terminal_text(c.get('body'), 160)}")
    if item.get("result") and item["result"].get("output") is not None:
        # json.dumps escapes every control and non-ASCII character: nothing in it can act on a terminal.
        lines.append(f"output      {json.dumps(item['result']['output'])}")
    if temporal_link:
        lines.append(f"temporal    {item['links'].get('temporal_ui', '')}")
    return "\n".join(lines)


def bundle_line(bundle: dict[str, Any]) -> str:
    """The evidence bundle's status in one line: UNSIGNED said as loudly as the item's MOCK label."""
    if bundle.get("status") == "signed":
        return f"signed bundle {bundle.get('url')} (crewwork bundle ID; crewwork verify)"
    return str(bundle.get("detail") or bundle.get("status"))
