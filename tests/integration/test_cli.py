"""The `crewwork` CLI against the real API, Temporal and PostgreSQL: submit, status, list, review, hotfix, keys."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from tests.conftest import ApiServer, Crew
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def cli(api: ApiServer, key: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "CREWWORK_API_URL": api.url, "CREWWORK_API_KEY": key, **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "crewwork",
        *args,
        env=full_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def test_submit_wait_status_and_list(crew: Crew, calc_repo: Path, tmp_path: Path) -> None:
    _kid, key = await crew.store.create_api_key("cli")
    item = tmp_path / "item.json"
    item.write_text(json.dumps(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}])))
    async with ApiServer(crew.settings) as api:
        res = await cli(api, key, "submit", str(item), "--wait")
        assert res.returncode == 0, res.stdout + res.stderr
        wid = res.stdout.split()[0]
        assert "succeeded" in res.stdout
        status = await cli(api, key, "status", wid)
        assert status.returncode == 0 and "succeeded" in status.stdout and f"crewwork/{wid}" in status.stdout
        as_json = json.loads((await cli(api, key, "status", wid, "--json")).stdout)
        assert as_json["id"] == wid and as_json["attempts"][0]["verdict"] == "passed"
        listed = await cli(api, key, "list")
        assert wid in listed.stdout
        # A download to a place that cannot be written is one line and exit 2 (it was a traceback, exit 1 "a bug";
        # `bundle -o` shares the code).
        art = json.loads((await cli(api, key, "artifacts", wid, "--json")).stdout)[0]["id"]
        res = await cli(api, key, "artifacts", wid, art, "-o", str(tmp_path))
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip() == f"crewwork: cannot write {tmp_path}: Is a directory", res.stderr


async def test_cli_errors_are_clear_and_nonzero(crew: Crew, tmp_path: Path) -> None:
    _kid, key = await crew.store.create_api_key("cli-errors")
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "task"}')
    async with ApiServer(crew.settings) as api:
        res = await cli(api, key, "submit", str(bad))
        assert res.returncode != 0 and "needs `input`" in res.stderr
        res = await cli(api, key, "submit", str(tmp_path / "missing.json"))
        assert res.returncode != 0 and "no such file" in res.stderr
        res = await cli(api, "cw_not_a_key", "status", "wi_x")
        assert res.returncode != 0 and "401" in res.stderr
        res = await cli(api, key, "review", "wi_nope", "--approve")
        assert res.returncode != 0 and "404" in res.stderr
    res = await cli(api, key, "status", "wi_x", env={"CREWWORK_API_URL": "http://127.0.0.1:9"})
    assert res.returncode != 0 and "cannot reach the API" in res.stderr


async def test_review_from_the_cli(crew: Crew, calc_repo: Path) -> None:
    _kid, key = await crew.store.create_api_key("cli-review")
    wid = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True}))
    row = await crew.store.get_work_item(wid)
    assert row is not None
    # The item belongs to the crew's tenant; use a key of that tenant.
    from sqlalchemy import select

    from crewwork.store.tables import Tenant

    async with crew.store.session() as s:
        tenant_name = await s.scalar(select(Tenant.name).where(Tenant.id == row.tenant_id))
    _kid, key = await crew.store.create_api_key(str(tenant_name))
    async with ApiServer(crew.settings) as api:
        await crew.wait_state(wid, "awaiting_review")
        res = await cli(api, key, "review", wid, "--approve")
        assert res.returncode == 0, res.stderr
        assert "review recorded: approve" in res.stdout
        again = await cli(api, key, "review", wid, "--reject", "--comment", "too late")
        assert again.returncode != 0 and "409" in again.stderr, "a second review must be refused"
    result = await crew.result(wid)
    assert result.state == "succeeded"


async def test_hotfix_from_the_cli(crew: Crew, calc_repo: Path, tmp_path: Path) -> None:
    _kid, key = await crew.store.create_api_key("cli-hotfix")
    trace = tmp_path / "trace.txt"
    trace.write_text(
        'Traceback (most recent call last):\n  File "calc.py", line 2, in add\n    return a - b\nAssertionError\n'
    )
    agent = tmp_path / "agent.json"
    agent.write_text(json.dumps({"name": "scripted", "config": {"files": {"calc.py": RIGHT}}}))
    async with ApiServer(crew.settings) as api:
        res = await cli(
            api,
            key,
            "hotfix",
            "--repo",
            str(calc_repo),
            "--ref",
            "main",
            "--message",
            "add() subtracts",
            "--trace-file",
            str(trace),
            "--agent-file",
            str(agent),
            "--no-review",
            "--wait",
        )
        assert res.returncode == 0, res.stdout + res.stderr
        wid = res.stdout.split()[0]
    row = await crew.store.get_work_item(wid)
    assert row is not None and row.kind == "hotfix" and row.state == "succeeded"
    assert "calc.py" in (row.spec.get("instruction") or "")


async def test_keys_create_list_revoke(pg_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "CREWWORK_DATABASE_URL": pg_url, "CREWWORK_DATA_DIR": str(tmp_path)}

    def run(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "crewwork", *a], env=env, capture_output=True, text=True)

    created = run("keys", "create", "--tenant", "cli-keys")
    assert created.returncode == 0, created.stderr
    kid = created.stdout.split()[2]
    plain = created.stdout.splitlines()[1].strip()
    assert plain.startswith("cw_")
    listed = run("keys", "list", "--tenant", "cli-keys")
    assert kid in listed.stdout and "active" in listed.stdout and plain not in listed.stdout
    assert run("keys", "revoke", kid).returncode == 0
    assert "revoked" in run("keys", "list", "--tenant", "cli-keys").stdout
    assert run("keys", "revoke", kid).returncode == 1
