"""Artifacts: diffs, logs, transcripts and reports, stored whole with their size and SHA-256.

An artifact insert on its own (`put_artifact`) is not fenced: a superseded attempt's artifacts exist but nothing
references them, because the fenced event or record that would name them is rejected. An artifact made by
`new_artifact` is inserted by the fenced write that names it (`insert_artifacts`, inside that transaction), so it
exists only if that write was accepted: one transaction where there were two."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.ids import new_id
from crewwork.store.engine import Database, StoreError
from crewwork.store.tables import Artifact
from crewwork.store.views import NewArtifact, StoredArtifact, first_view, select_view, view_of, views_of


class ArtifactTooLarge(StoreError):
    pass


ARTIFACT_INSERT = insert(Artifact)


def new_artifact(
    *, work_item_id: str, tenant_id: str, name: str, data: bytes, content_type: str, max_bytes: int
) -> NewArtifact:
    """An artifact to store, its id and digest made here (ArtifactTooLarge above `max_bytes`)."""
    if len(data) > max_bytes:
        raise ArtifactTooLarge(f"artifact {name!r} is {len(data)} bytes; the limit is {max_bytes}")
    return NewArtifact(
        id=new_id("art"),
        name=name,
        content_type=content_type,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        work_item_id=work_item_id,
        tenant_id=tenant_id,
        content=data,
    )


async def insert_artifacts(s: AsyncSession, artifacts: Sequence[NewArtifact], now: float) -> None:
    """Insert artifacts made by `new_artifact` in the caller's transaction (a Core INSERT, no ORM flush)."""
    if artifacts:
        conn = await s.connection()
        await conn.execute(ARTIFACT_INSERT, [{**a.columns(), "created_at": now} for a in artifacts])


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
    ) -> StoredArtifact:
        """Store an artifact on its own, outside any fenced write."""
        new = new_artifact(
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            name=name,
            data=data,
            content_type=content_type,
            max_bytes=max_bytes,
        )

        async def body(s: AsyncSession, started: Callable[[], None]) -> StoredArtifact:
            now = await self.now(s)
            started()
            values = {**new.columns(), "created_at": now}
            s.add(Artifact(**values))
            return view_of(StoredArtifact, values)

        return await self.transaction(body)

    async def work_item_artifact(
        self, work_item_id: str, artifact_id: str, *, with_content: bool
    ) -> StoredArtifact | None:
        """One artifact of a work item (its bytes loaded only `with_content`)."""
        q = select_view(StoredArtifact, Artifact, without=() if with_content else ("content",))
        q = q.where(Artifact.id == artifact_id, Artifact.work_item_id == work_item_id)
        async with self.session() as s:
            return await first_view(StoredArtifact, s.execute(q))

    async def artifact_content(self, artifact_id: str) -> bytes | None:
        """The bytes of an artifact (the content column is deferred everywhere else)."""
        async with self.session() as s:
            data = await s.scalar(select(Artifact.content).where(Artifact.id == artifact_id))
        return None if data is None else bytes(data)

    async def list_artifacts(self, work_item_id: str) -> list[StoredArtifact]:
        """A work item's artifacts, oldest first (without their bytes)."""
        async with self.session() as s:
            q = select_view(StoredArtifact, Artifact, without=("content",))
            q = q.where(Artifact.work_item_id == work_item_id).order_by(Artifact.created_at)
            return await views_of(StoredArtifact, s.execute(q))
