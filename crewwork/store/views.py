"""What the store hands to the code above it: immutable, typed views of its records, never an ORM row.

A row (crewwork/store/tables.py) is bound to a session, lazy in its deferred columns and writable: code outside the
store that holds one can load from, or write to, the database behind the store's back. A view is a frozen dataclass
of the fields its readers use, made here only: read as exactly those columns (`select_view`, then `first_view` or
`views_of`), or from the values the store has just written (`view_of`). Its JSON fields (`spec`, `data`, ...) are
the dicts decoded for this read, shared with no other reader.

tests/unit/test_store_boundary.py keeps the rows and SQLAlchemy inside crewwork/store/.
"""

from __future__ import annotations

from collections.abc import Awaitable, Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from sqlalchemy import Result, Select, select

from crewwork.models import ArtifactRef

V = TypeVar("V")


def select_view(cls: type[Any], table: type[Any], *, without: Collection[str] = ()) -> Select[Any]:
    """A SELECT of the columns of `table` that the view `cls` has a field of the same name for (less `without`,
    which must have defaults): what `first_view` and `views_of` make views of. Columns, not ORM entities: no row
    object is built only to be copied."""
    columns = table.__table__.c
    return select(*(columns[name] for name in _field_names(cls) if name not in without))


async def first_view(cls: type[V], result: Awaitable[Result[Any]]) -> V | None:
    """The view of the first row of a `select_view` query, None when there is none."""
    row = (await result).first()
    return None if row is None else cls(**row._asdict())


async def views_of(cls: type[V], result: Awaitable[Result[Any]]) -> list[V]:
    """The views of every row of a `select_view` query, in its order."""
    return [cls(**row._asdict()) for row in await result]


def view_of(cls: type[V], values: Mapping[str, Any]) -> V:
    """The view of a row the store has just written, from the values it wrote (a field without one keeps its
    default)."""
    return cls(**{name: values[name] for name in _field_names(cls) if name in values})


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True)
class StoredWorkItem:
    """A submitted work item as last written (the rank marks are the fencing state: crewwork/store/fencing/rule.py)."""

    id: str
    tenant_id: str
    kind: str
    state: str
    spec: dict[str, Any]
    submission_hash: str | None
    labels: dict[str, Any]
    repo_url: str | None
    base_commit: str | None
    workflow_id: str
    reason: str
    result: dict[str, Any] | None
    fence_rank: int
    result_rank: int | None
    state_rank: int | None
    attempt_count: int
    delivery_branch: str | None
    landed_commit: str | None
    mock: bool
    created_at: float
    updated_at: float
    legal_hold: dict[str, Any] | None = None
    """A legal hold (`reason`, `set_by`, `set_at`): retention keeps the item whole while it is set."""
    retained_at: float | None = None
    """When retention removed the item's details (events, attempt details, artifacts' bytes), or None."""


@dataclass(frozen=True, slots=True)
class StoredAttempt:
    """One attempt's record: the agent's outcome and the measured validation, with the verdict."""

    number: int
    rank: int
    verdict: str
    reason: str
    cause: str | None
    fingerprint: str | None
    agent: dict[str, Any] | None
    validation: dict[str, Any] | None
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One entry of a work item's event log (`rank`: the fenced write that appended it, None for an informational
    event)."""

    id: int
    work_item_id: str
    type: str
    data: dict[str, Any]
    rank: int | None
    created_at: float


@dataclass(frozen=True, slots=True)
class _ArtifactMeta:
    id: str
    name: str
    content_type: str
    size: int
    sha256: str

    def ref(self) -> ArtifactRef:
        """How the attempt's records and events name this artifact."""
        return ArtifactRef(
            id=self.id, name=self.name, size=self.size, sha256=self.sha256, content_type=self.content_type
        )


@dataclass(frozen=True, slots=True)
class StoredArtifact(_ArtifactMeta):
    """A stored artifact; `content` only when the read loaded the bytes (else None: nothing loads them later)."""

    created_at: float
    content: bytes | None = None
    removed_at: float | None = None
    """When retention removed the bytes (the name, size and SHA-256 stay), or None."""

    @property
    def content_bytes(self) -> bytes:
        """The bytes of an artifact read with them (`work_item_artifact(..., with_content=True)`)."""
        if self.content is None:
            raise ValueError(f"artifact {self.id} was read without its content")
        return self.content


@dataclass(frozen=True, slots=True)
class NewArtifact(_ArtifactMeta):
    """An artifact not stored yet (made by `crewwork.store.artifacts.new_artifact`, which gives it its id and
    digest): the fenced write that names it inserts it in its own transaction, so it exists only if that write is
    accepted."""

    work_item_id: str
    tenant_id: str
    content: bytes

    def columns(self) -> dict[str, Any]:
        """Its row's values, for an INSERT (`created_at` is set by the write that inserts it)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A lease as its holder took it (`token`: the grant, crewwork/store/leases.py), on the database clock."""

    key: str
    holder: str
    token: int
    acquired_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class StoredRepository:
    """A tenant's registration of a repository (docs/repositories.md); `credential` is a name, never a secret."""

    id: str
    url: str
    default_ref: str
    credential: str | None
    protect_paths: list[Any]
    environment: dict[str, Any] | None
    auto_registered: bool
    created_at: float
    checks: list[Any] | None = None


@dataclass(frozen=True, slots=True)
class StoredFlakyTest:
    """One test of a repository seen flaky (crewwork/store/baselines.py)."""

    repository: str
    test_id: str
    times: int
    first_seen_at: float
    last_seen_at: float
    last_work_item_id: str
    last_attempt: int
    last_runs: str
