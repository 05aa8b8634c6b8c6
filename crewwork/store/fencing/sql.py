"""The statements of the fenced write (crewwork/store/fencing/), built once: building a statement and its cache key
was a tenth of a worker's CPU per item (bench/trace.py --profile). Values are bound per call."""

from __future__ import annotations

from sqlalchemy import LargeBinary, bindparam, func, insert, select, text, tuple_, update

from crewwork.store.tables import Event, Tenant, Webhook, WorkItem

EVENT_INSERT = insert(Event)
# PostgreSQL: an event appended by the statement it goes with, as a data-modifying CTE (`WITH ev AS (INSERT INTO
# events ...) UPDATE work_items ...`): the change and its event in one round trip. A round trip to the database cost
# the worker ~0.3 ms of CPU (the socket write alone ~0.14 ms; bench/overhead.py under py-spy), and every state
# change, attempt record and evidence event had its own. Both statements of one SQL statement see the same snapshot
# and commit in the same transaction; nothing reads the event back. SQLite has no DML in a CTE and runs the two
# statements (in process: no round trip to save).
EVENT_CTE = (
    insert(Event)
    .values(
        work_item_id=bindparam("ev_work_item_id"),
        tenant_id=bindparam("ev_tenant_id"),
        type=bindparam("ev_type"),
        data=bindparam("ev_data", type_=Event.__table__.c.data.type),
        rank=bindparam("ev_rank"),
        created_at=bindparam("ev_created_at"),
    )
    .cte("ev")
)

# Whether the changed item's tenant has an active webhook: returned by the state change's own UPDATE, whose snapshot
# is taken after every lock the write waited for (the row's, the tenant's), so a webhook registered before the change
# commits is seen, as the outbox insert's own lookup saw it. (Read in the write's first statement it predated those
# waits, and a change that committed after a webhook's registration was never announced.)
# (The tenant is a bound value, not a correlation: SQLite's RETURNING clause is rendered with unqualified column
# names, and `tenant_id = tenant_id` inside the subquery would match every tenant's webhooks.)
HAS_WEBHOOKS = (
    select(Webhook.id)
    .where(Webhook.tenant_id == bindparam("hooks_tenant"), Webhook.active.is_(True))
    .exists()
    .label("hooks")
)
IN_FLIGHT_COUNT = (
    select(func.count())
    .select_from(WorkItem)
    .where(WorkItem.tenant_id == bindparam("tenant"), WorkItem.state.in_(bindparam("states", expanding=True)))
    .scalar_subquery()
)
QUEUED_AHEAD_COUNT = (
    select(func.count())
    .select_from(WorkItem)
    .where(
        WorkItem.tenant_id == bindparam("tenant"),
        WorkItem.state == "queued",
        # Row values: both databases seek the (tenant, state, created_at, id) index.
        tuple_(WorkItem.created_at, WorkItem.id) < tuple_(bindparam("created_at"), bindparam("wid")),
    )
    .scalar_subquery()
)
ADMISSION_COUNTS = select(IN_FLIGHT_COUNT.label("in_flight"), QUEUED_AHEAD_COUNT.label("ahead"))
# FOR NO KEY UPDATE: it serialises admissions and hand-offs, but not against the KEY SHARE locks that the foreign key
# checks of rows referencing the tenant take on its row (a submission's work item, a webhook, a repository, an API
# key; `events` has no foreign key). With FOR UPDATE, two items ending at once deadlocked (found under load; the
# lock that closed the cycle was not pinned down further).
TENANT_LOCK = select(Tenant.id).where(Tenant.id == bindparam("tenant")).with_for_update(key_share=True)
FIRST_QUEUED = (
    select(WorkItem.id, IN_FLIGHT_COUNT.label("in_flight"), WorkItem.created_at)
    .where(WorkItem.tenant_id == bindparam("tenant"), WorkItem.state == "queued")
    .order_by(WorkItem.created_at, WorkItem.id)
    .limit(bindparam("n"))
)
# The queued items after a given one, in queue order (when the first ones were all admitting themselves).
NEXT_QUEUED = (
    select(WorkItem.id, WorkItem.created_at)
    .where(
        WorkItem.tenant_id == bindparam("tenant"),
        WorkItem.state == "queued",
        tuple_(WorkItem.created_at, WorkItem.id) > tuple_(bindparam("after_created_at"), bindparam("after_id")),
    )
    .order_by(WorkItem.created_at, WorkItem.id)
    .limit(bindparam("n"))
)
LOCK_QUEUED = (
    select(WorkItem.id, WorkItem.fence_rank, WorkItem.workflow_id)
    .where(WorkItem.id.in_(bindparam("ids", expanding=True)), WorkItem.state == "queued")
    .with_for_update(skip_locked=True)
)
RAISE_MARK = update(WorkItem).where(WorkItem.id == bindparam("wid")).values(fence_rank=bindparam("rank"))

# PostgreSQL: a whole fenced write in one call of `crewwork_fenced_write` (migration 0008), outside an explicit
# transaction: one round trip where the Python path makes 4 to 9 (BEGIN, the row's lock, each change, COMMIT), each
# ~0.3 ms of a worker's CPU. The function runs the Python path's statements in the same order, each with its own
# snapshot; the Python path (SQLite, and `CREWWORK_STORE_SERVER_WRITES=false`) stays the reference.
SERVER_WRITE = text(
    "SELECT crewwork_fenced_write(:wid, :tenant, :rank, :writer, CAST(:ops AS jsonb), :terminal, :in_flight, "
    "CAST(:hand_off AS jsonb), :trace, :art_id, :art_name, :art_type, :art_size, :art_sha, :art)"
).bindparams(bindparam("art", type_=LargeBinary))
# The same call as the driver's own statement (`Database.driver_scalar`: no SQLAlchemy execution layers on the
# hottest statement), its parameters in SERVER_WRITE_ARGS' order.
SERVER_WRITE_DRIVER = (
    "SELECT crewwork_fenced_write($1, $2, $3, $4, CAST($5 AS jsonb), $6, $7, CAST($8 AS jsonb), $9, $10, $11, $12, "
    "$13, $14, $15::bytea)"
)
SERVER_WRITE_ARGS = (
    "wid", "tenant", "rank", "writer", "ops", "terminal", "in_flight", "hand_off", "trace",
    "art_id", "art_name", "art_type", "art_size", "art_sha", "art",
)  # fmt: skip
# The columns a server-side state change sets from `fields` (crewwork_change_state); a write with any other runs the
# Python path.
SERVER_FIELDS = frozenset({"result", "delivery_branch", "landed_commit", "mock"})
