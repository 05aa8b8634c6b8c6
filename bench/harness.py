"""Shared machinery of the benchmarks: throwaway PostgreSQL databases, a Temporal dev server, in-process pools,
percentiles, tables and the JSON results file.

Every benchmark measures the things it compares side by side in one run on the same machine, and prints ratios
next to the absolute figures: the machines are shared and noisy, so only ratios travel.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Benchmarks run as the test suite does: repositories registered on first use, fault injection on (chaos runs),
# remotes on loopback allowed.
os.environ.setdefault("CREWWORK_AUTO_REGISTER_REPOS", "true")
os.environ.setdefault("CREWWORK_TEST_FAULTS", "true")
os.environ.setdefault("CREWWORK_REPO_ALLOW_NETWORKS", "127.0.0.0/8,::1/128")  # the benchmarks' git servers

from crewwork.config import Settings  # noqa: E402
from crewwork.store.db import upgrade_sync  # noqa: E402
from crewwork.store.store import Store  # noqa: E402
from crewwork.temporal.devserver import DevServer, free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PG_ADMIN = os.environ.get("CREWWORK_BENCH_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432")


# ------------------------------------------------------------------------------------------------ services


def psql(sql: str, db: str = "postgres") -> str:
    return subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-qAtc", sql],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@contextlib.contextmanager
def pg_database(prefix: str = "crewwork_bench", migrate: bool = True) -> Iterator[tuple[str, str]]:
    """A throwaway PostgreSQL database: yields (SQLAlchemy async URL, database name); dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    psql(f"CREATE DATABASE {name}")
    url = f"{PG_ADMIN}/{name}"
    try:
        if migrate:
            import concurrent.futures

            # In a thread: callers may already run an event loop, and the migration runs its own.
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                ex.submit(upgrade_sync, url).result()
        yield url, name
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class InMemoryDevServer(DevServer):
    """The same dev server without its SQLite file (state in memory): no fsync per transition."""

    def command(self) -> list[str]:
        cmd = super().command()
        i = cmd.index("--db-filename")
        return cmd[:i] + cmd[i + 2 :]


@contextlib.contextmanager
def dev_server(
    data_dir: Path, memory: bool | None = None, dynamic_config: dict[str, str] | None = None
) -> Iterator[DevServer]:
    """The Temporal dev server. With a persistent file by default (as `crewwork dev` runs it); in memory with
    `memory=True` or CREWWORK_BENCH_TEMPORAL_MEMORY=1. `dynamic_config`: server dynamic config values."""
    if memory is None:
        memory = os.environ.get("CREWWORK_BENCH_TEMPORAL_MEMORY", "") in ("1", "true")
    server = (InMemoryDevServer if memory else DevServer)(
        data_dir, port=free_port(), ui=False, dynamic_config=dynamic_config
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def bench_settings(data_dir: Path, temporal: DevServer, db_url: str, **kw: Any) -> Settings:
    if "sandbox_backend" in kw:  # shorthand for the nested section's field
        from crewwork.config.sandbox import SandboxSettings

        kw["sandbox"] = SandboxSettings(backend=kw.pop("sandbox_backend"))
    return Settings(
        data_dir=data_dir,
        database_url=db_url,
        temporal_address=temporal.address,
        task_queue_prefix=f"b{uuid.uuid4().hex[:8]}",
        **kw,
    )


@contextlib.asynccontextmanager
async def in_process_pools(
    settings: Settings, pools: Sequence[str] = ("control", "agent", "validate")
) -> AsyncIterator[tuple[Any, Store, str]]:
    """crewwork's worker pools in this process (as tests/conftest.running_crew): yields (service, store, tenant)."""
    from crewwork.api.service import WorkItemService
    from crewwork.temporal.client import connect
    from crewwork.workers.pools import build_worker

    store = Store(
        settings.resolved_database_url(),
        pool_size=settings.db_pool_size,
        pre_ping=False,
        server_writes=settings.store_server_writes,
    )  # as the pools
    client = await connect(settings)
    workers = [build_worker(p, client, store, settings) for p in pools]
    service = WorkItemService(store, client, settings)
    tenant = await store.ensure_tenant(f"bench-{uuid.uuid4().hex[:6]}")
    async with contextlib.AsyncExitStack() as stack:
        for w in workers:
            await stack.enter_async_context(w)
        yield service, store, tenant
    await store.close()


GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@x",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@x",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "PATH": os.environ.get("PATH", ""),
}


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(content)
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "base"]):
        subprocess.run(cmd, cwd=path, check=True, env=GIT_ENV)
    return path


