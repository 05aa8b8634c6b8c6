# The two commands of the quick start: `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
# Some of these machines set PYTHONDONTWRITEBYTECODE=1 in every shell: then every Python process (each pytest-xdist
# worker, each `crewwork` subprocess a test starts, each inner pytest) compiles crewwork, the tests and pytest's
# rewritten test modules from source again -- collecting the fast tier cost 14 s of CPU per worker instead of 6.5 s.
# The bytecode goes to __pycache__/ (ignored by git).
unexport PYTHONDONTWRITEBYTECODE
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

## The fast tier: every test that needs no PostgreSQL, Temporal dev server, Docker engine or browser (tests/conftest.py
## marks what each test starts) -- units, grading, the SQLite half of the store and step tests, bubblewrap sandboxes,
## git servers on loopback, and the workflow's decisions on Temporal's time-skipping test server.
## Tests marked `heavy` (their own work is seconds of CPU by design) run in `make test` only.
FAST_TIER := not postgres and not temporal and not docker and not browser and not heavy
fast: install
	$(VENV)/bin/pytest -q -n 4 -m "$(FAST_TIER)"

## Before every commit: lint, types and the fast tier (under a minute, warm).
check: lint typecheck fast

## The tests: lint, types, then the whole suite against real PostgreSQL, Temporal, sandboxes and a browser.
test: test-env lint typecheck pytest

clean:
	rm -rf $(VENV) .crewwork .pytest_cache .mypy_cache .ruff_cache test-artifacts
