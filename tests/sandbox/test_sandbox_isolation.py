"""Every isolating backend, for real: no network, read-only host, caps hit as evidence, no leaked env."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crewwork.sandbox.base import Sandbox, SandboxLimits

PY = "python3"
# Small caps: these tests run fork bombs and memory hogs on a shared 2-core machine.
SMALL = SandboxLimits(memory_mb=96, pids=48, cpus=1.0, timeout_s=30.0, tmpfs_mb=16)


def limits(**changes: object) -> SandboxLimits:
    return dataclasses.replace(SMALL, **changes)  # type: ignore[arg-type]


async def test_network_is_unreachable_from_inside(sandbox: Sandbox, workspace: Path) -> None:
    # A listener the host can reach for sure, next to PostgreSQL (5432) and Temporal's default port (7233).
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        probe = (
            "import socket,sys\n"
            "ok=[]\n"
            "for p in map(int, sys.argv[1:]):\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', p), timeout=2).close(); ok.append(p)\n"
            "    except OSError as e:\n"
            "        print(p, 'refused:', e)\n"
            "print('reached', ok)\n"
            "sys.exit(1 if ok else 0)\n"
        )
        r = await sandbox.run([PY, "-c", probe, str(port), "5432", "7233"], workspace=workspace, limits=limits())
    finally:
        listener.close()
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert b"reached []" in r.stdout


async def test_writes_outside_workspace_fail_and_host_files_are_unchanged(
    sandbox: Sandbox, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("original")
    script = (
        "import sys\n"
        "for target in sys.argv[1:]:\n"
        "    try:\n"
        "        open(target, 'w').write('pwned')\n"
        "        print('wrote', target)\n"
        "    except OSError as e:\n"
        "        print('denied', target, e.errno)\n"
        "open('inside.txt', 'w').write('made in the sandbox')\n"
    )
    targets = [str(outside), "/etc/crewwork-sandbox-probe", "/usr/crewwork-sandbox-probe", sys.executable]
    r = await sandbox.run([PY, "-c", script, *targets], workspace=workspace, limits=limits())
    assert r.exit_code == 0, (r.stdout, r.stderr)
    for target in targets[1:]:
        assert f"denied {target}".encode() in r.stdout
        assert not _was_overwritten(target)
    # The sibling of the workspace is not mounted: a write there lands in the private /tmp, never on the host.
    assert outside.read_text() == "original"
    assert (workspace / "inside.txt").read_text() == "made in the sandbox"


async def test_host_secrets_and_service_sockets_are_hidden(sandbox: Sandbox, workspace: Path) -> None:
    probe = (
        "import os\n"
        "for p in ['/var/run/docker.sock', '/run/postgresql', '/root/.ssh', '/etc/shadow']:\n"
        "    try:\n"
        "        data = open(p, 'rb').read(64) if os.path.isfile(p) else os.listdir(p)\n"
        "        print('visible', p, bool(data))\n"
        "    except OSError as e:\n"
        "        print('hidden', p, e.errno)\n"
    )
    r = await sandbox.run([PY, "-c", probe], workspace=workspace, limits=limits())
    assert r.exit_code == 0, r.stderr
    for line in r.stdout.decode().splitlines():
        # /etc/shadow may exist in an image, but then it must be empty or unreadable.
        assert line.startswith("hidden") or line == "visible /etc/shadow False", line


async def test_fork_bomb_is_stopped_by_pids_cap_and_host_stays_responsive(sandbox: Sandbox, workspace: Path) -> None:
    bomb = "import os, time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"
    r = await sandbox.run([PY, "-c", bomb], workspace=workspace, limits=limits(pids=24, memory_mb=256, timeout_s=20))
    assert r.pids_limited, (r.exit_code, r.stderr[-500:])
    assert not r.timed_out
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec("true")
    assert await proc.wait() == 0
    assert time.monotonic() - started < 2.0


async def test_a_silent_fork_bomb_is_still_flagged_by_the_pids_cap(sandbox: Sandbox, workspace: Path) -> None:
    """No fork-failure message to recognise: the cap hit is read from the sandbox's own counters (under gVisor, its
    process count), not from what the program says."""
    bomb = (
        "import os, time\n"
        "for _ in range(400):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(3)\n"
    )
    r = await sandbox.run([PY, "-c", bomb], workspace=workspace, limits=limits(pids=24, memory_mb=256, timeout_s=30))
    assert r.stdout == r.stderr == b"", (r.stdout, r.stderr)
    assert r.pids_limited and r.cause == "pids", (r.exit_code, r.cause, r.enforcement)


async def test_filling_the_workspace_disk_is_flagged_by_the_disk_cap(sandbox: Sandbox, tmp_path: Path) -> None:
    """A silent program that fills its workspace (its own file system, as validation gives it) until a 1 MiB write
    fails, then exits 0."""
    from crewwork.config.sandbox import SandboxSettings
    from crewwork.sandbox.disk import WorkspaceDisk

    owner = SandboxSettings().owner() or (os.geteuid(), os.getegid())
    disk = await WorkspaceDisk.create(tmp_path / "ws.img", tmp_path / "disk", 32, owner)
    fill = "f = open('filler', 'wb')\ntry:\n    while True:\n        f.write(b'0' * (1 << 20)); f.flush()\nexcept OSError:\n    pass\n"
    try:
        r = await sandbox.run([PY, "-c", fill], workspace=tmp_path / "disk", limits=limits(disk_mb=32))
    finally:
        await disk.remove()
    assert r.disk_limited and r.cause == "disk", (r.exit_code, r.stderr[-300:])


async def test_memory_hog_is_stopped_by_memory_cap(sandbox: Sandbox, workspace: Path) -> None:
    hog = "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 * 1024 * 1024))\n"
    r = await sandbox.run([PY, "-c", hog], workspace=workspace, limits=limits(memory_mb=64, timeout_s=30))
    assert r.oom_killed, (r.exit_code, r.enforcement, r.stderr[-500:])
    assert r.exit_code != 0
    assert not r.timed_out
    if r.peak_memory_bytes is not None:
        assert r.peak_memory_bytes <= 64 * 1024 * 1024 + 4 * 1024 * 1024


async def test_endless_loop_is_stopped_by_timeout(sandbox: Sandbox, workspace: Path) -> None:
    r = await sandbox.run([PY, "-c", "while True: pass"], workspace=workspace, limits=limits(timeout_s=1.5))
    assert r.timed_out
    assert r.killed_by_signal == 9
    assert r.cause == "timeout"
    assert 1.4 < r.duration_s < 10


async def test_worker_environment_is_not_visible_inside(
    sandbox: Sandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREWWORK_FAKE_SECRET", "sk-live-do-not-leak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "also-do-not-leak")
    r = await sandbox.run(
        [PY, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
        workspace=workspace,
        limits=limits(),
        env={"GIVEN": "explicitly"},
    )
    assert r.exit_code == 0, r.stderr
    assert b"do-not-leak" not in r.stdout
    import json

    inside = json.loads(r.stdout)
    assert inside["GIVEN"] == "explicitly"
    assert inside["HOME"] == "/tmp"
    assert inside["LANG"] == "C.UTF-8"
    assert "CREWWORK_FAKE_SECRET" not in inside and "AWS_SECRET_ACCESS_KEY" not in inside


async def test_python_pytest_runs_in_the_workspace(sandbox: Sandbox, workspace: Path) -> None:
    (workspace / "test_sample.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    r = await sandbox.run(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=report.xml"],
        workspace=workspace,
        limits=limits(timeout_s=60, memory_mb=256),
    )
    assert r.exit_code == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert b"1 passed" in r.stdout
    assert (workspace / "report.xml").exists()


async def test_output_beyond_the_cap_keeps_its_start_and_end_and_is_flagged(sandbox: Sandbox, workspace: Path) -> None:
    r = await sandbox.run(
        [PY, "-c", "import sys; sys.stdout.write('a' + 'y' * 200000 + 'z'); sys.stderr.write('e' * 10)"],
        workspace=workspace,
        limits=limits(max_log_bytes=1000),
    )
    assert r.exit_code == 0
    assert r.truncated
    assert (
        r.stdout
        == b"a"
        + b"y" * 499
        + b"\n[\xe2\x80\xa6 199002 bytes of output not kept here \xe2\x80\xa6]\n"
        + b"y" * 499
        + b"z"
    )
    assert r.stderr == b"e" * 10
    report = r.report(tail_bytes=100)
    assert report.stdout_tail == "y" * 99 + "z"
    assert report.isolated


async def test_cancelling_a_run_kills_everything_it_started(sandbox: Sandbox, workspace: Path) -> None:
    ticker = "import time\nwhile True:\n    open('ticks', 'a').write('.')\n    time.sleep(0.05)\n"
    task = asyncio.create_task(sandbox.run([PY, "-c", ticker], workspace=workspace, limits=limits()))
    ticks = workspace / "ticks"
    assert await asyncio.to_thread(_wait_for_file, ticks, 20.0), "the sandboxed command never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)
    size = ticks.stat().st_size
    await asyncio.sleep(0.5)
    assert ticks.stat().st_size == size, "the command kept running after cancellation"


async def test_nonzero_exit_is_reported_without_cap_flags(sandbox: Sandbox, workspace: Path) -> None:
    r = await sandbox.run(["sh", "-c", "echo out; echo err >&2; exit 3"], workspace=workspace, limits=limits())
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert not (r.timed_out or r.oom_killed or r.pids_limited) and r.killed_by_signal is None
    assert r.isolated and r.backend == sandbox.name and r.enforcement


@pytest.mark.parametrize(
    ("said", "code"),
    [
        ("bwrap: execvp python3: No such file or directory", 1),  # bwrap failing to exec the command
        ("bwrap: Creating new namespace failed: Operation not permitted", 1),  # bwrap failing to build the sandbox
        ("mount: /stage: permission denied.", 1),  # the root-side staging failing
        ("cgroup-join: cannot write cgroup.procs", 125),  # joining the run's cgroup failing
    ],
)
async def test_a_program_cannot_pass_its_own_words_off_as_the_machinerys(
    sandbox: Sandbox, workspace: Path, said: str, code: int
) -> None:
    """What the sandbox's machinery says about itself (the command does not exist; the sandbox, its staging or its
    cgroup could not be set up) must come from the machinery. A program that ran and printed the same words is a
    program that failed: before, on bwrap, the first made its run `command_not_found` (exit 127, and the item ended
    as the submission's fault) and the others a SandboxError (infrastructure: retried until the item was `dead`)."""
    r = await sandbox.run(
        ["sh", "-c", f"printf '%s\\n' '{said}' >&2; exit {code}"], workspace=workspace, limits=limits()
    )
    assert (r.exit_code, r.command_not_found, r.stderr) == (code, False, f"{said}\n".encode())


async def test_bwraps_own_failures_are_still_the_machinerys(workspace: Path) -> None:
    """The other side of the test above: when bwrap itself cannot build the sandbox (here: a bind whose source is
    gone) or cannot exec the command, that is still a SandboxError and `command_not_found`, as bwrap says."""
    from crewwork.sandbox.base import SandboxError
    from crewwork.sandbox.bwrap import BwrapSandbox
    from tests.sandbox.conftest import require_backend

    require_backend("bwrap")

    class BrokenBind(BwrapSandbox):
        def command(self, argv: Any, *args: Any, **kw: Any) -> list[str]:
            cmd = super().command(argv, *args, **kw)
            at = len(cmd) - len(argv) - 1
            return [*cmd[:at], "--ro-bind", "/nonexistent-crewwork-source", "/x", *cmd[at:]]

    with pytest.raises(SandboxError, match="could not build the sandbox"):
        await BrokenBind().run(["true"], workspace=workspace, limits=limits())
    r = await BwrapSandbox().run(["no-such-test-runner"], workspace=workspace, limits=limits())
    assert (r.exit_code, r.command_not_found) == (127, True) and r.stderr.startswith(b"bwrap: execvp ")


def _was_overwritten(target: str) -> bool:
    path = Path(target)
    return path.exists() and path.read_bytes()[:5] == b"pwned"


def _wait_for_file(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_nested_user_namespaces_are_refused(sandbox: Sandbox, workspace: Path) -> None:
    # A new user namespace would hand the command every capability again inside it: a kernel attack surface.
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.unshare(0x10000000)\n"
        "print('unshare', rc, os.strerror(ctypes.get_errno()) if rc else 'ok')\n"
    )
    r = await sandbox.run([PY, "-c", probe], workspace=workspace, limits=limits())
    assert r.exit_code == 0, r.stderr
    if sandbox.name == "gvisor":
        # gVisor implements namespaces in its own user-space kernel; the host kernel never sees them.
        assert r.stdout.startswith(b"unshare "), r.stdout
    else:
        assert r.stdout.startswith(b"unshare -1 Operation not permitted"), r.stdout


async def test_a_dead_worker_leaves_no_sandbox_running(sandbox: Sandbox, workspace: Path) -> None:
    """SIGKILL the process that started a run: bwrap dies with its parent; a container is reaped by deadline."""
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from crewwork.sandbox.base import SandboxLimits\nfrom crewwork.sandbox.backends import get_sandbox\n"
        "ticker = \"import time\\nwhile True:\\n    open('ticks', 'a').write('.')\\n    time.sleep(0.05)\\n\"\n"
        "asyncio.run(get_sandbox(sys.argv[1]).run(['python3', '-c', ticker], workspace=Path(sys.argv[2]),\n"
        "            limits=SandboxLimits(timeout_s=1)))\n"
    )
    worker = await asyncio.create_subprocess_exec(sys.executable, "-c", script, sandbox.name, str(workspace))
    ticks = workspace / "ticks"
    assert await asyncio.to_thread(_wait_for_file, ticks, 30.0), "the sandboxed command never started"
    worker.kill()
    await worker.wait()
    if sandbox.name != "bwrap":
        import docker

        from crewwork.sandbox.docker import ORPHAN_GRACE_S, reap_orphans

        client = docker.from_env()
        # all=True: a container whose command has exited (under load the runtime can take its time) is still an
        # orphan to reap; only one that is gone altogether would mean something removed it before its deadline.
        listed = client.containers.list(all=True, filters={"label": "crewwork.sandbox"}, ignore_removed=True)
        mine = {c.id for c in listed if any(m.get("Source") == str(workspace) for m in c.attrs.get("Mounts", []))}
        seen = [(c.short_id, c.status, [m.get("Source") for m in c.attrs.get("Mounts", [])]) for c in listed]
        assert mine, f"the container should outlive its killed worker until reaped; on the engine: {seen}"
        assert await asyncio.to_thread(reap_orphans, client, force=True, only_ids=mine) == []
        # Reap as a worker would once the deadline (timeout 1 s + grace) has passed.
        later = time.time() + ORPHAN_GRACE_S + 5
        removed = await asyncio.to_thread(reap_orphans, client, force=True, now=later, only_ids=mine)
        assert set(removed) == mine
    await asyncio.sleep(0.5)
    size = ticks.stat().st_size
    await asyncio.sleep(0.5)
    assert ticks.stat().st_size == size, "the sandboxed command outlived its worker"
