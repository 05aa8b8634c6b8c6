"""A private PostgreSQL server for the chaos soak, so that its full-restart faults (the server stopped and started,
not only connections terminated) hit only the soak's own database, never the machine's shared server.

Built from the machine's PostgreSQL binaries (Debian's postgresql package): `initdb` into a temporary directory as
the `postgres` user (PostgreSQL refuses to run as root), trust authentication on loopback, a free port."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from crewwork.temporal.devserver import free_port


def _bin_dir() -> Path | None:
    root = Path("/usr/lib/postgresql")
    versions = sorted((p for p in root.glob("*/bin") if (p / "initdb").exists()), reverse=True) if root.exists() else []
    return versions[0] if versions else None


def available() -> tuple[bool, str]:
    if _bin_dir() is None:
        return False, "PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return False, "runuser is needed to run initdb as the postgres user"
    return True, "ok"


@dataclass
class PrivatePostgres:
    data: Path
    port: int
    bin: Path

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/soak"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def start(self, *settings: str) -> None:
        """Start the server (`settings`: more `-c name=value` options) and wait until pg_ctl sees it up."""
        # A start that fails says why (the server's own log), so that a rare failure can be told apart from the code.
        try:
            self._start(*settings)
        except subprocess.CalledProcessError as exc:
            log = self.data / "server.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no server.log)"
            raise RuntimeError(
                f"pg_ctl start failed ({exc.returncode}): {exc.stderr}\n--- server.log ---\n{tail}"
            ) from exc

    def _start(self, *settings: str) -> None:
        extra = "".join(f" -c {c}" for c in settings)
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-l",
            str(self.data / "server.log"),
            "-o",
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200{extra}",
            "start",
        )

    def start_in_recovery(self) -> None:
        """Start the (stopped) server as a standby with hot_standby off and no primary: it listens, and answers
        every connection with SQLSTATE 57P03 ("the database system is not accepting connections") until
        `promote()`, the state a restarting server is in for a moment while it replays its WAL."""
        self._run("touch", str(self.data / "standby.signal"))
        self.start("hot_standby=off")

    def promote(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "promote")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-m", mode, "stop", check=False)

    def restart(self, down_s: float = 1.0) -> None:
        """A full restart: the server process stops (every connection and in-flight transaction dies), stays down
        for `down_s`, and starts again on the same data."""
        self.stop("immediate")
        time.sleep(down_s)
        self.start()

    def psql(self, sql: str, db: str = "postgres") -> str:
        return subprocess.run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db, "-qAtc", sql],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A fresh server in its own directory under the system temp dir (the `postgres` user must be able to reach it,
    which rules out root's private pytest directories), removed afterwards."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    bin_dir = _bin_dir()
    assert bin_dir is not None
    root = Path(tempfile.mkdtemp(prefix="crewwork-soak-pg-"))
    data = root / "pgdata"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(data, "postgres", "postgres")
    pg = PrivatePostgres(data, free_port(), bin_dir)
    try:
        pg._run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        pg.start()
        pg.psql("CREATE DATABASE soak")
        yield pg
    finally:
        pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
