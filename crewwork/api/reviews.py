"""What the API shows of an item's review: its recorded decisions (`review_decided` events), the attempt a decision
is taken on while it awaits review, and the latest attempt's checks at a glance (the triage queue's columns).
Views built from the store's records; the routes that change or show a review are in crewwork/api/changes.py."""

from __future__ import annotations

from typing import Any

from crewwork.api.schemas import CheckSummary, ReviewView, UnderReview
from crewwork.models import ReviewRecord
from crewwork.models.review import clean_line, describe
from crewwork.store.fencing import REVIEW_EVENT
from crewwork.store.store import Store
from crewwork.store.views import StoredAttempt, StoredWorkItem


def title_of(spec: dict[str, Any]) -> str:
    """The instruction's first line as one clean line (a task without one: its kind and agent)."""
    lines = str(spec.get("instruction") or "").strip().splitlines()
    if lines:
        return clean_line(lines[0], 200)
    return f"{spec.get('kind', 'task')}: {(spec.get('agent') or {}).get('name', 'agent')}"


def checks_of(a: StoredAttempt | None) -> CheckSummary | None:
    """The latest attempt's checks at a glance: tests run and failed, probes, the diff's size."""
    if a is None:
        return None
    val = a.validation if isinstance(a.validation, dict) else {}
    agent = a.agent if isinstance(a.agent, dict) else {}
    tests = [t for t in val.get("tests") or [] if isinstance(t, dict)]
    probes = [p for p in ((val.get("preview") or {}).get("probes") or []) if isinstance(p, dict)]
    stats: dict[str, Any] = agent["diff_stats"] if isinstance(agent.get("diff_stats"), dict) else {}
    return CheckSummary(
        attempt=a.number,
        verdict=a.verdict,
        cause=a.cause,
        tests_executed=int(val.get("tests_executed") or 0),
        tests_failed=sum(1 for t in tests if t.get("outcome") in ("failed", "error")),
        probes_passed=sum(1 for p in probes if p.get("passed")),
        probes_failed=sum(1 for p in probes if not p.get("passed")),
        files_changed=int(stats.get("files_changed") or 0),
        insertions=int(stats.get("insertions") or 0),
        deletions=int(stats.get("deletions") or 0),
    )


async def reviews_of(store: Store, work_item_id: str) -> list[ReviewView]:
    """The item's review decisions as recorded (`review_decided` events), oldest first."""
    out = []
    for e in await store.events_of_type(work_item_id, REVIEW_EVENT):
        data = {k: v for k, v in e.data.items() if k in ReviewRecord.model_fields}
        try:
            record = ReviewRecord.model_validate(data)
        except ValueError:  # a record this version cannot read: left out rather than a 500
            continue
        out.append(ReviewView(**record.model_dump(), summary=describe(record)))
    return out


def under_review(row: StoredWorkItem, attempts: list[StoredAttempt], live_attempt: int | None) -> UnderReview | None:
    """The attempt awaiting review: the workflow's word when it answered, else the latest passing attempt (the one
    the review gate waits on)."""
    passed = [a for a in attempts if a.verdict == "passed"]
    chosen = next((a for a in attempts if a.number == live_attempt), None) if live_attempt else None
    chosen = chosen or (passed[-1] if passed else None)
    if chosen is None:
        return None
    ref = (chosen.agent or {}).get("diff_ref") if isinstance(chosen.agent, dict) else None
    sha = ref.get("sha256") if isinstance(ref, dict) else None
    return UnderReview(attempt=chosen.number, diff_sha256=sha, base_commit=row.base_commit)