# A validation that passes trivially but is real evidence: exit 0 and a JUnit report with one passing test.
PASSING_JUNIT = (
    "import pathlib; p = pathlib.Path('.crewwork/junit.xml'); p.parent.mkdir(exist_ok=True); "
    'p.write_text(\'<testsuite name="b" tests="1" failures="0" errors="0">'
    '<testcase classname="t" name="test_ok" time="0.001"/></testsuite>\')'
)
TRIVIAL_VALIDATION = {
    "command": ["python3", "-c", PASSING_JUNIT],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
}


def task_spec(delay_s: float = 0.0, **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "task",
        "instruction": "no-op",
        "input": {"n": 1},
        "agent": {"name": "scripted", "config": {"output": {"ok": True}, "delay_s": delay_s}},
        "budget": {"max_attempts": 3},
    }
    spec.update(kw)
    return spec


def code_change_spec(repo: Path, **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "no-op change",
        "validation": TRIVIAL_VALIDATION,
        "agent": {"name": "scripted", "config": {"files": {"note.txt": "changed\n"}}},
        "budget": {"max_attempts": 2},
        "review": {"required": False},  # measured to the landing, without a person in the loop
    }
    spec.update(kw)
    return spec


# ------------------------------------------------------------------------------------------------ figures


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank), 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return float(s[k])


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p95": pct(values, 95),
        "p99": pct(values, 99),
        "mean": statistics.fmean(values) if values else 0.0,
        "max": max(values) if values else 0.0,
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


LOAD_AT_START = os.getloadavg()
"""The load average when the benchmark's process started (this module is imported first thing)."""


def machine() -> dict[str, Any]:
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        # The load when the benchmark started, and now (at the end, when its results are written): a figure is read
        # against the first, and the second says whether the machine stayed quiet.
        "loadavg_at_start": LOAD_AT_START,
        "loadavg_now": os.getloadavg(),
    }


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(), **data}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"\nresults written to {path.relative_to(ROOT)}")
    return path


def rss_mb(pid: int) -> float:
    """Resident set size of a process (and nothing else), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and of every process below it, live or ended: for each process in the tree its own
    user + system time and that of its children it has reaped (an ended child's time moves into its parent's, so
    a difference over a run loses nothing that a process of the tree waited for). An agent pool's slots run agent
    code in child processes forked by its zygote (crewwork.agents.isolation): their CPU is the pool's."""
    by_parent: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            by_parent.setdefault(ppid, []).append(int(d.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
        todo.extend(by_parent.get(p, []))
    return total


def postgres_cpu_s() -> float:
    """CPU seconds used so far by every PostgreSQL server process on this host (backends come and go, so only a
    difference over a run where no backend exited is exact; pools keep their connections open)."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() in ("postgres", "postmaster"):
                    total += proc_cpu_s(int(d.name))
            except OSError:
                continue
    return total


def children_cpu_s(parent: int | None = None) -> dict[int, float]:
    """CPU seconds so far of each live child process of `parent` (default: this one), by pid: the agent slots'
    child processes (crewwork.agents.isolation) run the agent code of in-process pools."""
    parent = os.getpid() if parent is None else parent
    out: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            out[int(d.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


class CpuMeter:
    """CPU seconds used during a block by: this process, its child processes (agent slots' children), the Temporal
    server, PostgreSQL."""

    def __init__(self, temporal_pid: int) -> None:
        self.temporal_pid = temporal_pid
        self.used: dict[str, float] = {}

    def __enter__(self) -> CpuMeter:
        self._children = children_cpu_s()
        self._start = (time.process_time(), proc_cpu_s(self.temporal_pid), postgres_cpu_s())
        return self

    def __exit__(self, *exc: object) -> None:
        me, t, pg = self._start
        after = children_cpu_s()
        # A child started during the block counts from zero; one that ended during it is lost (they are persistent).
        kids = sum(v - self._children.get(pid, 0.0) for pid, v in after.items() if pid != self.temporal_pid)
        self.used = {
            "bench_process": time.process_time() - me,
            "children": kids,
            "temporal": proc_cpu_s(self.temporal_pid) - t,
            "postgres": postgres_cpu_s() - pg,
        }

    def per_item_ms(self, n: int) -> dict[str, float]:
        return {k: 1000 * v / n for k, v in self.used.items()}


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until `url` answers with anything but a 5xx, from the process `proc` a benchmark started; exits with a message
    naming the URL if the process ends first or the time runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: {url} exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench: {url} did not become ready in {timeout_s:g} s")
