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

# Inline artifacts big enough to be stored by content (crewwork/store/retention.py): ix_artifacts_inline's rows.
COMPACTABLE = "content IS NOT NULL AND size >= 2048"
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
    """The highest rank accepted for this item (crewwork/store/fencing/rule.py): a write ranked lower is rejected."""
    result_rank: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state_rank: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    delivery_branch: Mapped[str | None] = mapped_column(String(256), nullable=True)
    landed_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mock: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    """When the last accepted write changed the item: for a terminal item, when it ended (nothing writes it after)."""
    legal_hold: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """A legal hold (migration 0010): while set, retention keeps the item whole (`reason`, `set_by`, `set_at`)."""
    retained_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When retention removed the item's details (crewwork/store/retention.py); None while they are all kept."""

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
        # The items retention has not visited, by when they were last written (migration 0010).
        Index(
            "ix_work_items_unretained",
            "updated_at",
            "id",
            postgresql_where=text("retained_at IS NULL"),
            sqlite_where=text("retained_at IS NULL"),
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
    content: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True, nullable=True)
    """The bytes, inline, as every write stores them; NULL once compacted into `artifact_chunks` (its
    `artifact_parts`), or removed by retention (`removed_at`). Migration 0010."""
    created_at: Mapped[float] = mapped_column(Float)
    removed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When retention removed the bytes; the row stays, with the name, size and SHA-256 a signed statement names."""

    __table_args__ = (
        # The artifacts worth compacting (crewwork/store/retention.py): 2 KiB or more.
        Index(
            "ix_artifacts_inline",
            "created_at",
            "id",
            postgresql_where=text(COMPACTABLE),
            sqlite_where=text(COMPACTABLE),
        ),
    )


class ArtifactChunk(Base):
    """A piece of artifact content, stored once however many artifacts hold it (migration 0010): keyed by the
    SHA-256 of its bytes, zlib-compressed where that pays (`encoding`). `referenced_at` is raised by every compaction
    that names it, so that the collection of unreferenced chunks, which spares recently named ones, never races a
    compaction (crewwork/store/retention.py)."""

    __tablename__ = "artifact_chunks"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    """Bytes before encoding."""
    encoding: Mapped[str] = mapped_column(String(16))
    """`raw` or `zlib`."""
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)
    referenced_at: Mapped[float] = mapped_column(Float)


class ArtifactPart(Base):
    """An artifact's content as its chunks, in order (migration 0010)."""

    __tablename__ = "artifact_parts"
    artifact_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    chunk: Mapped[str] = mapped_column(String(64), index=True)


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
    """The normalised URL (crewwork.boundary.urls), for a local repository its resolved absolute path."""
    default_ref: Mapped[str] = mapped_column(String(256), default="HEAD")
    credential: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """The NAME of an operator-held credential (CREWWORK_REPO_CREDENTIALS); never the secret."""
    protect_paths: Mapped[list[Any]] = mapped_column(JSON, default=list)
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    auto_registered: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float)
    checks: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    """The named checks every work item of the registration runs (migration 0015; docs/checks.md)."""

    __table_args__ = (UniqueConstraint("tenant_id", "url", name="uq_repositories_tenant_url"),)


# ---------------------------------------------------------------- forge intake (migration 0011)


class ForgeSubscription(Base):
    """A registered repository's subscription to its forge's events (docs/forge.md): the webhook secret the forge
    signs deliveries with (kept, not hashed: verifying an HMAC needs it, as signing one does for `webhooks`), and
    the tenant's trigger settings (label, mention, who is trusted, what a triggered item runs)."""

    __tablename__ = "forge_subscriptions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    repository_id: Mapped[str] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), unique=True)
    dialect: Mapped[str] = mapped_column(String(16))
    secret: Mapped[str] = mapped_column(String(128))
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class ForgeDelivery(Base):
    """One webhook delivery a subscription accepted, by the forge's delivery id: a second delivery with the same id
    (a retry, a redelivery, a replay) is answered as a duplicate and changes nothing."""

    __tablename__ = "forge_deliveries"
    subscription_id: Mapped[str] = mapped_column(
        ForeignKey("forge_subscriptions.id", ondelete="CASCADE"), primary_key=True
    )
    delivery_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    event: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(32))
    received_at: Mapped[float] = mapped_column(Float, index=True)


