"""Invariants of the store after any run, however faulty: the checker the reliability and soak tests end with.

Everything here is read from the canonical store (and, optionally, the repositories' refs), after the fact, so it
holds no matter which processes crashed, which activities ran twice, or which connections dropped. What is
checkable, and how (docs/reliability.md explains why these are the right ones):

- `terminal`: every work item is in a terminal state (the non-terminal ones are listed; pass
  `require_terminal=False` for a check taken while work is still in flight).
- `monotonic_writes`: accepted fenced writes of a work item (events written inside a fenced transaction, each
  carrying the token it was accepted with) appear in commit order with non-decreasing tokens. Fenced writes of one
  key serialize on the counter row's lock, so event ids follow commit order; a lower token after a higher one
  would mean an older writer overwrote a newer one.
- `result_token`: the stored result's token (`work_items.result_token`) and state token are the highest token of any
  accepted write, and no accepted write is newer than the key's fence counter. So once the result is stored, nothing
  older, nor anything at all, was accepted after it.
- `unique_tokens`: no two accepted writes of the same kind share a token, and no two attempt rows share one. (One
  activity attempt may write several kinds of event with its single lease token, so equal tokens across kinds are
  allowed.) Every `stale_write_rejected` event presented a token lower than the one current at the time.
- `lease_exclusive`: for every lease key in `lease_history`, grants never overlap on the database clock (each grant
  ends at or before the next one begins; at most one is open, and it is the latest).
- `no_lease_held`: a terminal work item holds no lease: neither its execution lease nor a workspace lease.
- `one_landing`: a succeeded code change has exactly one `landed` event whose commit is the stored landed commit
  (and, with `check_git`, what its delivery branch points to); every other work item has none.

Not checkable here, by design: side effects outside the store that a zombie attempt made before it was fenced
(an external call, files in its own worktree), and artifact rows a zombie inserted (they exist, unreferenced).
"""

from __future__ import annotations

import itertools
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from crewwork.models import WorkItemKind, WorkItemState
from crewwork.store.store import Store, work_item_fence_key
from crewwork.store.tables import Attempt, Event, Fence, Lease, LeaseHistory, WorkItem

# Events appended inside `Store.fenced_write`, i.e. accepted only when their token was the newest.
FENCED_EVENT_TYPES = frozenset({"state_changed", "attempt_recorded", "agent_finished", "validation_finished"})
INVARIANTS = (
    "terminal",
    "monotonic_writes",
    "result_token",
    "unique_tokens",
    "lease_exclusive",
    "no_lease_held",
    "one_landing",
)


@dataclass
class InvariantResult:
    name: str
    ok: bool = True
    details: list[str] = field(default_factory=list)

    def fail(self, detail: str) -> None:
        self.ok = False
        self.details.append(detail)


@dataclass
class InvariantReport:
    results: dict[str, InvariantResult]
    work_item_ids: list[str]
    non_terminal: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results.values())

    def failed(self) -> list[str]:
        return [n for n, r in self.results.items() if not r.ok]

    def __str__(self) -> str:
        lines = [f"invariants over {len(self.work_item_ids)} work item(s): {'PASS' if self.ok else 'FAIL'}"]
        for r in self.results.values():
            lines.append(f"  {'ok  ' if r.ok else 'FAIL'} {r.name}")
            lines.extend(f"       - {d}" for d in r.details[:20])
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(str(self))


async def check_invariants(
    store: Store,
    work_item_ids: Iterable[str] | None = None,
    *,
    require_terminal: bool = True,
    check_git: bool = False,
) -> InvariantReport:
    """Check every invariant over `work_item_ids` (default: every work item in the store)."""
    results = {n: InvariantResult(n) for n in INVARIANTS}
    async with store.session() as s:
        q = select(WorkItem)
        if work_item_ids is not None:
            ids = list(work_item_ids)
            q = q.where(WorkItem.id.in_(ids))
        items = {w.id: w for w in (await s.scalars(q)).all()}
        if work_item_ids is not None:
            for missing in sorted(set(ids) - set(items)):
                results["terminal"].fail(f"{missing}: not in the store")
        wids = list(items)
        events = list((await s.scalars(select(Event).where(Event.work_item_id.in_(wids)).order_by(Event.id))).all())
        attempts = list((await s.scalars(select(Attempt).where(Attempt.work_item_id.in_(wids)))).all())
        fence_keys = {work_item_fence_key(w): w for w in wids}
        fences = {f.key: f.token for f in (await s.scalars(select(Fence).where(Fence.key.in_(list(fence_keys))))).all()}
        ws_keys = {str(e.data.get("key")) for e in events if e.type == "workspace_acquired" and e.data.get("key")}
        hist_keys = list(fence_keys) + sorted(ws_keys)
        history = list(
            (
                await s.scalars(select(LeaseHistory).where(LeaseHistory.key.in_(hist_keys)).order_by(LeaseHistory.id))
            ).all()
        )
        leases = list((await s.scalars(select(Lease).where(Lease.key.in_(hist_keys)))).all())

    by_item: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_item[e.work_item_id].append(e)
    attempts_by_item: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        attempts_by_item[a.work_item_id].append(a)

    report = InvariantReport(results=results, work_item_ids=sorted(wids))
    for wid, item in sorted(items.items()):
        state = WorkItemState(item.state)
        if not state.terminal:
            report.non_terminal.append(f"{wid}: {item.state}")
            if require_terminal:
                results["terminal"].fail(f"{wid} is {item.state}, not terminal")
        evs = by_item.get(wid, [])
        accepted = [e for e in evs if e.type in FENCED_EVENT_TYPES and e.token is not None]
        _check_monotonic(results["monotonic_writes"], wid, accepted)
        _check_result_token(results["result_token"], item, accepted, attempts_by_item.get(wid, []), fences)
        _check_unique(results["unique_tokens"], wid, accepted, attempts_by_item.get(wid, []), evs)
        _check_landing(results["one_landing"], item, evs, check_git)

    _check_leases(results["lease_exclusive"], history)
    for lease in leases:
        owner = fence_keys.get(lease.key) or (lease.holder if lease.holder in items else None)
        if owner is not None and WorkItemState(items[owner].state).terminal:
            results["no_lease_held"].fail(
                f"{lease.key} is still held by {lease.holder} (token {lease.token}) though {owner} is "
                f"{items[owner].state}"
            )
    return report


