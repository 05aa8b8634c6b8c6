"""Prepared environments: a work item's setup runs once per (repository, base commit, setup spec), then every
attempt and every validation run reuses the result through a read-only mount.

A cache entry is a directory `<root>/<key>/` holding `src/` (the repository tree the setup ran against) and
`env/` (what the setup installed). Setup commands run in a sandbox with cwd `src/` and `$CREWWORK_ENV`
pointing at `env/`, e.g. `python -m pip install --prefix "$CREWWORK_ENV" -r requirements.txt`. Because the
entry is used at the same absolute path it was built at, scripts and .pth files with baked-in paths keep
working. Later runs mount `env/` read-only and get PATH/PYTHONPATH pointing into it (see `PreparedEnv.env`).

Invalidation is by construction: the key hashes the repository, the base commit and the setup spec, so a
new commit or a changed setup is a different entry. `evict()` removes least-recently-used entries beyond
a byte budget. Entries are built under a per-key file lock, so concurrent attempts on one host build once.
Sandboxes have no network: setup installs from what is mounted (a wheelhouse, a vendored tree) or from an
image that already has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from crewwork.sandbox.base import Sandbox, SandboxLimits, SandboxRunResult

READY = "READY.json"
DEFAULT_MAX_BYTES = 10 * 1024**3


def prepare_key(
    repo: str, base_commit: str, setup: Sequence[Sequence[str]], env: Mapping[str, str] | None = None
) -> str:
    """Content key of a prepared environment. Any change in the inputs gives a different key."""
    spec = json.dumps(
        {"repo": repo, "commit": base_commit, "setup": [list(c) for c in setup], "env": dict(env or {})},
        sort_keys=True,
    )
    return hashlib.sha256(spec.encode()).hexdigest()[:32]


@dataclasses.dataclass
class PreparedEnv:
    """A ready environment: mount `env_dir` read-only and add `env()` to the run's environment."""

    key: str
    root: Path
    cold: bool
    setup_results: list[SandboxRunResult]
    prepare_s: float

    @property
    def env_dir(self) -> Path:
        return self.root / "env"

    def mounts(self) -> list[Path]:
        return [self.env_dir]

    def env(self, python_version: str | None = None) -> dict[str, str]:
        """PATH and PYTHONPATH entries for what `pip install --prefix $CREWWORK_ENV` put there."""
        version = python_version or f"python{sys.version_info.major}.{sys.version_info.minor}"
        site = self.env_dir / "lib" / version / "site-packages"
        return {"CREWWORK_ENV": str(self.env_dir), "PYTHONPATH": str(site)}

    def path_prefix(self) -> str:
        return str(self.env_dir / "bin")


class SetupFailed(RuntimeError):
    """A setup command exited non-zero or hit a cap: a property of the work item, not of the machinery."""

    def __init__(self, message: str, results: list[SandboxRunResult]) -> None:
        super().__init__(message)
        self.results = results


class PreparedEnvCache:
    """Prepared environments on local disk, bounded by `max_bytes` with least-recently-used eviction."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def lookup(self, key: str) -> Path | None:
        entry = self.root / key
        ready = entry / READY
        if ready.exists():
            # The marker's mtime is the entry's last use, which eviction orders by.
            with contextlib.suppress(OSError):
                os.utime(ready)
            return entry
        return None

    async def get_or_prepare(
        self,
        *,
        sandbox: Sandbox,
        repo: str,
        base_commit: str,
        setup: Sequence[Sequence[str]],
        source: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None = None,
        ro_mounts: Sequence[Path] = (),
    ) -> PreparedEnv:
        """The entry for these inputs; on a miss, runs `setup` in `sandbox` against a copy of `source`."""
        started = time.monotonic()
        key = prepare_key(repo, base_commit, setup, env)
        entry = self.lookup(key)
        if entry is not None:
            return PreparedEnv(key, entry, cold=False, setup_results=[], prepare_s=time.monotonic() - started)
        async with self._lock(key):
            entry = self.lookup(key)  # built by someone else while we waited
            if entry is not None:
                return PreparedEnv(key, entry, False, [], time.monotonic() - started)
            results = await self._build(key, sandbox, setup, source, limits, env, ro_mounts)
        prepared = PreparedEnv(key, self.root / key, True, results, time.monotonic() - started)
        await asyncio.to_thread(self.evict, keep={key})
        return prepared

    async def _build(
        self,
        key: str,
        sandbox: Sandbox,
        setup: Sequence[Sequence[str]],
        source: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None,
        ro_mounts: Sequence[Path],
    ) -> list[SandboxRunResult]:
        entry = self.root / key
        await asyncio.to_thread(shutil.rmtree, entry, True)  # a half-built leftover of a crashed worker
        entry.mkdir()
        try:
            await asyncio.to_thread(
                shutil.copytree, source, entry / "src", symlinks=True, ignore=shutil.ignore_patterns(".git")
            )
            (entry / "env").mkdir()
            run_env = {**(env or {}), "CREWWORK_ENV": str(entry / "env")}
            results: list[SandboxRunResult] = []
            for command in setup:
                # cwd is the repository copy; the entry itself is the sandbox's one writable place.
                argv = ["sh", "-c", 'cd src && exec "$@"', "setup", *command]
                r = await sandbox.run(argv, workspace=entry, limits=limits, env=run_env, ro_mounts=ro_mounts)
                results.append(r)
                if not r.ok:
                    raise SetupFailed(
                        f"setup command {list(command)} failed ({r.cause}, exit {r.exit_code}): "
                        f"{r.stderr[-2000:].decode(errors='replace')}",
                        results,
                    )
            meta = {
                "key": key,
                "setup": [list(c) for c in setup],
                "built_at": time.time(),
                "backend": sandbox.name,
            }
            tmp = entry / (READY + ".tmp")
            tmp.write_text(json.dumps(meta))
            tmp.rename(entry / READY)  # atomic: an entry without the marker is never used
            return results
        except BaseException:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, entry, True))
            raise

    @contextlib.asynccontextmanager
    async def _lock(self, key: str):  # type: ignore[no-untyped-def]
        fd = os.open(self.root / f".{key}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.1)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def entries(self) -> list[tuple[str, float, int]]:
        """(key, last use, bytes) of every ready entry."""
        out = []
        for d in self.root.iterdir():
            ready = d / READY
            if d.is_dir() and ready.exists():
                out.append((d.name, ready.stat().st_mtime, _du(d)))
        return out

    def evict(self, keep: set[str] | None = None) -> list[str]:
        """Remove least-recently-used entries until the cache fits in `max_bytes`. Returns removed keys."""
        keep = keep or set()
        entries = sorted(self.entries(), key=lambda e: e[1])
        total = sum(size for _, _, size in entries)
        removed = []
        for key, _, size in entries:
            if total <= self.max_bytes:
                break
            if key in keep:
                continue
            lock_fd = os.open(self.root / f".{key}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being built or rebuilt right now
                # Remove the marker first so no new user picks the entry up mid-removal.
                with contextlib.suppress(FileNotFoundError):
                    (self.root / key / READY).unlink()
                shutil.rmtree(self.root / key, ignore_errors=True)
            finally:
                os.close(lock_fd)
            total -= size
            removed.append(key)
        return removed


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total
