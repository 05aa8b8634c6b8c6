"""`crewwork demo`: one code-change work item end to end on the embedded defaults.

Creates a small git repository whose test fails, starts the embedded stack (Temporal dev server, SQLite store,
API, one process per pool), submits a work item through the HTTP API whose scripted (mock) agent makes a wrong
change on attempt 1 and the right one on attempt 2, approves it as the reviewer, and prints what happened.
Exit status 0 only if the work item succeeded.

It runs the agent and the tests in the best isolating sandbox this host offers (gVisor, Docker, bubblewrap). With
none, it starts nothing (NoSandbox: one line saying what to install and how; `crewwork demo` exits 7); `--unsafe` runs
the demo's own sample with the `local` backend instead, which isolates nothing, and the output says so.

`--serve` keeps the stack (API, console, Temporal UI) up after the summary until Ctrl-C, so its links work; without
it the stack stops and the last line says how to keep it. `--json` prints the narrative on stderr and one JSON
summary on stdout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from crewwork.temporal.devserver import free_port

BUGGY = "def add(a, b):\n    return a - b\n"
WRONG = "def add(a, b):\n    return abs(a) + abs(b)\n"
RIGHT = "def add(a, b):\n    return a + b\n"
TEST = """from calc import add


def test_adds_positive_numbers():
    assert add(2, 3) == 5


def test_adds_negative_numbers():
    assert add(-1, 1) == 0
