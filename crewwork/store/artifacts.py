"""Artifacts: diffs, logs, transcripts and reports, stored whole with their size and SHA-256.

An artifact insert on its own (`put_artifact`) is not fenced: a superseded attempt's artifacts exist but nothing
references them, because the fenced event or record that would name them is rejected. An artifact made by
`new_artifact` is inserted by the fenced write that names it (`insert_artifacts`, inside that transaction), so it
exists only if that write was accepted: one transaction where there were two."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.models.ids import new_id
from crewwork.store.chunking import decode
from crewwork.store.engine import StoreError
from crewwork.store.retention import RetentionStore
from crewwork.store.tables import Artifact, ArtifactChunk, ArtifactPart
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


class ArtifactStore(RetentionStore):
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
            # Unfenced, so a late attempt may still put one after its item ended; not once retention has run.
            await self.refuse_if_retained(s, work_item_id)
            values = {**new.columns(), "created_at": now}
            s.add(Artifact(**values))
            return view_of(StoredArtifact, values)

        return await self.transaction(body)

    async def work_item_artifact(
        self, work_item_id: str, artifact_id: str, *, with_content: bool
    ) -> StoredArtifact | None:
        """One artifact of a work item (its bytes loaded only `with_content`, and only while retention has not
        removed them: a removed artifact comes with `removed_at` and no content)."""
        q = select_view(StoredArtifact, Artifact, without=("content",))
        q = q.where(Artifact.id == artifact_id, Artifact.work_item_id == work_item_id)
        async with self.session() as s:
            meta = await first_view(StoredArtifact, s.execute(q))
        if meta is None or not with_content or meta.removed_at is not None:
            return meta
        data = await self.artifact_content(artifact_id)
        if data is None:
            return replace(meta, removed_at=meta.removed_at or meta.created_at)
        return replace(meta, content=data)

    async def artifact_content(self, artifact_id: str) -> bytes | None:
        """The bytes of an artifact (the content column is deferred everywhere else): inline, or put together from
        its chunks (crewwork/store/retention.py), read in one statement; None when there is no such artifact or
        retention removed its bytes."""
        q = (
            select(
                Artifact.content, ArtifactPart.seq, ArtifactChunk.encoding, ArtifactChunk.content, ArtifactChunk.size
            )
            .outerjoin(ArtifactPart, ArtifactPart.artifact_id == Artifact.id)
            .outerjoin(ArtifactChunk, ArtifactChunk.sha256 == ArtifactPart.chunk)
            .where(Artifact.id == artifact_id)
            .order_by(ArtifactPart.seq)
        )
        async with self.session() as s:
            rows = (await s.execute(q)).all()
        if not rows:
            return None
        if rows[0][0] is not None:
            return bytes(rows[0][0])
        if rows[0][1] is None:
            return None  # no parts: removed by retention
        if any(r[3] is None for r in rows):
            raise StoreError(f"artifact {artifact_id} names a chunk that is not stored")
        return b"".join(decode(r[2], r[3], int(r[4])) for r in rows)

    async def list_artifacts(self, work_item_id: str) -> list[StoredArtifact]:
        """A work item's artifacts, oldest first (without their bytes)."""
        async with self.session() as s:
            q = select_view(StoredArtifact, Artifact, without=("content",))
            q = q.where(Artifact.work_item_id == work_item_id).order_by(Artifact.created_at)
            return await views_of(StoredArtifact, s.execute(q))
