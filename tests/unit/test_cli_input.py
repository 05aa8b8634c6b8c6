"""Bad input to the CLI is one line on stderr and a usage exit (2), never a Python traceback: checked before any
request is sent, so no API is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Nothing listens here: a command that got as far as a request would fail with "cannot reach" (exit 4), not 2.
NOWHERE = "http://127.0.0.1:9"


def crewwork(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env["CREWWORK_API_URL"] = NOWHERE
    env["CREWWORK_API_KEY"] = "cw_test_key"
    return subprocess.run(
        [sys.executable, "-m", "crewwork", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def one_line_usage_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage:"), p.stderr
    return lines[-1]


@pytest.mark.parametrize(
    ("literal", "field"),
    [
        ('{"kind": "task", "input": {}, "budget": {"max_cost_usd": 1e999}}', "budget.max_cost_usd"),
        ('{"kind": "task", "input": {"readings": [1, NaN]}}', "input.readings.1"),
        ('{"kind": "task", "input": {}, "review": {"timeout_s": -Infinity}}', "review.timeout_s"),
        ('{"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {"x": Infinity}}}', "agent.config.x"),
    ],
)
def test_submit_refuses_a_non_finite_number_naming_the_field(tmp_path: Path, literal: str, field: str) -> None:
    item = tmp_path / "item.json"
    item.write_text(literal)
    line = one_line_usage_error(crewwork("submit", str(item)))
    assert field in line and "finite" in line and str(item) in line, line
    # From stdin the same.
    assert field in one_line_usage_error(crewwork("submit", "-", stdin=literal))


def test_submit_refuses_files_that_hold_no_work_item(tmp_path: Path) -> None:
    cases = {
        "list.json": ("[1, 2]", "must hold a JSON object"),
        "string.json": ('"task"', "must hold a JSON object"),
        "dup.json": ('{"kind": "task", "kind": "code_change", "input": {}}', "appears twice"),
        "broken.json": ('{"kind": "task",', "is not valid JSON"),
        "repo.json": ('{"kind": "code_change", "repo": {"url": 5}}', None),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        p = crewwork("submit", str(tmp_path / name))
        if message is None:
            # A well-formed object goes to the API (here: nobody listens), without a traceback on the way.
            assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr
            continue
        assert message in one_line_usage_error(p), (name, p.stderr)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00{")
    assert "not UTF-8" in one_line_usage_error(crewwork("submit", str(tmp_path / "binary.json")))
    assert "cannot read" in one_line_usage_error(crewwork("submit", str(tmp_path)))


def test_number_options_refuse_nan_and_infinity() -> None:
    for args in (
        ["wait", "wi_x", "--timeout", "nan"],
        ["submit", "-", "--wait", "--timeout", "inf"],
        ["webhooks", "rotate", "wh_x", "--overlap=-inf"],
        ["reconcile", "--min-age", "NaN"],
    ):
        line = one_line_usage_error(crewwork(*args, stdin="{}"))
        assert "finite" in line, (args, line)


def test_hotfix_reports_an_unreadable_trace_and_an_unbalanced_test_command(tmp_path: Path) -> None:
    line = one_line_usage_error(crewwork("hotfix", "--repo", str(tmp_path), "--message", "m", "--trace-file", "/"))
    assert "cannot read /" in line
    line = one_line_usage_error(crewwork("hotfix", "--repo", str(tmp_path), "--message", "m", "--test-command", "a 'b"))
    assert "--test-command" in line and "quotation" in line
