"""The outcome witness, judged: pure functions over the records the witness plugin left and the report beside them.

The plugin (crewwork/validation/witness_plugin.py, loaded by pytest before anything of the package under test) records
what the runner itself saw for every test. `witness_doubts` compares that with the parsed report and the exit code and
returns every reason to doubt the report, each one sentence; grading turns any doubt into `suspected_tampering`.

A doubt is raised when:

- a witness was expected (the command runs pytest) but no stream was written, or a stream did not finish (no `end`
  record after tests were recorded: the process was ended before pytest could finish, or the stream was cut), or
  holds a line that is not a record the plugin writes (the stream was written by something else). A process that
  never ran a test (`pytest --version`, a configuration error) may end without an `end` record;
- the report says a test passed that the witness saw raise, skip or xfail (in any phase, or in the test function
  itself below every wrapper), or says a test was skipped that the witness saw fail without an xfail marker;
- the witness saw a test fail that the report does not show at all (only when the report's sample is not cut);
- the report shows more passing tests than the witness saw pass, or a listed test passing that the witness never saw;
- a test, or a whole module at collection, was skipped or xfailed by code in a file the change touched that is not a
  test (the witness records who raised the skip: the innermost frame that is neither pytest's nor hidden);
- collected tests were dropped before the run without being deselected (`-k`, `-m`, `--deselect` report theirs), or
  selected tests never ran and yet pytest ended with exit status 0;
- exactly one pytest session ran and the command's exit code differs from the exit status pytest itself reached.

Ids are compared as the report parser writes them (crewwork.validation.parsers.normalize_test_id); a witness test id
is a pytest node id, which is what pytest's JUnit report encodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from crewwork.models import TestCaseResult
from crewwork.validation.parsers import ParsedReport, junit_test_id, normalize_test_id
from crewwork.validation.reach import is_test_path

PLUGIN_MODULE = "crewwork_witness"
"""The name pytest imports the plugin under (`-p crewwork_witness`)."""
WITNESS_DIR = "witness"
"""Where, under the workspace's platform directory (`.crewwork/`), each pytest process writes its stream."""
MAX_STREAMS = 64
"""Streams read (one per pytest process: a session, or each xdist worker); more is a doubt, not a cut."""
MAX_WITNESS_BYTES = 16 * 1024 * 1024
"""All streams together; over it, the witness is a decisive cut (`not_judged`)."""
MAX_DOUBTS = 20
"""Doubts carried in a verdict (each names one test or one stream); the count says how many there were."""

_KINDS = frozenset({"passed", "skipped", "xfailed", "raised"})


_RANK = {"passed": 0, "skipped": 1, "xfailed": 2, "failed": 3}


@dataclass
class WitnessedTest:
    """What the witness saw of one test: the raw kind of each phase and of the test function, and who skipped it."""

    id: str
    phases: dict[str, str | None] = field(default_factory=dict)
    xfail: bool = False
    origin: str | None = None
    """`path:line` of the code that skipped or xfailed it (None: pytest itself, from a marker)."""

    @property
    def outcome(self) -> str:
        """`failed`, `xfailed`, `skipped` or `passed`, from what was raised, not from any report."""
        kinds = [k for k in self.phases.values() if k is not None]
        if "raised" in kinds:
            return "xfailed" if self.xfail and self.phases.get("call") == "raised" else "failed"
        if "xfailed" in kinds:
            return "xfailed"
        if "skipped" in kinds:
            return "skipped"
        return "passed"


@dataclass
class Witness:
    """Every stream, read. Within a stream the last record of a test wins (a rerun replaces its first run); across
    streams the worst (a test two sessions ran, or a stream written beside the real one, cannot hide a failure)."""

    tests: dict[str, WitnessedTest] = field(default_factory=dict)
    skipped_modules: dict[str, str] = field(default_factory=dict)
    """Collector id -> `path:line` of the code that skipped it at collection."""
    sessions: list[int] = field(default_factory=list)
    """Exit status of each finished session that was not an xdist worker."""
    problems: list[str] = field(default_factory=list)
    """What was wrong with the streams themselves, or with what they say happened between collection and the run."""


