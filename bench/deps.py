"""Up-front checks of a benchmark's optional dependencies (the `bench` extra), so a run that cannot finish says what
to install before it starts anything, instead of failing with a traceback minutes in. Standard library only: it runs
before any of those imports."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

INSTALL = "pip install -e '.[bench]'  (or: make install, then .venv/bin/pip install -e '.[bench]')"

# import name -> distribution to install
PACKAGES = {
    "psycopg": "psycopg[binary,pool]",
    "psycopg_pool": "psycopg[binary,pool]",
    "procrastinate": "procrastinate",
    "dbos": "dbos",
}


def missing(modules: Sequence[str], programs: Sequence[str] = ()) -> list[str]:
    """The distributions (or programs) among these that are not installed."""
    out = []
    for m in modules:
        if importlib.util.find_spec(m) is None:
            out.append(PACKAGES.get(m, m))
    for prog in programs:
        if shutil.which(prog) is None and not (Path(sys.executable).parent / prog).exists():
            out.append(prog)
    return sorted(set(out))


def require(script: str, modules: Sequence[str], programs: Sequence[str] = (), hint: str = "") -> None:
    """Exit with status 2 and a message naming what to install when anything is missing."""
    gone = missing(modules, programs)
    if not gone:
        return
    print(
        f"{script}: missing {', '.join(gone)}; install the benchmark extra first:\n  {INSTALL}"
        + (f"\n{hint}" if hint else ""),
        file=sys.stderr,
    )
    sys.exit(2)


def stop_on_sigterm() -> None:
    """Let SIGTERM (`timeout`, a CI runner's cancel, `kill`) end a benchmark as Ctrl-C does, through every `finally`
    and `with` that stops what it started. Python's default for SIGTERM ends the process at once, and the stack a
    benchmark had started (its PostgreSQL database, Temporal dev server and pools) kept running until killed by hand.
    Call it first thing in an entry point; a process that set its own handler keeps it."""
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
