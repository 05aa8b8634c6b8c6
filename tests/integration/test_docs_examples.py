"""The docs' examples, run as written: every work item a page shows is valid, and the README's hotfix session, the
scripted agent's complete work item (docs/agents.md) and examples/lifecycle.sh's refusal run against the default
stack, `crewwork dev` started as a newcomer starts it (no CREWWORK_* setting but its data directory).

"As written" means the blocks are taken from the pages themselves; the only edits are the ones a reader makes:
`/tmp/calc` becomes a fresh directory of this test, and `. .venv/bin/activate` becomes this interpreter's PATH."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crewwork.agents.classes import get_agent_class
from crewwork.models import AgentSpec, EnvironmentSpec, WorkItemKind, WorkItemSpec
from crewwork.temporal.devserver import free_port

pytestmark = [pytest.mark.temporal]

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = str(Path(sys.executable).parent)


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), re.M | re.S)


def work_item_examples() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for page in PAGES:
        for i, text in enumerate(blocks(page, "json")):
            doc = json.loads(text)  # every ```json block of the docs is JSON
            if isinstance(doc, dict) and doc.get("kind") in {k.value for k in WorkItemKind}:
                found.append((f"{page.name}#{i}", doc))
    return found


def test_every_work_item_a_page_shows_is_one_the_api_takes() -> None:
    examples = work_item_examples()
    assert {name.split("#")[0] for name, _ in examples} >= {"agents.md"}, examples
    for name, doc in examples:
        spec = WorkItemSpec.model_validate(doc)
        get_agent_class(spec.agent.name).validate_config(spec.kind, spec.agent.config)
        if spec.validation is not None and "--junitxml=.crewwork/junit.xml" in spec.validation.command:
            assert spec.validation.junit_path is not None, f"{name}: writes a JUnit report but names no junit_path"
    for page in PAGES:
        for text in blocks(page, "json"):
            doc = json.loads(text)
            if isinstance(doc, dict) and isinstance(doc.get("environment"), dict):
                EnvironmentSpec.model_validate(doc["environment"])
    fix = AgentSpec.model_validate_json((ROOT / "examples" / "calc-fix.json").read_text())
    get_agent_class(fix.name).validate_config(WorkItemKind.hotfix, fix.config)


def test_the_cli_page_documents_every_command() -> None:
    from crewwork.cli.main import build_parser

    page = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    missing = [name for name in commands if f"`{name}" not in page and f", `{name}" not in page]
    assert not missing, f"docs/cli.md does not mention: {missing}"


@contextlib.contextmanager
def dev_stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    """`crewwork dev` on free ports, with the environment a newcomer's shell has; yields that environment for the
    commands of the examples (PATH with this crewwork, the API URL it printed to export, its data directory)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env["CREWWORK_DATA_DIR"] = str(tmp_path / "data")
    temporal, ui, api = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [f"{BIN}/crewwork", "dev", "--temporal-port", str(temporal), "--ui-port", str(ui), "--api-port", str(api)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        ready.wait(180)
        text = "".join(lines)
        assert "crewwork is running" in text, text
        exports = dict(re.findall(r"^  export (CREWWORK_[A-Z_]+)=(\S+)$", text, re.M))
        yield {**env, **exports}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise


def sh(script: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_the_readme_and_the_agents_page_run_as_written_on_the_default_stack(tmp_path: Path) -> None:
    (readme_session,) = [b for b in blocks(ROOT / "README.md", "bash") if "crewwork hotfix" in b]
    agents_page = (ROOT / "docs" / "agents.md").read_text()
    scripted_section = agents_page.split("## The scripted agent", 1)[1].split("\n## ", 1)[0]
    (scripted_item,) = blocks_in(scripted_section, "json")

    with dev_stack(tmp_path) as env:
        # README: the hotfix session, line by line as written (in a fresh directory instead of /tmp/calc).
        calc = tmp_path / "calc"
        script = readme_session.replace(". .venv/bin/activate\n", "").replace("/tmp/calc", str(calc))
        run = sh(script, env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "succeeded" in run.stderr + run.stdout and "Fix the error reported below" in run.stdout, run.stdout

        # docs/agents.md: the scripted agent's complete work item, with the commands the page gives.
        calc2 = tmp_path / "calc2"
        item = tmp_path / "item.json"
        item.write_text(scripted_item.replace("/tmp/calc", str(calc2)))
        run = sh(
            f"examples/calc-repo.sh {calc2}\n"
            f"id=$(crewwork submit {item} --wait --until awaiting_review | head -n 1 | cut -d' ' -f1)\n"
            'crewwork status "$id"\n'
            'crewwork review "$id" --approve\n'
            'crewwork wait "$id"\n',
            env,
        )
        out = run.stdout
        assert run.returncode == 0, out + run.stderr
        assert re.search(r"attempt 1: failed .*1 test of 2 failed.*\[1/2 tests passed", out), out
        assert re.search(r"attempt 2: passed .*\[2/2 tests passed", out), out
        assert "MOCK agent" in out and re.search(r"wi_\w+  succeeded: validated on attempt 2", out), out

        # examples/lifecycle.sh on an item that cannot reach review in time: it says which step and why, exits 1,
        # and cancels what it left running (it used to exit 1 silently, leaving the item behind).
        calc3 = tmp_path / "calc3"
        slow = json.loads(scripted_item.replace("/tmp/calc", str(calc3)))
        slow["agent"]["config"] = {"files": {"calc.py": "def add(a, b):\n    return a + b\n"}, "delay_s": 120}
        good = tmp_path / "slow.json"
        good.write_text(json.dumps(slow))
        run = sh(
            f"examples/calc-repo.sh {calc3}\nLIFECYCLE_TIMEOUT_S=5 examples/lifecycle.sh {good} {item}",
            env,
            timeout=120,
        )
        assert run.returncode == 1, run.stdout + run.stderr
        said = run.stderr
        assert "lifecycle.sh: 1. submit" in said and "not awaiting_review" in said, said
        cancelled = re.search(r"lifecycle.sh: cancelled (wi_\w+)", said)
        assert cancelled, said
        end = sh(f"crewwork wait {cancelled.group(1)} --timeout 60 --json", env)
        assert json.loads(end.stdout)["state"] == "cancelled", end.stdout + end.stderr


def blocks_in(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)
