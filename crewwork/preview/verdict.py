"""The pure decision whether a preview and its probes passed, from the saved `PreviewEvidence` and the declared
`PreviewSpec`. `crewwork.validation.grading.grade` applies it after the tests passed (its rules 12-17).

The rules, in order (the first that matches decides the cause):

1. ``preview_not_started``  no command to start: none given and nothing detected (or the detected row's file is gone).
2. ``preview_limit``   a sandbox cap ended the app, or the app hit one while it kept running (its sandbox reports
                       every cap at the stop): its lifetime (wall clock), memory, processes or disk.
3. ``preview_crashed`` the app's process ended before the probes were done (or a signal killed it).
4. ``preview_not_ready``  the app ran but never answered its readiness check within the deadline.
5. ``probe_missing``   a declared probe has no record: missing evidence never passes.
6. ``probe_failure``   a probe failed: an HTTP status or body assertion, a flow step, or a flow assertion.
7. ``passed``          every declared probe passed.

HTTP assertions are evaluated on the recorded body (its first 64 KiB, as recorded), so re-grading decides what the
live run decided. Regular expressions are RE2: linear time whatever the pattern.

Evidence cut by a bound never passes. Where a bound cut what an assertion needs, the probe is **not judged** and fails
(`failed` says "not judged: ..." and why): a body cut at 64 KiB cannot show that it does *not* contain something,
nor that text missing from its first part is missing from all of it, nor parse as the JSON it began; a regular
expression counts as matched on a cut body only where its match ends before the cut; a compressed body is never
judged; a flow whose pipe guard dropped an event (which could have been an error) is not judged. Errors are counted
whole, whatever was kept of their text: `no_console_errors` fails on the count.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from crewwork.models.preview import (
    BrowserFlow,
    Contains,
    HttpProbe,
    JsonEquals,
    Matches,
    NoConsoleErrors,
    NoFailedRequests,
    NotContains,
    PreviewSpec,
    TextVisible,
    UrlIs,
    probe_id,
)
from crewwork.preview.records import ERROR_TYPES, MAX_BODY_SEEN, FlowRecord, HttpExchange, PreviewEvidence, cut

PREVIEW_CAUSES = (
    "preview_not_started",
    "preview_limit",
    "preview_crashed",
    "preview_not_ready",
    "probe_missing",
    "probe_failure",
)
MAX_SEEN = 600


class ProbeVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    kind: str
    passed: bool
    summary: str = Field(description="One line: what was done and what came back.")
    failed: str | None = Field(default=None, description="The first assertion that failed.")
    seen: str | None = Field(default=None, description="What was seen instead (cut).")


class PreviewVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool
    cause: str
    reason: str
    probes: list[ProbeVerdict] = Field(default_factory=list)
    failing: list[str] = Field(default_factory=list, description="Ids of the probes that failed or are missing.")
    signature: str | None = Field(default=None, description="An error line for the fingerprint (no failing ids).")


def grade_preview(spec: PreviewSpec, ev: PreviewEvidence | None) -> PreviewVerdict:
    """Decide from the evidence. Pure and deterministic; never raises on bad evidence."""
    if ev is None:
        ids = spec.probe_ids()
        return PreviewVerdict(
            passed=False,
            cause="probe_missing",
            reason="Probes were declared but the preview left no evidence; missing evidence never passes.",
            failing=sorted(ids),
        )
    probes = [_http(p, _find_http(ev, p.name)) for p in spec.http] + [
        _flow(f, _find_flow(ev, f.name)) for f in spec.browser
    ]
    last = _last_line(ev.log_tail)
    if not ev.started:
        why = ev.start_error or "no start command"
        return _fail("preview_not_started", f"The preview could not be started: {why}.", probes, signature=why)
    run = ev.run
    cap = next(
        (
            what
            for flag, what in (
                (run.timed_out, "its lifetime (wall clock)"),
                (run.oom_killed, "its memory cap"),
                (run.pids_limited, "its process cap"),
                (run.disk_limited, "its disk cap"),
            )
            if flag
        ),
        None,
    )
    if cap is not None:
        return _fail("preview_limit", f"The preview app was stopped by {cap}.", probes, signature=cap)
    if run.exited or run.killed_by_signal is not None:
        how = f"killed by signal {run.killed_by_signal}" if run.killed_by_signal else f"exit code {run.exit_code}"
        when = "during the probes" if ev.ready else "before it became ready"
        reason = f"The preview app exited {when} ({how})" + (f"; its last output: {last}" if last else "") + "."
        return _fail("preview_crashed", reason, probes, signature=f"{how} {last or ''}")
    if not ev.ready:
        detail = ev.ready_detail or "no answer"
        reason = f"The preview app never became ready (last seen: {cut(detail, 300)})" + (
            f"; its last output: {last}" if last else ""
        )
        return _fail("preview_not_ready", reason + ".", probes, signature=last or detail)
    missing = [p.id for p in probes if p.summary == _MISSING]
    if missing:
        return _fail(
            "probe_missing",
            f"{_plural(len(missing), 'declared probe')} left no evidence ({', '.join(missing[:5])}); "
            "missing evidence never passes.",
            probes,
            failing=missing,
        )
    failed = [p for p in probes if not p.passed]
    if failed:
        first = failed[0]
        reason = f"{_plural(len(failed), 'probe')} of {len(probes)} failed (first: {first.id}: {first.failed}"
        reason += f"; seen: {cut(first.seen, 200)})." if first.seen else ")."
        return _fail("probe_failure", reason, probes, failing=[p.id for p in failed])
    return PreviewVerdict(
        passed=True, cause="passed", reason=f"All {_plural(len(probes), 'probe')} passed.", probes=probes
    )


_MISSING = "no record"


def _fail(
    cause: str,
    reason: str,
    probes: list[ProbeVerdict],
    *,
    failing: list[str] | None = None,
    signature: str | None = None,
) -> PreviewVerdict:
    return PreviewVerdict(
        passed=False,
        cause=cause,
        reason=reason,
        probes=probes,
        failing=sorted(failing or []),
        signature=cut(signature, 300) if signature and not failing else None,
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _last_line(text: str) -> str | None:
    for line in reversed(text.strip().splitlines()):
        if line.strip():
            return cut(line.strip(), 300)
    return None


def _find_http(ev: PreviewEvidence, name: str) -> HttpExchange | None:
    return next((x for x in ev.http if x.name == name), None)


def _find_flow(ev: PreviewEvidence, name: str) -> FlowRecord | None:
    return next((x for x in ev.flows if x.name == name), None)


# ------------------------------------------------------------------------------------------------ HTTP


def _http(p: HttpProbe, x: HttpExchange | None) -> ProbeVerdict:
    pid = probe_id("http", p.name)
    if x is None:
        return ProbeVerdict(id=pid, kind="http", passed=False, summary=_MISSING, failed="no record of this probe")
    line = f"{p.method} {p.path}"
    if x.error is not None or x.status is None:
        return ProbeVerdict(
            id=pid, kind="http", passed=False, summary=f"{line} -> no answer", failed="an answer",
            seen=cut(x.error or "no status", MAX_SEEN),
        )  # fmt: skip
    summary = f"{line} -> {x.status}"
    if x.status not in p.status:
        want = " or ".join(str(s) for s in p.status)
        return ProbeVerdict(
            id=pid, kind="http", passed=False, summary=summary, failed=f"status {want}",
            seen=f"status {x.status}: {cut(x.body, MAX_SEEN)}",
        )  # fmt: skip
    for a in p.expect:
        failed = _unjudged(a, x) or _body_assertion(a, x.body)
        if failed is not None:
            return ProbeVerdict(
                id=pid, kind="http", passed=False, summary=summary, failed=failed[0], seen=cut(failed[1], MAX_SEEN)
            )
    return ProbeVerdict(id=pid, kind="http", passed=True, summary=summary)


NOT_JUDGED = "not judged"
# What in a pattern can make a match depend on the text after it (`$`, `\z`, word boundaries): found anywhere, even
# escaped, a match that reaches the cut is not taken.
_END_SENSITIVE = re.compile(r"\$|\\[zZbB]")


def _unjudged(a: Any, x: HttpExchange) -> tuple[str, str] | None:
    """(not judged, why) when the recorded body cannot decide assertion `a`; None when it can."""
    if x.body_encoding:
        why = f"the body is {x.body_encoding}-encoded and is never decoded, so {_describe(a)} cannot be judged"
        return f"{NOT_JUDGED}: {_describe(a)}", why
    if not x.body_truncated:
        return None
    where = f"the body was cut at {MAX_BODY_SEEN} bytes"
    if isinstance(a, Contains) and a.contains in x.body:
        return None
    if isinstance(a, NotContains) and a.not_contains in x.body:
        return None  # found in the part kept: a plain failure
    if isinstance(a, Matches):
        import re2

        m = re2.search(a.regex, x.body)
        if m is not None and (m.end() < len(x.body) or not _END_SENSITIVE.search(a.regex)):
            # Matched in what was kept: away from the cut, or by a pattern whose match cannot depend on what follows.
            return None
    return f"{NOT_JUDGED}: {_describe(a)}", f"{where}, and {_describe(a)} needs the rest of it: {x.body}"


def _describe(a: Any) -> str:
    if isinstance(a, Contains):
        return f"body contains {a.contains!r}"
    if isinstance(a, NotContains):
        return f"body does not contain {a.not_contains!r}"
    if isinstance(a, Matches):
        return f"body matches /{a.regex}/"
    if isinstance(a, JsonEquals):
        return f"{a.json_path} == {json.dumps(a.equals)}"
    return repr(a)


def _body_assertion(a: Any, body: str) -> tuple[str, str] | None:
    """None when the assertion holds, else (the assertion, what was seen)."""
    if isinstance(a, Contains):
        return None if a.contains in body else (f"body contains {a.contains!r}", body)
    if isinstance(a, NotContains):
        return None if a.not_contains not in body else (f"body does not contain {a.not_contains!r}", body)
    if isinstance(a, Matches):
        import re2

        return None if re2.search(a.regex, body) else (f"body matches /{a.regex}/", body)
    if isinstance(a, JsonEquals):
        want = f"{a.json_path} == {json.dumps(a.equals)}"
        try:
            doc = json.loads(body)
        except ValueError:
            return want, "the body is not JSON: " + body
        found, value = json_path(doc, a.json_path)
        if not found:
            return want, f"{a.json_path} is not in the body: {body}"
        return None if _json_equal(value, a.equals) else (want, f"{a.json_path} == {json.dumps(value)[:MAX_SEEN]}")
    return ("a known assertion", repr(a))


def json_path(doc: Any, path: str) -> tuple[bool, Any]:
    """(found, value) of `$`, `$.a.b`, `$.items[0].name` in a parsed JSON document."""
    cur = doc
    for name, index in re.findall(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]", path[1:]):
        if name:
            if not isinstance(cur, dict) or name not in cur:
                return False, None
            cur = cur[name]
        else:
            i = int(index)
            if not isinstance(cur, list) or i >= len(cur):
                return False, None
            cur = cur[i]
    return True, cur


def _json_equal(a: Any, b: Any) -> bool:
    # JSON equality: 1 == 1.0, but true is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


# ------------------------------------------------------------------------------------------------ browser


def console_errors(f: FlowRecord) -> list[str]:
    """The errors kept of a flow (console errors, then uncaught ones); `error_count` says how many there were."""
    return [f"{c.text}" + (f" ({c.location})" if c.location else "") for c in f.console if c.type in ERROR_TYPES] + [
        f"uncaught: {e}" for e in f.page_errors
    ]


def error_count(f: FlowRecord) -> int:
    """Every error of the flow, kept or not (records made before errors were counted: the ones kept)."""
    kept = sum(1 for c in f.console if c.type in ERROR_TYPES)
    return max(f.console_errors_seen, kept) + max(f.page_errors_seen, len(f.page_errors))


def _flow(spec: BrowserFlow, f: FlowRecord | None) -> ProbeVerdict:
    pid = probe_id("browser", spec.name)
    if f is None:
        return ProbeVerdict(id=pid, kind="browser", passed=False, summary=_MISSING, failed="no record of this flow")
    done = sum(1 for s in f.steps if s.ok)
    summary = f"{done} of {len(spec.steps)} steps"
    if f.page_crashed:
        return ProbeVerdict(id=pid, kind="browser", passed=False, summary=summary, failed="the page not to crash",
                            seen=cut(f.error or "the page crashed", MAX_SEEN))  # fmt: skip
    bad = next((s for s in f.steps if not s.ok), None)
    if bad is not None:
        errors = console_errors(f)
        seen = (bad.error or "failed") + (f"; console: {' | '.join(errors[:3])}" if errors else "")
        return ProbeVerdict(
            id=pid, kind="browser", passed=False, summary=summary, failed=f"step {bad.action} {bad.target}",
            seen=cut(seen, MAX_SEEN),
        )  # fmt: skip
    if len(f.steps) < len(spec.steps):
        return ProbeVerdict(id=pid, kind="browser", passed=False, summary=summary, failed="every step to run",
                            seen=cut(f.error or "the flow stopped early", MAX_SEEN))  # fmt: skip
    for a in spec.expect:
        failed = _flow_assertion(a, f)
        if failed is not None:
            return ProbeVerdict(
                id=pid, kind="browser", passed=False, summary=summary, failed=failed[0], seen=cut(failed[1], MAX_SEEN)
            )
    if f.not_judged:
        return ProbeVerdict(id=pid, kind="browser", passed=False, summary=summary,
                            failed=f"{NOT_JUDGED}: a bound cut evidence that could decide it",
                            seen=cut("; ".join(f.not_judged), MAX_SEEN))  # fmt: skip
    return ProbeVerdict(id=pid, kind="browser", passed=True, summary=summary)


def _flow_assertion(a: Any, f: FlowRecord) -> tuple[str, str] | None:
    if isinstance(a, TextVisible):
        if f.visible.get(a.text_visible) is True:
            return None
        return f"text visible {a.text_visible!r}", "the page shows: " + (f.page_text or "(nothing)")
    if isinstance(a, NoConsoleErrors):
        n = error_count(f)
        return None if n == 0 else ("no console errors", f"{_plural(n, 'error')}: " + " | ".join(console_errors(f)))
    if isinstance(a, NoFailedRequests):
        failed = [f"{r.method} {r.url}: {r.failure}" for r in f.failed_requests]
        n = max(f.failed_requests_seen, len(failed))
        return None if n == 0 else ("no failed requests", f"{_plural(n, 'failed request')}: " + " | ".join(failed))
    if isinstance(a, UrlIs):
        if f.final_origin_ok and f.final_url == a.url:
            return None
        where = f.final_url if f.final_origin_ok else "another origin"
        return f"url {a.url}", f"url {where}"
    return ("a known assertion", repr(a))
