"""What the review workbench reads and writes in the store, on SQLite and PostgreSQL alike: a decision recorded fenced
with its webhook, the queue's filters (agent, repository, instruction text) and each item's latest attempt."""

from __future__ import annotations

from sqlalchemy import select

from crewwork.models import WorkItemSpec
from crewwork.store.fencing import REVIEW_EVENT, REVIEW_WEBHOOK, AttemptRecord, FencedWrite, Rank
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import Store
from crewwork.store.tables import OutboxMessage


def spec(instruction: str, agent: str) -> WorkItemSpec:
    return WorkItemSpec.model_validate(
        {
            "kind": "code_change",
            "repo": {"url": "/srv/repos/payments", "ref": "main"},
            "instruction": instruction,
            "validation": {"command": ["pytest"]},
            "agent": {"name": agent},
        }
    )


async def test_a_decision_is_recorded_fenced_with_its_webhook(any_store: Store) -> None:
    tid = await any_store.ensure_tenant("reviews")
    item, _ = await any_store.create_work_item(
        tenant_id=tid, spec=spec("Fix it", "scripted"), base_commit="b" * 40, repo_path="/srv/repos/payments"
    )
    hook = await OutboxStore(any_store).create_webhook(tid, "https://hooks.example/x", [REVIEW_WEBHOOK])
    review = {"action": "approve", "attempt": 2, "reviewer": "alice", "decided_at": 1.5, "line_comments": []}
    assert (await any_store.record_review(FencedWrite(item.id, tid, Rank(9, 1), "record_review#1"), review)).ok
    # A write scheduled before an accepted one is stale, and records nothing.
    late = {**review, "decided_at": 0.5}
    assert (await any_store.record_review(FencedWrite(item.id, tid, Rank(8, 1), "x#1"), late)).stale
    [event] = await any_store.events_of_type(item.id, REVIEW_EVENT)
    assert event.data["reviewer"] == "alice" and event.data["decided_at"] == 1.5
    async with any_store.session() as s:
        rows = (await s.scalars(select(OutboxMessage).where(OutboxMessage.webhook_id == hook.id))).all()
    assert [(m.event_type, m.payload["review"]["action"]) for m in rows] == [(REVIEW_WEBHOOK, "approve")]


async def test_the_queue_filters_and_each_items_latest_attempt(any_store: Store) -> None:
    tid = await any_store.ensure_tenant("queue")
    a, _ = await any_store.create_work_item(
        tenant_id=tid,
        spec=spec("Fix the 100% discount rounding", "model"),
        base_commit="b" * 40,
        repo_path="/srv/repos/payments",
    )
    b, _ = await any_store.create_work_item(
        tenant_id=tid, spec=spec("Add a changelog", "scripted"), base_commit="b" * 40, repo_path="/srv/repos/docs"
    )
    ids = lambda rows: {r.id for r in rows}  # noqa: E731
    assert ids(await any_store.list_work_items(tid, agent="model")) == {a.id}
    assert ids(await any_store.list_work_items(tid, repo="repos/docs")) == {b.id}
    assert ids(await any_store.list_work_items(tid, search="100% discount")) == {a.id}
    assert ids(await any_store.list_work_items(tid, search="50% discount")) == set()
    for n in (1, 2):
        record = AttemptRecord(number=n, verdict="failed" if n == 1 else "passed", reason=f"attempt {n}")
        assert (await any_store.record_attempt(FencedWrite(a.id, tid, Rank(n + 1, 1), "w"), record)).ok
    latest = await any_store.latest_attempts([a.id, b.id])
    assert set(latest) == {a.id} and latest[a.id].number == 2 and latest[a.id].verdict == "passed"
