"""The diagnostics packet: what the next attempt is told about why the previous one did not succeed.

A bounded, deterministic plain-text document built from the verdict and the saved evidence: the attempt
number, the cause class with a hint of what it usually means, the failing tests with their assertion messages,
what the attempt changed, the reviewer's comment if there was one, and the tail of the test output. It is
stored as an artifact and handed to the agent, so it must stay readable and small whatever the test run
printed: every section has a share of `max_chars`, and the whole is cut to `max_chars` at the end.
"""

from __future__ import annotations

from crewwork.models import DiffStats
from crewwork.preview.verdict import console_errors
from crewwork.validation.grading import Cause, ValidationEvidence, Verdict

DEFAULT_MAX_CHARS = 16_000
MAX_TESTS_LISTED = 30
MAX_FILES_LISTED = 50
MAX_CUTS_LISTED = 10
TRUNCATION_MARK = "\n[… diagnostics cut to size …]\n"

# What each cause usually means for the agent, in one sentence: the cause class alone is jargon.
HINTS: dict[Cause, str] = {
    Cause.passed: "Validation passed; the change still needs the work described below.",
    Cause.test_failure: "Fix the code so the failing tests pass. Test files named in the validation spec are "
    "reset to the base commit before every run, so editing them does not help.",
    Cause.no_tests: "The test command ran no tests. Check that test discovery still works (imports, file and "
    "function names, conftest.py).",
    Cause.empty_diff: "The attempt left the repository unchanged. Make the change in the workspace files.",
    Cause.patch_failed: "The attempt's diff did not apply to a clean checkout of the base commit. Keep "
    "changes to ordinary tracked files.",
    Cause.setup_failed: "A setup command failed before the tests ran. Setup runs on the base commit's content, so "
    "no change an attempt makes can fix it: the environment's setup commands (see the setup log) need fixing.",
    Cause.timeout: "The tests exceeded the time limit. Look for infinite loops, deadlocks or very slow code.",
    Cause.oom: "The tests ran out of memory. Look for unbounded data structures or runaway recursion.",
    Cause.pids: "The tests started too many processes or threads. Look for unbounded process creation.",
    Cause.disk: "The tests filled the workspace or /tmp (disk cap). Look for runaway output files or very "
    "large test data.",
    Cause.command_not_found: "The validation command is missing or not executable in the sandbox; the "
    "change cannot fix that (the submission names the command).",
    Cause.no_effective_change: "Everything the attempt changed is protected test infrastructure (tests, "
    "conftest.py, pytest configuration), which is reset before validation. Change the code under test instead.",
    Cause.signal: "The test process was killed by a signal. Look for crashes in native code or code that "
    "kills its own process.",
    Cause.not_judged: "A bound cut evidence that could decide the verdict (a report too large to read, output cut "
    "before its summary or a listed test), so the attempt was not judged. Keep test output and reports small: do not "
    "print or report more than the bounds named below.",
    Cause.report_unparseable: "The test run left no trustworthy report. Do not change how the tests report "
    "their results; see the output below for what happened.",
    Cause.exit_mismatch: "The test command's exit code and its test report disagree. Do not change how the "
    "tests report results or exit; fix the code so the tests genuinely pass.",
    Cause.infrastructure: "Validation could not run for reasons outside the change; the same change may pass "
    "on the next attempt.",
    Cause.preview_not_started: "The tests passed, but there was no way to start the app for its preview: the "
    "submission's start command, or the file the detected framework needs (app.py, main.py, manage.py, "
    "index.html), is missing.",
    Cause.preview_limit: "The tests passed, but the running app hit a sandbox cap (lifetime, memory, processes or "
    "disk). Look for runaway work at start-up or per request.",
    Cause.preview_crashed: "The tests passed, but the app exited when started for its preview. Its output below "
    "says why; the app must keep running in the foreground and listen on $PORT.",
    Cause.preview_not_ready: "The tests passed, but the app never answered its readiness check. It must listen "
    "on 127.0.0.1:$PORT (the port is in the environment) and answer there.",
    Cause.probe_missing: "The tests passed, but some declared probes left no evidence; that never passes.",
    Cause.suspected_tampering: "The report was not believed: what the test runner itself saw differs from what "
    "it reported, or the change adds code that reaches into the test runner (hooks, report objects, pytest "
    "internals). Remove that code; fix the code under test so the tests genuinely pass.",
    Cause.security_finding: "The tests passed, but the change introduces what the security scanners block: a "
    "hard-coded secret, or unsafe code (shell=True with built commands, eval, yaml.load ...). The findings below say "
    "where; remove the secret (read it from the environment) or write the code safely. Suppression comments do not "
    "count.",
    Cause.scan_failed: "The tests passed, but a required security scanner gave no evidence (it crashed, timed out "
    "or left no readable SARIF). Keep changed files small and readable.",
    Cause.check_failed: "The tests passed, but a required check (lint, type-check, another environment's tests) "
    "failed. Its findings are listed under 'Checks that did not pass'; fix the code they name, never the check's "
    "configuration (it is protected, and a weakened check is flagged).",
    Cause.probe_failure: "The tests passed, but the running app failed an acceptance probe: an HTTP answer or "
    "what a browser saw. The probes below say what was expected and what came back; fix the app, not the probes.",
}


