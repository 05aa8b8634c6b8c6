"""The app under preview, in its own sandbox: started through the ordinary `Sandbox.run` (any backend), with the app
relay as its first process, its output in a platform log file in the workspace that the host tails through
crewwork.boundary.safefs, and stopped through the run's `stop` event: the sandbox kills the whole tree (or the
container) and still returns what it measured, so a cap the app hit while it kept running (a fork bomb at its process
cap, a full disk, a worker process the memory cap killed) is evidence like one that ended it. Cancelling the run, the
fallback when that does not finish within STOP_WAIT_S, kills everything too but leaves no such evidence.

The sandbox is the validated workspace's: same backend, limits, prepared environment and mounts as the tests,
no network but its own loopback; the only extra mount is the tunnel directory, read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import httpx

from crewwork.boundary import safefs
from crewwork.models.preview import ReadySpec
from crewwork.preview.records import AppRun
from crewwork.preview.tunnel import Tunnels
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits, SandboxRunResult

LOG_DIR = ".crewwork/preview"
LOG_FILE = f"{LOG_DIR}/app.log"
LOG_CAP = 4 * 1024 * 1024
LOG_QUIET_S = 0.25
LOG_SETTLE_MAX_S = 2.0
"""After the probes, the log is read once it has not grown for LOG_QUIET_S, waiting at most LOG_SETTLE_MAX_S."""
TUNNEL_INSIDE = "/crewwork/preview"
STOP_WAIT_S = 30.0
"""How long a stopped app's sandbox may take to report (a container's kill and removal on a loaded engine)."""
READY_STATUSES = (*range(200, 400), 400, 401, 402, 403)
POLL_S = 0.25


class AppPreview:
    """One started app: `await start()`, `await wait_ready()`, `alive`, `await stop()`; `log()` for its output."""

    def __init__(
        self,
        sandbox: Sandbox,
        workspace: Path,
        tunnels: Tunnels,
        *,
        argv: list[str],
        port: int,
        env: dict[str, str],
        mounts: Sequence[Mount],
        limits: SandboxLimits,
        owner: tuple[int, int] | None,
    ) -> None:
        self.sandbox = sandbox
        self.workspace = workspace
        self.tunnels = tunnels
        self.argv = argv
        self.port = port
        self.env = env
        self.mounts = list(mounts)
        self.limits = limits
        self.owner = owner
        self.task: asyncio.Task[SandboxRunResult] | None = None
        self._log_fd: int | None = None
        self._log = bytearray()
        self._stop = asyncio.Event()
        self.started_at = 0.0

    async def start(self) -> None:
        self._log_fd = await asyncio.to_thread(self._make_log)
        mount = Mount(self.tunnels.hub_dir, TUNNEL_INSIDE)
        inside = self.sandbox.inside(mount)
        log_inside = f"{self.sandbox.workspace_inside(self.workspace)}/{LOG_FILE}"
        relay = ["python3", f"{inside}/relay.py", f"{inside}/hub.sock", str(self.port), log_inside, str(LOG_CAP)]
        env = {**self.env, "PORT": str(self.port), "HOST": "127.0.0.1", "CREWWORK_PREVIEW": "1"}
        self.started_at = time.monotonic()
        self.task = asyncio.create_task(
            self.sandbox.run(
                [*relay, "--", *self.argv],
                workspace=self.workspace,
                limits=replace(self.limits, max_log_bytes=256 * 1024),
                env=env,
                mounts=[*self.mounts, mount],
                stop=self._stop,
            )
        )

    def _make_log(self) -> int:
        """The log file, made by the host in a fresh platform directory (whatever the tests left there is removed,
        never followed), owned by the sandbox user; the host keeps its own descriptor to read it."""
        root = safefs.open_root(self.workspace)
        try:
            try:
                safefs.remove(root, LOG_DIR)
            except safefs.Refused:
                safefs.remove(root, ".crewwork")  # a link or a file where the platform's directory goes
            safefs.make_dirs(root, LOG_DIR, owner=self.owner)
            os.close(safefs.create_file(root, LOG_FILE, mode=0o644, owner=self.owner))
            fd, _st = safefs.open_regular(root, LOG_FILE)
            return fd
        finally:
            os.close(root)

    def log(self) -> bytes:
        """Everything the app has written so far (at most LOG_CAP bytes), read from the host's own descriptor."""
        if self._log_fd is not None and len(self._log) < LOG_CAP:
            while len(self._log) < LOG_CAP:
                chunk = os.pread(self._log_fd, min(65536, LOG_CAP - len(self._log)), len(self._log))
                if not chunk:
                    break
                self._log += chunk
        return bytes(self._log)

    async def settled_log(self, quiet_s: float = LOG_QUIET_S, max_s: float = LOG_SETTLE_MAX_S) -> bytes:
        """The log once the app's output has stopped arriving. The relay copies the app's output into the log from a
        thread of its own, so what the app wrote before it answered the last probe (the traceback of a 500) can reach
        the log after the answer has reached us: on a loaded host the log was read without it (a flaky
        tests/preview/test_repair.py). Waits until the log has not grown for `quiet_s`, at most `max_s`."""
        deadline = time.monotonic() + max_s
        size = len(self.log())
        while time.monotonic() < deadline:
            await asyncio.sleep(quiet_s)
            now = len(self.log())
            if now == size:
                break
            size = now
        return self.log()

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def client(self, timeout_s: float = 10.0) -> httpx.AsyncClient:
        """An HTTP client whose every connection goes through the front door to this app, and nowhere else."""
        transport = httpx.AsyncHTTPTransport(uds=self.tunnels.short(self.tunnels.front), retries=0)
        return httpx.AsyncClient(
            transport=transport,
            base_url=f"http://127.0.0.1:{self.port}",
            follow_redirects=False,
            # Bodies are read raw and bounded; a compressed one could not be judged (nor safely inflated).
            headers={"Accept-Encoding": "identity"},
            timeout=timeout_s,
            trust_env=False,
        )

    async def wait_ready(self, ready: ReadySpec) -> tuple[bool, float | None, str | None]:
        """(ready, seconds after start, the last thing seen). Stops early when the app exits."""
        import re2

        deadline = self.started_at + ready.timeout_s
        detail: str | None = None
        pattern = re2.compile(ready.log) if ready.log is not None else None
        scanned = 0  # complete lines already searched: each byte of the log is searched once
        async with self.client(timeout_s=5.0) as client:
            while time.monotonic() < deadline and self.alive:
                if pattern is not None:
                    log = self.log()
                    end = log.rfind(b"\n") + 1
                    fresh = log[scanned:end].decode("utf-8", "replace")
                    scanned = max(scanned, end)
                    if any(pattern.search(line) for line in fresh.splitlines()):
                        return True, time.monotonic() - self.started_at, None
                    detail = "no output line matched" if log else "no output yet"
                    if len(log) >= LOG_CAP:
                        detail = (
                            f"not judged: the app's log reached its {LOG_CAP}-byte cap before a line matched, "
                            "and what it wrote after that is not read"
                        )
                else:
                    try:
                        resp = await client.get(ready.http or "/")
                        await resp.aclose()
                        if resp.status_code in READY_STATUSES:
                            return True, time.monotonic() - self.started_at, None
                        detail = f"{ready.http or '/'} answered {resp.status_code}"
                    except httpx.HTTPError as exc:
                        detail = _why(exc, self.tunnels)
                await asyncio.sleep(POLL_S)
        if not self.alive:
            detail = detail or "the app exited"
        return False, None, detail

    def run_record(self) -> AppRun:
        """What the sandbox measured of the app's run: once it ended by itself, or once `stop()` ended it (then the
        caps it hit while it kept running; it did not exit)."""
        if self.task is None or not self.task.done() or self.task.cancelled():
            return AppRun()
        if self.task.exception() is not None:
            return AppRun()
        r = self.task.result()
        return AppRun(
            exited=not r.stopped,
            exit_code=None if r.stopped else r.exit_code,
            timed_out=r.timed_out,
            oom_killed=r.oom_killed,
            pids_limited=r.pids_limited,
            disk_limited=r.disk_limited,
            killed_by_signal=None if r.stopped else r.killed_by_signal,
        )

    async def stop(self) -> None:
        """Stop the app (the sandbox kills the whole tree, or its container) and close the log. The run's result,
        caps included, is then in `run_record()`."""
        task = self.task
        if task is not None and not task.done():
            self._stop.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)
            if not task.done():
                task.cancel()
        if task is not None:
            with contextlib.suppress(BaseException):
                await task
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None


def _why(exc: httpx.HTTPError, tunnels: Tunnels) -> str:
    if tunnels.dialed == 0:
        return "the app's relay has not connected yet"
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.ConnectError):
        return f"no HTTP answer on 127.0.0.1:$PORT ({text})"
    return text
