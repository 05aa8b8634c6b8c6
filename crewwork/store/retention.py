"""Bounded storage: artifacts stored by content, retention of the items that ended, and legal holds.

Three passes, each in batches, each safe to run on several processes at once (the retention workflow,
crewwork/workflows/reaper.py, runs them on the control pool):

| pass | what | why it is safe |
|---|---|---|
| `compact_artifacts` | moves the bytes of the artifacts (of 2 KiB or more: a smaller one stays inline, where it costs less than a chunk and a part would) of items that ended (at least `settle_s` ago) into `artifact_chunks`, one row per distinct chunk (crewwork/store/chunking.py), the artifact keeping the list of its chunks (`artifact_parts`) | one transaction per artifact, under its row lock; a chunk is named by an upsert that locks its row; readers read an artifact in one statement (one snapshot) |
| `apply_retention` | for one item that ended more than its tenant's retention period ago and holds no legal hold: removes its artifacts' bytes (not the evidence bundles), its events (but its submission, its last state change, its evidence and hold events), the details of its attempts (what is large: test lists, logs, diagnostics); records `retention_applied`; the item's row (its final record, result and reason) stays | the item row's lock, taken as a fenced write takes it, and the rules of the fence: a live item is never touched, and an item that ended refuses every later write (the fence's terminal rule), so no write can race the removal; a late artifact put outside a fenced write is refused once the item is retained |
| `collect_chunks` | deletes the chunks no artifact names any more | the candidates are locked first (`FOR UPDATE SKIP LOCKED`: a chunk a compaction is naming is skipped), then deleted only if a fresh statement still finds no part naming them |

What stays of a retained item: the `work_items` row, its attempts' verdicts, causes, fingerprints and artifact refs,
every artifact's name, size and SHA-256 (the digests a signed statement names), the evidence bundles whole, and the
events named in `KEPT_EVENTS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, null, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.models import TERMINAL_STATES
from crewwork.store.chunking import cut, encode
from crewwork.store.engine import Database, NotFound, StoreError
from crewwork.store.tables import (
    COMPACTABLE,
    Artifact,
    ArtifactChunk,
    ArtifactPart,
    Attempt,
    Event,
    OutboxMessage,
    Tenant,
    WorkItem,
)

KEPT_EVENTS = frozenset(
    {"submitted", "evidence_signed", "evidence_unsigned", "legal_hold_set", "legal_hold_cleared", "retention_applied"}
)
"""Event types retention keeps (and the item's last `state_changed`, the end it recorded)."""
SMALL_TEXT = 200
"""An attempt detail kept by retention: a scalar, an artifact ref, or text up to this many characters."""
_TERMINAL = sorted(s.value for s in TERMINAL_STATES)


class RetainedItem(StoreError):
    """A write refused because retention already removed the item's details."""


@dataclass(frozen=True)
class CompactionPass:
    artifacts: int = 0
    bytes_in: int = 0
    """Bytes of the artifacts compacted."""
    chunks_new: int = 0
    bytes_new: int = 0
    """Bytes stored for the chunks not stored before (after compression)."""


@dataclass(frozen=True)
class RetentionOutcome:
    work_item_id: str
    applied: bool
    why: str = ""
    """Why it was skipped (live, held, too recent, done already), when not applied."""
    artifacts_removed: int = 0
    bytes_removed: int = 0
    events_removed: int = 0
    attempts_trimmed: int = 0


@dataclass(frozen=True)
class RetentionPolicy:
    """How long the details of an ended item are kept: `default_days` (0: for ever) unless its tenant (by id) has its
    own in `tenant_days`."""

    default_days: float
    tenant_days: Mapping[str, float] = field(default_factory=dict)

    def days(self, tenant_id: str) -> float:
        return self.tenant_days.get(tenant_id, self.default_days)

    @property
    def longest_window_s(self) -> float | None:
        """The shortest period anyone has, as seconds (None: nobody's items are ever removed)."""
        periods = [d for d in [self.default_days, *self.tenant_days.values()] if d > 0]
        return min(periods) * 86400.0 if periods else None


def trim_detail(doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[str]]:
    """An attempt's `agent` or `validation` document as retention leaves it: scalars, short text and artifact refs
    (`*_ref`) stay, lists, nested documents and long text go (named in `retention_removed`)."""
    if not isinstance(doc, dict):
        return doc, []
    kept: dict[str, Any] = {}
    removed: list[str] = []
    for k, v in doc.items():
        small = v is None or isinstance(v, bool | int | float) or (isinstance(v, str) and len(v) <= SMALL_TEXT)
        if small or (k.endswith("_ref") and isinstance(v, dict)):
            kept[k] = v
        else:
            removed.append(k)
    if removed:
        kept["retention_removed"] = removed
    return kept, removed


class RetentionStore(Database):
    # ------------------------------------------------------------------ content

    def _upsert_chunk(self) -> Any:
        dialect = sqlite if self.is_sqlite else postgresql
        stmt = dialect.insert(ArtifactChunk)
        return stmt.on_conflict_do_update(
            index_elements=[ArtifactChunk.sha256], set_={"referenced_at": stmt.excluded.referenced_at}
        )

    async def compact_artifacts(self, *, settle_s: float, limit: int) -> CompactionPass:
        """Compact the inline artifacts of up to `limit` (oldest first) whose item ended `settle_s` ago or more."""
        async with self.session() as s:
            now = await self.now(s)
            ids = list(
                (
                    await s.execute(
                        select(Artifact.id)
                        .join(WorkItem, WorkItem.id == Artifact.work_item_id)
                        .where(
                            # In the partial index's own words (ix_artifacts_inline), so that it serves this walk.
                            text(COMPACTABLE.replace("content", "artifacts.content").replace("size", "artifacts.size")),
                            WorkItem.state.in_(_TERMINAL),
                            WorkItem.updated_at < now - settle_s,
                        )
                        .order_by(Artifact.created_at, Artifact.id)
                        .limit(limit)
                    )
                ).scalars()
            )
        total = CompactionPass()
        for artifact_id in ids:
            done = await self._compact_one(artifact_id)
            total = CompactionPass(
                total.artifacts + done.artifacts,
                total.bytes_in + done.bytes_in,
                total.chunks_new + done.chunks_new,
                total.bytes_new + done.bytes_new,
            )
        return total

    async def _compact_one(self, artifact_id: str) -> CompactionPass:
        async with self.session() as s:
            q = select(Artifact.content).where(Artifact.id == artifact_id, Artifact.content.is_not(None))
            if not self.is_sqlite:
                q = q.with_for_update()
            data = (await s.execute(q)).scalar_one_or_none()
            if data is None:
                return CompactionPass()  # compacted (or removed) by another pass meanwhile
            now = await self.now(s)
            # An empty artifact is one empty chunk, so that "no parts" keeps meaning "removed".
            pieces = [encode(p) for p in cut(bytes(data))] or [encode(b"")]
            distinct = {c.sha256: c for c in pieces}
            digests = sorted(distinct)  # one lock order for every compaction: no deadlock between two of them
            before = set(
                (await s.execute(select(ArtifactChunk.sha256).where(ArtifactChunk.sha256.in_(digests)))).scalars()
            )
            conn = await s.connection()
            await conn.execute(
                self._upsert_chunk(),
                [
                    {
                        "sha256": d,
                        "size": distinct[d].size,
                        "encoding": distinct[d].encoding,
                        "content": distinct[d].stored,
                        "created_at": now,
                        "referenced_at": now,
                    }
                    for d in digests
                ],
            )
            if pieces:
                await conn.execute(
                    insert(ArtifactPart),
                    [{"artifact_id": artifact_id, "seq": i, "chunk": c.sha256} for i, c in enumerate(pieces)],
                )
            await conn.execute(update(Artifact).where(Artifact.id == artifact_id).values(content=None))
            fresh = [distinct[d] for d in digests if d not in before]
            return CompactionPass(1, len(data), len(fresh), sum(len(c.stored) for c in fresh))

    async def collect_chunks(self, *, limit: int) -> int:
        """Delete up to `limit` chunks that no artifact names; returns how many."""
        async with self.session() as s:
            orphan = ~select(ArtifactPart.chunk).where(ArtifactPart.chunk == ArtifactChunk.sha256).exists()
            q = select(ArtifactChunk.sha256).where(orphan).limit(limit)
            if not self.is_sqlite:
                q = q.with_for_update(skip_locked=True)
            locked = list((await s.execute(q)).scalars())
            if not locked:
                return 0
            # A fresh statement (a new snapshot under READ COMMITTED): a compaction that named one of these chunks
            # and committed before the lock was taken has its parts visible here.
            res = await s.execute(delete(ArtifactChunk).where(ArtifactChunk.sha256.in_(locked), orphan))
            return int(res.rowcount or 0)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ retention

    async def tenant_ids(self, keys: Sequence[str]) -> dict[str, str]:
        """The tenant id of each key that names a tenant, by id or by name."""
        if not keys:
            return {}
        async with self.session() as s:
            rows = (
                await s.execute(select(Tenant.id, Tenant.name).where((Tenant.id.in_(keys)) | (Tenant.name.in_(keys))))
            ).all()
        out: dict[str, str] = {}
        for tid, name in rows:
            if name in keys:
                out[str(name)] = str(tid)
            if tid in keys:
                out[str(tid)] = str(tid)
        return out

    async def retention_candidates(self, policy: RetentionPolicy, *, limit: int) -> list[str]:
        """Up to `limit` items, oldest end first, that ended longer ago than their tenant's period, hold no legal
        hold and were not retained yet. Checked again, under the item's lock, by `apply_retention`."""
        window = policy.longest_window_s
        if window is None:
            return []
        async with self.session() as s:
            now = await self.now(s)
            default_cutoff = now - policy.default_days * 86400.0 if policy.default_days > 0 else float("-inf")
            q = select(WorkItem.id, WorkItem.tenant_id, WorkItem.updated_at).where(
                WorkItem.retained_at.is_(None),
                WorkItem.updated_at < now - window,
                WorkItem.state.in_(_TERMINAL),
                WorkItem.legal_hold.is_(None),
            )
            rows = (await s.execute(q.order_by(WorkItem.updated_at, WorkItem.id).limit(limit * 4))).all()
        out: list[str] = []
        for wid, tenant, ended in rows:
            days = policy.days(str(tenant))
            cutoff = now - days * 86400.0 if days > 0 else float("-inf")
            if days == policy.default_days:
                cutoff = default_cutoff
            if ended < cutoff:
                out.append(str(wid))
            if len(out) >= limit:
                break
        return out

    async def apply_retention(
        self, work_item_id: str, policy: RetentionPolicy, *, keep_artifact: Callable[[str], bool]
    ) -> RetentionOutcome:
        """Remove the details of one item that ended, if, under its row lock, it still may be (see the module's
        docstring); `keep_artifact(name)` names the artifacts kept whole (the evidence bundles)."""
        async with self.session() as s:
            conn = await s.connection()
            q = select(
                WorkItem.state, WorkItem.updated_at, WorkItem.legal_hold, WorkItem.retained_at, WorkItem.tenant_id
            )
            q = q.where(WorkItem.id == work_item_id)
            if not self.is_sqlite:
                q = q.with_for_update(of=WorkItem)
            row = (await conn.execute(q)).first()
            if row is None:
                return RetentionOutcome(work_item_id, False, "not in the store")
            state, ended, hold, retained, tenant = row
            now = await self.now(s)
            days = policy.days(str(tenant))
            if state not in _TERMINAL:
                return RetentionOutcome(work_item_id, False, f"live ({state})")
            if hold is not None:
                return RetentionOutcome(work_item_id, False, "legal hold")
            if retained is not None:
                return RetentionOutcome(work_item_id, False, "retained already")
            if days <= 0 or ended >= now - days * 86400.0:
                return RetentionOutcome(work_item_id, False, "within its retention period")
            # Artifacts: the bytes go, the row (name, size, SHA-256) stays.
            arts = (
                await conn.execute(
                    select(Artifact.id, Artifact.name, Artifact.size).where(
                        Artifact.work_item_id == work_item_id, Artifact.removed_at.is_(None)
                    )
                )
            ).all()
            gone = [(a[0], int(a[2])) for a in arts if not keep_artifact(str(a[1]))]
            ids = [a for a, _ in gone]
            if ids:
                await conn.execute(delete(ArtifactPart).where(ArtifactPart.artifact_id.in_(ids)))
                await conn.execute(update(Artifact).where(Artifact.id.in_(ids)).values(content=None, removed_at=now))
            # Attempts: what is large goes, what the breaker and the record read stays.
            trimmed = 0
            for aid, agent, validation in (
                await conn.execute(
                    select(Attempt.id, Attempt.agent, Attempt.validation).where(Attempt.work_item_id == work_item_id)
                )
            ).all():
                new_agent, ra = trim_detail(agent)
                new_validation, rv = trim_detail(validation)
                if ra or rv:
                    trimmed += 1
                    await conn.execute(
                        update(Attempt).where(Attempt.id == aid).values(agent=new_agent, validation=new_validation)
                    )
            # Events: all but the kept types and the last state change.
            last_state = (
                await conn.execute(
                    select(func.max(Event.id)).where(Event.work_item_id == work_item_id, Event.type == "state_changed")
                )
            ).scalar()
            doomed = delete(Event).where(Event.work_item_id == work_item_id, Event.type.not_in(sorted(KEPT_EVENTS)))
            if last_state is not None:
                doomed = doomed.where(Event.id != last_state)
            events_removed = int((await conn.execute(doomed)).rowcount or 0)
            # Delivered (or dead) webhook messages of the item: the outbox's own log of what it sent.
            await conn.execute(
                delete(OutboxMessage).where(
                    OutboxMessage.work_item_id == work_item_id, OutboxMessage.status != "pending"
                )
            )
            outcome = RetentionOutcome(
                work_item_id,
                True,
                artifacts_removed=len(ids),
                bytes_removed=sum(n for _, n in gone),
                events_removed=events_removed,
                attempts_trimmed=trimmed,
            )
            await conn.execute(
                insert(Event).values(
                    work_item_id=work_item_id,
                    tenant_id=tenant,
                    type="retention_applied",
                    data={
                        "retention_days": days,
                        "ended_at": ended,
                        "artifacts_removed": outcome.artifacts_removed,
                        "bytes_removed": outcome.bytes_removed,
                        "events_removed": outcome.events_removed,
                        "attempts_trimmed": outcome.attempts_trimmed,
                    },
                    rank=None,
                    created_at=now,
                )
            )
            await conn.execute(update(WorkItem).where(WorkItem.id == work_item_id).values(retained_at=now))
            return outcome

    # ------------------------------------------------------------------ legal holds

    async def set_legal_hold(
        self, work_item_id: str, tenant_id: str | None, *, reason: str | None, actor: str | None
    ) -> tuple[dict[str, Any] | None, float | None]:
        """Set (`reason` given) or clear (None) the item's legal hold, with an event saying who did it, under the
        item's row lock (so it is ordered with retention's removal). Returns the hold in force and `retained_at`
        (when retention had already removed the details, a hold keeps only what is left)."""
        async with self.session() as s:
            conn = await s.connection()
            q = select(WorkItem.tenant_id, WorkItem.legal_hold, WorkItem.retained_at).where(WorkItem.id == work_item_id)
            if tenant_id is not None:
                q = q.where(WorkItem.tenant_id == tenant_id)
            if not self.is_sqlite:
                q = q.with_for_update(of=WorkItem)
            row = (await conn.execute(q)).first()
            if row is None:
                raise NotFound(f"no work item {work_item_id}")
            owner, hold, retained = row
            now = await self.now(s)
            if reason is None:
                if hold is None:
                    return None, retained
                new_hold: dict[str, Any] | None = None
                data = {"previous": hold, "cleared_by": actor}
                kind = "legal_hold_cleared"
            else:
                new_hold = {"reason": reason, "set_by": actor, "set_at": now}
                data = {**new_hold, "previous": hold}
                kind = "legal_hold_set"
            await conn.execute(
                # SQL NULL, not the JSON value null, when cleared: `legal_hold IS NULL` finds the items without one.
                update(WorkItem)
                .where(WorkItem.id == work_item_id)
                .values(legal_hold=new_hold if new_hold is not None else null()),
            )
            await conn.execute(
                insert(Event).values(
                    work_item_id=work_item_id, tenant_id=owner, type=kind, data=data, rank=None, created_at=now
                )
            )
            return new_hold, retained

    async def refuse_if_retained(self, s: AsyncSession, work_item_id: str) -> None:
        """Inside an artifact's insert outside a fenced write: refuse it once retention removed the item's details
        (the item's row is read under a share lock, so the check is ordered with `apply_retention`)."""
        q = select(WorkItem.retained_at).where(WorkItem.id == bindparam("wid"))
        if not self.is_sqlite:
            q = q.with_for_update(read=True, of=WorkItem)
        retained = (await s.execute(q, {"wid": work_item_id})).scalar_one_or_none()
        if retained is not None:
            raise RetainedItem(f"work item {work_item_id}: its details were removed by retention; nothing more is kept")

    # ------------------------------------------------------------------ figures

    async def storage_bytes(self) -> dict[str, int]:
        """Bytes on disk per table, indexes and TOAST included (PostgreSQL), or the whole file (SQLite, as `all`)."""
        async with self.session() as s:
            if self.is_sqlite:
                pages = (await s.execute(text("PRAGMA page_count"))).scalar_one()
                size = (await s.execute(text("PRAGMA page_size"))).scalar_one()
                return {"all": int(pages) * int(size)}
            rows = (
                await s.execute(
                    text(
                        "SELECT relname, pg_total_relation_size(c.oid) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
                    )
                )
            ).all()
            return {str(name): int(size) for name, size in rows}


__all__: Sequence[str] = [
    "KEPT_EVENTS",
    "CompactionPass",
    "RetainedItem",
    "RetentionOutcome",
    "RetentionPolicy",
    "RetentionStore",
    "trim_detail",
]
