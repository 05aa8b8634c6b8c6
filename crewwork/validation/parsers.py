"""Test-report parsers: turn the bytes a test run left behind into per-test results, and never raise.

Grading (``crewwork.validation.grading``) is a pure function over saved evidence, so the parsers here are pure
too: bytes in, a `ParsedReport` out. A registry (`PARSERS`) maps a report format name to its parser, so
another test runner is one function and one registry line.

Reports are written inside the sandbox by code the agent may have changed, so they are untrusted input:

* XML is parsed with expat directly and any DOCTYPE, entity declaration or external entity is refused, which
  rules out billion-laughs and external-entity tricks (a JUnit report never needs a DOCTYPE); elements nested
  deeper than MAX_XML_DEPTH are refused too. Time and memory are linear in the report's size, which is bounded.
* Sizes are bounded without losing what decides (crewwork.validation.bounded): counts are exact over every test
  case; failed and errored cases are kept up to MAX_FAILURES_KEPT, the rest up to MAX_CASES, the tests a work
  item lists (`keep`) always; messages are cut to MAX_MESSAGE_CHARS, and only the first MAX_FAILURE_MESSAGES
  failures keep one. A bound that still cuts what could decide (a report over MAX_REPORT_BYTES or MAX_XML_DEPTH,
  terminal output cut before its summary or a listed test) is a decisive `Cut` in ``ParsedReport.cuts``: grading
  then says `not_judged`, never a pass.
* Anything that cannot be read comes back as ``ParsedReport(ok=False, error=...)``, never as an exception and
  never as a pass.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal, Protocol
from xml.parsers import expat

from crewwork.models import TestCaseResult
from crewwork.validation.bounded import Cut, Sample

Outcome = Literal["passed", "failed", "error", "skipped"]

# A pytest JUnit report of a very large suite is a few MiB; anything far beyond that is not a report we trust.
MAX_REPORT_BYTES = 32 * 1024 * 1024
# Passing and skipped results kept per report. Counts stay exact beyond this; only the per-test list is sampled.
MAX_CASES = 50_000
# Failed and errored results kept per report (each also counted): every one decides, so their bound is their own.
MAX_FAILURES_KEPT = 50_000
# Failures that keep their message; later ones keep their id and outcome (messages are for people, not verdicts).
MAX_FAILURE_MESSAGES = 2_000
# JUnit nests testsuites > testsuite > testcase > failure; a few levels more for nested suites. Deeper is hostile.
MAX_XML_DEPTH = 64
# Characters kept of one test's failure message (head of the message, tail of the traceback).
MAX_MESSAGE_CHARS = 4_000
MAX_TEST_ID_CHARS = 1_000
# Terminal lines longer than this are cut before matching; no summary or result line is anywhere near it.
MAX_LINE_CHARS = 8_000

# When the same test id appears twice (reruns, duplicated suites), the worse outcome wins: evidence is judged
# conservatively.
_SEVERITY: dict[str, int] = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


@dataclass(frozen=True)
class ParsedReport:
    """What one parser made of one report."""

    format: str
    """Name of the parser that produced this (a key of `PARSERS`)."""
    ok: bool
    """False when the report could not be read at all; then `error` says why and nothing else is trusted."""
    tests: tuple[TestCaseResult, ...] = ()
    """Per-test results, one per test id (duplicates merged, worse outcome wins): every failed and errored one up to
    MAX_FAILURES_KEPT, every listed one, the others up to MAX_CASES."""
    counts: dict[str, int] = field(default_factory=dict)
    """Exact counts per outcome over every test case seen, including those not kept in `tests`."""
    cuts: tuple[Cut, ...] = ()
    """What a bound cut, and whether it could decide the verdict (crewwork.validation.bounded)."""
    error: str | None = None
    """Why the report is unusable (`ok` is False) or why it is not trusted (declared counts disagree)."""
    inconsistent: bool = False
    """The report's own declared failure/error counts exceed what its test cases show: it was tampered
    with, or cut in a way that still parses, so it must not be believed."""

    @property
    def executed(self) -> int:
        """Tests that actually ran (skipped ones did not)."""
        return self.counts.get("passed", 0) + self.counts.get("failed", 0) + self.counts.get("error", 0)

    @property
    def not_passing(self) -> int:
        return self.counts.get("failed", 0) + self.counts.get("error", 0)

    def by_id(self) -> dict[str, TestCaseResult]:
        return {t.id: t for t in self.tests}


class Parser(Protocol):
    """bytes in, a `ParsedReport` out. `keep`: test ids kept whatever the bounds (a work item's listed tests);
    `input_cut`: how the data was already cut before it reached the parser (a tail of terminal output)."""

    def __call__(
        self, data: bytes | str, *, keep: Collection[str] = ..., input_cut: Cut | None = ...
    ) -> ParsedReport: ...


def _unparseable(fmt: str, why: str, cut: Cut | None = None) -> ParsedReport:
    return ParsedReport(format=fmt, ok=False, error=why, cuts=(cut,) if cut is not None else ())


def _too_large(fmt: str, size: int) -> ParsedReport:
    return _unparseable(
        fmt,
        f"report is {size} bytes, more than the {MAX_REPORT_BYTES} allowed",
        Cut(
            what=f"{fmt} report",
            bound="MAX_REPORT_BYTES",
            limit=MAX_REPORT_BYTES,
            unit="bytes",
            seen=size,
            kept=0,
            decisive=True,
            why="nothing of a report over its size bound is read, so nothing in it was judged",
        ),
    )


def _bound_message(head: str | None, body: str | None) -> str | None:
    """Keep the start of the one-line message and the end of the traceback, where the assertion is."""
    head = (head or "").strip()
    body = (body or "").strip()
    if len(head) > MAX_MESSAGE_CHARS // 4:
        head = head[: MAX_MESSAGE_CHARS // 4] + " …"
    if body and body == head:
        body = ""
    room = MAX_MESSAGE_CHARS - len(head) - 1
    if len(body) > room:
        body = "… " + body[-(room - 2) :]
    text = "\n\n".join(p for p in (head, body) if p)
    return text or None


def _merge(prior: TestCaseResult, new: TestCaseResult) -> TestCaseResult:
    """One test id seen twice: the worse outcome wins. pytest reports a teardown error as a second <testcase> with
    the same id; both messages are kept so the assertion of the call phase is not lost behind the teardown error."""
    worse = new.outcome if _SEVERITY[new.outcome] > _SEVERITY[prior.outcome] else prior.outcome
    merged = prior.message
    if new.outcome in ("failed", "error") and new.message and new.message != prior.message:
        merged = _bound_message(None, f"{prior.message}\n\n{new.message}" if prior.message else new.message)
    if worse == prior.outcome and merged == prior.message:
        return prior
    return TestCaseResult(id=prior.id, outcome=worse, message=merged)


class _Accumulator:
    """Collects results within the bounds (a `Sample`: failures and listed tests kept, the rest sampled, counts
    exact), merging duplicate ids."""

    def __init__(self, keep: Collection[str] = ()) -> None:
        self.sample: Sample[TestCaseResult] = Sample(
            what="test cases",
            deciding=frozenset({"failed", "error"}),
            keep_deciding=MAX_FAILURES_KEPT,
            deciding_bound="MAX_FAILURES_KEPT",
            keep_rest=MAX_CASES,
            rest_bound="MAX_CASES",
            merge=_merge,
            kind_of=lambda r: r.outcome,
            must_keep=frozenset(normalize_test_id(k)[:MAX_TEST_ID_CHARS] for k in keep),
        )
        self.messages = 0
        self.messages_dropped = 0

    @property
    def counts(self) -> dict[str, int]:
        return {k: self.sample.counts.get(k, 0) for k in ("passed", "failed", "error", "skipped")}

    def add(self, test_id: str, outcome: Outcome, message: str | None) -> None:
        test_id = test_id[:MAX_TEST_ID_CHARS]
        if message is not None and test_id not in self.sample.items:
            if self.messages >= MAX_FAILURE_MESSAGES and outcome in ("failed", "error"):
                message = None
                self.messages_dropped += 1
            elif outcome in ("failed", "error"):
                self.messages += 1
        self.sample.add(test_id, TestCaseResult(id=test_id, outcome=outcome, message=message))

    def cuts(self) -> list[Cut]:
        cuts = self.sample.cuts()
        if self.messages_dropped:
            cuts.append(
                Cut(
                    what="failure messages",
                    bound="MAX_FAILURE_MESSAGES",
                    limit=MAX_FAILURE_MESSAGES,
                    seen=self.messages + self.messages_dropped,
                    kept=self.messages,
                    decisive=False,
                    why="every failure is kept with its id and outcome; only the later ones' messages are not",
                )
            )
        return cuts

    def report(
        self,
        fmt: str,
        *,
        inconsistent: bool = False,
        error: str | None = None,
        counts: dict[str, int] | None = None,
        cuts: list[Cut] | None = None,
    ) -> ParsedReport:
        return ParsedReport(
            format=fmt,
            ok=True,
            tests=tuple(self.sample.items.values()),
            counts=counts if counts is not None else self.counts,
            cuts=tuple([*self.cuts(), *(cuts or [])]),
            inconsistent=inconsistent,
            error=error,
        )


# ---------------------------------------------------------------- test ids


def _looks_like_python_module(part: str) -> bool:
    return part.startswith("test_") or part.endswith("_test") or part in ("test", "tests")


def junit_test_id(classname: str, name: str, *, file: str | None = None, pytest_style: bool = False) -> str:
    """A JUnit (classname, name) pair as a pytest node id where recognisably pytest, else ``classname::name``.

    pytest writes classname ``tests.test_x.TestClass`` for ``tests/test_x.py::TestClass::test_name``: module
    parts are lower case, classes start with an upper-case letter. The xunit1 ``file`` attribute, when
    present, is authoritative for the path.
    """
    classname = classname.strip()
    name = name.strip()
    if not classname:
        # pytest reports a module that failed to import as classname "" and name "tests.test_x".
        if pytest_style and name and not any(c in name for c in "/:[ "):
            return name.replace(".", "/") + ".py"
        return normalize_test_id(name)
    parts = classname.split(".")
    first_class = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
    module_parts, class_parts = parts[:first_class], parts[first_class:]
    if file and file.endswith(".py"):
        path = file
    elif module_parts and (pytest_style or any(_looks_like_python_module(p) for p in module_parts)):
        path = "/".join(module_parts) + ".py"
    else:
        return f"{classname}::{name}"
    return normalize_test_id("::".join([path, *class_parts, name]))


def normalize_test_id(test_id: str) -> str:
    """Canonical form of a pytest-like id, so ids from a spec, a report and terminal output compare equal."""
    test_id = test_id.strip()
    if "::" not in test_id:
        return test_id.replace("\\", "/").removeprefix("./")
    path, _, rest = test_id.partition("::")
    return path.replace("\\", "/").removeprefix("./") + "::" + rest


# ---------------------------------------------------------------- JUnit XML


class _RefusedXML(Exception):
    pass


class _TooDeep(_RefusedXML):
    pass


_CHILD_OUTCOME: dict[str, Outcome] = {"failure": "failed", "error": "error", "skipped": "skipped"}


def parse_junit(data: bytes | str, *, keep: Collection[str] = (), input_cut: Cut | None = None) -> ParsedReport:
    """JUnit XML as written by pytest ``--junitxml`` (xunit1 or xunit2) and by most other runners.

    The root is ``<testsuites>`` or ``<testsuite>``; each ``<testcase classname= name=>`` passed unless it
    has a ``<failure>``, ``<error>`` or ``<skipped>`` child.
    """
    fmt = "junit"
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if len(raw) > MAX_REPORT_BYTES:
        return _too_large(fmt, len(raw))
    if input_cut is not None:
        # Part of an XML document is no report: whatever was cut could hold a failure.
        return _unparseable(fmt, f"the report was cut before parsing ({input_cut.describe()})", input_cut)
    if not raw.strip():
        return _unparseable(fmt, "report is empty")
    try:
        return _parse_junit_xml(raw, keep)
    except _TooDeep as exc:
        return _unparseable(
            fmt,
            str(exc),
            Cut(
                what="junit report",
                bound="MAX_XML_DEPTH",
                limit=MAX_XML_DEPTH,
                unit="levels",
                kept=0,
                decisive=True,
                why="a report nested past its depth bound is not read, so nothing in it was judged",
            ),
        )
    except _RefusedXML as exc:
        return _unparseable(fmt, str(exc))
    except expat.ExpatError as exc:
        return _unparseable(fmt, f"report is not well-formed XML ({expat.ErrorString(exc.code)}, line {exc.lineno})")
    except (RecursionError, MemoryError, ValueError, UnicodeError) as exc:
        return _unparseable(fmt, f"report could not be read ({type(exc).__name__})")


def _parse_junit_xml(raw: bytes, keep: Collection[str]) -> ParsedReport:
    acc = _Accumulator(keep)
    stack: list[str] = []
    suite_names: list[str] = []
    # Per open <testsuite>: [declared failures+errors or None, seen failures+errors].
    suite_tallies: list[list[int | None]] = []
    inconsistent = False

    case: dict[str, str] | None = None
    case_outcome: Outcome = "passed"
    case_head: str | None = None
    body_parts: list[str] = []
    body_len = 0
    collecting_body = False

    def refuse_doctype(*_args: object) -> None:
        raise _RefusedXML("report has a DOCTYPE; refused (a JUnit report never needs one)")

    def refuse_entity(*_args: object) -> None:
        raise _RefusedXML("report declares XML entities; refused")

    def refuse_external(*_args: object) -> int:
        raise _RefusedXML("report references an external entity; refused")

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal case, case_outcome, case_head, body_len, collecting_body
        if not stack and tag not in ("testsuites", "testsuite"):
            raise _RefusedXML(f"root element is <{tag[:50]}>, not <testsuites> or <testsuite>")
        if len(stack) >= MAX_XML_DEPTH:
            raise _TooDeep(f"report nests elements deeper than {MAX_XML_DEPTH} levels (MAX_XML_DEPTH); refused")
        stack.append(tag)
        if tag == "testsuite":
            suite_names.append(attrs.get("name", ""))
            declared: int | None = None
            try:
                if "failures" in attrs or "errors" in attrs:
                    declared = int(attrs.get("failures", "0") or 0) + int(attrs.get("errors", "0") or 0)
            except ValueError:
                declared = None
            suite_tallies.append([declared, 0])
        elif tag == "testcase":
            case = dict(attrs)
            case_outcome, case_head = "passed", None
            body_parts.clear()
            body_len = 0
        elif case is not None and len(stack) >= 2 and stack[-2] == "testcase":
            mapped = _CHILD_OUTCOME.get(tag)
            if mapped is not None and _SEVERITY[mapped] > _SEVERITY[case_outcome]:
                case_outcome = mapped
                case_head = attrs.get("message") or attrs.get("type")
                body_parts.clear()
                body_len = 0
            collecting_body = mapped in ("failed", "error")
            # Declared counts are per <failure>/<error> element, so tally elements, not test cases.
            if collecting_body and suite_tallies:
                tally = suite_tallies[-1]
                tally[1] = (tally[1] or 0) + 1

    def end(tag: str) -> None:
        nonlocal case, collecting_body, inconsistent
        stack.pop()
        if tag == "testcase" and case is not None:
            pytest_style = any(n == "pytest" for n in suite_names)
            test_id = junit_test_id(
                case.get("classname", ""),
                case.get("name", ""),
                file=case.get("file"),
                pytest_style=pytest_style,
            )
            message = _bound_message(case_head, "".join(body_parts)) if case_outcome != "passed" else None
            acc.add(test_id, case_outcome, message)
            case = None
        elif tag in ("failure", "error", "skipped"):
            collecting_body = False
        elif tag == "testsuite":
            suite_names.pop()
            declared, seen = suite_tallies.pop()
            if declared is not None and declared > (seen or 0):
                inconsistent = True
            if suite_tallies:
                parent = suite_tallies[-1]
                parent[1] = (parent[1] or 0) + (seen or 0)

    def chars(text: str) -> None:
        nonlocal body_len
        if collecting_body:
            body_parts.append(text)
            body_len += len(text)
            # Keep memory bounded on a giant traceback: only the tail is ever shown.
            if body_len > 4 * MAX_MESSAGE_CHARS:
                joined = "".join(body_parts)[-2 * MAX_MESSAGE_CHARS :]
                body_parts[:] = [joined]
                body_len = len(joined)

    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = refuse_doctype
    parser.EntityDeclHandler = refuse_entity
    parser.UnparsedEntityDeclHandler = refuse_entity
    parser.ExternalEntityRefHandler = refuse_external
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    parser.buffer_text = True
    parser.Parse(raw, True)

    error = "the report's declared failure/error counts exceed its test cases" if inconsistent else None
    return acc.report("junit", inconsistent=inconsistent, error=error)


# ---------------------------------------------------------------- pytest terminal output

# "===== 1 failed, 2 passed, 1 warning in 0.12s =====", or -q's bare "1 failed, 2 passed in 0.12s".
# Patterns are kept free of nested or overlapping quantifiers: the output is written by code under test, and a
# crafted line must not make matching quadratic.
_SUMMARY = re.compile(r"^=* ?(?P<body>no tests ran|\d+ [a-z]+(?:, \d+ [a-z]+)*) in \d+(?:\.\d+)?s\b")
_SUMMARY_PART = re.compile(r"(\d+) ([a-z]+)")
# "tests/test_x.py::test_a PASSED   [ 50%]" (-v)
_VERBOSE = re.compile(r"^(?P<id>[^\s:]+::\S+) (?P<word>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
# "FAILED tests/test_x.py::test_a - AssertionError: boom" (-r short summary)
_SHORT = re.compile(r"^(?P<word>PASSED|FAILED|ERROR|XFAIL|XPASS) (?P<id>\S+)(?: - (?P<msg>.*))?$")

_WORD_OUTCOME: dict[str, Outcome] = {
    "PASSED": "passed",
    "XPASS": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
    "XFAIL": "skipped",
}
_COUNT_OUTCOME: dict[str, Outcome] = {
    "passed": "passed",
    "xpassed": "passed",
    "failed": "failed",
    "error": "error",
    "errors": "error",
    "skipped": "skipped",
    "xfailed": "skipped",
}


def parse_pytest_terminal(
    data: bytes | str, *, keep: Collection[str] = (), input_cut: Cut | None = None
) -> ParsedReport:
    """Fallback when no report file exists: pytest's terminal output (the tail is enough).

    Counts come from the final summary line, which must be present; per-test ids come from ``-v`` lines and
    the ``-r`` short summary, so a test not named there is simply unknown (and a listed test that is unknown
    counts as not passing). When the output was cut before it got here (`input_cut`: only a tail was kept), a
    missing summary line or a listed test that is not named is a decisive cut: what was cut could have held it.
    """
    fmt = "pytest_terminal"
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    if len(text) > MAX_REPORT_BYTES:
        text = text[-MAX_REPORT_BYTES:]
        input_cut = input_cut or Cut(
            what="test output",
            bound="MAX_REPORT_BYTES",
            limit=MAX_REPORT_BYTES,
            unit="bytes",
            seen=len(data),
            kept=MAX_REPORT_BYTES,
            decisive=False,
        )
    counts: dict[str, int] | None = None
    per_test: dict[str, tuple[Outcome, str | None]] = {}
    for line in text.splitlines():
        line = line[:MAX_LINE_CHARS].rstrip()
        summary = _SUMMARY.match(line)
        if summary:
            # The last summary line wins (a plugin may print earlier look-alikes).
            counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
            for n, word in _SUMMARY_PART.findall(summary.group("body")):
                outcome = _COUNT_OUTCOME.get(word)
                if outcome is not None:
                    counts[outcome] += int(n)
            continue
        m = _SHORT.match(line) or _VERBOSE.match(line)
        if m:
            outcome = _WORD_OUTCOME[m.group("word")]
            test_id = normalize_test_id(m.group("id"))
            msg = m.groupdict().get("msg")
            prior = per_test.get(test_id)
            if prior is None or _SEVERITY[outcome] >= _SEVERITY[prior[0]]:
                per_test[test_id] = (outcome, _bound_message(msg, None) or (prior[1] if prior else None))
    if counts is None:
        if input_cut is not None:
            return _unparseable(
                fmt,
                "no pytest summary line in the kept output, which was cut",
                input_cut.model_copy(
                    update={"decisive": True, "why": "the summary line could have been in what was not kept"}
                ),
            )
        return _unparseable(fmt, "no pytest summary line found in the output")
    acc = _Accumulator(keep)
    for test_id, (outcome, msg) in per_test.items():
        acc.add(test_id, outcome, msg)
    cuts: list[Cut] = []
    if input_cut is not None:
        unnamed = sorted({normalize_test_id(k) for k in keep} - set(per_test))
        if unnamed:
            cuts.append(
                input_cut.model_copy(
                    update={
                        "decisive": True,
                        "why": f"{len(unnamed)} listed test(s) not named in the kept output (first: "
                        f"{unnamed[0][:200]}); their lines could have been in what was not kept",
                    }
                )
            )
        else:
            cuts.append(input_cut)
    # The summary line is authoritative for counts; per-test lines may be partial (only a tail was kept).
    return acc.report(fmt, counts=counts, cuts=cuts)


PARSERS: dict[str, Parser] = {
    "junit": parse_junit,
    "pytest_terminal": parse_pytest_terminal,
}
"""Report format name -> parser. Adding a runner is one parser function and one line here."""


def parse_report(
    fmt: str, data: bytes | str, *, keep: Collection[str] = (), input_cut: Cut | None = None
) -> ParsedReport:
    """Parse with the named parser (`keep`, `input_cut`: see `Parser`). An unknown format or a parser bug gives an
    unparseable report."""
    parser = PARSERS.get(fmt)
    if parser is None:
        return _unparseable(fmt, f"no parser registered for report format {fmt!r}")
    try:
        return parser(data, keep=keep, input_cut=input_cut)
    except Exception as exc:  # a parser bug must never turn into a pass or escape into the activity
        return _unparseable(fmt, f"parser {fmt!r} failed ({type(exc).__name__})")
