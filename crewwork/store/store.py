"""The canonical store: one facade over the store's aggregates, each in its own module.

| module | aggregate |
|---|---|
| `engine` | the engine, sessions and transactions, the database clock |
| `auth` | tenants and API keys |
| `work_items` | submitted work items and their reads |
| `open_items` | the work items not terminal yet, oldest first (the reconciler's walk) |
| `fencing/` | the fenced writes (a package; its `__init__` lists its modules): |
| `fencing/rule.py` | the ordering rule, and `FencingStore`, which runs every fenced write through one path: |
| `fencing/reference.py` | the fenced write statement by statement: the reference implementation of the rules |
| `fencing/dialects.py` | SQLite and PostgreSQL as subclasses of it |
| `fencing/server_side.py` | PostgreSQL as one call of `crewwork_fenced_write` (migration 0008), proven equal by tests |
| `fencing/vocabulary.py` | ranks; the values a write is made of, built once where it starts; results |
| `fencing/sql.py` | the statements, built once |
| `events` | the append-only event log |
| `attempts` | attempt records and the breaker's fingerprints |
| `leases` | workspace leases and their history |
| `artifacts` | diffs, logs, transcripts, reports |
| `outbox` | webhooks and their durable outbox (`OutboxStore`, beside the facade; the deliverer is crewwork/webhooks) |
| `repositories` | repositories owned by tenants |
| `baselines` | validation baselines per base commit, cached per tenant, and each repository's flaky tests |
| `projections` | aggregate counts for the metrics scrape |
| `ratelimits` | the API's rate-limit buckets, shared by every API process |
| `audit` | a snapshot of items, events, attempts and lease grants for the invariant checker |
| `views` | what the reads hand out: frozen views of the records, never the ORM rows of `tables` |

Every write that changes a work item's state or records what an attempt produced goes through
`FencingStore.fenced_write` (see crewwork/store/fencing/rule.py for the ordering rule;
tests/store/test_fencing_differential.py proves the server function equal to the Python path).
"""

from __future__ import annotations

from crewwork.boundary.masking import mask_secrets
from crewwork.models.ids import new_id
from crewwork.store.artifacts import ArtifactStore, ArtifactTooLarge
from crewwork.store.attempts import AttemptRecord, AttemptStore
from crewwork.store.audit import AuditStore
from crewwork.store.auth import API_KEY_PREFIX, AuthStore, Principal, hash_api_key
from crewwork.store.baselines import BaselineStore
from crewwork.store.engine import NotFound, StoreError
from crewwork.store.events import EventStore
from crewwork.store.fencing import SUBMISSION, Accepted, Admission, FencedWrite, Rank, StateChange, WriteResult
from crewwork.store.leases import LeaseStore, workspace_lease_key
from crewwork.store.open_items import OpenItemStore
from crewwork.store.projections import ProjectionStore, StoreCounts
from crewwork.store.ratelimits import RateLimitStore
from crewwork.store.repositories import RepositoryExists, RepositoryStore
from crewwork.store.work_items import WorkItemStore


class Store(
    AuthStore,
    WorkItemStore,
    OpenItemStore,
    AttemptStore,
    EventStore,
    LeaseStore,
    ArtifactStore,
    RateLimitStore,
    ProjectionStore,
    RepositoryStore,
    BaselineStore,
    AuditStore,
):
    """Everything the API, the activities and the tools read and write, on one engine."""


__all__ = [
    "API_KEY_PREFIX",
    "SUBMISSION",
    "Accepted",
    "Admission",
    "ArtifactTooLarge",
    "AttemptRecord",
    "FencedWrite",
    "NotFound",
    "Principal",
    "Rank",
    "RepositoryExists",
    "StateChange",
    "Store",
    "StoreCounts",
    "StoreError",
    "WriteResult",
    "hash_api_key",
    "mask_secrets",
    "new_id",
    "workspace_lease_key",
]
