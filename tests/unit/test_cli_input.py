"""Bad input to the CLI is one line on stderr and a usage exit (2), never a Python traceback: checked before any
request is sent, so no API is needed."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Nothing listens here: a command that got as far as a request would fail with "cannot reach" (exit 4), not 2.
NOWHERE = "http://127.0.0.1:9"


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, stdin: str | None = None, cwd: Path | None = None, env: dict[str, str] | None = None) -> Ran:
    """`crewwork ARGS` in this process (a subprocess per case made this file slow), with no CREWWORK_* setting but
    `env`, in `cwd`. An exception escaping the CLI fails the test, as a traceback would."""
    from crewwork.cli.main import main
    from crewwork.config import reset_settings_cache

    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update({k: v for k, v in saved_env.items() if not k.startswith(("CREWWORK_", "OTEL_"))})
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.StringIO(stdin or "")
        reset_settings_cache()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.stdin = saved_stdin
        reset_settings_cache()
    return Ran(code, out.getvalue(), err.getvalue())


def crewwork(*args: str, stdin: str | None = None, cwd: Path | None = None) -> Ran:
    return run_cli(*args, stdin=stdin, cwd=cwd, env={"CREWWORK_API_URL": NOWHERE, "CREWWORK_API_KEY": "cw_test_key"})


def one_line_usage_error(p: Ran) -> str:
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


def _bare(tmp_path: Path, *args: str, **env: str) -> Ran:
    """The CLI with no CREWWORK_* setting but `env`, run in an empty directory (a new shell somewhere else)."""
    return run_cli(*args, cwd=tmp_path, env=env)


def test_an_api_url_without_a_scheme_is_a_usage_error_not_an_api_that_is_down(tmp_path: Path) -> None:
    for url in ("127.0.0.1:8080", "localhost", "http://", "http://127.0.0.1:port"):
        p = _bare(tmp_path, "status", "wi_x", CREWWORK_API_URL=url, CREWWORK_API_KEY="cw_x")
        line = one_line_usage_error(p)
        assert "CREWWORK_API_URL" in line and "http://127.0.0.1:8080" in line and "running" not in line, line
    line = one_line_usage_error(_bare(tmp_path, "--api-url", "127.0.0.1:8080", "list", CREWWORK_API_KEY="cw_x"))
    assert "--api-url" in line


def test_a_missing_api_key_names_the_variable_and_the_file_looked_for(tmp_path: Path) -> None:
    line = one_line_usage_error(_bare(tmp_path, "list"))
    assert "CREWWORK_API_KEY" in line and str(tmp_path / ".crewwork" / "api_key") in line, line
    assert "Authorization" not in line


def test_a_local_command_in_the_wrong_directory_does_not_create_a_new_empty_store(tmp_path: Path) -> None:
    for args in (["keys", "list"], ["keys", "create", "--tenant", "t"], ["db", "current"], ["reconcile"]):
        line = one_line_usage_error(_bare(tmp_path, *args))
        assert "no store at" in line and "CREWWORK_DATA_DIR" in line and "crewwork db upgrade" in line, line
        assert not (tmp_path / ".crewwork").exists(), args
    # Where the store is, the same command works.
    assert _bare(tmp_path, "db", "upgrade").returncode == 0
    assert _bare(tmp_path, "keys", "list").returncode == 0


def test_config_shows_the_values_in_force_with_secrets_masked(tmp_path: Path) -> None:
    import json

    env = {
        "CREWWORK_API_PORT": "9999",
        "CREWWORK_API_KEY": "cw_thisisasecretkey123456",
        "CREWWORK_DATABASE_URL": "postgresql+asyncpg://crew:hunter2@db/crewwork",
        "CREWWORK_SANDBOX_BACKEND": "bwrap",
    }
    p = _bare(tmp_path, "config", "--json", **env)
    assert p.returncode == 0, p.stderr
    rows = {r["env"]: r for r in json.loads(p.stdout)}
    assert rows["CREWWORK_API_PORT"]["value"] == 9999 and rows["CREWWORK_API_PORT"]["set"] is True
    assert rows["CREWWORK_API_HOST"]["value"] == "127.0.0.1" and rows["CREWWORK_API_HOST"]["set"] is False
    assert rows["CREWWORK_SANDBOX_BACKEND"]["value"] == "bwrap" and rows["CREWWORK_SANDBOX_BACKEND"]["set"] is True
    assert rows["CREWWORK_API_KEY"]["value"] == "***"
    assert "hunter2" not in p.stdout and "thisisasecret" not in p.stdout
    human = _bare(tmp_path, "config", **env).stdout
    assert any(ln.split()[:3] == ["CREWWORK_API_PORT", "set", "9999"] for ln in human.splitlines()), human


def test_an_invalid_setting_is_named_instead_of_a_traceback(tmp_path: Path) -> None:
    for var, value in (
        ("CREWWORK_API_PORT", "eighty"),
        ("CREWWORK_TENANT_POLICIES", "{nope"),
        ("OTEL_SDK_DISABLED", "maybe"),
    ):
        line = one_line_usage_error(_bare(tmp_path, "config", **{var: value}))
        assert line.startswith(f"crewwork: invalid configuration: {var}"), line


def test_dev_names_the_option_of_a_port_that_is_taken(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for option in ("--ui-port", "--temporal-port", "--api-port"):
            others = {"--ui-port": "1", "--temporal-port": "2", "--api-port": "3"}
            args = [a for o, v in others.items() if o != option for a in (o, str(free_port_number()))]
            line = one_line_usage_error(_bare(tmp_path, "dev", option, str(port), *args))
            assert f"port {port}" in line and option in line, line
        memory = {"CREWWORK_DATABASE_URL": "sqlite+aiosqlite:///:memory:"}
        line = one_line_usage_error(_bare(tmp_path, "api", "--port", str(port), **memory))
        assert f"port {port}" in line and "--port" in line, line
    line = one_line_usage_error(_bare(tmp_path, "dev", "--api-port", "70000"))
    assert "1-65535" in line
    assert not (tmp_path / ".crewwork").exists(), "nothing is started or created"


def free_port_number() -> int:
    from crewwork.temporal.devserver import free_port

    return free_port()


def test_a_signing_key_put_where_its_variables_name_goes_is_never_echoed(tmp_path: Path) -> None:
    """CREWWORK_EVIDENCE_SIGNING_KEY_ENV names the variable that holds the key. An operator who puts the key itself
    there had it printed by `crewwork config` (as the value in force) and by every error about it (the control pool's
    log, and the reason of each item that could not land). It is now a setting that does not parse, named in one line
    without its value; and a PEM private key is masked wherever crewwork masks secrets (logs, events, config)."""
    from crewwork.attestation.keys import generate
    from crewwork.boundary.masking import mask_secrets

    generate(tmp_path / "k")
    pem = (tmp_path / "k").read_text()
    seed_b64 = pem.splitlines()[1]  # its last characters are the key's own (the first are PKCS#8's header)
    p = _bare(tmp_path, "config", CREWWORK_EVIDENCE_SIGNING_KEY_ENV=pem)
    line = one_line_usage_error(p)
    assert line.startswith("crewwork: invalid configuration: CREWWORK_EVIDENCE_SIGNING_KEY_ENV"), line
    assert seed_b64[-20:] not in p.stdout + p.stderr, p.stderr
    masked = mask_secrets(f"key: {pem} and json {pem!r}")
    assert seed_b64[-20:] not in masked and masked.count("-----BEGIN PRIVATE KEY-----***") == 2, masked
    # A variable's name parses; that the variable is not set is what a control pool would refuse to start with, and
    # `crewwork config` says so (tests/evidence/test_signing_key_status.py).
    named = _bare(tmp_path, "config", CREWWORK_EVIDENCE_SIGNING_KEY_ENV="EVIDENCE_KEY_2026")
    assert "invalid configuration" not in named.stderr and "names EVIDENCE_KEY_2026, which is not set" in named.stderr


def test_worker_pools_are_checked_before_anything_starts() -> None:
    for value, said in (
        ("nope", "unknown pool 'nope'"),
        ("control,nope", "unknown pool 'nope'"),
        ("control,control", "named twice"),
        ("", "unknown pool ''"),
    ):
        line = one_line_usage_error(crewwork("worker", "--pool", value))
        assert said in line, (value, line)
