#!/usr/bin/env bash
# The whole suite, as `make test` runs it: every test against the same real components, in two passes.
#   1. everything not marked `alone`, spread over CREWWORK_TEST_JOBS pytest-xdist workers (default 4). Each worker is
#      its own pytest session with its own PostgreSQL database and Temporal dev server (tests/conftest.py), so the
#      tests of one worker cannot see another's items, queues or histories. Most of the suite waits on real
#      processes (Temporal, sandboxes, git servers), so more workers than cores pays on these 2-core machines.
#   2. the tests marked `alone`, one at a time: those that read machine-wide state another session would disturb
#      (every sandbox container on the engine) or whose fault timing a loaded machine would distort.
# Extra arguments go to both passes (e.g. `-k preview`). Exits non-zero if either pass fails; a pass that selects
# nothing (exit 5) is not a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST="${VENV:-.venv}/bin/pytest"
JOBS="${CREWWORK_TEST_JOBS:-4}"

status=0
start=$(date +%s)
mkdir -p test-artifacts
# --maxschedchunk 1: xdist's load scheduler otherwise hands each worker a first block of ~80 consecutive tests, so
# the longest tests (sorted first, tests/conftest.py LONG_FIRST) all went to one worker, which then ran them one
# after another while the others had finished. One at a time, they start on different workers.
# Every test's time is in the JUnit reports (test-artifacts/), the 25 slowest on the terminal.
"$PYTEST" -ra -n "$JOBS" --dist load --maxschedchunk 1 -m "not alone" --durations=25 --junitxml=test-artifacts/parallel.xml "$@" \
    || status=$?
mid=$(date +%s)
"$PYTEST" -ra -m alone --durations=10 --junitxml=test-artifacts/alone.xml "$@"
rc=$?
[ "$rc" = 0 ] || [ "$rc" = 5 ] || status=$rc
end=$(date +%s)
echo "run-tests: parallel pass $((mid - start)) s with $JOBS workers, alone pass $((end - mid)) s, total $((end - start)) s"
exit "$status"
