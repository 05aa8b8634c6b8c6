"""Bounded storage: what the store holds per 1,000 code-change items before and after storage by content (dedup and
compression) and retention, and what the retention work costs while items run.

Real items on the real stack (Temporal dev server, PostgreSQL, bubblewrap sandboxes): each a code change of the
demo's repository repaired once (attempt 1 fails its tests, attempt 2 passes, then it lands), so each has two diffs,
two validation logs, two JUnit reports and the agent's transcripts. Sizes are PostgreSQL's own
(`pg_total_relation_size`: heap, TOAST, indexes) of the tables retention touches, after `VACUUM FULL` so that what a
phase freed is not counted (in production, autovacuum makes it reusable rather than returning it), and the logical
bytes (artifact sizes before any compression). Per 1,000 items = measured over N items x 1000 / N.

Then the cost while items run: the same batch of items twice, once with nothing else running, once with the
retention passes (compaction, retention with a period of 0 days, collection) running in a loop over every item as
it ends (every second: what an hourly schedule does at once, spread thin); submit-to-done latency side by side, and
the CPU time of the passes. The repository has `--tests` tests besides the demo's two, run verbosely, so that each
validation log and JUnit report has the size of a real project's (two runs per item that share most of their lines).

    .venv/bin/python bench/storage.py [--items N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    bench_settings,
    dev_server,
    in_process_pools,
    make_repo,
    pct,
    pg_database,
    psql,
    table,
    write_results,
)
from crewwork.cli.demo import BUGGY, RIGHT, TEST, WRONG
from crewwork.models import WorkItemSpec
from crewwork.steps.retain.activity import keep_artifact
from crewwork.store.retention import RetentionPolicy

WARMUP = 4
TABLES = ("artifacts", "artifact_chunks", "artifact_parts", "events", "attempts", "work_items", "outbox")
VALIDATION = {
    "command": ["python", "-m", "pytest", "-v", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
    "test_files": ["tests/test_calc.py"],
}


def item(repo: Path, n: int) -> dict[str, Any]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "target_branch": f"b{n}",
        "instruction": f"Fix add() so the tests pass ({n})",
        "validation": VALIDATION,
        "agent": {
            "name": "scripted",
            "config": {"attempts": [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]},
        },
        "budget": {"max_attempts": 3},
        "review": {"required": False},
    }


async def run_batch(service: Any, store: Any, tenant: str, repo: Path, first: int, count: int) -> list[float]:
    """Submit `count` items at once; each one's submit-to-done seconds."""
    from crewwork.admission.starts import workflow_result
    from crewwork.models import WorkItemResult

    async def one(n: int) -> float:
        t0 = time.monotonic()
        res = await service.submit(tenant, WorkItemSpec.model_validate(item(repo, n)))
        out = await workflow_result(service.client, res.row.workflow_id, WorkItemResult)
        assert out.state == "succeeded", out.reason
        return time.monotonic() - t0

    return list(await asyncio.gather(*(one(first + i) for i in range(count))))


def sizes(db: str) -> dict[str, int]:
    psql("VACUUM FULL " + ", ".join(TABLES), db)
    rows = psql(
        "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname IN ("
        + ", ".join(f"'{t}'" for t in TABLES)
        + ") AND relkind = 'r'",
        db,
    )
    out = {}
    for line in rows.strip().splitlines():
        name, size = line.split("|")
        out[name] = int(size)
    return out


def logical(db: str) -> int:
    return int(psql("SELECT coalesce(sum(size), 0) FROM artifacts WHERE removed_at IS NULL", db).strip() or 0)