class ForgeTrigger(Base):
    """A trigger (an issue labelled, a command in a comment) queued for the intake (crewwork/api/forge_intake.py),
    once per subscription and trigger key, whatever delivered it: the outbox row of intake. The intake claims due
    rows, checks the actor's permission on the forge, and submits a work item or posts one refusal."""

    __tablename__ = "forge_triggers"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    subscription_id: Mapped[str] = mapped_column(ForeignKey("forge_subscriptions.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    trigger_key: Mapped[str] = mapped_column(String(160))
    trigger: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    """pending | submitted | refused | failed"""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    work_item_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    done_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        UniqueConstraint("subscription_id", "trigger_key", name="uq_forge_triggers_key"),
        Index("ix_forge_triggers_due", "status", "next_attempt_at"),
    )


class ForgeProgress(Base):
    """The one progress comment of a work item a forge trigger made (crewwork/api/forge_intake.py): where it is on
    the forge and what it last said. The intake compares what the item's comment should say now with `posted`, and
    posts or edits it when they differ, so a forge that is down delays the comment and loses nothing."""

    __tablename__ = "forge_progress"
    work_item_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    subscription_id: Mapped[str] = mapped_column(ForeignKey("forge_subscriptions.id", ondelete="CASCADE"))
    issue_number: Mapped[int] = mapped_column(Integer)
    comment_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    posted: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """SHA-256 of the body last posted."""
    done: Mapped[bool] = mapped_column(default=False)
    """The item ended and its last word is on the forge."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Failed posts in a row."""
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    review_shown: Mapped[str | None] = mapped_column(String(100), nullable=True)
    """`<attempt>:<diff sha256>` of the attempt shown for review on the forge (migration 0012)."""
    review_pull_url: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    """The pull request it is shown in."""

    __table_args__ = (Index("ix_forge_progress_due", "done", "next_attempt_at"),)


# ---------------------------------------------------------------- error intake (migration 0013)


class ErrorProject(Base):
    """A registered repository's error intake (docs/errors-intake.md): the project an app's Sentry DSN names. `id` is
    the DSN's numeric project id; `public_key` the DSN's key (an app ships it, so it is an address, not a secret of
    weight: it only lets its holder report errors, within the project's rate). `fence_secret` is never shown: it
    keys the nonce that fences the error's text in the instruction (crewwork/forge/untrusted.py)."""

    __tablename__ = "error_projects"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    repository_id: Mapped[str] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), unique=True)
    public_key: Mapped[str] = mapped_column(String(64), unique=True)
    fence_secret: Mapped[str] = mapped_column(String(64))
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class ErrorGroup(Base):
    """All reports of one error (one fingerprint) of a project: ONE work item at a time, a count and the last time
    it was seen. `status` is the intake's queue (pending -> submitted | failed); `generation` counts the items the
    group has had (a report after the group's item ended starts the next one)."""

    __tablename__ = "error_groups"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("error_projects.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))
    generation: Mapped[int] = mapped_column(Integer, default=1)
    title: Mapped[str] = mapped_column(Text)
    sample: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The first report of this generation: exception type, message, stack trace (bounded), platform, event id."""
    count: Mapped[int] = mapped_column(BigInteger, default=1)
    """Reports of this generation."""
    total: Mapped[int] = mapped_column(BigInteger, default=1)
    """Reports of every generation."""
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    """pending | submitted | failed"""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    work_item_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    previous_work_item_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        UniqueConstraint("project_id", "fingerprint", name="uq_error_groups_fingerprint"),
        Index("ix_error_groups_due", "status", "next_attempt_at"),
    )


# ---------------------------------------------------------------- baselines and flaky tests (migration 0014)


class ValidationBaseline(Base):
    """What a work item's validation command showed on a base commit (crewwork.validation.baseline), cached per
    tenant, repository, base commit and definition (command, setup, report path, timeout, environment, sandbox):
    a later item on the same base reuses it instead of running it again. Never shared across tenants (the tenant is
    part of the key), and only usable runs are kept."""

    __tablename__ = "validation_baselines"
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    repository: Mapped[str] = mapped_column(String(300), primary_key=True)
    """The registration's id, or `unregistered:<url>`."""
    base_commit: Mapped[str] = mapped_column(String(64), primary_key=True)
    definition: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 of the definition (crewwork.validation.baseline.definition_key)."""
    facts: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The run's RunFacts and its log's artifact ref."""
    created_at: Mapped[float] = mapped_column(Float)


class FlakyTest(Base):
    """A test of a repository seen flaky (failed, then passed in a rerun of the same tree): the repository's flaky
    list, shown by the API and the CLI."""

    __tablename__ = "flaky_tests"
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    repository: Mapped[str] = mapped_column(String(300), primary_key=True)
    test_id: Mapped[str] = mapped_column(String(1000), primary_key=True)
    times: Mapped[int] = mapped_column(Integer, default=1)
    """Validations that saw it flaky."""
    first_seen_at: Mapped[float] = mapped_column(Float)
    last_seen_at: Mapped[float] = mapped_column(Float)
    last_work_item_id: Mapped[str] = mapped_column(String(64))
    last_attempt: Mapped[int] = mapped_column(Integer)
    last_runs: Mapped[str] = mapped_column(Text)
    """`id: failed in ...; passed in ...` of the last validation that saw it."""
