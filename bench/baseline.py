"""What the baseline at the base commit costs (validation.baseline, docs/lifecycle.md): the same work item validated
with the baseline off, on with a cold cache (a new base commit each round), and on with the baseline cached (the same
base again), side by side in alternating rounds, through the real stack (Temporal dev server, in-process pools,
bubblewrap, PostgreSQL).

The repository has `--tests` passing tests and one that fails at the base and after (a pre-existing failure); the
scripted agent fixes a bug, so with the baseline off the item fails (the pre-existing failure counts) and with it on
the item passes. Wall seconds from submission to the result, and this process's CPU seconds with its waited children
(the sandboxes) in that time.

    .venv/bin/python bench/baseline.py [--tests 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import GIT_ENV, bench_settings, dev_server, in_process_pools, make_repo, pg_database, table
from crewwork.admission.starts import workflow_result
from crewwork.api.service import WorkItemService
from crewwork.models import WorkItemResult, WorkItemSpec

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
PYTEST = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"]


def files(tests: int) -> dict[str, str]:
    out = {"calc.py": BUGGY, "conftest.py": "", "tests/test_legacy.py": "def test_legacy():\n    assert False\n"}
    out["tests/test_add.py"] = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    for f in range(0, tests, 100):
        out[f"tests/test_many_{f // 100}.py"] = "".join(
            f"\ndef test_{n}():\n    assert {n} == {n}\n" for n in range(f, min(f + 100, tests))
        )
    return out


def new_base(repo: Path, n: int) -> None:
    (repo / "NOTES").write_text(f"base {n}\n")
    for cmd in (["git", "add", "-A"], ["git", "commit", "-q", "-m", f"base {n}"]):
        subprocess.run(cmd, cwd=repo, check=True, env=GIT_ENV)


def spec(repo: Path, baseline: str) -> WorkItemSpec:
    return WorkItemSpec.model_validate(
        {
            "kind": "code_change",
            "repo": {"url": str(repo), "ref": "main"},
            "instruction": "fix add",
            "validation": {
                "command": PYTEST,
                "junit_path": ".crewwork/junit.xml",
                "timeout_s": 300,
                "baseline": baseline,
            },
            "agent": {"name": "scripted", "config": {"files": {"calc.py": FIXED}}},
            "budget": {"max_attempts": 1},
            "review": {"required": False},
        }
    )


def cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


async def one(service: WorkItemService, client: Any, tenant: str, item: WorkItemSpec) -> tuple[float, float, Any]:
    c0, t0 = cpu(), time.perf_counter()
    res = await service.submit(tenant, item)
    result = await workflow_result(client, res.row.workflow_id, WorkItemResult)
    return time.perf_counter() - t0, cpu() - c0, result


async def run(tests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, pg_database() as (url, _), dev_server(Path(tmp) / "t") as temporal:
        repo = make_repo(Path(tmp) / "repo", files(tests))
        settings = bench_settings(Path(tmp) / "d", temporal, url, sandbox_backend="bwrap", auto_register_repos=True)
        rows: dict[str, list[tuple[float, float]]] = {"baseline off": [], "baseline cold": [], "baseline cached": []}
        states: dict[str, set[str]] = {k: set() for k in rows}
        async with in_process_pools(settings) as (service, _store, tenant):
            client = service.client
            await one(service, client, tenant, spec(repo, "off"))  # warm-up: mirror, sandbox interpreter
            for n in range(rounds):
                new_base(repo, n)
                for name, mode in (
                    ("baseline off", "off"),
                    ("baseline cold", "compare"),
                    ("baseline cached", "compare"),
                ):
                    wall, cpu_s, result = await one(service, client, tenant, spec(repo, mode))
                    rows[name].append((wall, cpu_s))
                    v = result.attempts[0].validation
                    cached = [r.cached for r in v.extra_runs]
                    states[name].add(f"{result.state} {v.cause} extra_runs cached={cached}")
    print(f"{tests + 2} tests, {rounds} rounds (medians)")
    print(
        table(
            ["validation", "wall s", "CPU s", "outcome"],
            [
                [
                    name,
                    f"{statistics.median(w for w, _ in xs):.2f}",
                    f"{statistics.median(c for _, c in xs):.2f}",
                    "; ".join(sorted(states[name])),
                ]
                for name, xs in rows.items()
            ],
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(run(args.tests, args.rounds))


if __name__ == "__main__":
    main()
