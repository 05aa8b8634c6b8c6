"""What verifying a bundle found: the verified statements, the problems, and the printable account of what was
proven (every text from the bundle escaped with `safe`, so a test id cannot rewrite the terminal)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any

from crewwork.attestation.format import (
    MAX_PRINTED,
)

BUNDLE_FIELDS = {"mediaType", "workItem", "scope", "envelopes", "files"}


@dataclass
class Verified:
    """One envelope whose signatures met the threshold, and its statement."""

    index: int
    statement: dict[str, Any]
    keyids: list[str]

    @property
    def type(self) -> str:
        return str(self.statement["predicateType"])

    @property
    def predicate(self) -> dict[str, Any]:
        return self.statement["predicate"]  # type: ignore[no-any-return]


@dataclass
class Report:
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    """keyid -> status of every key whose signature counted."""
    proven: dict[str, Any] = field(default_factory=dict)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "checked": self.checked,
            "unchecked": self.unchecked,
            "keys": self.keys,
            "proven": self.proven,
        }

    def human(self) -> str:
        if not self.ok and len(self.problems) == 1:
            return f"crewwork verify: REFUSED: {safe(self.problems[0], 600)}"
        if not self.ok:
            lines = [f"crewwork verify: REFUSED: {len(self.problems)} problems"]
            lines += [f"  - {safe(p, 600)}" for p in self.problems]
            return "\n".join(lines)
        p = self.proven
        lines = ["crewwork verify: OK: every signature and every subject checked"]
        if self.unchecked:
            lines[0] = (
                f"crewwork verify: OK, but {len(self.unchecked)} subject(s) NOT CHECKED: {', '.join(self.unchecked)}"
            )
        wi = p.get("work_item", {})
        lines.append(f"  work item    {safe(wi.get('id'))} ({safe(wi.get('kind'))}), tenant {safe(wi.get('tenant'))}")
        lines.append(
            f"  builder      {safe(p.get('builder'))}, crewwork {safe(p.get('version'))}, workflow "
            f"{safe(p.get('workflow_id'))}, {safe(p.get('started_on'))} .. {safe(p.get('finished_on'))}"
        )
        ch = p.get("change", {})
        if ch.get("commit"):
            lines.append(
                f"  change       commit {ch['commit']} (tree {ch.get('tree')}) on {safe(ch.get('branch'))}, "
                f"parent {ch.get('base_commit')} of {safe(ch.get('repo'))}"
            )
        else:
            lines.append(
                f"  change       attempt {p.get('attempt')}'s diff on {ch.get('base_commit')} of "
                f"{safe(ch.get('repo'))} (not landed)"
            )
        agent = p.get("agent", {})
        mock = "  MOCK: a scripted agent made this change, not a model or a person" if p.get("mock") else ""
        lines.append(f"  agent        {safe(agent.get('name'))}{mock}")
        t = p.get("tests", {})
        history = ", ".join(f"{a.get('number')} {a.get('verdict')}" for a in p.get("attempts", []))
        counts = t.get("counts") or {}
        n = {k: _count(counts.get(k), len(t.get(v, []))) for k, v in (("passed", "passed"), ("failed", "failed"))}
        n["skipped"] = _count(counts.get("skipped"), len(t.get("warned", [])))
        lines.append(
            f"  tests        {safe(t.get('result'))}: {n['passed']} passed, {n['failed']} failed, "
            f"{n['skipped']} skipped (attempt {p.get('attempt')}; attempts: "
            f"{safe(history)})"
        )
        unlisted = (
            n["passed"] + n["failed"] + n["skipped"] - sum(len(t.get(k, [])) for k in ("passed", "failed", "warned"))
        )
        if unlisted > 0:
            lines.append(
                f"      ({unlisted} of them not listed in the statement, which lists ids within a bound: the report "
                "subject names every test)"
            )
        for outcome in ("passed", "failed"):
            ids = t.get(outcome, [])
            for tid in ids[:MAX_PRINTED]:
                lines.append(f"      {outcome:<7} {safe(tid, 200)}")
            if len(ids) > MAX_PRINTED:
                lines.append(f"      … and {len(ids) - MAX_PRINTED} more {outcome} (--json lists them all)")
        sb = p.get("sandbox")
        lines.append(f"  sandbox      {describe_sandbox(sb) if sb else 'not checked'}")
        env = p.get("environment")
        lines.append(f"  environment  {describe_environment(env) if env else 'not checked'}")
        rv = p.get("review")
        if rv is not None:
            lines.append(f"  review       {describe_review(rv)}")
        keys = ", ".join(f"{k[:16]}… ({s})" for k, s in self.keys.items())
        lines.append(f"  signed by    {keys}; threshold {p.get('threshold')} per envelope")
        lines.append(f"  subjects     {len(self.checked)} checked: {', '.join(self.checked)}")
        return "\n".join(lines)


def _count(value: Any, listed: int) -> int:
    """A signed count, never fewer than the ids listed."""
    return max(value, listed) if isinstance(value, int) and not isinstance(value, bool) else listed


def describe_sandbox(sb: dict[str, Any]) -> str:
    runner = sb.get("runner") or {}
    limits = sb.get("limits") or {}
    what = ", ".join(f"{k}={v}" for k, v in sorted(runner.items()) if k != "backend")
    caps = ", ".join(f"{k} {v}" for k, v in sorted(limits.items()))
    iso = "isolated" if sb.get("isolated") else "NOT ISOLATED"
    return safe(
        f"{sb.get('backend')} ({iso}{', ' + sb['enforcement'] if sb.get('enforcement') else ''}{', ' + what if what else ''})"
        f", network {sb.get('network')}, limits: {caps or 'unknown'}",
        400,
    )


def describe_environment(env: dict[str, Any]) -> str:
    if not env.get("prepared"):
        return "none prepared (validation ran in the sandbox's own environment)"
    setup = "; ".join(" ".join(c) for c in env.get("setup") or [])
    return safe(f"prepared {env.get('key')} (python {env.get('python')}, setup: {setup or 'none'})", 400)


def describe_review(rv: dict[str, Any]) -> str:
    if not rv.get("required"):
        return "NOT REQUIRED: nobody approved this change before it landed"
    who = f"{rv.get('reviewer')!r}" if rv.get("reviewer") else "an unnamed reviewer"
    key = f" through API key {rv.get('apiKey')}" if rv.get("apiKey") else " (not through the API)"
    when = f" at {rv.get('decidedAt')}" if rv.get("decidedAt") else ""
    comment = f": {rv.get('comment')!r}" if rv.get("comment") else ""
    notes = rv.get("lineComments")
    notes_text = f" (+{len(notes)} line comments)" if isinstance(notes, list) and notes else ""
    history = rv.get("history")
    before = f"; {len(history)} earlier decision(s)" if isinstance(history, list) and history else ""
    return safe(f"{rv.get('decision')} by {who}{key}{when}{comment}{notes_text}{before}", 400)


_BIDI = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F}


def safe(value: Any, limit: int = 300) -> str:
    """Text from a bundle, fit for a terminal: control, format and bidirectional characters escaped, bounded."""
    text = "" if value is None else str(value)
    out = []
    for ch in text:
        if ch in "\t" or (unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")) or ord(ch) in _BIDI:
            out.append(ch.encode("unicode_escape").decode())
        else:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= limit else s[: limit - 1] + "…"
