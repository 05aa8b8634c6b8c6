"""What named checks (`validation.checks`, docs/checks.md) and the security scanners cost one attempt: the same change
validated three ways, side by side, in alternating rounds, through the real stack (Temporal dev server, PostgreSQL,
in-process pools, the bwrap sandbox):

- tests only;
- tests + lint (pyflakes) + types (mypy --strict), each check in its own sandbox beside the tests;
- tests + lint + types + the security scanners (secrets, Bandit; `flag`, so every variant passes and lands).

The repository: a typed calc module, a dozen ordinary modules and 20 tests; its environment (python3, with pytest,
pyflakes and mypy installed from a loopback package index: tests/repos/pkgindex.py, nothing fetched) is prepared once
in the warm-up round and reused by every item (the same environment, so the same prepared entry). Each item is one
attempt. Figures per variant: the validation's wall time (the `validating` state to `validation_finished`), the
whole item's (submit to result), and the machine's busy CPU seconds over the item (every process: the sandboxes,
this process's pools, Temporal and PostgreSQL), so the benchmark refuses a busy machine.

    .venv/bin/python bench/checks.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    bench_settings,
    code_change_spec,
    dev_server,
    in_process_pools,
    make_repo,
    pg_database,
    table,
)

BUGGY = "def add(a: int, b: int) -> int:\n    return a - b\n"
RIGHT = "def add(a: int, b: int) -> int:\n    return a + b\n"
MODULE = '''"""Module {n}: ordinary typed code the checks read."""

import json
import os


def load(path: str) -> object:
    with open(path) as f:
        return json.load(f)


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def total(values: list[int | None]) -> int:
    return sum(v for v in values if v is not None)
'''
TESTS = "from calc import add\n\n" + "".join(
    f"\ndef test_add_{i}() -> None:\n    assert add({i}, 1) == {i + 1}\n" for i in range(20)
)
PYTEST = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"]
MYPY = ["mypy==2.4.1", "mypy_extensions==1.2.0", "typing_extensions==4.16.0", "pathspec==1.1.1", "librt==0.17.0"]
MYPY += ["ast-serialize==0.13.1"]
VARIANTS = ("tests only", "tests + lint + types", "tests + lint + types + scanners")


def repo_files() -> dict[str, str]:
    files = {"calc.py": BUGGY, "tests/test_calc.py": TESTS, "tests/__init__.py": "", "conftest.py": ""}
    files.update({f"pkg/mod_{n}.py": MODULE.format(n=n) for n in range(12)})
    files["pkg/__init__.py"] = ""
    return files


def spec(repo: Path, index_url: str, variant: str) -> dict[str, Any]:
    validation: dict[str, Any] = {"command": PYTEST, "junit_path": ".crewwork/junit.xml", "timeout_s": 180}
    if variant != VARIANTS[0]:
        validation["checks"] = [
            {"name": "lint", "command": ["python", "-m", "pyflakes", "calc.py", "pkg"]},
            {"name": "types", "command": ["python", "-m", "mypy", "--strict", "--no-incremental", "calc.py", "pkg"]},
        ]
    if variant == VARIANTS[2]:
        validation["scanners"] = {"secrets": "flag", "python": "flag"}
    pip = ["python", "-m", "pip", "install", "--no-cache-dir", "-q", "--index-url", index_url]
    return code_change_spec(
        repo,
        environment={
            "python": "/usr/bin/python3",
            "setup": [[*pip, "pytest==8.3.5", "pyflakes==3.4.0", *MYPY]],
            "network": True,
        },
        validation=validation,
        agent={"name": "scripted", "config": {"files": {"calc.py": RIGHT}}},
        budget={"max_attempts": 1},
    )


def cpu_s() -> float:
    """Busy CPU seconds of the whole machine (/proc/stat: every process, the sandboxes, Temporal and PostgreSQL
    included): the benchmark wants a quiet machine, and checks its load before it starts."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


async def one(service: Any, store: Any, tenant: str, item: dict[str, Any]) -> tuple[float, float, float]:
    from crewwork.models import WorkItemSpec

    start, cpu = time.perf_counter(), cpu_s()
    res = await service.submit(tenant, WorkItemSpec.model_validate(item))
    wid = str(res.row.id)
    while True:
        row = await store.get_work_item(wid)
        if row is not None and row.state in ("succeeded", "failed", "dead", "cancelled"):
            break
        await asyncio.sleep(0.1)
    whole, used = time.perf_counter() - start, cpu_s() - cpu
    assert row.state == "succeeded", (row.state, row.reason)
    events = await store.list_events(wid)
    began = next(e.created_at for e in events if e.type == "state_changed" and e.data.get("state") == "validating")
    ended = next(e.created_at for e in events if e.type == "validation_finished")
    return ended - began, whole, used


async def main_async(args: argparse.Namespace) -> None:
    from crewwork.sandbox.prepare import PreparedEnvCache
    from tests.repos.pkgindex import PackageIndex, packages_ready

    ok, why = packages_ready()
    if not ok:
        sys.exit(f"bench/checks.py needs the test packages: {why}")
    load = os.getloadavg()[0]
    if load > 1.5 and not args.loaded:
        sys.exit(
            f"bench/checks.py measures the machine's CPU: load is {load:.1f}; run it on a quiet machine (--loaded)"
        )
    rows: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-checks-") as tmp_name, dev_server(Path(tmp_name) / "t") as temporal:
        tmp = Path(tmp_name)
        with pg_database("crewwork_bench_checks") as (url, _name), PackageIndex(tmp / "index") as index:
            settings = bench_settings(
                tmp / "data", temporal, url, sandbox_backend="bwrap", setup_network_allowlist=index.hostport
            )
            async with in_process_pools(settings) as (service, store, tenant):
                repo = make_repo(tmp / "repo", repo_files())
                try:
                    for r in range(args.rounds + 1):
                        for variant in VARIANTS:
                            got = await one(service, store, tenant, spec(repo, index.url, variant))
                            print(f"round {r} {variant}: validate {got[0]:.2f} s, CPU {got[2]:.2f} s", file=sys.stderr)
                            if r > 0:  # round 0 warms the prepared environment and the scanner kit
                                rows[variant].append(got)
                finally:
                    # Prepared environments are mounted loop images while cached: unmounted before the directory goes.
                    PreparedEnvCache(tmp / "data" / "prepared", max_bytes=0).evict()
    base_v = statistics.median(v for v, _, _ in rows[VARIANTS[0]])
    base_c = statistics.median(c for _, _, c in rows[VARIANTS[0]])
    out = []
    for variant in VARIANTS:
        vs, ws, cs = ([x[i] for x in rows[variant]] for i in range(3))
        out.append(
            [
                variant,
                statistics.median(vs),
                min(vs),
                max(vs),
                statistics.median(ws),
                statistics.median(cs),
                statistics.median(vs) / base_v,
                statistics.median(cs) / base_c,
            ]
        )
    print(f"bwrap, {args.rounds} rounds each (alternating), medians (validate: min and max too), seconds\n")
    print(table(["attempt", "validate s", "min", "max", "item s", "CPU s", "validate x", "CPU x"], out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--loaded", action="store_true", help="run even though the machine is busy (CPU then counts it)")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
