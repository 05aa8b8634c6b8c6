"""Artifacts: diffs, logs, transcripts and reports, stored whole with their size and SHA-256.

An artifact insert on its own (`put_artifact`) is not fenced: a superseded attempt's artifacts exist but nothing
references them, because the fenced event or record that would name them is rejected. An artifact made by
`artifact_row` is inserted by the fenced write that names it (`insert_artifacts`, inside that transaction), so it
exists only if that write was accepted: one transaction where there were two."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import undefer

from crewwork.ids import new_id
from crewwork.store.engine import Database, StoreError
from crewwork.store.tables import Artifact


class ArtifactTooLarge(StoreError):
    pass


ARTIFACT_INSERT = insert(Artifact)


def artifact_row(
    *, work_item_id: str, tenant_id: str, name: str, data: bytes, content_type: str, max_bytes: int
) -> dict[str, Any]:
    """An artifact's row, id and digest made here, for a fenced write to insert (`created_at` is set there)."""
    if len(data) > max_bytes:
        raise ArtifactTooLarge(f"artifact {name!r} is {len(data)} bytes; the limit is {max_bytes}")
    return {
        "id": new_id("art"),
        "work_item_id": work_item_id,
        "tenant_id": tenant_id,
        "name": name,
        "content_type": content_type,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "content": data,
    }


async def insert_artifacts(s: AsyncSession, rows: Sequence[dict[str, Any]], now: float) -> None:
    """Insert rows made by `artifact_row` in the caller's transaction (a Core INSERT, no ORM flush)."""
    if rows:
        conn = await s.connection()
        await conn.execute(ARTIFACT_INSERT, [{**r, "created_at": now} for r in rows])


class ArtifactStore(Database):
    async def put_artifact(
        self,
        *,
        work_item_id: str,
        tenant_id: str,
        name: str,
        data: bytes,
        content_type: str = "text/plain",
        max_bytes: int = 16 * 1024 * 1024,
    ) -> Artifact:
        if len(data) > max_bytes:
            raise ArtifactTooLarge(f"artifact {name!r} is {len(data)} bytes; the limit is {max_bytes}")
        digest = hashlib.sha256(data).hexdigest()

        async def body(s: AsyncSession, started: Callable[[], None]) -> Artifact:
            now = await self.now(s)
            started()
            art = Artifact(
                id=new_id("art"),
                work_item_id=work_item_id,
                tenant_id=tenant_id,
                name=name,
                content_type=content_type,
                size=len(data),
                sha256=digest,
                content=data,
                created_at=now,
            )
            s.add(art)
            return art

        return await self.transaction(body)

    async def work_item_artifact(self, work_item_id: str, artifact_id: str, *, with_content: bool) -> Artifact | None:
        """One artifact of a work item (its bytes loaded only `with_content`)."""
        q = select(Artifact).where(Artifact.id == artifact_id, Artifact.work_item_id == work_item_id)
        if with_content:
            q = q.options(undefer(Artifact.content))
        async with self.session() as s:
            return await s.scalar(q)

    async def artifact_content(self, artifact_id: str) -> bytes | None:
        """The bytes of an artifact (the content column is deferred everywhere else)."""
        async with self.session() as s:
            data = await s.scalar(select(Artifact.content).where(Artifact.id == artifact_id))
        return None if data is None else bytes(data)

    async def list_artifacts(self, work_item_id: str) -> list[Artifact]:
        """A work item's artifacts, oldest first (without their bytes)."""
        async with self.session() as s:
            q = select(Artifact).where(Artifact.work_item_id == work_item_id).order_by(Artifact.created_at)
            return list((await s.scalars(q)).all())
