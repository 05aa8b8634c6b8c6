"""A warm template process that forks the agent pool's children, so that a new child costs a fork, not an import.

An agent child (crewwork.agents.child) must import the agents, the sandboxes and their settings before it can serve a
call: 0.4 s of CPU on a quiet machine, several seconds of wall time on a busy one, paid again for every child a kill
or a crash replaces. A pool that is being flooded with crashing or cancelled agent code replaces children all the
time, and an ordinary item that lands on a slot whose child is still importing waits for it. So each pool process
starts one *zygote*: `python -P -m crewwork.agents.zygote FD` imports all of that once, runs no agent code itself,
and forks a child per request. A forked child has the imports already done and says `ready` within milliseconds.

The zygote is started from a fresh interpreter, not forked from the pool: it holds none of the pool's memory (store
connections, Temporal clients, secrets read into memory), only the pool's environment at its start, which a child
replaces by the environment of each call anyway (crewwork.agents.child). Each child gets its own session and
process group (`setsid`), its socket pair end and nothing else of the zygote's: the control socket and the
zygote's wake-up pipe are closed right after the fork. Agent code in a child can signal the zygote (same uid), as
it could signal the pool itself before; if the zygote dies, the pool kills every child it had forked (their exit
codes could not be told any more) and starts a new zygote for the next child.

Protocol on the control socket (a socket pair, pool <-> zygote):
- pool -> zygote: one byte `f` with one file descriptor attached (SCM_RIGHTS): fork a child that serves it;
- zygote -> pool, fixed 9-byte frames `!cii`: `P pid 0` (forked, in request order), `F 0 errno` (the fork failed),
  `X pid code` (a child exited; `code` as `subprocess.Popen.returncode`: the exit status, or minus the signal).
Frames are fixed-size structs, not pickles: the pool unpickles nothing from another process.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections import deque

log = logging.getLogger("crewwork.agents.zygote")

FRAME = struct.Struct("!cii")
START_TIMEOUT_S = 60.0
"""How long a spawn waits for the zygote to say which pid it forked (its own imports come first)."""


class ForkedChild:
    """A child forked by the zygote, seen from the pool: what `subprocess.Popen` offers for a child process (pid,
    poll, wait), fed by the zygote's frames instead of `waitpid` (the child is the zygote's, not ours)."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self.returncode: int | None = None
        self._known = threading.Event()
        self._exited = threading.Event()

    def _set_pid(self, pid: int) -> None:
        self._pid = pid
        self._known.set()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._known.set()
        self._exited.set()

    @property
    def pid(self) -> int | None:
        """The child's pid once the zygote has forked it (waits for that), None if it never was."""
        self._known.wait(START_TIMEOUT_S)
        return self._pid

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired("agent child", timeout or 0)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """The pool's side of one zygote process: forks children on request and tells their exits."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self._sock = ours
        fd = theirs.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "crewwork.agents.zygote", str(fd)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        theirs.close()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: deque[ForkedChild] = deque()
        self._children: dict[int, ForkedChild] = {}
        self.dead = False
        self._reader = threading.Thread(target=self._read, name="crewwork-zygote", daemon=True)
        self._reader.start()

    def spawn(self, fd: int) -> ForkedChild:
        """Ask for a child serving `fd` (our copy stays ours to close). Returns at once; the pid comes later."""
        child = ForkedChild()
        # Requests are sent in the order their children are queued (the zygote answers in that order), but never
        # with `_lock` held: the reader takes it for every frame, and a sender blocked on a full socket while
        # holding it could wait for a zygote that waits for us to read.
        with self._send_lock:
            with self._lock:
                if self.dead:
                    child._set_exit(-signal.SIGKILL)
                    return child
                self._pending.append(child)
            try:
                socket.send_fds(self._sock, [b"f"], [fd])
            except OSError:
                with self._lock:
                    if child in self._pending:
                        self._pending.remove(child)
                child._set_exit(-signal.SIGKILL)
        return child

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while len(buf) >= FRAME.size:
                kind, pid, code = FRAME.unpack_from(buf)
                buf = buf[FRAME.size :]
                self._frame(kind, pid, code)
        self._died()

    def _frame(self, kind: bytes, pid: int, code: int) -> None:
        with self._lock:
            if kind == b"P" and self._pending:
                child = self._pending.popleft()
                self._children[pid] = child
                child._set_pid(pid)
            elif kind == b"F" and self._pending:
                log.warning("the agent zygote could not fork: %s", os.strerror(code))
                self._pending.popleft()._set_exit(-signal.SIGKILL)
            elif kind == b"X":
                exited = self._children.pop(pid, None)
                if exited is not None:
                    exited._set_exit(code)

    def _died(self) -> None:
        """The zygote is gone: its children's exits can no longer be told, so they are killed and count as dead."""
        with self._lock:
            self.dead = True
            pending, self._pending = list(self._pending), deque()
            children, self._children = dict(self._children), {}
        for child in pending:
            child._set_exit(-signal.SIGKILL)
        for pid, child in children.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            child._set_exit(-signal.SIGKILL)
        if children or pending:
            log.warning(
                "the agent zygote is gone (exit code %s); the %d children it had forked were killed",
                self.proc.poll(),
                len(children) + len(pending),
            )
        with contextlib.suppress(OSError):
            self._sock.close()


_zygote: Zygote | None = None
_zygote_pid = 0
_zygote_lock = threading.Lock()


def zygote() -> Zygote:
    """This process's zygote, started on first use and again if it died."""
    global _zygote, _zygote_pid
    with _zygote_lock:
        if _zygote is None or _zygote.dead or _zygote_pid != os.getpid() or _zygote.proc.poll() is not None:
            _zygote = Zygote()
            _zygote_pid = os.getpid()
        return _zygote


# ------------------------------------------------------------------------------------------------- the zygote itself


def _forked(fd: int, closing: list[int]) -> None:
    """In a fresh fork: become a child of our own session and serve `fd` (never returns)."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for other in closing:
            with contextlib.suppress(OSError):
                os.close(other)
        from crewwork.agents.child import main

        code = main([str(fd)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(ctrl_fd: int) -> int:
    # Everything a child needs, imported once here so that no child pays for it.
    import crewwork.agents.child
    import crewwork.agents.classes
    import crewwork.sandbox.backends  # noqa: F401

    ctrl = socket.socket(fileno=ctrl_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def send(kind: bytes, pid: int, code: int) -> None:
        ctrl.sendall(FRAME.pack(kind, pid, code))

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send(b"X", pid, os.waitstatus_to_exitcode(status))

    try:
        while True:
            try:
                ready, _, _ = select.select([ctrl.fileno(), wake_r], [], [])
            except InterruptedError:
                continue
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                reap()
            if ctrl.fileno() in ready:
                msg, fds, _flags, _addr = socket.recv_fds(ctrl, 1, 4)
                if not msg:
                    return 0  # the pool is gone
                for fd in fds[1:]:
                    os.close(fd)
                if not fds:
                    continue
                try:
                    pid = os.fork()
                except OSError as exc:
                    os.close(fds[0])
                    send(b"F", 0, exc.errno or errno.EAGAIN)
                    continue
                if pid == 0:
                    _forked(fds[0], [ctrl.fileno(), wake_r, wake_w])
                os.close(fds[0])
                send(b"P", pid, 0)
                reap()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the pool is gone


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