_PYTEST_WORD = re.compile(r"(?<![\w.-])(pytest|py\.test)(?![\w.-])")


def expects_witness(command: Sequence[str]) -> bool:
    """Whether a validation command runs pytest (so a missing witness is a doubt): `pytest` or `py.test` as a word of
    an argument (`.venv/bin/pytest`, `python -m pytest`, `sh -c "... pytest -q"`), not inside another name
    (`/tmp/pytest-of-root/...`, `pytest_cov`)."""
    return any(_PYTEST_WORD.search(arg) for arg in command)


def read_streams(streams: Mapping[str, bytes], report_path: str | None = None) -> Witness:
    """Parse the streams (name -> bytes, as read from the workspace). Never raises: anything odd is a problem. Only the
    tests of sessions that wrote `report_path` (None: sessions that wrote no report) are compared with the report: a
    session a test starts in a subprocess is checked for its own consistency only."""
    w = Witness()
    if len(streams) > MAX_STREAMS:
        w.problems.append(f"{len(streams)} witness streams, more than pytest processes write ({MAX_STREAMS} at most)")
    for name, data in sorted(streams.items())[:MAX_STREAMS]:
        tests, report = _read_one(name, data, w)
        if report != (normalize_test_id(report_path) if report_path is not None else None):
            continue
        for test_id, test in tests.items():
            seen = w.tests.get(test_id)
            if seen is None or _RANK[test.outcome] >= _RANK[seen.outcome]:
                w.tests[test_id] = test
    return w


def _count(rec: dict[str, object], key: str) -> int | None:
    value = rec.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_one(name: str, data: bytes, w: Witness) -> tuple[dict[str, WitnessedTest], str | None]:
    """The stream's tests (the last record of each) and the report its session wrote."""
    started = ended = False
    tests: dict[str, WitnessedTest] = {}
    report: str | None = None
    ran = 0
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            w.problems.append(f"witness stream {name}: line {n} is not a record the witness writes")
            return tests, report
        kind = rec.get("k") if isinstance(rec, dict) else None
        if kind == "start" and not started and n == 1:
            started = True
        elif kind == "configure" and started:
            report = normalize_test_id(rec["report"]) if isinstance(rec.get("report"), str) else None
        elif kind == "collect" and started and not ended and isinstance(rec.get("id"), str):
            if isinstance(rec.get("origin"), str):
                w.skipped_modules[rec["id"]] = rec["origin"]
        elif kind == "test" and started and not ended and isinstance(rec.get("id"), str):
            phases = {p: rec.get(p) for p in ("setup", "call", "teardown", "function")}
            if any(v is not None and v not in _KINDS for v in phases.values()):
                w.problems.append(f"witness stream {name}: line {n} holds an outcome the witness never writes")
                return tests, report
            ran += 1
            test_id = normalize_test_id(rec["id"])
            origin = rec.get("origin") if isinstance(rec.get("origin"), str) else None
            tests[test_id] = WitnessedTest(test_id, phases, bool(rec.get("xfail")), origin)
        elif kind == "end" and started and not ended and isinstance(rec.get("exitstatus"), int):
            ended = True
            _check_end(name, rec, ran, w)
        else:
            w.problems.append(f"witness stream {name}: line {n} is out of place ({str(kind)[:40]!r})")
            return tests, report
    if not started:
        w.problems.append(f"witness stream {name} does not start as the witness starts one")
    elif not ended and ran:
        w.problems.append(
            f"witness stream {name} never finished: the pytest process ended (or its stream was cut) before the "
            "session's end was recorded"
        )
    return tests, report


def _check_end(name: str, rec: dict[str, object], ran: int, w: Witness) -> None:
    """What the session's end says about the run: tests that vanished between collection and the run."""
    status = rec["exitstatus"]
    assert isinstance(status, int)
    worker = rec.get("worker")
    if worker is None:
        w.sessions.append(status)
    collected, deselected, selected = (_count(rec, k) for k in ("collected", "deselected", "selected"))
    if collected is not None and deselected is not None and selected is not None and collected - selected > deselected:
        w.problems.append(
            f"witness stream {name}: {collected - selected - deselected} collected tests were dropped before the run "
            "without being deselected"
        )
    if worker is None and status == 0 and rec.get("looped") is True and selected is not None and ran < selected:
        w.problems.append(
            f"witness stream {name}: {selected - ran} of {selected} selected tests never ran, yet pytest ended with "
            "exit status 0"
        )