"""

TERMINAL = ("succeeded", "failed", "rejected", "cancelled", "dead")

_narrative = sys.stdout


def _say(msg: str = "") -> None:
    print(msg, file=_narrative, flush=True)


def make_sample_repo(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "calc.py").write_text(BUGGY)
    (path / "tests").mkdir(exist_ok=True)
    (path / "tests" / "test_calc.py").write_text(TEST)
    (path / "conftest.py").write_text("")  # makes the repository root importable for pytest
    env = {
        "GIT_AUTHOR_NAME": "demo",
        "GIT_AUTHOR_EMAIL": "demo@localhost",
        "GIT_COMMITTER_NAME": "demo",
        "GIT_COMMITTER_EMAIL": "demo@localhost",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "PATH": "/usr/bin:/bin",
    }
    for cmd in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "calculator with a bug"],
    ):
        subprocess.run(cmd, cwd=path, check=True, env=env)


def demo_work_item(repo: Path, sandbox: str) -> dict[str, Any]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() in calc.py so that the tests in tests/test_calc.py pass.",
        "validation": {
            "command": [
                "python",
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--junitxml=.crewwork/junit.xml",
            ],
            "junit_path": ".crewwork/junit.xml",
            "timeout_s": 120,
            "test_files": ["tests/test_calc.py"],
        },
        "agent": {
            "name": "scripted",
            "config": {"attempts": [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]},
        },
        "budget": {"max_attempts": 3},
        "review": {"required": True},
        "sandbox": {"backend": sandbox},
        "labels": {"source": "demo"},
        "idempotency_key": "demo-1",
    }


NO_SANDBOX = (
    "crewwork demo: no isolating sandbox here; install bubblewrap (as root: `apt-get install -y bubblewrap`, which "
    "`make demo` does where it can) or start Docker (docs/sandbox.md), or run `crewwork demo --unsafe` to run the "
    "demo's own sample with no isolation"
)


class NoSandbox(Exception):
    """No isolating sandbox works here and the person did not ask for the unsafe `local` backend."""


def choose_sandbox(*, unsafe: bool = False) -> str:
    """The best isolating backend available; `local` (no isolation) only when none is and `unsafe` was asked for.
    Raises NoSandbox (its message: the one line saying what to install) otherwise."""
    try:
        from crewwork.sandbox.backends import best_available

        name, why = best_available()
    except Exception as exc:
        name, why = "local", f"sandbox discovery failed: {exc}"
    if name != "local":
        _say(f"sandbox: {name} ({why})" + ("  (--unsafe not needed: this one isolates)" if unsafe else ""))
        return name
    if not unsafe:
        raise NoSandbox(NO_SANDBOX)
    _say(
        "! UNSAFE: no isolating sandbox is available (" + why + ").\n"
        "  As asked with --unsafe, the demo runs its own sample with the `local` backend: NO isolation."
    )
    return "local"


def run_demo(
    *,
    keep: bool = False,
    data_dir: Path | None = None,
    serve: bool = False,
    json_output: bool = False,
    unsafe: bool = False,
    restart_healthy_s: float = 60.0,
) -> int:
    """Run the demo; its exit status. Raises NoSandbox, before starting anything, where no isolating sandbox works
    and `unsafe` was not asked for. `restart_healthy_s`: the stack's CREWWORK_POOL_RESTART_HEALTHY_S."""
    from crewwork.cli.stack import Stack

    global _narrative
    _narrative = sys.stderr if json_output else sys.stdout
    started = time.monotonic()
    sandbox = choose_sandbox(unsafe=unsafe)
    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="crewwork-demo-")
        data_dir = Path(tmp)
    data_dir = data_dir.resolve()
    repo = data_dir / "sample-repo"
    unsafe = sandbox == "local"
    _say(f"1/5 creating a sample repository with a failing test at {repo}")
    make_sample_repo(repo)
    temporal_port = free_port()
    ui_port = free_port()
    stack = Stack(
        data_dir=data_dir / "state",
        temporal_port=temporal_port,
        ui_port=ui_port,
        api_port=free_port(),
        extra_env={
            "CREWWORK_ALLOW_UNSAFE_SANDBOX": "true" if unsafe else "false",
            # The operator policy of the demo's own stack: the backend it chose, `local` only when asked for.
            "CREWWORK_POLICY_SANDBOX_BACKENDS": sandbox,
            "CREWWORK_SANDBOX_BACKEND": sandbox,
            "CREWWORK_DATABASE_URL": f"sqlite+aiosqlite:///{data_dir / 'state' / 'crewwork.db'}",
        },
        database_url=f"sqlite+aiosqlite:///{data_dir / 'state' / 'crewwork.db'}",
        on_event=lambda m: _say(f"    {m}"),
        healthy_after_s=restart_healthy_s,
    )
    _say("2/5 starting the embedded stack (Temporal dev server, SQLite store, API, control/agent/validate pools)")
    summary: dict[str, Any] = {"ok": False, "data_dir": str(data_dir)}
    try:
        stack.start()
        rc, summary = _drive(stack, repo, sandbox, started, summary)
        if serve:
            _serve(stack, summary)
        return rc
    except Exception as exc:
        _say(f"demo failed: {exc}")
        _say(f"logs are in {stack.data_dir / 'logs'}")
        summary["error"] = str(exc)
        keep = True
        return 1
    finally:
        _say("stopping the stack")
        stack.stop()
        if tmp is not None:
            if keep:
                _say(f"kept {data_dir}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        if json_output:
            print(json.dumps(summary, indent=2), flush=True)
        if not serve:
            # The links above died with the stack: the last line says how to keep them, never a dead link.
            _say("the stack is stopped; `crewwork demo --serve` keeps it (API, console, Temporal UI) up until Ctrl-C")


def _serve(stack: Any, summary: dict[str, Any]) -> None:
    """Keep the stack up until Ctrl-C (SIGINT) or SIGTERM."""
    import signal
    import threading

    stop = threading.Event()
    # Explicit handlers: started in the background by a non-interactive shell, SIGINT is inherited as ignored.
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    wid = summary.get("work_item_id", "")
    _say()
    _say("The stack stays up until Ctrl-C:")
    _say(f"  API          {stack.api_url}   (OpenAPI: {stack.api_url}/docs; API key in {stack.data_dir / 'api_key'})")
    _say(f"  console      {stack.api_url}/console#/items/{wid}")
    _say(f"  Temporal UI  {summary.get('temporal_ui', stack.ui_url)}")
    _say("Press Ctrl-C to stop it.")
    while not stop.wait(0.5):
        pass


def _drive(stack: Any, repo: Path, sandbox: str, started: float, summary: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    api = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=30)
    _say("3/5 submitting the work item through the API (scripted mock agent: wrong fix first, then the right one)")
    r = api.post("/v1/work-items", json=demo_work_item(repo, sandbox))
    if r.status_code >= 400:
        _say(f"submission rejected: {r.text}")
        return 1, summary
    wid = r.json()["id"]
    summary["work_item_id"] = wid
    _say(f"    work item {wid}")
    _say("4/5 following it (Temporal runs: admit -> attempt [agent -> validate -> record] -> review -> land)")
    last = ""
    approved = False
    deadline = time.monotonic() + 300
    item: dict[str, Any] = {}
    while time.monotonic() < deadline:
        item = api.get(f"/v1/work-items/{wid}").json()
        line = f"{item['state']}: {item['reason']}"
        if line != last:
            _say(f"    [{time.monotonic() - started:5.1f}s] {line}")
            last = line
        if item["state"] == "awaiting_review" and not approved:
            _say("    reviewer: approving the validated change")
            rr = api.post(f"/v1/work-items/{wid}/review", json={"action": "approve", "reviewer": "demo"})
            if rr.status_code >= 400:
                _say(f"    review failed: {rr.text}")
                return 1, summary
            approved = True
        if item["state"] in TERMINAL:
            break
        time.sleep(0.3)
    else:
        _say("the work item did not finish within 300 s")
        return 1, summary
    item = api.get(f"/v1/work-items/{wid}", params={"live": False}).json()
    _say("5/5 summary")
    _print_summary(api, item, repo, sandbox)
    wall = time.monotonic() - started
    _say(f"demo wall time: {wall:.1f}s")
    summary.update(
        ok=item["state"] == "succeeded",
        state=item["state"],
        reason=item["reason"],
        attempts=[{"number": a["number"], "verdict": a["verdict"]} for a in item.get("attempts") or []],
        delivery_branch=item.get("delivery_branch"),
        landed_commit=item.get("landed_commit"),
        sandbox=sandbox,
        unsafe=sandbox == "local",
        temporal_ui=item["links"]["temporal_ui"],
        api_url=stack.api_url,
        wall_time_s=round(wall, 1),
    )
    return (0 if item["state"] == "succeeded" else 1), summary


def _print_summary(api: httpx.Client, item: dict[str, Any], repo: Path, sandbox: str) -> None:
    """The summary, without the Temporal Web UI link: the UI stops with the stack right after it, unless --serve
    keeps it, which then prints the link once with the other live ones."""
    from crewwork.cli.render import render_item

    _say()
    _say(render_item(item, temporal_link=False))
    _say(f"sandbox     {sandbox}" + ("  (UNSAFE: no isolation)" if sandbox == "local" else ""))
    _say("\nevidence per attempt (measured by the platform, not claimed by the agent):")
    for a in item.get("attempts") or []:
        val = a.get("validation") or {}
        _say(f"  attempt {a['number']}: verdict={a['verdict']} cause={a.get('cause')} exit={val.get('exit_code')}")
        for t in val.get("tests") or []:
            msg = f"  ({(t.get('message') or '').splitlines()[0][:90]})" if t.get("message") else ""
            _say(f"      {t['outcome']:7} {t['id']}{msg}")
    attempts = item.get("attempts") or []
    if attempts:
        diff_ref = (attempts[-1].get("agent") or {}).get("diff_ref") or {}
        if diff_ref.get("id"):
            diff = api.get(f"/v1/work-items/{item['id']}/artifacts/{diff_ref['id']}").text
            _say("\nthe landed change:\n" + "\n".join("    " + ln for ln in diff.splitlines()))
    if item.get("delivery_branch"):
        log = subprocess.run(
            ["git", "log", "--oneline", "-n", "2", item["delivery_branch"]],
            cwd=repo,
            capture_output=True,
            text=True,
        ).stdout
        _say(f"\ngit log {item['delivery_branch']}:\n" + "\n".join("    " + ln for ln in log.splitlines()))
