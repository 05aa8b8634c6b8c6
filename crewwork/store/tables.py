"""SQLAlchemy tables of the canonical store.

PostgreSQL is canonical; SQLite is the embedded default. Types are chosen to behave the same on both: ids are
strings, timestamps and lease expiries are epoch seconds as floats taken from the DATABASE clock (never a worker's),
JSON columns hold pydantic dumps.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# BIGINT on PostgreSQL, INTEGER (the rowid alias, so it autoincrements) on SQLite.
BigIntPK = BigInteger().with_variant(Integer, "sqlite")

# Not terminal (crewwork.models.TERMINAL_STATES): the rows of the partial index ix_work_items_open.
OPEN_ITEMS = "state NOT IN ('succeeded', 'failed', 'rejected', 'cancelled', 'dead')"


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(128), unique=True)
    scopes: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class WorkItem(Base):
    __tablename__ = "work_items"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(32))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    submission_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """SHA-256 of the canonical submission (migration 0007): the same idempotency key with another is a conflict."""
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    repo_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    base_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    workflow_id: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    fence_rank: Mapped[int] = mapped_column(BigInteger, default=0)
    """The highest rank accepted for this item (crewwork/store/fencing.py): a write ranked lower is rejected."""
    result_rank: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state_rank: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    delivery_branch: Mapped[str | None] = mapped_column(String(256), nullable=True)
    landed_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mock: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_work_items_tenant_idempotency"),
        # Keyset pagination per tenant, newest first, optionally by state.
        Index("ix_work_items_tenant_created", "tenant_id", "created_at", "id"),
        Index("ix_work_items_tenant_state_created", "tenant_id", "state", "created_at", "id"),
        # The open items in submission order, for the reconciler (migration 0009).
        Index(
            "ix_work_items_open",
            "created_at",
            "id",
            postgresql_where=text(OPEN_ITEMS),
            sqlite_where=text(OPEN_ITEMS),
        ),
    )


class Attempt(Base):
    __tablename__ = "attempts"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    work_item_id: Mapped[str] = mapped_column(ForeignKey("work_items.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(BigInteger)
    verdict: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    cause: Mapped[str | None] = mapped_column(String(64), nullable=True)
    fingerprint: Mapped[str | None] = mapped_column(String(128), nullable=True)
    agent: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    validation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (UniqueConstraint("work_item_id", "number", name="uq_attempts_item_number"),)


class Event(Base):
    """Append-only. Ordered per work item by `id` (monotonic on both databases)."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    work_item_id: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[str] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    rank: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The rank of the fenced write that appended it (None for informational events)."""
    created_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_events_item_id", "work_item_id", "id"),
        Index("ix_events_tenant_id", "tenant_id", "id"),
    )


class Fence(Base):
    """The grant counter of a lease key (crewwork/store/leases.py). It only ever grows."""

    __tablename__ = "fences"
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)


class Lease(Base):
    __tablename__ = "leases"
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    token: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class LeaseHistory(Base):
    """Every grant and end of a lease, on the database clock, so overlap can be checked after the fact."""

    __tablename__ = "lease_history"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(300), index=True)
    holder: Mapped[str] = mapped_column(String(200))
    token: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)


class RateLimit(Base):
    """One API rate-limit bucket shared by every API process (crewwork/store/ratelimits.py, migration 0007)."""

    __tablename__ = "rate_limits"
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    tat: Mapped[float] = mapped_column(Float, index=True)
    """Theoretical arrival time (GCRA): when the bucket would be full again, on the database clock."""
    checked_at: Mapped[float] = mapped_column(Float)
    allowed: Mapped[bool] = mapped_column()
    """Whether the last request charged to this bucket was let through."""


class Artifact(Base):
    __tablename__ = "artifacts"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    work_item_id: Mapped[str] = mapped_column(String(64), index=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(300))
    content_type: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    content: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    created_at: Mapped[float] = mapped_column(Float)


# ---------------------------------------------------------------- webhooks and the outbox (migration 0002)


class Webhook(Base):
    """A tenant's webhook endpoint. The secret signs deliveries (HMAC-SHA256), so it is kept, not hashed."""

    __tablename__ = "webhooks"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(128))
    previous_secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """The secret before the last rotation, still used to sign until `previous_secret_expires_at` (migration 0005)."""
    previous_secret_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    event_types: Mapped[str] = mapped_column(String(500), default="")
    """Comma-separated event types to deliver; empty means all."""
    active: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[float] = mapped_column(Float)


class OutboxMessage(Base):
    """One delivery of one change to one webhook, written in the same transaction as the change."""

    __tablename__ = "outbox"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    webhook_id: Mapped[str] = mapped_column(String(64))
    work_item_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    """pending | delivered | dead"""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    trace_context: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """W3C `traceparent` of the change that wrote this row, when tracing is on (migration 0005): the delivery joins
    the work item's trace."""

    __table_args__ = (
        Index("ix_outbox_due", "status", "next_attempt_at"),
        Index("ix_outbox_webhook", "webhook_id", "id"),
    )


class Repository(Base):
    """A repository a tenant registered (docs/repositories.md): the only repositories its work items may name."""

    __tablename__ = "repositories"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    """The normalised URL (crewwork.urls), for a local repository its resolved absolute path."""
    default_ref: Mapped[str] = mapped_column(String(256), default="HEAD")
    credential: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """The NAME of an operator-held credential (CREWWORK_REPO_CREDENTIALS); never the secret."""
    protect_paths: Mapped[list[Any]] = mapped_column(JSON, default=list)
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    auto_registered: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (UniqueConstraint("tenant_id", "url", name="uq_repositories_tenant_url"),)
