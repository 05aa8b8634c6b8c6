"""Running a host process with a wall-clock cap, bounded output capture and whole-tree kill on cancel.

Shared by the daemonless backends (bwrap, local). The child is a session leader, so killing its process
group takes its descendants with it; a cgroup, when the backend has one, catches any that left the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# After the main process exits, how long descendants holding the pipes open may keep us waiting.
PIPE_DRAIN_GRACE_S = 2.0
_CHUNK = 64 * 1024


@dataclass
class ProcessOutcome:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    duration_s: float
    stopped: bool = False


class OutputCapture:
    """A command's output kept within `cap` bytes: the first half and the **last** half, with a line between them
    saying how much was not kept. The end of a test run's output is where its summary is, so a command that prints
    more than the cap (by accident, or to push the summary out of the evidence) still has it kept."""

    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 2)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.total = 0

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def add(self, chunk: bytes | None) -> None:
        if not chunk:
            return
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_len += len(chunk)
        keep = self.cap - self.cap // 2
        while self.tail and self.tail_len - len(self.tail[0]) >= keep:
            self.tail_len -= len(self.tail.popleft())

    def value(self) -> bytes:
        tail = b"".join(self.tail)[-(self.cap - self.cap // 2) :] if self.tail else b""
        if not self.truncated:
            return bytes(self.head) + tail
        lost = self.total - len(self.head) - len(tail)
        return bytes(self.head) + f"\n[… {lost} bytes of output not kept here …]\n".encode() + tail

    async def drain(self, stream: asyncio.StreamReader) -> None:
        # Reads to the end (discarding the middle) so a chatty command never blocks on a full pipe.
        while chunk := await stream.read(_CHUNK):
            self.add(chunk)


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_log_bytes: int,
    preexec_fn: Callable[[], None] | None = None,
    kill_extra: Callable[[], None] | None = None,
    pass_fds: Sequence[int] = (),
    stop: asyncio.Event | None = None,
) -> ProcessOutcome:
    """Run `argv`; on timeout, `stop` or cancellation SIGKILL the process group (and `kill_extra`, e.g. a cgroup)."""
    out, err = OutputCapture(max_log_bytes), OutputCapture(max_log_bytes)
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        preexec_fn=preexec_fn,
        pass_fds=tuple(pass_fds),
    )
    assert proc.stdout is not None and proc.stderr is not None
    readers = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))

    def kill_tree() -> None:
        _killpg(proc.pid)
        if kill_extra is not None:
            kill_extra()

    timed_out = stopped = False
    waiter = asyncio.ensure_future(proc.wait())
    stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        done, _ = await asyncio.wait(
            {waiter} | ({stopper} if stopper is not None else set()),
            timeout=timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if waiter not in done:
            stopped = stopper is not None and stopper in done
            timed_out = not stopped
            kill_tree()
            await waiter
        duration = time.monotonic() - start
        # Leftover descendants die with the group; if one escaped it, the pipes may stay open.
        _killpg(proc.pid)
        if kill_extra is not None:
            kill_extra()
        try:
            await asyncio.wait_for(asyncio.shield(readers), timeout=PIPE_DRAIN_GRACE_S)
        except TimeoutError:
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await readers
    except asyncio.CancelledError:
        kill_tree()
        waiter.cancel()
        readers.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.shield(proc.wait())
        # Retrieved, so a cancelled run (a preview being stopped) logs no "exception was never retrieved".
        with contextlib.suppress(BaseException):
            await readers
        raise
    finally:
        if stopper is not None:
            stopper.cancel()
    return ProcessOutcome(
        returncode=proc.returncode,
        stdout=out.value(),
        stderr=err.value(),
        truncated=out.truncated or err.truncated,
        timed_out=timed_out,
        duration_s=duration,
        stopped=stopped,
    )


def shell_status(rc: int | None) -> int | None:
    """Report a signalled process as 128+N like bwrap and container runtimes do, so backends compare."""
    return 128 - rc if rc is not None and rc < 0 else rc


def signal_from_returncode(rc: int | None, *, shell_style: bool) -> int | None:
    """The signal that ended a process, from a Popen returncode (negative) or a 128+N wrapper status."""
    if rc is None:
        return None
    if rc < 0:
        return -rc
    # bwrap and container runtimes report a signalled child as 128+N, like a shell.
    if shell_style and 128 < rc <= 128 + 64:
        return rc - 128
    return None


def apply_rlimits(memory_mb: int, pids: int, cpu_seconds: int) -> None:
    """Per-process caps for hosts without cgroups. Called in the child between fork and exec.

    RLIMIT_AS bounds address space, not RSS, so it is stricter than a cgroup for programs that map a lot.
    RLIMIT_NPROC counts every process of the real uid on the host and root ignores it, so it is only set
    for non-root workers.
    """
    import resource

    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() != 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))


def rlimit_prefix(memory_mb: int, pids: int, cpu_seconds: int) -> list[str] | None:
    """The same caps as apply_rlimits via util-linux `prlimit`, so the spawn needs no preexec_fn."""
    import shutil

    exe = shutil.which("prlimit")
    if exe is None:
        return None
    args = [exe, f"--as={memory_mb * 1024 * 1024}", f"--cpu={cpu_seconds}:{cpu_seconds + 1}", "--core=0"]
    if os.geteuid() != 0:
        args.append(f"--nproc={pids}")
    return [*args, "--"]


def rlimit_enforcement() -> str:
    return "rlimit" if os.geteuid() != 0 else "rlimit(no-pids-cap-as-root)"
