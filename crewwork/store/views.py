"""What the store hands to the code above it: immutable, typed views of its records, never an ORM row.

A row (crewwork/store/tables.py) is bound to a session, lazy in its deferred columns and writable: code outside the
store that holds one can load from, or write to, the database behind the store's back. A view is a frozen copy of
the fields its readers use, made in one place (`view_of`) from the row the store read. Its JSON fields (`spec`,
`data`, ...) are the dicts decoded for this read, shared with no other reader.

tests/unit/test_store_boundary.py keeps the rows and SQLAlchemy inside crewwork/store/.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from crewwork.models import ArtifactRef

V = TypeVar("V")


def view_of(cls: type[V], row: Any) -> V:
    """The view `cls` of `row`: each of the view's fields read from the row's attribute of the same name. A column
    the row has not loaded (an artifact's deferred `content`) is left at the field's default, never loaded here."""
    loaded = row.__dict__  # where the ORM keeps the column values a row has loaded (an unloaded one is absent)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    return cls(**{name: loaded[name] for name in names if name in loaded})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def view_or_none(cls: type[V], row: Any | None) -> V | None:
    return None if row is None else view_of(cls, row)


@dataclass(frozen=True, slots=True)
class StoredWorkItem:
    """A submitted work item as last written (the rank marks are the fencing state: crewwork/store/fencing.py)."""

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
