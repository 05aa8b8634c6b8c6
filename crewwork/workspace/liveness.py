"""Which workspaces on this host are in use: each workspace home `H` has a sibling lock file `H.lock`, held (an
exclusive flock) by the process that made the workspace for as long as the workspace lives.

The kernel drops an flock when its process dies, however it dies (SIGKILL, an OOM kill, the host's power), so a
workspace whose lock can be taken is one that no live process uses: the host sweep (crewwork/steps/sweep.py)
removes it while holding the lock. A process making a workspace takes the lock before it touches the home, so the
sweep and a retried attempt on the same host never work on one home at once."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class HomeLock:
    path: Path
    fd: int

    def release(self, *, unlink: bool) -> None:
        """Give the lock up (deleting its file first when `unlink`, while still holding it)."""
        if self.fd < 0:
            return
        if unlink:
            with contextlib.suppress(OSError):
                if os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self.fd).st_ino:
                    os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


def lock_path(home: Path) -> Path:
    return home.with_name(home.name + ".lock")


def _open_and_lock(path: Path, *, wait: bool) -> int | None:
    """The lock file at `path`, created if missing, locked exclusively (None when `wait` is False and another
    process holds it). Retries when the file was unlinked between the open and the lock (a sweep released it)."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:  # the directory went (a sweep removed an empty item directory): again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


async def claim(home: Path) -> HomeLock:
    """Take `home`'s lock, waiting (without blocking the event loop) while another process of this host holds it."""
    path = lock_path(home)
    delay = 0.01
    while True:
        fd = await asyncio.to_thread(_open_and_lock, path, wait=False)
        if fd is not None:
            return HomeLock(path, fd)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


def try_claim(home: Path) -> HomeLock | None:
    """`home`'s lock if no live process holds it, without waiting."""
    fd = _open_and_lock(lock_path(home), wait=False)
    return None if fd is None else HomeLock(lock_path(home), fd)
