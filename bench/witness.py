"""What the outcome witness (crewwork/validation/witness_plugin.py) costs a pytest run: the same generated suite run
with and without the plugin, side by side, in alternating rounds, and what grading the streams costs the host.

The suite has `--tests` tests in files of 100: plain passing tests, a tenth failing, a tenth skipped from the code
under test (the case where the plugin walks the traceback). Each round runs pytest once without the plugin and once
with it (as the validate step loads it: on PYTHONPATH, `-p crewwork_witness` in PYTEST_ADDOPTS), in a subprocess of
this interpreter, and reads wall seconds and the child's CPU (`RUSAGE_CHILDREN`). Then `witness_doubts` is timed on
the streams and the JUnit report of the last round.

    .venv/bin/python bench/witness.py [--tests 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import table
from crewwork.steps.validate.witnessing import STREAMS_REL, install_plugin, read_streams
from crewwork.validation.parsers import parse_junit
from crewwork.validation.witness import witness_doubts

CALC = "import pytest\n\n\ndef add(a, b):\n    return a + b\n\n\ndef maybe_skip(n):\n    if n % 10 == 5:\n" \
       "        pytest.skip('skipped from the code under test')\n"  # fmt: skip


def make_suite(root: Path, tests: int) -> None:
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    for f in range(0, tests, 100):
        body = ["from calc import add, maybe_skip\n"]
        for n in range(f, min(f + 100, tests)):
            check = "add(1, 1) == 3" if n % 10 == 3 else "add(1, 1) == 2"
            body.append(f"\ndef test_{n}():\n    maybe_skip({n})\n    assert {check}\n")
        (root / "tests" / f"test_{f // 100:04d}.py").write_text("".join(body))


def run(root: Path, plugin: Path | None) -> tuple[float, float]:
    env = {**os.environ}
    env.pop("PYTEST_ADDOPTS", None)
    if plugin is not None:
        env.update(
            PYTHONPATH=str(plugin), PYTEST_ADDOPTS="-p crewwork_witness", CREWWORK_WITNESS_DIR=str(root / STREAMS_REL)
        )
        for old in (root / STREAMS_REL).glob("*.jsonl"):
            old.unlink()
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml", "tests"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=root, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "suite"
        make_suite(root, args.tests)
        (root / STREAMS_REL).mkdir(parents=True)
        plugin = install_plugin(Path(tmp) / "data")
        runs: dict[str, list[tuple[float, float]]] = {"without the witness": [], "with the witness": []}
        for _ in range(args.rounds):
            runs["without the witness"].append(run(root, None))
            runs["with the witness"].append(run(root, plugin))
        streams = read_streams(root).streams
        report = (root / ".crewwork" / "junit.xml").read_bytes()
        start = time.perf_counter()
        doubts = witness_doubts(expected=True, streams=streams, parsed=parse_junit(report), exit_code=1)
        judge_s = time.perf_counter() - start
    rows = []
    base = statistics.median(w for w, _ in runs["without the witness"])
    for name, samples in runs.items():
        wall = statistics.median(w for w, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        rows.append([name, wall, cpu, f"{wall / base:.2f}x"])
    print(f"pytest over {args.tests} tests (a tenth failing, a tenth skipped from the code under test), "
          f"median of {args.rounds} alternating rounds:")  # fmt: skip
    print(table(["run", "wall s", "CPU s", "wall vs without"], rows))
    size = sum(len(s) for s in streams.values())
    print(f"\nstreams: {size} bytes ({size / args.tests:.0f} per test); witness_doubts on them and the report: "
          f"{judge_s * 1000:.1f} ms, {len(doubts)} doubts (expected 0)")  # fmt: skip


if __name__ == "__main__":
    main()