def _check_monotonic(r: InvariantResult, wid: str, accepted: list[Event]) -> None:
    high: Event | None = None
    for e in accepted:
        assert e.token is not None
        if high is not None and e.token < (high.token or 0):
            r.fail(
                f"{wid}: accepted {e.type} (event {e.id}) has token {e.token} after {high.type} "
                f"(event {high.id}) was accepted with token {high.token}"
            )
        if high is None or e.token >= (high.token or 0):
            high = e


def _check_result_token(
    r: InvariantResult, item: WorkItem, accepted: list[Event], attempts: list[Attempt], fences: dict[str, int]
) -> None:
    tokens = [int(e.token) for e in accepted if e.token is not None] + [a.token for a in attempts]
    if not tokens:
        return
    top = max(tokens)
    counter = fences.get(work_item_fence_key(item.id))
    if counter is None or top > counter:
        r.fail(f"{item.id}: accepted token {top} is newer than the fence counter {counter}")
    if item.result is not None and item.result_token != top:
        r.fail(f"{item.id}: stored result has token {item.result_token}, but an accepted write has token {top}")
    if WorkItemState(item.state).terminal and item.state_token != top:
        r.fail(f"{item.id}: final state has token {item.state_token}, but an accepted write has token {top}")


def _check_unique(
    r: InvariantResult, wid: str, accepted: list[Event], attempts: list[Attempt], events: list[Event]
) -> None:
    seen: dict[tuple[str, int], int] = {}
    for e in accepted:
        assert e.token is not None
        k = (e.type, int(e.token))
        if k in seen:
            r.fail(f"{wid}: two accepted {e.type} writes share token {e.token} (events {seen[k]} and {e.id})")
        seen[k] = e.id
    by_token: dict[int, int] = {}
    numbers: set[int] = set()
    for a in attempts:
        if a.token in by_token:
            r.fail(f"{wid}: attempts {by_token[a.token]} and {a.number} share token {a.token}")
        by_token[a.token] = a.number
        if a.number in numbers:
            r.fail(f"{wid}: attempt {a.number} was stored twice")
        numbers.add(a.number)
    for e in events:
        if e.type != "stale_write_rejected":
            continue
        presented, current = e.data.get("presented_token"), e.data.get("current_token")
        if current is not None and presented is not None and presented >= current:
            r.fail(f"{wid}: write with token {presented} was rejected though the current token was {current}")


def _check_landing(r: InvariantResult, item: WorkItem, events: list[Event], check_git: bool) -> None:
    landed = [e for e in events if e.type == "landed"]
    should = item.state == WorkItemState.succeeded.value and item.kind == WorkItemKind.code_change.value
    if not should:
        if landed:
            r.fail(f"{item.id} is {item.state} ({item.kind}) but has {len(landed)} landed event(s)")
        return
    if len(landed) != 1:
        r.fail(f"{item.id} succeeded with {len(landed)} landed events; exactly one is expected")
    commits = {e.data.get("commit") for e in landed}
    if landed and commits != {item.landed_commit}:
        r.fail(f"{item.id}: landed commits {sorted(map(str, commits))} != stored {item.landed_commit}")
    if check_git and item.repo_url and item.delivery_branch:
        # ls-remote reads a local path and a (credential-free) remote URL alike.
        res = subprocess.run(
            ["git", "ls-remote", "--", item.repo_url, f"refs/heads/{item.delivery_branch}"],
            cwd="/",
            capture_output=True,
            text=True,
        )
        at = res.stdout.split()[0] if res.stdout.split() else ""
        if at != item.landed_commit:
            r.fail(f"{item.id}: {item.delivery_branch} is at {at or 'nothing'}, not the landed commit")


def _check_leases(r: InvariantResult, history: list[LeaseHistory]) -> None:
    by_key: dict[str, list[LeaseHistory]] = defaultdict(list)
    for h in history:
        by_key[h.key].append(h)
    for key, grants in by_key.items():
        grants.sort(key=lambda h: (h.acquired_at, h.token))
        open_ = [g for g in grants if g.ended_at is None]
        if len(open_) > 1:
            r.fail(f"{key}: {len(open_)} grants are open at once (tokens {[g.token for g in open_]})")
        for prev, nxt in itertools.pairwise(grants):
            end = prev.ended_at
            if end is None or end > nxt.acquired_at:
                r.fail(
                    f"{key}: {prev.holder} (token {prev.token}) held it until "
                    f"{'still open' if end is None else f'{end:.6f}'}, overlapping {nxt.holder} "
                    f"(token {nxt.token}) from {nxt.acquired_at:.6f}"
                )
            if nxt.token <= prev.token:
                r.fail(f"{key}: a later grant has token {nxt.token} <= earlier token {prev.token}")


def summarize(report: InvariantReport) -> dict[str, Any]:
    """A JSON-able summary (for soak benchmarks)."""
    return {
        "ok": report.ok,
        "work_items": len(report.work_item_ids),
        "failed": report.failed(),
        "non_terminal": report.non_terminal,
    }
