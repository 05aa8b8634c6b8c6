"""The CLI's output rules: results on stdout (JSON only with --json), progress on stderr, a live status line only on
a terminal."""

from __future__ import annotations

import argparse
import io
import json

from crewwork.cli.main import EXIT_CODES, Output, build_parser, state_exit_code


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_rewrites_one_line_on_a_terminal_and_prints_lines_elsewhere() -> None:
    out, err = io.StringIO(), Tty()
    o = Output(argparse.Namespace(json=True), out, err)
    o.progress("running")
    o.progress("validating")
    o.result({"state": "succeeded"})
    assert json.loads(out.getvalue()) == {"state": "succeeded"}
    assert err.getvalue().count("\r\033[K") == 3 and err.getvalue().endswith("validating\n")

    out, err = io.StringIO(), io.StringIO()
    o = Output(argparse.Namespace(json=False), out, err)
    o.progress("running")
    o.progress("validating")
    o.result({"state": "succeeded"}, "wi_1  succeeded")
    assert err.getvalue() == "running\nvalidating\n" and out.getvalue() == "wi_1  succeeded\n"

    out, err = io.StringIO(), Tty()
    Output(argparse.Namespace(json=False, quiet=True), out, err).progress("x")
    assert err.getvalue() == ""


def test_exit_codes_are_distinct_per_outcome_and_documented() -> None:
    codes = [state_exit_code(s) for s in ("succeeded", "failed", "rejected", "cancelled", "dead")]
    assert codes == [0, 10, 11, 12, 13]
    assert state_exit_code("awaiting_review", ["awaiting_review"]) == 0
    assert set(codes) <= set(EXIT_CODES)
    assert "exit codes:" in build_parser().format_help()


def test_json_is_accepted_before_and_after_the_command() -> None:
    p = build_parser()
    assert p.parse_args(["--json", "status", "x"]).json is True
    assert p.parse_args(["status", "x", "--json"]).json is True
    assert p.parse_args(["status", "x"]).json is False
    assert p.parse_args(["webhooks", "rotate", "wh_1", "--overlap", "60", "--json"]).json is True


def test_evidence_shows_what_an_attempt_flags_as_plain_text() -> None:
    from crewwork.cli.render import flag_lines

    validation = {
        "doubts": ["tests/t.py::test_a: the report says passed, the witness saw it failed"],
        "runner_reach": ["calc.py:3: names a pytest hook: def pytest_runtest_makereport(item, call):\x1b[2J"],
        "weakened": [f"calc.py:{n}: silences a linter: x  # noqa" for n in range(12)],
    }
    lines = flag_lines(validation)
    assert lines[0] == "    not believed: tests/t.py::test_a: the report says passed, the witness saw it failed"
    assert (
        lines[1]
        == "    reaches into the test runner: calc.py:3: names a pytest hook: def pytest_runtest_makereport(item, call):"
    )
    assert lines[-1] == "    weakens a check: … and 2 more" and len(lines) == 13
    assert flag_lines({}) == []
