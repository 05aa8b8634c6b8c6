"""Schema migrations (Alembic) as an explicit, idempotent step: `crewwork db upgrade`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import create_async_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


async def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision`. Safe to run twice, and from several processes at once on PostgreSQL
    (a transaction-scoped advisory lock serializes concurrent runs)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(727274)")

            def _do(sync_conn):  # type: ignore[no-untyped-def]
                cfg = alembic_config(url)
                cfg.attributes["connection"] = sync_conn
                command.upgrade(cfg, revision)

            await conn.run_sync(_do)
            await conn.commit()
    finally:
        await engine.dispose()


def upgrade_sync(url: str, revision: str = "head") -> None:
    asyncio.run(upgrade(url, revision))


async def current_revision(url: str) -> str | None:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            from alembic.runtime.migration import MigrationContext

            def _cur(sync_conn):  # type: ignore[no-untyped-def]
                return MigrationContext.configure(sync_conn).get_current_revision()

            return await conn.run_sync(_cur)
    finally:
        await engine.dispose()
