"""What the security scanners (`validation.scanners`, docs/scanners.md) cost one validation: the same small change
validated with and without them, side by side, in alternating rounds, through the real stack (Temporal dev server,
PostgreSQL, in-process pools, the chosen sandbox backend).

The repository: a calc module, a dozen modules of ordinary code and a pytest suite of 20 tests. The change fixes the
bug and touches three files (one requirement added). Each round submits one item without scanners and one with
`"scanners": {"secrets": "flag", "python": "flag"}` (so both pass and land), and reads from the item's events the
validation's wall time (from the `validating` state to `validation_finished`) and the whole item's (submit to result).
The first round with scanners builds the scanner kit (copied once per worker and version); it is shown apart.

    .venv/bin/python bench/scanners.py [--rounds 5] [--backend bwrap]
"""

from __future__ import annotations

import argparse
import asyncio
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

BUGGY = "def add(a, b):\n    return a - b\n"
RIGHT = "def add(a, b):\n    return a + b\n"
MODULE = '''"""Module {n}: ordinary code the scanners read."""

import json
import os


def load(path):
    with open(path) as f:
        return json.load(f)


def env(name, default=None):
    return os.environ.get(name, default)


def total(values):
    return sum(v for v in values if v is not None)
'''
TESTS = "from calc import add\n\n" + "".join(
    f"\ndef test_add_{i}():\n    assert add({i}, 1) == {i + 1}\n" for i in range(20)
)
PYTEST = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"]


def repo_files() -> dict[str, str]:
    files = {"calc.py": BUGGY, "tests/test_calc.py": TESTS, "conftest.py": "", "requirements.txt": "requests==2.31.0\n"}
    files.update({f"pkg/mod_{n}.py": MODULE.format(n=n) for n in range(12)})
    return files


def spec(repo: Path, scanners: bool) -> dict[str, Any]:
    validation: dict[str, Any] = {"command": PYTEST, "junit_path": ".crewwork/junit.xml", "timeout_s": 120}
    if scanners:
        validation["scanners"] = {"secrets": "flag", "python": "flag"}
    change = {
        "calc.py": RIGHT,
        "pkg/mod_0.py": MODULE.format(n=0)
        + "\n\ndef run(cmd):\n    import subprocess\n\n    return subprocess.call(cmd)\n",
        "requirements.txt": "requests==2.31.0\npyyaml>=6.0\n",
    }
    return code_change_spec(
        repo,
        validation=validation,
        agent={"name": "scripted", "config": {"files": change}},
        budget={"max_attempts": 1},
    )


async def one(service: Any, store: Any, tenant: str, repo: Path, scanners: bool) -> tuple[float, float]:
    from crewwork.models import WorkItemSpec

    start = time.perf_counter()
    res = await service.submit(tenant, WorkItemSpec.model_validate(spec(repo, scanners)))
    wid = str(res.row.id)
    while True:
        row = await store.get_work_item(wid)
        if row is not None and row.state in ("succeeded", "failed", "dead", "cancelled"):
            break
        await asyncio.sleep(0.1)
    whole = time.perf_counter() - start
    assert row.state == "succeeded", (row.state, scanners)
    events = await store.list_events(wid)
    began = next(e.created_at for e in events if e.type == "state_changed" and e.data.get("state") == "validating")
    ended = next(e.created_at for e in events if e.type == "validation_finished")
    return ended - began, whole


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-scanners-") as tmp, dev_server(Path(tmp) / "temporal") as temporal:
        with pg_database("crewwork_bench_scan") as (url, _name):
            settings = bench_settings(Path(tmp) / "data", temporal, url, sandbox_backend=args.backend)
            async with in_process_pools(settings) as (service, store, tenant):
                rows: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
                first: tuple[float, float] | None = None
                for r in range(args.rounds + 1):
                    for scanners in (False, True):
                        repo = make_repo(Path(tmp) / f"repo-{r}-{int(scanners)}", repo_files())
                        got = await one(service, store, tenant, repo, scanners)
                        if r == 0:  # warm-up: the prepared caches, and the scanner kit's one-time build
                            if scanners:
                                first = got
                            continue
                        rows[scanners].append(got)
    base_v = statistics.median(v for v, _ in rows[False])
    out = []
    for scanners in (False, True):
        vs = [v for v, _ in rows[scanners]]
        ws = [w for _, w in rows[scanners]]
        out.append(
            [
                "tests + scanners" if scanners else "tests only",
                statistics.median(vs),
                min(vs),
                max(vs),
                statistics.median(ws),
                statistics.median(vs) / base_v,
            ]
        )
    print(f"backend {args.backend}, {args.rounds} rounds each (alternating), median / min / max seconds\n")
    print(table(["validation", "validate s", "min", "max", "item s", "validate vs tests only"], out))
    if first is not None:
        print(f"\nfirst item with scanners (builds the kit): validation {first[0]:.2f} s, item {first[1]:.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--backend", default="bwrap")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
