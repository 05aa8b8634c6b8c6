# The two commands of the quick start: `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test check fast install install-dev sandbox-env test-env lint typecheck pytest dev clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## An isolating sandbox: installs bubblewrap where none works yet and this machine can (root, apt-get).
sandbox-env: install
	bash scripts/sandbox-env.sh $(PY)

## The main job: one work item end to end on the embedded defaults (Temporal dev server + SQLite), in an isolating
## sandbox. Where none can be had it says what to install and fails; `make demo UNSAFE=1` runs it without isolation.
demo: sandbox-env
	$(VENV)/bin/crewwork demo $(if $(UNSAFE),--unsafe)

## Run crewwork on this machine (Temporal, API, console, worker pools) until Ctrl-C.
dev: sandbox-env
	$(VENV)/bin/crewwork dev

## Everything the tests need that is not a Python package: bubblewrap, git, Chromium, a Docker engine with gVisor,
## and a reachable PostgreSQL. Needs root (these machines run as root).
test-env: install
	bash scripts/test-env.sh $(PY)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

## The whole suite in parallel (scripts/run-tests.sh: CREWWORK_TEST_JOBS workers, then the `alone` tests).
pytest: install
	bash scripts/run-tests.sh

## The fast tier: the tests that need no database, sandbox or git server -- pure units, grading, and the workflow's
## decisions on Temporal's time-skipping test server. Seconds, not minutes.
fast: install
	$(VENV)/bin/pytest -q -n 2 tests/unit tests/workflows tests/validation

## Before every commit: lint, types and the fast tier (under 2 minutes).
check: lint typecheck fast

## The tests: lint, types, then the whole suite against real PostgreSQL, Temporal, sandboxes and a browser.
test: test-env lint typecheck pytest

clean:
	rm -rf $(VENV) .crewwork .pytest_cache .mypy_cache .ruff_cache test-artifacts
