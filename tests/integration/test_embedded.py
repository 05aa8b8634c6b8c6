"""The embedded defaults: `crewwork demo` (the main job) and `crewwork dev` (supervised stack), as a user runs them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from crewwork.temporal.devserver import free_port

pytestmark = [pytest.mark.temporal]


def test_demo_succeeds_after_a_repair_on_embedded_defaults(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    proc = subprocess.run(
        [sys.executable, "-m", "crewwork", "demo", "--data-dir", str(tmp_path / "demo")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert re.search(r"attempt 1: failed .*1 test of 2 failed", out), out
    assert re.search(r"attempt 2: passed .*All 2 tests passed", out), out
    assert "reviewer: approving" in out
    m = re.search(r"delivered   (crewwork/wi_\w+) @ ([0-9a-f]{12})", out)
    assert m, out
    log = subprocess.run(
        ["git", "log", "--format=%s", "-n", "1", m.group(1)],
        cwd=tmp_path / "demo" / "sample-repo",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert log.startswith("Fix add()")
    assert "+    return a + b" in out
    # The Temporal UI stops with the stack: without --serve no link to it is printed (there were two, both dead).
    assert "/workflows/work-item-" not in out, out
    assert "demo wall time" in out
    # The stack is gone when the demo ends: the last line says how to keep it, it is not a dead link.
    last = out.strip().splitlines()[-1]
    assert "--serve" in last and "http" not in last, last


def _path_without_bwrap(tmp_path: Path) -> str:
    """A PATH like this machine's, but with every program except `bwrap`: a host where bubblewrap is not installed
    (the first thing a newcomer's machine lacks), without uninstalling it for the other tests."""
    bin_dir = tmp_path / "bin-without-bwrap"
    bin_dir.mkdir()
    for d in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin"]:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = bin_dir / name
            if name != "bwrap" and not target.exists() and not target.is_symlink():
                target.symlink_to(os.path.join(d, name))
    return str(bin_dir)


def test_demo_without_an_isolating_sandbox_says_what_to_install_and_runs_local_only_when_asked(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env["PATH"] = _path_without_bwrap(tmp_path)
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker-engine.sock"  # a docker client, but no engine
    argv = [sys.executable, "-m", "crewwork", "demo", "--data-dir", str(tmp_path / "demo")]

    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 7, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "apt-get install -y bubblewrap" in lines[0] and "--unsafe" in lines[0], lines[0]
    assert not (tmp_path / "demo").exists(), "nothing is started or created without a sandbox"

    # Asked for explicitly, it runs on `local` (before: a 422 from its own policy, exit 2), and says it is unsafe.
    unsafe = subprocess.run([*argv, "--unsafe"], env=env, capture_output=True, text=True, timeout=300)
    out = unsafe.stdout
    assert unsafe.returncode == 0, out + unsafe.stderr
    assert "UNSAFE" in out.splitlines()[0], out
    assert re.search(r"^sandbox     local  \(UNSAFE: no isolation\)$", out, re.M), out
    assert re.search(r"attempt 2: passed .*All 2 tests passed", out), out


def test_demo_serve_keeps_the_stack_up_until_ctrl_c_and_its_links_work(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "crewwork", "demo", "--serve", "--data-dir", str(tmp_path / "demo")],
        env=env,
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
            if "Press Ctrl-C to stop it" in line:
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        ready.wait(300)
        text = "".join(lines)
        assert "Press Ctrl-C to stop it" in text, text
        urls = dict(re.findall(r"^  (API|console|Temporal UI)\s+(http://\S+)", text, re.M))
        assert set(urls) == {"API", "console", "Temporal UI"}, text
        assert httpx.get(urls["API"] + "/healthz", timeout=10).json()["ok"]
        assert httpx.get(urls["console"], timeout=10).status_code == 200
        ui = httpx.get(urls["Temporal UI"], timeout=10, follow_redirects=True)
        assert ui.status_code == 200 and "/workflows/work-item-" in urls["Temporal UI"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode == 0, "".join(lines[-30:])
    time.sleep(0.2)
    assert "stopping the stack" in "".join(lines[-5:])


def test_dev_stack_serves_restarts_a_killed_pool_and_stops_cleanly(tmp_path: Path) -> None:
    api_port, temporal_port, ui_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env["CREWWORK_DATA_DIR"] = str(tmp_path / "data")
    # Started, as a user does, from a directory that holds something named `crewwork` (here a decoy package that
    # fails on import, as a checkout of another version would be imported): the stack's processes must import the
    # installed crewwork all the same.
    cwd = tmp_path / "work"
    (cwd / "crewwork").mkdir(parents=True)
    (cwd / "crewwork" / "__init__.py").write_text("raise ImportError('the decoy crewwork in the current directory')\n")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "crewwork"),
            "dev",
            "--temporal-port",
            str(temporal_port),
            "--ui-port",
            str(ui_port),
            "--api-port",
            str(api_port),
        ],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        # Read the stack's output for its whole life: a pipe nobody drains fills up and blocks the writer.
        ready = threading.Event()

        def drain() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if "Ctrl-C stops everything" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(120)
        text = "".join(lines)
        assert "crewwork is running" in text, text
        assert f"http://127.0.0.1:{api_port}" in text and f"http://127.0.0.1:{ui_port}" in text
        key = (tmp_path / "data" / "api_key").read_text().strip()
        assert (tmp_path / "data" / "api_key").stat().st_mode & 0o077 == 0, "the key file must be private"
        health = httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=5).json()
        assert health["ok"] and health["database"] and health["temporal"]
        r = httpx.post(
            f"http://127.0.0.1:{api_port}/v1/work-items",
            headers={"Authorization": f"Bearer {key}"},
            json={"kind": "task", "input": {}, "agent": {"config": {"output": {"ok": True}}}},
        )
        assert r.status_code == 202, r.text

        pids = _pool_pids("agent", tmp_path)
        assert pids, "an agent pool process must be running"
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        restarted: list[int] = []
        while time.monotonic() < deadline:
            restarted = [p for p in _pool_pids("agent", tmp_path) if p != pids[0]]
            if restarted:
                break
            time.sleep(0.5)
        assert restarted, "the supervisor must restart a pool process that died"
        wid = r.json()["id"]
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            state = httpx.get(
                f"http://127.0.0.1:{api_port}/v1/work-items/{wid}", headers={"Authorization": f"Bearer {key}"}
            ).json()["state"]
            if state == "succeeded":
                break
            time.sleep(0.3)
        assert state == "succeeded"
        # Started on another API port, it says what the CLI needs to reach it (it never said), and that works.
        exports = dict(re.findall(r"^  export (CREWWORK_[A-Z_]+)=(\S+)$", text, re.M))
        assert exports == {"CREWWORK_API_URL": f"http://127.0.0.1:{api_port}"}, text
        status = subprocess.run(
            [sys.executable, "-m", "crewwork", "status", wid],
            env={**env, **exports},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0 and "succeeded" in status.stdout, status.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            alive = {pool: _pool_pids(pool, tmp_path) for pool in ("control", "agent", "validate")}
            os.killpg(proc.pid, signal.SIGKILL)
            # The stack's processes run in their own sessions: kill them too, or they outlive the test.
            for pid in _stack_pids("crewwork (api|worker)|temporal server start-dev", tmp_path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            logs = "".join(
                f"\n--- {f.name} (tail)\n" + f.read_text(errors="replace")[-2000:]
                for f in sorted((tmp_path / "data" / "logs").glob("*.log"))
            )
            pytest.fail(
                f"`crewwork dev` did not stop within 60 s; pools still alive: {alive}\n{''.join(lines[-40:])}{logs}"
            )
    assert proc.returncode == 0
    time.sleep(0.5)
    assert not _pool_pids("agent", tmp_path) and not _pool_pids("control", tmp_path), "no process may be left behind"


def _pool_pids(pool: str, tmp_path: Path) -> list[int]:
    """Pool processes of this test's stack (identified by the data directory in their environment)."""
    return _stack_pids(f"crewwork worker --pool {pool}", tmp_path)


def _stack_pids(pattern: str, tmp_path: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    pids = []
    for pid in (int(p) for p in out.split()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"CREWWORK_DATA_DIR={tmp_path / 'data'}".encode() in environ:
            pids.append(pid)
    return pids
