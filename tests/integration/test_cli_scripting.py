"""The CLI as scripts use it: examples/lifecycle.sh drives submit -> wait -> diff/evidence/artifacts -> review ->
land, a failing item and a cancelled one, through `crewwork ... --json | jq` against the real API, Temporal and
PostgreSQL. Every JSON document goes through jq, so any stray text on stdout fails the script."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from tests.conftest import ApiServer, Crew, make_repo
from tests.integration.test_cli import cli
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

ROOT = Path(__file__).resolve().parents[2]


async def _tenant_key(crew: Crew) -> str:
    from sqlalchemy import select

    from crewwork.store.tables import Tenant

    async with crew.store.session() as s:
        name = await s.scalar(select(Tenant.name).where(Tenant.id == crew.tenant_id))
    _kid, key = await crew.store.create_api_key(str(name))
    return key


GREET = 'def greet(name):\n    return "Hello " + name\n'
GREET_TEST = 'from greet import greet\n\n\ndef test_greets_with_a_comma():\n    assert greet("Ada") == "Hello, Ada!"\n'


async def test_a_shell_script_drives_the_whole_lifecycle_with_json_and_jq(crew: Crew, tmp_path: Path) -> None:
    """On a repository that is not the demo's (the script checked the calc fix's exact diff and exited 1 silently
    anywhere else): whatever the repository, a change that passes, is reviewed and lands."""
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (scripts/test-env.sh installs it)")
    key = await _tenant_key(crew)
    repo = make_repo(tmp_path / "greet", {"greet.py": GREET, "tests/test_greet.py": GREET_TEST, "conftest.py": ""})

    def item(content: str, **kw: object) -> str:
        fields = {"files": {"greet.py": f"def greet(name):\n    return {content}\n"}}
        spec = code_change(repo, [fields], instruction="Greet with a comma", **kw)
        return json.dumps({**spec, "validation": {**spec["validation"], "test_files": ["tests/test_greet.py"]}})

    good = tmp_path / "good.json"
    good.write_text(item('"Hello, " + name + "!"'))  # review left to the default the script expects: a person
    bad = tmp_path / "bad.json"
    bad.write_text(item('"Hi " + name', budget={"max_attempts": 1}))
    # The operator's default: code changes wait for review (the suite's switch turns it off).
    async with ApiServer(crew.settings.model_copy(update={"review_required_default": True})) as api:
        env = {
            **os.environ,
            "CREWWORK_API_URL": api.url,
            "CREWWORK_API_KEY": key,
            # The venv's `crewwork` entry point, as a user's shell finds it.
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
        proc = await asyncio.create_subprocess_exec(
            "bash",
            str(ROOT / "examples" / "lifecycle.sh"),
            str(good),
            str(bad),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 600)
    text = out.decode() + "\n--- stderr\n" + err.decode()
    assert proc.returncode == 0, text
    assert "lifecycle ok" in out.decode(), text
    assert "admitted,running,validating,awaiting_review,landing,succeeded" in out.decode(), text


async def test_json_output_is_only_json_and_progress_goes_to_stderr(
    crew: Crew, calc_repo: Path, tmp_path: Path
) -> None:
    key = await _tenant_key(crew)
    item = tmp_path / "item.json"
    item.write_text(json.dumps(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}])))
    async with ApiServer(crew.settings) as api:
        res = await cli(api, key, "submit", str(item), "--wait", "--json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)  # the whole of stdout is one JSON document
        assert doc["state"] == "succeeded" and doc["attempts"][0]["verdict"] == "passed"
        assert "succeeded" in res.stderr, "progress (each state change) goes to stderr"
        wid = doc["id"]
        for args in (
            ("status", wid),
            ("list",),
            ("events", wid),
            ("evidence", wid),
            ("artifacts", wid),
            ("diff", wid),
            ("webhooks", "list"),
            ("config",),
        ):
            res = await cli(api, key, *args, "--json")
            assert res.returncode == 0, (args, res.stderr)
            json.loads(res.stdout)
        # Errors: a clear message on stderr, nothing on stdout, an exit code by kind.
        res = await cli(api, key, "status", "wi_nope", "--json")
        assert res.returncode == 3 and res.stdout == "" and "404" in res.stderr
        res = await cli(api, key, "review", wid, "--approve", "--json")
        assert res.returncode == 3 and "409" in res.stderr
        res = await cli(api, key, "submit", str(tmp_path / "missing.json"), "--json")
        assert res.returncode == 2 and res.stdout == ""
    res = await cli(api, key, "status", wid, "--json", env={"CREWWORK_API_URL": "http://127.0.0.1:9"})
    assert res.returncode == 4 and res.stdout == "" and "cannot reach the API" in res.stderr


def test_shell_completion_scripts_are_generated_from_the_parser(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "crewwork", "completion", "bash"], capture_output=True, text=True, check=True
    )
    script = tmp_path / "crewwork.bash"
    script.write_text(res.stdout)
    # Source it in a real bash and ask for completions of `crewwork sub` and `crewwork webhooks r`.
    probe = (
        f"source {script}; "
        "COMP_WORDS=(crewwork su); COMP_CWORD=1; COMP_LINE='crewwork su'; COMP_POINT=${#COMP_LINE}; "
        "_shtab_crewwork; echo ${COMPREPLY[@]}; "
        "COMP_WORDS=(crewwork webhooks r); COMP_CWORD=2; COMP_LINE='crewwork webhooks r'; COMP_POINT=${#COMP_LINE}; "
        "_shtab_crewwork; echo ${COMPREPLY[@]}"
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert "submit" in out[0].split()
    assert {"redeliver", "rotate"} <= set(out[1].split())
    zsh = subprocess.run(
        [sys.executable, "-m", "crewwork", "completion", "zsh"], capture_output=True, text=True, check=True
    ).stdout
    assert "#compdef crewwork" in zsh and "events" in zsh
