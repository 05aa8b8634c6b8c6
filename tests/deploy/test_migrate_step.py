"""`crewwork db upgrade` is the explicit migration step of a deployment (the compose `migrate` service, a Kubernetes
Job, a pre-deploy hook). Rolling deploys can start it twice, or on several machines at once: it must converge on
the same schema and never fail or corrupt it. Real PostgreSQL, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from crewwork.store.db import current_revision, upgrade
from crewwork.store.store import Store
from tests.conftest import PG_ADMIN, _psql, run_sync

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def empty_pg_url() -> Iterator[str]:
    name = f"crewwork_migrate_{uuid.uuid4().hex[:8]}"
    try:
        _psql(f"CREATE DATABASE {name}")
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 is not usable: {exc}")
    yield f"{PG_ADMIN}/{name}"
    _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def db_upgrade(url: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env["CREWWORK_DATABASE_URL"] = url
    return subprocess.Popen(
        [sys.executable, "-m", "crewwork", "db", "upgrade"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from crewwork.store.db import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def test_concurrent_db_upgrades_on_an_empty_database_both_succeed_with_one_schema(empty_pg_url: str) -> None:
    runs = [db_upgrade(empty_pg_url) for _ in range(3)]
    outputs = [p.communicate(timeout=120)[0] for p in runs]
    assert [p.returncode for p in runs] == [0, 0, 0], outputs
    assert run_sync(current_revision(empty_pg_url)) == head_revision()
    # The output names the database without its password.
    assert all("store schema is at" in out for out in outputs)


def test_db_upgrade_run_twice_is_a_no_op_that_keeps_data(empty_pg_url: str) -> None:
    first = db_upgrade(empty_pg_url)
    assert first.wait(120) == 0, first.communicate()[0]

    async def seed() -> str:
        st = Store(empty_pg_url)
        try:
            return await st.ensure_tenant("kept-across-upgrades")
        finally:
            await st.close()

    tenant_id = run_sync(seed())
    again = db_upgrade(empty_pg_url)
    assert again.wait(120) == 0, again.communicate()[0]
    run_sync(upgrade(empty_pg_url))  # and in-process, as `crewwork dev` does

    async def still_there() -> str:
        st = Store(empty_pg_url)
        try:
            return await st.ensure_tenant("kept-across-upgrades")
        finally:
            await st.close()

    assert run_sync(still_there()) == tenant_id
    assert run_sync(current_revision(empty_pg_url)) == head_revision()


def test_db_upgrade_never_prints_the_database_password(empty_pg_url: str) -> None:
    _psql(
        "DO $$ BEGIN CREATE ROLE crewwork_pw_probe LOGIN PASSWORD 's3cret-pw'; EXCEPTION WHEN duplicate_object THEN END $$"
    )
    name = empty_pg_url.rsplit("/", 1)[1]
    _psql(f"GRANT ALL ON DATABASE {name} TO crewwork_pw_probe")
    _psql(f"ALTER DATABASE {name} OWNER TO crewwork_pw_probe")
    url = empty_pg_url.replace("//postgres@", "//crewwork_pw_probe:s3cret-pw@")
    assert url != empty_pg_url, "expects the default admin URL (postgres@127.0.0.1)"
    p = db_upgrade(url)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 0, out
    assert "s3cret-pw" not in out
    assert "crewwork_pw_probe:***@" in out
