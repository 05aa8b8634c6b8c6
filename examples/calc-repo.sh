#!/usr/bin/env bash
# Make the demo's sample repository at DIR: a git repository (branch main) whose test fails because add() subtracts.
# The README's and docs/agents.md's examples work on it.
#
#   examples/calc-repo.sh /tmp/calc
set -euo pipefail
dir=${1:?usage: examples/calc-repo.sh DIR (a directory that does not exist yet)}
if [ -e "$dir" ]; then
    echo "calc-repo.sh: $dir already exists; give a new directory (or remove it: rm -rf $dir)" >&2
    exit 2
fi
# The same files as `crewwork demo` (crewwork/cli/demo.py): this checkout's virtualenv, else the python on PATH.
py="$(dirname "$0")/../.venv/bin/python"
[ -x "$py" ] || py=python3
"$py" -c 'import sys; from pathlib import Path; from crewwork.cli.demo import make_sample_repo; make_sample_repo(Path(sys.argv[1]))' "$dir"
echo "calc-repo.sh: made $dir (add() subtracts; tests/test_calc.py fails)" >&2
