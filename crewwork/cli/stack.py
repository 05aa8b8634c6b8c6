"""The embedded single-host stack behind `crewwork dev` and `crewwork demo`.

Starts the Temporal dev server (persistent SQLite file, Web UI, search attributes), applies the store's migrations,
makes sure a tenant and an API key exist, then runs the API and one process per worker pool, restarting any pool
process that dies. Stops everything cleanly (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from crewwork.store.db import upgrade_sync
from crewwork.temporal.devserver import DevServer, port_open
from crewwork.workers.pools import POOLS

RESTART_BACKOFF_S = (0.5, 1, 2, 5, 10)
"""Delays before restarting a pool process that exited: the k-th restart in a row waits the k-th entry (the last
one repeats). A process that ran for `Stack.healthy_after_s` resets its count, so a pool that crashes once an hour
comes back in half a second every time, while one that crashes on start settles at one try every 10 s."""


def restart_delay(restarts_in_a_row: int) -> float:
    return RESTART_BACKOFF_S[min(restarts_in_a_row, len(RESTART_BACKOFF_S) - 1)]


def crewwork_argv(*args: str) -> list[str]:
    """argv that runs this installation's crewwork in a child process, whatever the current directory holds.

    `python -m` puts the current directory first on sys.path, so started next to (or inside) a crewwork checkout,
    the child would import the checkout's `crewwork` instead of the installed one (a half-importable namespace
    package from the parent of a checkout: the API never became ready). `-P` (Python 3.11+) leaves the current
    directory off sys.path; unlike `-I` it keeps PYTHONPATH and the PYTHON* variables an operator may rely on."""
    return [sys.executable, "-P", "-m", "crewwork", *args]


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    """Restarts in a row without a healthy run between them (the back-off index)."""
    restarts_total: int = 0
    """Every restart of this process since the stack started."""
    restart: bool = True
    started_at: float = 0.0
    """time.monotonic() of the last start."""

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 25.0) -> None:
        self.restart = False
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Stack:
    data_dir: Path
    temporal_port: int = 7233
    ui_port: int = 8233
    api_port: int = 8080
    database_url: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    pool_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOLS, 1))
    ui: bool = True
    on_event: object = None
    worker_argv: Callable[[str], list[str]] | None = None
    """The command that runs one pool process (default: this Python's `-m crewwork worker --pool POOL`)."""
    healthy_after_s: float = 60.0
    """Seconds after which a running process counts as healthy and its back-off resets (the setting
    `pool_restart_healthy_s`, CREWWORK_POOL_RESTART_HEALTHY_S)."""
    temporal: DevServer | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    api_key: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _supervisor: threading.Thread | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()}
        env.update(
            {
                "CREWWORK_DATA_DIR": str(self.data_dir),
                "CREWWORK_TEMPORAL_ADDRESS": f"127.0.0.1:{self.temporal_port}",
                "CREWWORK_TEMPORAL_UI_URL": self.ui_url,
                "CREWWORK_API_PORT": str(self.api_port),
                "CREWWORK_API_URL": self.api_url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        # The embedded single-user stack: local repositories are registered for the tenant on first use, and a
        # remote on this machine (a local Gitea, `git daemon`) may be used. Production keeps both off.
        env.setdefault("CREWWORK_AUTO_REGISTER_REPOS", "true")
        env.setdefault("CREWWORK_REPO_ALLOW_NETWORKS", "127.0.0.0/8,::1/128")
        if self.database_url:
            env["CREWWORK_DATABASE_URL"] = self.database_url
        env.update(self.extra_env)
        return env

    def database(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'crewwork.db').resolve()}"

    def _say(self, msg: str) -> None:
        if callable(self.on_event):
            self.on_event(msg)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for port, what in ((self.api_port, "API"),):
            if port_open("127.0.0.1", port):
                raise RuntimeError(f"port {port} for the {what} is already in use; choose another")
        self.temporal = DevServer(self.data_dir, port=self.temporal_port, ui_port=self.ui_port, ui=self.ui)
        self._say(f"starting Temporal dev server on {self.temporal.address}")
        self.temporal.start()
        self._say("applying store migrations")
        upgrade_sync(self.database())
        self.api_key = ensure_dev_key(self.database(), self.data_dir)
        env = self.env()
        logs = self.data_dir / "logs"
        self.processes.append(
            ManagedProcess("api", crewwork_argv("api", "--port", str(self.api_port)), env, logs / "api.log")
        )
        for pool in POOLS:
            for i in range(self.pool_counts.get(pool, 1)):
                self.processes.append(
                    ManagedProcess(
                        f"{pool}-{i}",
                        self.worker_argv(pool) if self.worker_argv else crewwork_argv("worker", "--pool", pool),
                        env,
                        logs / f"worker-{pool}-{i}.log",
                    )
                )
        self._say(f"starting the API and worker pools ({', '.join(p.name for p in self.processes)})")
        for p in self.processes:
            p.start()
        self._supervisor = threading.Thread(target=self._supervise, name="crewwork-supervisor", daemon=True)
        self._supervisor.start()
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{self.api_url}/healthz", timeout=2)
                if r.status_code == 200 and r.json().get("ok"):
                    return
                last = r.text
            except httpx.HTTPError as exc:
                last = str(exc)
            api = next(p for p in self.processes if p.name == "api")
            if api.proc is not None and api.proc.poll() is not None and api.restarts > 3:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the API did not become ready in {timeout_s}s ({last}); see {self.data_dir}/logs/")

    def _supervise(self) -> None:
        healthy_s = self.healthy_after_s
        while not self._stop.wait(0.5):
            for p in self.processes:
                if p.restart and not p.alive():
                    code = p.proc.returncode if p.proc else None
                    if p.proc is not None and time.monotonic() - p.started_at >= healthy_s:
                        p.restarts = 0  # it ran long enough to count as healthy: this exit starts a new series
                    delay = restart_delay(p.restarts)
                    self._say(f"{p.name} exited (code {code}); restarting in {delay}s")
                    if self._stop.wait(delay):
                        return
                    p.restarts += 1
                    p.restarts_total += 1
                    p.start()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send a signal to one managed process (tests use this to crash a pool)."""
        for p in self.processes:
            if p.name == name and p.proc is not None:
                p.proc.send_signal(sig)

    def stop(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(5)
        for p in self.processes:
            p.restart = False
        threads = [threading.Thread(target=p.stop) for p in self.processes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.temporal is not None:
            self.temporal.stop()


def ensure_dev_key(database_url: str, data_dir: Path, tenant: str = "default") -> str:
    """The embedded setup's API key, created once and kept in DATA/api_key (mode 0600) for the CLI."""
    import asyncio

    from crewwork.store.store import Store

    key_file = data_dir / "api_key"
    if key_file.exists():
        key = key_file.read_text().strip()

        async def _valid() -> bool:
            st = Store(database_url)
            try:
                return await st.authenticate(key) is not None
            finally:
                await st.close()

        if asyncio.run(_valid()):
            return key

    async def _create() -> str:
        st = Store(database_url)
        try:
            _kid, plain = await st.create_api_key(tenant, ["admin"])
            return plain
        finally:
            await st.close()

    key = asyncio.run(_create())
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    return key
