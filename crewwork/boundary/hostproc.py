"""Bounds of the host's own child processes that work on tenant input: a git process on a tenant's repository, the
source parser of a repository map.

A wall clock stops a process that runs too long; it does not stop one that grows too large in the meantime (a
regular expression whose automaton explodes took a host `git grep` past 2 GiB in seconds). So every such child
starts through util-linux `prlimit`, which sets the limits on itself and then executes the program: the bound holds
from the program's first instruction, with no Python code run between fork and exec (a `preexec_fn` can deadlock in
a threaded process).

- **Memory** is RLIMIT_DATA: the heap and every private writable mapping (thread stacks included), which is what a
  regular expression, an inflated object or a parse tree takes. Read-only mappings of pack files are not counted, so
  a large repository is not mistaken for a large process. Past it allocation fails and the program ends with its
  own "out of memory" error; the host is untouched.
- **CPU** is RLIMIT_CPU, a backstop behind the caller's wall clock (set where the wall clock is short): a process
  orphaned by a crashed worker still ends.

`Profile`s name the limits per kind of process (`GIT`, `QUERY`, `PARSE`); `configure` sets them from the operator's
settings at a process's start (the API app, the worker pools), the defaults hold until then, and refuses to start
where `prlimit` is missing (a bound that silently does not apply is no bound). A process that never configured (the
offline `crewwork verify` on a laptop) runs its children unbounded there rather than not at all. docs/bounds.md lists
them.
"""

from __future__ import annotations

import enum
import math
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True)
class ChildLimits:
    """The rlimits one child process starts with."""

    memory_bytes: int
    """RLIMIT_DATA, bytes."""
    cpu_s: int | None = None
    """RLIMIT_CPU, seconds of CPU time (all threads); None: none besides the caller's wall clock."""

    def with_cpu_for(self, wall_clock_s: float, threads: int = 1) -> ChildLimits:
        """These limits with a CPU backstop for a process the caller stops after `wall_clock_s`: the most CPU it can
        use by then on `threads` threads, plus a second."""
        return ChildLimits(self.memory_bytes, math.ceil(wall_clock_s * max(1, threads)) + 1)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` started under these limits (unchanged where `prlimit` is missing: see the module's docstring)."""
        tool = prlimit_path()
        if tool is None:
            return list(argv)
        opts = [f"--data={self.memory_bytes}"]
        if self.cpu_s is not None:
            opts.append(f"--cpu={self.cpu_s}")
        return [tool, *opts, "--", *argv]


class Profile(enum.Enum):
    GIT = "git"
    """Any host git process (fetch, apply, capture, landing): CREWWORK_GIT_MEMORY_MB."""
    QUERY = "query"
    """A git process answering a tenant's question (search, read, log, diff): CREWWORK_GIT_QUERY_MEMORY_MB."""
    PARSE = "parse"
    """A repository map's source-parse worker: CREWWORK_CODEINTEL_PARSE_MEMORY_MB."""


DEFAULTS: dict[Profile, ChildLimits] = {
    Profile.GIT: ChildLimits(2048 * MIB),
    Profile.QUERY: ChildLimits(512 * MIB),
    Profile.PARSE: ChildLimits(512 * MIB),
}
DEFAULT_QUERY_GIT_THREADS = 2

_limits: dict[Profile, ChildLimits] = dict(DEFAULTS)
_query_threads = DEFAULT_QUERY_GIT_THREADS


def configure(*, git_memory_mb: int, query_memory_mb: int, parse_memory_mb: int, query_git_threads: int = 2) -> None:
    """Set this process's limits from the operator's settings (called once at a process's start). NoPrlimit when
    they cannot be applied here."""
    global _query_threads
    if prlimit_path() is None:
        raise NoPrlimit(
            "util-linux `prlimit` is not installed: crewwork bounds the memory of every host process on tenant input "
            "with it, and does not start without it (apt-get install util-linux)"
        )
    _limits[Profile.GIT] = ChildLimits(git_memory_mb * MIB)
    _limits[Profile.QUERY] = ChildLimits(query_memory_mb * MIB)
    _limits[Profile.PARSE] = ChildLimits(parse_memory_mb * MIB)
    _query_threads = query_git_threads


def configure_from(settings: Any) -> None:
    """`configure` from a `crewwork.config.Settings` (its `host` and `codeintel` sections; not imported here: the
    configuration package imports this one)."""
    configure(
        git_memory_mb=settings.git_memory_mb,
        query_memory_mb=settings.git_query_memory_mb,
        parse_memory_mb=settings.codeintel.parse_memory_mb,
        query_git_threads=settings.git_query_threads,
    )


def limits(profile: Profile) -> ChildLimits:
    return _limits[profile]


def query_git_threads() -> int:
    """Threads one git process answering a tenant may use (`grep.threads`)."""
    return _query_threads


def bounded(argv: Sequence[str], profile: Profile, *, wall_clock_s: float | None = None, threads: int = 1) -> list[str]:
    """`argv` started under `profile`'s limits (with a CPU backstop when the caller's wall clock is given)."""
    lim = _limits[profile]
    if wall_clock_s is not None:
        lim = lim.with_cpu_for(wall_clock_s, threads)
    return lim.argv(argv)


# What git (and glibc's regex engine inside it) says when an allocation fails under RLIMIT_DATA.
_EXHAUSTED = ("out of memory", "memory exhausted", "cannot allocate memory", "failed to create thread")


def exhausted(returncode: int, stderr: str) -> bool:
    """Whether a bounded child ended because it reached its memory or CPU bound (SIGXCPU, or an allocation
    failure in its own words)."""
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return True
    low = stderr.lower()
    return any(m in low for m in _EXHAUSTED)


class NoPrlimit(RuntimeError):
    """util-linux `prlimit` is missing: the host will not run a process on tenant input without its bounds."""


_PRLIMIT: list[str | None] = []


def prlimit_path() -> str | None:
    """util-linux `prlimit`, or None where it is not installed."""
    if not _PRLIMIT:
        _PRLIMIT.append(
            shutil.which("prlimit")
            or next((p for p in ("/usr/bin/prlimit", "/bin/prlimit") if os.access(p, os.X_OK)), None)
        )
    return _PRLIMIT[0]