async def main(n_items: int, tests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, pg_database("crewwork_bench_storage") as (url, db):
        base = Path(tmp)
        many = (
            f"import pytest\n\n\n@pytest.mark.parametrize('n', range({tests}))\ndef test_case(n):\n    assert n >= 0\n"
        )
        repo = make_repo(
            base / "repo",
            {"calc.py": BUGGY, "tests/test_calc.py": TEST, "tests/test_many.py": many, "conftest.py": ""},
        )
        with dev_server(base / "temporal", memory=True) as temporal:
            settings = bench_settings(base / "data", temporal, url, sandbox_backend="bwrap")
            async with in_process_pools(settings) as (service, store, tenant):
                # Warm-up (the mirror's clone, the sandbox's interpreter): not part of either latency batch, and
                # counted in the store's figures with the rest.
                await run_batch(service, store, tenant, repo, -WARMUP, WARMUP)
                idle = await run_batch(service, store, tenant, repo, 0, n_items)
                figures: dict[str, Any] = {"items": n_items + WARMUP, "tests_per_run": tests + 2, "phases": {}}

                def phase(name: str) -> None:
                    s = sizes(db)
                    figures["phases"][name] = {"tables": s, "total": sum(s.values()), "logical_artifacts": logical(db)}

                phase("before")
                t0, c0 = time.monotonic(), time.process_time()
                compacted = 0
                while True:
                    done = await store.compact_artifacts(settle_s=0, limit=200)
                    compacted += done.artifacts
                    if done.artifacts < 200:
                        break
                figures["compaction"] = {
                    "artifacts": compacted,
                    "wall_s": time.monotonic() - t0,
                    "cpu_s": time.process_time() - c0,
                }
                phase("after dedup")
                psql("UPDATE work_items SET updated_at = updated_at - 40 * 86400", db)
                policy = RetentionPolicy(default_days=30)
                t0, c0 = time.monotonic(), time.process_time()
                retained = 0
                for wid in await store.retention_candidates(policy, limit=100_000):
                    retained += (await store.apply_retention(wid, policy, keep_artifact=keep_artifact)).applied
                while await store.collect_chunks(limit=1000):
                    pass
                figures["retention"] = {
                    "items": retained,
                    "wall_s": time.monotonic() - t0,
                    "cpu_s": time.process_time() - c0,
                }
                phase("after retention (30 days, all past it)")

                # The cost while items run: the same batch again, with the passes looping over items as they end.
                stop = asyncio.Event()
                reaper_cpu = [0.0]
                passes = [0]

                async def reaper() -> None:
                    now_policy = RetentionPolicy(default_days=1e-9)
                    while not stop.is_set():
                        c = time.process_time()
                        await store.compact_artifacts(settle_s=0, limit=100)
                        retained = 0
                        for wid in await store.retention_candidates(now_policy, limit=100):
                            res = await store.apply_retention(wid, now_policy, keep_artifact=keep_artifact)
                            retained += res.applied
                        if retained:
                            await store.collect_chunks(limit=1000)
                        reaper_cpu[0] += time.process_time() - c
                        passes[0] += 1
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), 1.0)

                task = asyncio.create_task(reaper())
                busy = await run_batch(service, store, tenant, repo, n_items, n_items)
                stop.set()
                await task
                figures["latency"] = {
                    "idle": {"p50": pct(idle, 50), "p95": pct(idle, 95)},
                    "with_reaper": {"p50": pct(busy, 50), "p95": pct(busy, 95)},
                    "reaper_passes": passes[0],
                    "reaper_cpu_s": reaper_cpu[0],
                }

    n_items = figures["items"]
    per = 1000 / n_items
    rows = []
    before = figures["phases"]["before"]["total"]
    for name, p in figures["phases"].items():
        rows.append(
            [
                name,
                f"{p['total'] * per / 2**20:.1f} MiB",
                f"{p['logical_artifacts'] * per / 2**20:.1f} MiB",
                f"{p['total'] / before:.2f}",
            ]
        )
    print(
        f"store size per 1,000 code-change items (measured over {n_items}, scaled x{per:.1f}; {tests + 2} tests per "
        "validation run, two runs per item):"
    )
    print(table(["phase", "tables on disk", "artifact bytes kept (logical)", "vs before"], rows))
    for name, p in figures["phases"].items():
        print(f"  {name}: " + ", ".join(f"{t} {v * per / 2**20:.1f}" for t, v in sorted(p["tables"].items())) + " MiB")
    c, r = figures["compaction"], figures["retention"]
    print(
        f"compaction: {c['artifacts']} artifacts in {c['wall_s']:.2f} s wall, {c['cpu_s']:.2f} s CPU "
        f"({c['cpu_s'] * per:.1f} s CPU per 1,000 items); retention: {r['items']} items in {r['wall_s']:.2f} s wall, "
        f"{r['cpu_s']:.2f} s CPU ({r['cpu_s'] * per:.1f} s CPU per 1,000 items)"
    )
    lat = figures["latency"]
    print(
        table(
            ["items run", "p50 submit-to-done", "p95"],
            [
                ["alone", f"{lat['idle']['p50']:.2f} s", f"{lat['idle']['p95']:.2f} s"],
                [
                    "with the retention passes looping",
                    f"{lat['with_reaper']['p50']:.2f} s",
                    f"{lat['with_reaper']['p95']:.2f} s",
                ],
                [
                    "ratio",
                    f"{lat['with_reaper']['p50'] / lat['idle']['p50']:.2f}",
                    f"{lat['with_reaper']['p95'] / lat['idle']['p95']:.2f}",
                ],
            ],
        )
    )
    print(f"retention passes while items ran: {lat['reaper_passes']}, {lat['reaper_cpu_s']:.2f} s CPU")
    write_results("storage", figures)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=30)
    ap.add_argument("--tests", type=int, default=300, help="tests in the repository besides the two of calc.py")
    args = ap.parse_args()
    asyncio.run(main(args.items, args.tests))
