"""Prepared environments: a work item's setup runs once per (owner, repository, base commit, environment), then
every attempt and every validation run of that owner reuses the result through a read-only mount.

A cache entry is a directory `<root>/<key>/` holding `src/` (the repository tree the setup ran against) and
`env/` (what the setup installed). Setup commands run in a sandbox whose workspace is `src/` and which sees `env/`
writable at ENV_INSIDE (`/crewwork/env`, `$CREWWORK_ENV`), e.g. `python -m pip install --prefix "$CREWWORK_ENV" -r
requirements.txt`. Later runs see `env/` read-only at the same ENV_INSIDE and their own workspace at `/workspace`,
so scripts and .pth files with baked-in paths keep working (an editable install of `/workspace` points at the
validated change). The `local` backend cannot remap: there the entry's host paths are used both times.

**Whose an entry is.** The key (`prepare_key`) hashes everything that can change what a setup produces or sees: the
owner (tenant and the tenant's registration of the repository), the repository, the base commit, the setup
commands, the environment definition (interpreter, image, network allowlist), the backend and interpreter that run
it, and each secret by name and by a keyed digest of its value (HMAC-SHA256 under a random key kept in the cache
root, readable by the worker only: the key in evidence reveals nothing about a secret). So an entry is never served
to another tenant, nor to the same tenant after its secret changed: anything a setup builds from a secret or from
what the tenant controls stays that tenant's. Two tenants with identical public inputs build twice; that costs one
cold build each (docs/sandbox.md, "Caches and tenants") and closes a class of cross-tenant poisoning through a
setup that is not reproducible.

Invalidation is by construction: a new commit or a changed setup is a different key. `evict()` removes
least-recently-used entries beyond a byte budget, counting the blocks each entry really holds (a setup's sparse files
and hard links do not make it look bigger). Entries are built under a per-key file lock, so concurrent attempts on
one host build once; a run that uses an entry holds the same lock shared (`hold=True`), so eviction, which takes it
exclusively without waiting, never deletes an entry from under a run.

Disk cap: setup commands are the tenant's, so with `disk_mb` set each entry is its own ext4 loop image
(`<root>/.<key>.img`, sparse, see crewwork.sandbox.disk) mounted at the entry directory itself before anything is
written (the venv's absolute paths stay valid) and kept mounted while the entry is cached. Filling it fails the
setup with a reason naming the cap and CREWWORK_SANDBOX_PREPARE_DISK_MB; the host disk holds only the image.
A failed or cancelled build, eviction, and a later build over a crashed worker's leftover unmount the entry and
delete its image. After a reboot the mount is gone, the empty mountpoint has no READY marker, and the entry is
rebuilt. For the LRU budget an imaged entry counts the blocks its image really holds on the host.

A repository's environment (`SetupPlan`, from `EnvironmentSpec`) adds three things to a build:
- `python`: first create a virtual environment `env/venv` from that interpreter (inside the sandbox); its `bin`
  leads PATH for the setup commands and for every later run, and PYTHONPATH is not set, so tests run with the
  repository's interpreter and packages, never crewwork's own. Without it, runs use the sandbox's own clean
  interpreter (crewwork/sandbox/toolchain.py, or the image's) with PYTHONPATH into `env/`.
- `allowlist`: setup commands reach the network through `crewwork.sandbox.proxy` (an allowlisting proxy on a unix
  socket bind-mounted into the setup sandbox only). Later runs get no socket: no network.
- `secrets`: environment variables for the setup commands only, masked in the setup log.
Without an allowlist, sandboxes have no network at all: setup installs from what is mounted (a wheelhouse, a
vendored tree) or from an image that already has it. The setup log, each command's duration and the proxy's
decisions are kept in the entry (`setup.log`, `READY.json`) as evidence for cold and warm runs alike."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from crewwork.boundary.safefs import delete_tree
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits, SandboxRunResult
from crewwork.sandbox.disk import WorkspaceDisk, is_mountpoint, unmount_blocking
from crewwork.sandbox.envplan import (
    DEFAULT_MAX_BYTES,
    DIGEST_KEY,
    ENV_INSIDE,
    MAKE_VENV,
    NET_INSIDE,
    READY,
    SETUP_LOG,
    CacheOwner,
    PreparedEnv,
    SetupFailed,
    SetupPlan,
    _meta,
    prepare_key,
)
from crewwork.sandbox.proxy import AllowlistProxy, new_sock_dir


# Run with the environment's interpreter inside the sandbox: `python -m venv`, and where the interpreter has no
# ensurepip (slimmed images, Debian's python3 without python3-venv) a venv without pip plus a copy of the
# interpreter's own pip (pure Python, its dependencies vendored), so setup can still `python -m pip install`.
class PreparedEnvCache:
    """Prepared environments on local disk, bounded by `max_bytes` with least-recently-used eviction; with
    `disk_mb`, each entry is its own file system of that many MiB (None: no per-entry cap)."""

    def __init__(
        self,
        root: Path,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        disk_mb: int | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        self.disk_mb = disk_mb
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def disk_enforcement(self) -> str:
        return f"loop-{self.disk_mb}m" if self.disk_mb else "none"

    def image(self, key: str) -> Path:
        """Where the loop image of entry `key` lives (beside the entry, never inside what it mounts)."""
        return self.root / f".{key}.img"

    def _discard(self, key: str) -> None:
        """Remove entry `key` whatever state it is in: unmount its image, delete the image and the directory."""
        entry = self.root / key
        if is_mountpoint(entry):
            unmount_blocking(entry)
        with contextlib.suppress(FileNotFoundError):
            self.image(key).unlink()
        delete_tree(entry)  # also what the setup made unwritable (a worker that is not root has no override)

    def _disk_full(self, what: str) -> str:
        return (
            f"{what} filled the prepared environment's disk cap of {self.disk_mb} MiB "
            "(raise CREWWORK_SANDBOX_PREPARE_DISK_MB, or make the setup write less)"
        )

    def lookup(self, key: str) -> Path | None:
        entry = self.root / key
        ready = entry / READY
        if ready.exists():
            # The marker's mtime is the entry's last use, which eviction orders by.
            with contextlib.suppress(OSError):
                os.utime(ready)
            return entry
        return None

    def secret_digests(self, values: Mapping[str, str]) -> dict[str, str]:
        """Variable name -> HMAC-SHA256 of the value under this cache's own random key (made on first use, 0600):
        a changed secret is another entry, and no one holding an entry's key can test guesses of a secret."""
        if not values:
            return {}
        key = self._digest_key()
        return {
            name: hmac.new(key, f"{name}\0{value}".encode(), hashlib.sha256).hexdigest()
            for name, value in sorted(values.items())
        }

    def _digest_key(self) -> bytes:
        """The cache's digest key: made on first use, complete or absent (written aside and linked into place, so
        workers racing on a fresh cache, or one killed mid-write, never leave or read a short key); refused if it is
        a link, another user's, or readable or writable by others."""
        path = self.root / DIGEST_KEY
        for _ in range(2):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                break
            except FileNotFoundError:
                self._make_digest_key(path)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise OSError(f"{path} is a symbolic link: refused (it must be a file of the worker's)") from None
                raise
        else:
            raise OSError(f"{path} could not be made")
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise OSError(
                    f"{path} must be a regular file of uid {os.geteuid()} that nobody else can read or write (mode "
                    f"0600); remove it if in doubt: entries built with secrets are then rebuilt"
                )
            key = f.read(64)
        if len(key) != 32:
            raise OSError(f"{path} is damaged (remove it: entries built with secrets are then rebuilt)")
        return key

    def _make_digest_key(self, path: Path) -> None:
        tmp = self.root / f"{DIGEST_KEY}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # never replaces: the first complete key wins, the others read it
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def key_for(
        self,
        owner: CacheOwner,
        sandbox: Sandbox,
        repo: str,
        base_commit: str,
        setup: Sequence[Sequence[str]],
        env: Mapping[str, str] | None = None,
        plan: SetupPlan | None = None,
    ) -> str:
        """The key `get_or_prepare` files these inputs under (see `prepare_key`)."""
        plan = plan or SetupPlan()
        digests = self.secret_digests(plan.secrets)
        return prepare_key(
            owner, repo, base_commit, setup, runner=sandbox.runner(), env=env, plan=plan, secret_digests=digests
        )

    async def get_or_prepare(
        self,
        *,
        owner: CacheOwner,
        sandbox: Sandbox,
        repo: str,
        base_commit: str,
        setup: Sequence[Sequence[str]],
        source: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        plan: SetupPlan | None = None,
        hold: bool = False,
    ) -> PreparedEnv:
        """`owner`'s entry for these inputs; on a miss, runs `setup` in `sandbox` against a copy of `source`.

        `hold`: the entry stays (eviction skips it) until `PreparedEnv.release()`, for as long as a run uses it. The
        entry's lock file is shared by users and exclusive for a build or an eviction, so an entry is never deleted
        from under a run, whichever tenant's build pushed the cache over its budget."""
        started = time.monotonic()
        plan = plan or SetupPlan()
        key = await asyncio.to_thread(self.key_for, owner, sandbox, repo, base_commit, setup, env, plan)
        inside = sandbox.inside(Mount(self.root / key / "env", ENV_INSIDE))
        fd = os.open(self.root / f".{key}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            cold = False
            results: list[SandboxRunResult] = []
            while True:
                # Shared while it is looked up and used; READY only goes away under the exclusive lock.
                await _flock(fd, fcntl.LOCK_SH)
                entry = self.lookup(key)
                if entry is not None:
                    break
                # Not while holding the shared lock: two users both waiting to upgrade would wait on each other.
                fcntl.flock(fd, fcntl.LOCK_UN)
                await _flock(fd, fcntl.LOCK_EX)
                if self.lookup(key) is None:  # else built by someone else while we waited
                    results = await self._build(key, sandbox, setup, source, limits, env, mounts, plan)
                    cold = True
                # Back to shared (and READY checked again: an eviction may come between the two locks).
            assert entry is not None
            prepared = PreparedEnv(
                key, entry, cold, results, time.monotonic() - started, _meta(entry), inside, _hold=fd if hold else None
            )
            if cold:
                await asyncio.to_thread(self.evict, keep={key})
        except BaseException:
            os.close(fd)
            raise
        if not hold:
            os.close(fd)
        return prepared

    async def _build(
        self,
        key: str,
        sandbox: Sandbox,
        setup: Sequence[Sequence[str]],
        source: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None,
        mounts: Sequence[Mount],
        plan: SetupPlan,
    ) -> list[SandboxRunResult]:
        entry = self.root / key
        await asyncio.to_thread(self._discard, key)  # a half-built leftover of a crashed worker, mounted or not
        build_started = time.monotonic()
        log: list[bytes] = []
        steps: list[dict[str, Any]] = []
        proxy = None
        try:
            if self.disk_mb:
                # Mounted at the entry itself, so everything the build writes (and the paths baked into it) is
                # inside the cap. Owned by the worker like a plain directory; the sandbox run hands it over.
                await WorkspaceDisk.create(self.image(key), entry, self.disk_mb, (os.geteuid(), os.getegid()))
            else:
                entry.mkdir()
            try:
                await asyncio.to_thread(
                    shutil.copytree, source, entry / "src", symlinks=True, ignore=shutil.ignore_patterns(".git")
                )
            except (OSError, shutil.Error) as exc:
                if not self.disk_mb or not _no_space(exc):
                    raise
                raise SetupFailed(
                    self._disk_full("copying the repository"), [_disk_result(sandbox.name, str(exc))]
                ) from exc
            env_dir = entry / "env"
            env_dir.mkdir()
            run_mounts = [*mounts, Mount(env_dir, ENV_INSIDE, writable=True)]
            env_inside = sandbox.inside(run_mounts[-1])
            run_env = {**(env or {}), "CREWWORK_ENV": env_inside}
            commands: list[tuple[str, list[str], list[str]]] = []  # (kind, argv, argv as shown in evidence)
            if plan.python:
                venv = f"{env_inside}/venv"
                commands.append(("venv", [plan.python, "-c", MAKE_VENV, venv], [plan.python, "-m", "venv", venv]))
                run_env["VIRTUAL_ENV"] = venv
                run_env["PATH"] = f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"
            commands += [("setup", list(c), list(c)) for c in setup]
            if plan.allowlist:
                proxy = AllowlistProxy(list(plan.allowlist), new_sock_dir(self.root))
                await proxy.__aenter__()
                run_mounts.append(Mount(proxy.sock_dir, NET_INSIDE))
            results: list[SandboxRunResult] = []
            for kind, command, shown in commands:
                # The workspace is the repository copy; it and the environment are the run's writable places.
                argv = list(command)
                step_env = dict(run_env)
                if kind == "setup":
                    step_env.update(plan.secrets)
                    if proxy is not None:
                        argv = proxy.wrap(argv, python=plan.python or "python3", inside=sandbox.inside(run_mounts[-1]))
                r = await sandbox.run(argv, workspace=entry / "src", limits=limits, env=step_env, mounts=run_mounts)
                results.append(r)
                steps.append({"kind": kind, "argv": shown, "seconds": round(r.duration_s, 3), "exit": r.exit_code})
                log.append(
                    plan.mask(
                        f"$ {' '.join(shown)}   # {kind}, {r.duration_s:.2f} s, {r.cause} {r.exit_code}\n"
                        + r.stdout.decode(errors="replace")
                        + ("\n--- stderr ---\n" + r.stderr.decode(errors="replace") if r.stderr else "")
                        + "\n"
                    ).encode()
                )
                if not r.ok:
                    masked = [
                        dataclasses.replace(
                            x,
                            stdout=plan.mask(x.stdout.decode(errors="replace")).encode(),
                            stderr=plan.mask(x.stderr.decode(errors="replace")).encode(),
                        )
                        for x in results
                    ]
                    reason = f"{kind} command {shown} failed ({r.cause}, exit {r.exit_code})"
                    if r.disk_limited and self.disk_mb:
                        # Said where the submitter reads it too: the setup log and the evidence's stderr tail.
                        reason = self._disk_full(f"{kind} command {shown}")
                        note = f"\ncrewwork: {reason}\n".encode()
                        masked[-1] = dataclasses.replace(masked[-1], stderr=masked[-1].stderr + note)
                        log.append(note)
                    raise SetupFailed(
                        f"{reason}: {masked[-1].stderr[-2000:].decode(errors='replace')}",
                        masked,
                        log=b"".join(log),
                        network=proxy.summary() if proxy is not None else [],
                    )
            if proxy is not None:
                await proxy.__aexit__(None, None, None)
                log.append(f"--- setup network: {json.dumps(proxy.summary())}\n".encode())
            meta = {
                "key": key,
                "setup": [list(c) for c in setup],
                "built_at": time.time(),
                "build_seconds": round(time.monotonic() - build_started, 3),
                "backend": sandbox.name,
                "venv": bool(plan.python) or await asyncio.to_thread(_made_venv, env_dir),
                "steps": steps,
                "network": proxy.summary() if proxy is not None else [],
                "disk": self.disk_enforcement,
            }
            try:
                (entry / SETUP_LOG).write_bytes(b"".join(log))
                tmp = entry / (READY + ".tmp")
                tmp.write_text(json.dumps(meta))
                tmp.rename(entry / READY)  # atomic: an entry without the marker is never used
            except OSError as exc:
                if not self.disk_mb or not _no_space(exc):
                    raise
                raise SetupFailed(
                    self._disk_full("the setup's log"), [_disk_result(sandbox.name, str(exc))], log=b"".join(log)
                ) from exc
            return results
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self._discard, key))
            raise
        finally:
            if proxy is not None:
                await proxy.__aexit__(None, None, None)
                await asyncio.to_thread(shutil.rmtree, proxy.sock_dir, True)

    def entries(self) -> list[tuple[str, float, int]]:
        """(key, last use, bytes) of every ready entry."""
        out = []
        for d in self.root.iterdir():
            ready = d / READY
            if d.is_dir() and ready.exists():
                out.append((d.name, ready.stat().st_mtime, self._size(d.name)))
        return out

    def _size(self, key: str) -> int:
        """Host disk an entry costs: the blocks its (sparse) image holds, file system overhead included, or the
        files of a plain directory."""
        try:
            return self.image(key).stat().st_blocks * 512
        except FileNotFoundError:
            return _du(self.root / key)

    def evict(self, keep: set[str] | None = None) -> list[str]:
        """Remove least-recently-used entries until the cache fits in `max_bytes`. Returns removed keys."""
        keep = keep or set()
        self._sweep_half_built()
        entries = sorted(self.entries(), key=lambda e: e[1])
        total = sum(size for _, _, size in entries)
        removed = []
        for key, _, size in entries:
            if total <= self.max_bytes:
                break
            if key in keep:
                continue
            with self._try_lock(key) as locked:
                if not locked:
                    continue  # being built or rebuilt right now
                # Remove the marker first so no new user picks the entry up mid-removal.
                with contextlib.suppress(FileNotFoundError):
                    (self.root / key / READY).unlink()
                self._discard(key)
            total -= size
            removed.append(key)
        return removed

    def sweep(self, min_age_s: float) -> list[str]:
        """What builds that died on this host left (the host sweep, crewwork/steps/sweep.py): entries with no
        READY marker that nobody is building (imaged or plain directories), and lock files of keys that have no
        entry, older than `min_age_s`. An entry being built or used holds its lock and is left alone."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        cutoff = time.time() - min_age_s
        self._sweep_half_built()
        for entry in self.root.iterdir():
            if entry.name.startswith(".") or not entry.is_dir() or entry.is_symlink() or (entry / READY).exists():
                continue
            with self._try_lock(entry.name) as locked:
                if locked and not (entry / READY).exists() and entry.lstat().st_mtime < cutoff:
                    self._discard(entry.name)
                    removed.append(entry.name)
        for lock in self.root.glob(".*.lock"):
            key = lock.name[1 : -len(".lock")]
            if (self.root / key).exists() or lock.lstat().st_mtime >= cutoff:
                continue
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not (self.root / key).exists():
                    lock.unlink()
                    removed.append(lock.name)
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
        return removed

    def _sweep_half_built(self) -> None:
        """Unmount and delete the images of entries a killed worker left half-built (no READY marker, nobody
        building them): their key may never be asked for again, and they would hold host disk forever."""
        for image in self.root.glob(".*.img"):
            key = image.name[1 : -len(".img")]
            if (self.root / key / READY).exists():
                continue
            with self._try_lock(key) as locked:
                if locked and not (self.root / key / READY).exists():  # not locked: being built right now
                    self._discard(key)

    @contextlib.contextmanager
    def _try_lock(self, key: str) -> Iterator[bool]:
        """The entry's lock, exclusively, without waiting: yields whether it was taken (no build of `key` is running
        and no run holds it)."""
        lock_fd = os.open(self.root / f".{key}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(lock_fd)


async def _flock(fd: int, op: int) -> None:
    """`flock(fd, op)` without blocking the event loop (a build can take minutes)."""
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await asyncio.sleep(0.1)


def _no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # shutil.copytree gathers per-file errors as (src, dst, why) tuples.
    return isinstance(exc, shutil.Error) and any("No space left" in str(e) for e in exc.args[0])


def _disk_result(backend: str, why: str) -> SandboxRunResult:
    """What a cap hit outside any setup command (copying the tree, writing the log) is reported as."""
    return SandboxRunResult(
        backend=backend, isolated=True, exit_code=None, duration_s=0.0, stdout=b"", stderr=why.encode(),
        disk_limited=True,
    )  # fmt: skip


def _made_venv(env_dir: Path) -> bool:
    """Whether a setup made a virtualenv at `env/venv` itself: a real directory holding a real `pyvenv.cfg`. Nothing
    is followed (a link there points wherever the setup liked, on the host too)."""
    try:
        fd = os.open(env_dir / "venv", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.stat("pyvenv.cfg", dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def _du(path: Path) -> int:
    """Host disk the tree under `path` takes: the blocks each inode really holds, each inode once, directories
    included. Never the apparent size: a setup's sparse file or hard links would make its entry look big enough to
    evict every other tenant's (tests/security/test_prepared_eviction.py). Links are not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(path):
        for name in [".", *dirs, *files]:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total