def build_diagnostics(
    verdict: Verdict,
    evidence: ValidationEvidence | None,
    attempt: int,
    diff_stats: DiffStats | None,
    review_comment: str | None = None,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> str:
    """The packet for the attempt after `attempt`. Same inputs, same text; never longer than `max_chars`."""
    max_chars = max(max_chars, 200)
    status = "PASSED" if verdict.passed else "FAILED"
    header = [
        f"# Diagnostics for attempt {attempt}",
        "",
        f"Result: {status} (cause: {verdict.cause.value})",
        f"Reason: {verdict.reason}",
        f"Hint: {HINTS.get(verdict.cause, '')}",
    ]
    if verdict.exit_code is not None:
        header.append(f"Exit code: {verdict.exit_code}")
    if verdict.tests_executed or verdict.counts:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(verdict.counts.items()) if n)
        header.append(f"Tests executed: {verdict.tests_executed}" + (f" ({counts})" if counts else ""))
    sections: list[str] = ["\n".join(header)]
    if verdict.cuts:
        body = "\n".join(f"- {'DECIDES: ' if c.decisive else ''}{c.describe()}" for c in verdict.cuts[:MAX_CUTS_LISTED])
        sections.append(_section("Evidence cut by bounds", _head(body, max_chars // 5)))

    if verdict.doubts or verdict.runner_reach:
        body = "\n".join(f"- {d}" for d in verdict.doubts)
        if verdict.runner_reach:
            body += ("\n" if body else "") + "Lines of the change that reach into the test runner:\n"
            body += "\n".join(f"- {r}" for r in verdict.runner_reach)
        sections.append(_section("Why the report was not believed", _head(body, max_chars // 5)))
    if verdict.weakened:
        body = "\n".join(f"- {w}" for w in verdict.weakened)
        sections.append(_section("Checks the change weakens instead of satisfying", _head(body, max_chars // 6)))
    scan = evidence.scan if evidence is not None else None
    if scan is not None and (scan.findings or scan.errors):
        body = "\n".join(f"- {f.describe()}" for f in scan.findings[:50])
        if scan.errors:
            body += ("\n" if body else "") + "\n".join(f"- scanner gave no evidence: {e}" for e in scan.errors)
        sections.append(_section("What the security scanners found in the change", _head(body, max_chars // 6)))

    if verdict.baseline:
        body = verdict.baseline
        for title, ids in (
            ("Failing at the base commit too (not this change's fault)", verdict.pre_existing),
            ("Flaky (failed, then passed on the same tree; they do not decide)", verdict.flaky),
            ("Fixed by this change", verdict.fixed),
        ):
            if ids:
                body += f"\n{title}: " + ", ".join(ids[:10]) + (f" (+{len(ids) - 10} more)" if len(ids) > 10 else "")
        sections.append(_section("Baseline on the base commit", _head(body, max_chars // 6)))

    if review_comment and review_comment.strip():
        sections.append(_section("Reviewer's comment", _head(review_comment.strip(), max_chars // 4)))

    if verdict.preview is not None and not verdict.preview.passed:
        sections.append(_probes(verdict, evidence, budget=max_chars * 45 // 100))
    else:
        failing = _failing_tests(verdict, budget=max_chars * 45 // 100)
        if failing:
            sections.append(failing)

    sections.append(_section("What the attempt changed", _changes(diff_stats)))
    if evidence is not None and evidence.protected_reset:
        shown = evidence.protected_reset[:20]
        more = len(evidence.protected_reset) - len(shown)
        body = "\n".join(f"- {r}" for r in shown) + (f"\n- … and {more} more" if more > 0 else "")
        sections.append(
            _section("Put back before the run (protected test infrastructure)", _head(body, max_chars // 5))
        )

    if evidence is not None and evidence.preview is not None and verdict.preview is not None:
        log = evidence.preview.log_tail.strip("\n")
        if log:
            sections.append(_section("The app's output (tail)", _tail(log, max_chars // 6)))
    if evidence is not None:
        used = sum(len(s) + 2 for s in sections)
        room = max_chars - used - 200
        tails = [(name, text) for name, text in (("stdout", evidence.stdout_tail), ("stderr", evidence.stderr_tail))]
        tails = [(n, t.strip("\n")) for n, t in tails if t.strip()]
        for name, text in tails:
            share = room // len(tails)
            if share < 200:
                break
            sections.append(_section(f"Output tail ({name})", _tail(text, share - 60)))

    text = "\n\n".join(sections) + "\n"
    if len(text) > max_chars:
        text = text[: max_chars - len(TRUNCATION_MARK)] + TRUNCATION_MARK
    return text


def _section(title: str, body: str) -> str:
    return f"## {title}\n{body}"


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 12, 0)] + "\n[… cut …]"


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[… earlier output cut …]\n" + text[-max(limit - 26, 0) :]


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _failing_tests(verdict: Verdict, *, budget: int) -> str:
    by_id = {t.id: t for t in verdict.tests}
    ids = list(verdict.failing_tests)
    named = set(ids)
    others = [t.id for t in verdict.tests if t.outcome in ("failed", "error") and t.id not in named]
    footer = ""
    if not ids:
        # A failure without named culprits (exit mismatch, unparseable report with terminal hints) still lists
        # what the report saw failing.
        ids, others = others, []
    elif others:
        # With fail_to_pass/pass_to_pass lists, other failures (often pre-existing) do not decide the verdict;
        # name them, but give the space to the tests that do.
        footer = "Also failing, but not required by this work item: " + ", ".join(others[:10])
        footer += f" (+{len(others) - 10} more)" if len(others) > 10 else ""
        footer = _head(footer, 1_000)
    if not ids:
        return ""
    lines = [f"## Failing tests ({len(ids)})"]
    size = len(lines[0])
    per_test = max(budget // min(len(ids), MAX_TESTS_LISTED), 120)
    shown = 0
    for test_id in ids[:MAX_TESTS_LISTED]:
        result = by_id.get(test_id)
        outcome = result.outcome if result is not None else "missing from the report"
        entry = f"- {test_id} ({outcome})"
        if result is not None and result.message:
            entry += "\n" + _indent(_head(result.message, per_test - len(entry) - 8))
        if size + len(entry) > budget and shown:
            break
        lines.append(entry)
        size += len(entry) + 1
        shown += 1
    if shown < len(ids):
        lines.append(f"- … and {len(ids) - shown} more")
    if footer:
        lines.append(footer)
    return "\n".join(lines)


def _changes(diff_stats: DiffStats | None) -> str:
    if diff_stats is None:
        return "(no diff statistics recorded)"
    if not diff_stats.files_changed and not diff_stats.files:
        return "No files changed."
    lines = [
        f"{diff_stats.files_changed} file(s) changed, +{diff_stats.insertions} -{diff_stats.deletions} lines:",
    ]
    files = sorted(diff_stats.files)
    lines += [f"- {f[:300]}" for f in files[:MAX_FILES_LISTED]]
    if len(files) > MAX_FILES_LISTED:
        lines.append(f"- … and {len(files) - MAX_FILES_LISTED} more")
    return "\n".join(lines)


def _probes(verdict: Verdict, evidence: ValidationEvidence | None, *, budget: int) -> str:
    """The preview's failing probes: which assertion, what was seen, what the page logged."""
    pv = verdict.preview
    assert pv is not None
    failed = [p for p in pv.probes if not p.passed]
    lines = [f"## Acceptance probes ({len(failed)} of {len(pv.probes)} failed)"]
    if not pv.probes or pv.cause not in ("probe_failure", "probe_missing"):
        lines.append(f"The preview itself failed ({pv.cause}); no probe could run against it.")
    flows = {f.name: f for f in (evidence.preview.flows if evidence and evidence.preview else [])}
    per = max(budget // max(len(failed), 1), 300)
    for p in failed[:MAX_TESTS_LISTED]:
        entry = [f"- {p.id}: {p.summary}", f"    expected: {p.failed}"]
        if p.seen:
            entry.append("    seen: " + _head(p.seen, per // 2).replace("\n", "\n          "))
        flow = flows.get(p.id.split("::")[-1]) if p.kind == "browser" else None
        if flow is not None:
            errors = console_errors(flow)
            if errors:
                entry.append("    console errors: " + _head(" | ".join(errors), per // 4))
            if flow.failed_requests:
                reqs = " | ".join(f"{r.method} {r.url}: {r.failure}" for r in flow.failed_requests)
                entry.append("    failed requests: " + _head(reqs, per // 4))
        lines.append("\n".join(entry))
    return _head("\n".join(lines), budget)
