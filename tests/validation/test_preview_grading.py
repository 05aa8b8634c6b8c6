"""Grading with a declared preview: the tests AND every probe decide, missing probe evidence never passes, each
preview rule in its order, probe causes fingerprinted for the breaker, and their diagnostics for the next attempt.
Pure functions over saved evidence: no app, no browser."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crewwork.models import ValidationSpec
from crewwork.models.preview import PreviewSpec
from crewwork.preview.records import (
    AppRun,
    ConsoleEntry,
    FailedRequest,
    FlowRecord,
    HttpExchange,
    PreviewEvidence,
    StepRecord,
)
from crewwork.preview.verdict import grade_preview, json_path
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.grading import Cause, ValidationEvidence, grade

PASSING_JUNIT = (
    b'<testsuite tests="1" failures="0" errors="0" skipped="0">'
    b'<testcase classname="tests.test_app" name="test_total" file="tests/test_app.py"/></testsuite>'
)
SPEC = PreviewSpec.model_validate(
    {
        "http": [
            {
                "name": "total",
                "path": "/api/total?n=3",
                "expect": [{"json_path": "$.total", "equals": 6}, {"regex": '"total":\\s*6'}],
            }
        ],
        "browser": [
            {
                "name": "add",
                "steps": [{"open": "/"}, {"click": {"role": "button", "name": "Add"}}],
                "expect": [{"text_visible": "Count: 1"}, {"no_console_errors": True}, {"no_failed_requests": True}],
            }
        ],
    }
)


def good_http(**kw: object) -> HttpExchange:
    base: dict[str, object] = dict(name="total", method="GET", path="/api/total?n=3", status=200, body='{"total": 6}')
    return HttpExchange.model_validate({**base, **kw})


def good_flow(**kw: object) -> FlowRecord:
    base: dict[str, object] = dict(
        name="add",
        steps=[StepRecord(action="open", target="/", ok=True), StepRecord(action="click", target="button", ok=True)],
        visible={"Count: 1": True},
        final_url="/",
    )
    return FlowRecord.model_validate({**base, **kw})


def preview(**kw: object) -> PreviewEvidence:
    base: dict[str, object] = dict(command=["python", "app.py"], ready=True, http=[good_http()], flows=[good_flow()])
    return PreviewEvidence.model_validate({**base, **kw})


def evidence(pv: PreviewEvidence | None, **kw: object) -> ValidationEvidence:
    return ValidationEvidence(
        diff_nonempty=True,
        exit_code=0,
        report=PASSING_JUNIT,
        preview_spec=SPEC,
        preview=pv,
        **kw,  # type: ignore[arg-type]
    )


def test_tests_and_every_probe_passing_is_a_pass() -> None:
    v = grade(evidence(preview()))
    assert v.passed and v.cause == Cause.passed
    assert v.preview is not None and [p.passed for p in v.preview.probes] == [True, True]


def test_declared_probes_without_evidence_never_pass() -> None:
    v = grade(evidence(None))
    assert not v.passed and v.cause == Cause.probe_missing
    assert v.failing_tests == ["preview::browser::add", "preview::http::total"]


def test_a_probe_without_a_record_is_missing_not_passed() -> None:
    v = grade(evidence(preview(flows=[])))
    assert v.cause == Cause.probe_missing and v.failing_tests == ["preview::browser::add"]


def test_failing_tests_decide_before_the_preview() -> None:
    failing = PASSING_JUNIT.replace(b'failures="0"', b'failures="1"').replace(
        b"/></testsuite>", b"><failure message='x'/></testcase></testsuite>"
    )
    v = grade(ValidationEvidence(diff_nonempty=True, exit_code=1, report=failing, preview_spec=SPEC, preview=None))
    assert v.cause == Cause.test_failure


@pytest.mark.parametrize(
    ("pv", "cause"),
    [
        (preview(started=False, start_error="no app.py"), Cause.preview_not_started),
        (preview(run=AppRun(timed_out=True, exited=True)), Cause.preview_limit),
        (preview(run=AppRun(oom_killed=True, exited=True, killed_by_signal=9)), Cause.preview_limit),
        (
            preview(ready=False, run=AppRun(exited=True, exit_code=1), log_tail="Traceback\nImportError: nope\n"),
            Cause.preview_crashed,
        ),
        (preview(ready=False, ready_detail="connection refused"), Cause.preview_not_ready),
    ],
)
def test_each_preview_rule_in_its_order(pv: PreviewEvidence, cause: Cause) -> None:
    v = grade(evidence(pv))
    assert v.cause == cause and not v.passed
    assert v.fingerprint.startswith(f"{cause.value}:")


def test_a_crash_names_its_last_output() -> None:
    v = grade(evidence(preview(ready=False, run=AppRun(exited=True, exit_code=1), log_tail="ImportError: nope\n")))
    assert "ImportError: nope" in v.reason and "before it became ready" in v.reason


@pytest.mark.parametrize(
    ("http", "failed"),
    [
        (good_http(status=500, body="Internal Server Error"), "status 200"),
        (good_http(body='{"total": 5}'), "$.total == 6"),
        (good_http(body="not json"), "$.total == 6"),
        (good_http(error="timed out after 10 s", status=None), "an answer"),
    ],
)
def test_http_probe_failures_say_what_was_expected_and_seen(http: HttpExchange, failed: str) -> None:
    v = grade(evidence(preview(http=[http])))
    assert v.cause == Cause.probe_failure and v.failing_tests == ["preview::http::total"]
    assert v.preview is not None
    first = v.preview.probes[0]
    assert first.failed == failed and first.seen


def test_body_assertions_run_on_the_recorded_bytes() -> None:
    spec = PreviewSpec.model_validate(
        {"http": [{"name": "p", "expect": [{"contains": "ok"}, {"not_contains": "error"}, {"regex": "^o+k$"}]}]}
    )
    ok = PreviewEvidence(ready=True, http=[HttpExchange(name="p", method="GET", path="/", status=200, body="ok")])
    assert grade_preview(spec, ok).passed
    bad = ok.model_copy(update={"http": [HttpExchange(name="p", method="GET", path="/", status=200, body="ok error")]})
    assert grade_preview(spec, bad).probes[0].failed == "body does not contain 'error'"


def test_a_catastrophic_pattern_is_linear_time() -> None:
    # (a+)+$ over 64 KiB of a's then b: exponential in a backtracking engine, instant in RE2.
    spec = PreviewSpec.model_validate({"http": [{"name": "p", "expect": [{"regex": "(a+)+$"}]}]})
    body = "a" * 65536 + "b"
    ev = PreviewEvidence(ready=True, http=[HttpExchange(name="p", method="GET", path="/", status=200, body=body)])
    assert not grade_preview(spec, ev).passed


@pytest.mark.parametrize(
    ("flow", "failed"),
    [
        (good_flow(visible={"Count: 1": False}, page_text="Count: 0"), "text visible 'Count: 1'"),
        (good_flow(console=[ConsoleEntry(type="error", text="TypeError: x is undefined")]), "no console errors"),
        (good_flow(page_errors=["ReferenceError: y"]), "no console errors"),
        (
            good_flow(failed_requests=[FailedRequest(method="GET", url="/app.js", failure="HTTP 404")]),
            "no failed requests",
        ),
        (
            good_flow(
                steps=[
                    StepRecord(action="open", target="/", ok=True),
                    StepRecord(action="click", target="role=button name='Add'", ok=False, error="timeout 10s"),
                ]
            ),
            "step click role=button name='Add'",
        ),
        (good_flow(page_crashed=True), "the page not to crash"),
    ],
)
def test_browser_flow_failures(flow: FlowRecord, failed: str) -> None:
    v = grade(evidence(preview(flows=[flow])))
    assert v.cause == Cause.probe_failure and v.failing_tests == ["preview::browser::add"]
    assert v.preview is not None and v.preview.probes[1].failed == failed


@pytest.mark.parametrize(
    "flow",
    [
        # Errors counted past what was kept: none of them in the record, all of them in the count.
        good_flow(console_seen=10_001, console_errors_seen=1),
        good_flow(page_errors_seen=250),
        good_flow(failed_requests_seen=3),
        good_flow(console=[ConsoleEntry(type="assert", text="Assertion failed: total")]),
    ],
)
def test_errors_are_judged_on_their_counts_not_on_what_was_kept(flow: FlowRecord) -> None:
    v = grade(evidence(preview(flows=[flow])))
    assert not v.passed and v.preview is not None
    assert v.preview.probes[1].failed in ("no console errors", "no failed requests")


def test_a_flow_whose_deciding_evidence_was_cut_is_not_judged() -> None:
    cut = good_flow(not_judged=["the browser sent events over the DevTools pipe's bounds that were dropped (1 X)"])
    v = grade(evidence(preview(flows=[cut])))
    assert not v.passed and v.preview is not None
    assert (v.preview.probes[1].failed or "").startswith("not judged") and "dropped" in (v.preview.probes[1].seen or "")
    # What cannot change the verdict is only noted.
    assert grade(evidence(preview(flows=[good_flow(cut=["90 of 10,100 console messages not kept"])]))).passed


@pytest.mark.parametrize(
    ("assertion", "body", "truncated", "encoding", "outcome"),
    [
        ({"not_contains": "error"}, "a" * 100, True, None, "not judged"),
        ({"not_contains": "error"}, "an error", True, None, "body does not contain 'error'"),
        ({"contains": "ok"}, "a" * 100, True, None, "not judged"),
        ({"contains": "ok"}, "ok" + "a" * 100, True, None, "pass"),
        ({"regex": "^a+"}, "a" * 100, True, None, "pass"),
        ({"regex": "a$"}, "a" * 100, True, None, "not judged"),
        ({"regex": "b\\b"}, "ab " + "a" * 10, True, None, "pass"),
        ({"regex": "a\\b"}, "a" * 100, True, None, "not judged"),
        ({"json_path": "$.total", "equals": 6}, '{"total": 6, "items": [', True, None, "not judged"),
        ({"not_contains": "error"}, "[12 bytes of gzip-encoded body, not decoded]", False, "gzip", "not judged"),
        ({"not_contains": "error"}, "all fine", False, None, "pass"),
    ],
)
def test_a_body_cut_or_compressed_cannot_pass_what_it_does_not_show(
    assertion: dict[str, object], body: str, truncated: bool, encoding: str | None, outcome: str
) -> None:
    spec = PreviewSpec.model_validate({"http": [{"name": "p", "expect": [assertion]}]})
    x = HttpExchange(
        name="p", method="GET", path="/", status=200, body=body, body_truncated=truncated, body_encoding=encoding
    )
    probe = grade_preview(spec, PreviewEvidence(ready=True, http=[x])).probes[0]
    assert ("pass" if probe.passed else (probe.failed or "")).startswith(outcome), probe


def test_console_warnings_are_not_errors() -> None:
    v = grade(evidence(preview(flows=[good_flow(console=[ConsoleEntry(type="warning", text="deprecated")])])))
    assert v.passed


def test_the_same_probe_failure_has_the_same_fingerprint_across_attempts() -> None:
    a = grade(evidence(preview(http=[good_http(status=500, body="Traceback at 0x7f00aa: KeyError 'n' line 12")])))
    b = grade(evidence(preview(http=[good_http(status=500, body="Traceback at 0x7f11bb: KeyError 'n' line 14")])))
    other = grade(evidence(preview(flows=[good_flow(visible={})])))
    assert a.fingerprint == b.fingerprint != other.fingerprint
    assert a.fingerprint.startswith("probe_failure:")


def test_diagnostics_hand_the_next_attempt_the_probes() -> None:
    pv = preview(
        http=[good_http(status=500, body="KeyError: 'price'")],
        flows=[good_flow(visible={"Count: 1": False}, console=[ConsoleEntry(type="error", text="TypeError: boom")])],
        log_tail="127.0.0.1 - GET /api/total 500\nKeyError: 'price'\n",
    )
    ev = evidence(pv)
    text = build_diagnostics(grade(ev), ev, 1, None)
    assert "cause: probe_failure" in text and "Acceptance probes (2 of 2 failed)" in text
    assert "preview::http::total" in text and "expected: status 200" in text and "KeyError: 'price'" in text
    assert "console errors: TypeError: boom" in text
    assert "The app's output (tail)" in text
    assert "missing from the report" not in text


def test_json_path() -> None:
    doc = {"a": {"b": [1, {"c": None}]}}
    assert json_path(doc, "$") == (True, doc)
    assert json_path(doc, "$.a.b[1].c") == (True, None)
    assert json_path(doc, "$.a.b[2]") == (False, None)
    assert json_path(doc, "$.x") == (False, None)


@pytest.mark.parametrize(
    ("preview_doc", "field"),
    [
        ({"http": [{"name": "a", "path": "//evil.example/"}]}, "preview.http.0.path"),
        ({"http": [{"name": "a", "expect": [{"regex": "(?<=x)y"}]}]}, "preview.http.0.expect.0.regex.regex"),
        ({"http": [{"name": "a", "headers": {"Transfer-Encoding": "chunked"}}]}, "preview.http.0.headers"),
        ({"browser": [{"name": "b", "steps": [{"hover": {"text": "x"}}]}]}, "preview.browser.0.steps.0"),
        (
            {"browser": [{"name": "b", "steps": [{"open": "/"}], "expect": [{"url": "https://x/"}]}]},
            "preview.browser.0.expect.0.url.url",
        ),
        ({"http": [{"name": "a"}], "start": {"env": {"PORT": "1"}}}, "preview.start.env"),
        ({}, "preview"),
        ({"http": [{"name": "a"}, {"name": "a"}]}, "preview"),
        ({"http": [{"name": "a"}], "lifetime_s": 86400}, "preview.lifetime_s"),
    ],
)
def test_a_bad_preview_is_refused_naming_the_field(preview_doc: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        ValidationSpec.model_validate({"command": ["pytest"], "preview": preview_doc})
    assert field in [".".join(str(x) for x in e["loc"]) for e in err.value.errors()]
