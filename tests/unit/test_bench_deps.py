"""Benchmarks that need the peers' packages say what to install before running anything (the `bench` extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.deps import missing

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_dependency_stops_the_benchmark_up_front_with_what_to_install() -> None:
    res = subprocess.run(
        [sys.executable, "-c", "from bench.deps import require; require('bench/x.py', ['json', 'no_such_module_zz'])"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "bench/x.py: missing no_such_module_zz" in res.stderr and "[bench]" in res.stderr
    assert missing(["json"]) == [] and missing([], ["no-such-program-zz"]) == ["no-such-program-zz"]


def test_the_peer_benchmarks_check_before_they_start() -> None:
    gone = missing(["psycopg", "psycopg_pool", "procrastinate", "dbos"])
    if not gone:
        return  # the extra is installed here: the scripts would run for real, which is not this test's job
    for script in (["bench/peers/run.py", "--quick"], ["bench/load.py", "--quick"]):
        res = subprocess.run([sys.executable, *script], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, (script, res.stdout[-500:], res.stderr[-500:])
        assert "missing" in res.stderr and "pip install" in res.stderr and res.stdout == ""


def test_the_report_renders_every_committed_result() -> None:
    # docs/performance.md's tables are rendered from bench/results by bench/report.py: a benchmark that changes the
    # shape of its results must keep the report working (it once failed on chaos.json's p95).
    res = subprocess.run(
        [sys.executable, "bench/report.py"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    for name in ("overhead", "load", "peers", "components", "scaling", "chaos"):
        if (ROOT / "bench" / "results" / f"{name}.json").exists():
            assert f"### {name}" in res.stdout, name
