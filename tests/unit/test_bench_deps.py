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