def _path(origin: str) -> str:
    return normalize_test_id(origin.rpartition(":")[0])


def _report_id(result: TestCaseResult) -> str:
    return normalize_test_id(result.id)


def _junit_form(node_id: str) -> str:
    """A node id as it comes back from pytest's JUnit report (classname and name), so both sides compare."""
    path, sep, rest = node_id.partition("::")
    if not sep or not path.endswith(".py"):
        return node_id
    parts = rest.split("::")
    classname = ".".join([path[:-3].replace("/", "."), *parts[:-1]])
    return junit_test_id(classname, parts[-1], pytest_style=True)


def witness_doubts(
    *,
    expected: bool,
    streams: Mapping[str, bytes] | None,
    parsed: ParsedReport | None,
    exit_code: int | None,
    listed: Sequence[str] = (),
    changed: Collection[str] = (),
    report_path: str | None = None,
) -> list[str]:
    """Every reason the witness gives to doubt the report (empty: none). Pure; `parsed` is None when the report could
    not be read (then only the streams and the exit code are checked)."""
    if not streams:
        if expected:
            return [
                "the command runs pytest, but crewwork's outcome witness recorded nothing: pytest was kept from "
                "loading it, or its records were removed"
            ]
        return []
    w = read_streams(streams, report_path)
    doubts = list(w.problems)
    seen = {_junit_form(k): v for k, v in w.tests.items()}
    seen.update(w.tests)
    if parsed is not None and parsed.ok:
        reported = {_report_id(t): t for t in parsed.tests}
        for test_id, result in sorted(reported.items()):
            saw = seen.get(test_id)
            if saw is None:
                continue
            if result.outcome == "passed" and saw.outcome != "passed":
                doubts.append(f"{test_id}: the report says passed, the witness saw it {saw.outcome}")
            elif result.outcome == "skipped" and saw.outcome == "failed":
                doubts.append(f"{test_id}: the report says skipped, the witness saw it fail (no xfail marker)")
        failed = {k for k, v in w.tests.items() if v.outcome == "failed"}
        sample_cut = any(c.what.startswith("test cases") for c in parsed.cuts)
        if not sample_cut:
            shown = set(reported)
            for test_id in sorted(failed):
                if test_id not in shown and _junit_form(test_id) not in shown:
                    doubts.append(f"{test_id}: the witness saw it fail; the report does not show it")
        passed_seen = sum(1 for v in w.tests.values() if v.outcome == "passed")
        passed_reported = parsed.counts.get("passed", 0)
        if passed_reported > passed_seen:
            doubts.append(
                f"the report shows {passed_reported} passing tests, the witness saw {passed_seen} pass: "
                "passes were added after the runner decided"
            )
        for raw in listed:
            test_id = normalize_test_id(raw)
            listed_result = reported.get(test_id)
            if listed_result is not None and listed_result.outcome == "passed" and test_id not in seen:
                doubts.append(f"{test_id}: listed and reported passing, but the witness never saw it run")
    changed_code = {p for p in changed if not is_test_path(p)}
    for test_id, saw in sorted(w.tests.items()):
        if saw.origin is not None and saw.outcome in ("skipped", "xfailed") and _path(saw.origin) in changed_code:
            doubts.append(f"{test_id}: {saw.outcome} by code the change touched, not by a test ({saw.origin})")
    for collector, origin in sorted(w.skipped_modules.items()):
        if _path(origin) in changed_code:
            doubts.append(f"{collector}: skipped at collection by code the change touched, not by a test ({origin})")
    if len(w.sessions) == 1 and exit_code is not None and exit_code != w.sessions[0]:
        doubts.append(
            f"pytest ended its session with exit status {w.sessions[0]}, but the command exited {exit_code}: "
            "something changed the exit code after pytest decided"
        )
    return doubts
