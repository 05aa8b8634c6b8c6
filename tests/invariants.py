"""Invariants of the store after any run, however faulty: the checker the reliability and soak tests end with.

Everything is read after the fact from the canonical store (and optionally the repositories' refs and Temporal's
workflow histories), so it holds whichever processes crashed, which activities ran twice, which connections dropped.
Ranks are fixed when Temporal *schedules* a step (crewwork/store/fencing/rule.py), not by the store, so a store that
accepted a late write would show it here. What is checked (docs/reliability.md says why these are the right ones):

- `terminal`: every work item is in a terminal state (pass `require_terminal=False` while work is in flight).
- `monotonic_writes`: the accepted fenced writes of an item (events carrying a rank), in commit order, never go
  down in rank: no write of an older (step, attempt) was accepted after a newer one.
- `fence_mark`: the item's mark (`fence_rank`) is the highest accepted rank (while in flight it may be higher: a
  queued item's admission that changes nothing raises it without an event), and the stored final state and result
  carry it: once the result is stored, nothing was accepted after it.
- `rejections_justified`: every `stale_write_rejected` presented a rank below the one current at the time.
- `state_forward`: the stored state only moves forward: (attempt, phase) of successive accepted state changes never
  decreases (a reviewer's request for changes starts the next attempt, so it moves forward too), and nothing
  follows a terminal state.
- `outcome_agreement`: each attempt record names the same diff as the last accepted `agent_finished` of that attempt
  and its own `attempt_recorded` event: the event log and the records tell one story.
- `unique_attempts`: no attempt number is stored twice.
- `lease_exclusive`: workspace lease grants of a key never overlap on the database clock.
- `no_lease_held`: a terminal work item holds no workspace lease.
- `one_landing`: a succeeded code change has exactly one `landed` event, whose commit is the stored landed commit
  (and, with `check_git`, what its delivery branch points to, read as the workers read a remote: hardened host
  git, the address policy of crewwork.repos.address); every other item has none.
- `temporal_agreement` (only with `histories`): the last accepted outcome of each agent, validation and landing step
  comes from the attempt Temporal recorded as completing that step.

Not checkable here, by design: side effects outside the store that a zombie attempt made before it was fenced (an
external call, files in its own worktree), and artifact rows a zombie inserted (they exist, unreferenced).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crewwork.boundary.urls import RepoURLError, parse_repo_url
from crewwork.models import WorkItemKind, WorkItemState
from crewwork.repos.address import RemoteAddressPolicy
from crewwork.repos.git import RemoteError
from crewwork.repos.remote import Remote
from crewwork.store.audit import AuditAttempt, AuditEvent, AuditItem, LeaseGrant
from crewwork.store.fencing import Rank
from crewwork.store.store import Store

REJECTIONS = frozenset({"stale_write_rejected", "write_after_terminal_rejected"})
# Phases of a work item in lifecycle order; every terminal state is the last phase.
PHASES = {
    WorkItemState.submitted.value: 0,
    WorkItemState.queued.value: 1,
    WorkItemState.admitted.value: 2,
    WorkItemState.running.value: 3,
    WorkItemState.validating.value: 4,
    WorkItemState.awaiting_review.value: 5,
    WorkItemState.landing.value: 6,
}
TERMINAL_PHASE = 7
# Steps whose outcome is an event the checker can compare with Temporal's record of who completed the step.
OUTCOME_EVENTS = {"run_agent": "agent_finished", "validate_change": "validation_finished", "land_change": "landed"}
INVARIANTS = (
    "terminal",
    "monotonic_writes",
    "fence_mark",
    "rejections_justified",
    "state_forward",
    "outcome_agreement",
    "unique_attempts",
    "lease_exclusive",
    "no_lease_held",
    "one_landing",
    "temporal_agreement",
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
    counts: dict[str, int] = field(default_factory=dict)
    """Totals over the checked items: accepted writes, rejected stale writes, state regressions, landings..."""

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


@dataclass(frozen=True)
class CompletedStep:
    """From a workflow history: a step Temporal recorded as completed, by which attempt, of which activity."""

    activity: str
    step: int
    attempt: int


async def check_invariants(
    store: Store,
    work_item_ids: Iterable[str] | None = None,
    *,
    require_terminal: bool = True,
    check_git: bool = False,
    histories: Mapping[str, list[CompletedStep]] | None = None,
    address: RemoteAddressPolicy | None = None,
) -> InvariantReport:
    """Check every invariant over `work_item_ids` (default: every work item in the store). `histories` maps work
    item ids to their completed steps (`completed_steps` of their Temporal histories). With `check_git`, each
    delivery branch is read from its remote as the workers read it, host git hardened and the remote's host held to
    `address` (default: the operator's CREWWORK_REPO_ALLOW_NETWORKS, crewwork.repos.address): the URL is a
    tenant's."""
    if check_git and address is None:
        from crewwork.config import Settings

        address = RemoteAddressPolicy.from_settings(Settings())
    results = {n: InvariantResult(n) for n in INVARIANTS}
    snap = await store.audit_snapshot(None if work_item_ids is None else list(work_item_ids))
    items = snap.items
    for missing in snap.missing:
        results["terminal"].fail(f"{missing}: not in the store")
    wids = list(items)

    by_item: dict[str, list[AuditEvent]] = defaultdict(list)
    for e in snap.events:
        by_item[e.work_item_id].append(e)
    attempts_by_item: dict[str, list[AuditAttempt]] = defaultdict(list)
    for a in snap.attempts:
        attempts_by_item[a.work_item_id].append(a)

    report = InvariantReport(results=results, work_item_ids=sorted(wids))
    counts: dict[str, int] = defaultdict(int)
    for wid, item in sorted(items.items()):
        state = WorkItemState(item.state)
        if not state.terminal:
            report.non_terminal.append(f"{wid}: {item.state}")
            if require_terminal:
                results["terminal"].fail(f"{wid} is {item.state}, not terminal")
        evs = by_item.get(wid, [])
        accepted = [e for e in evs if e.rank is not None and e.type not in REJECTIONS]
        counts["accepted_writes"] += len(accepted)
        counts["stale_rejected"] += sum(e.type == "stale_write_rejected" for e in evs)
        counts["after_terminal_rejected"] += sum(e.type == "write_after_terminal_rejected" for e in evs)
        counts["landed"] += sum(e.type == "landed" for e in evs)
        _check_monotonic(results["monotonic_writes"], wid, accepted, counts)
        _check_mark(results["fence_mark"], item, accepted)
        _check_rejections(results["rejections_justified"], wid, evs)
        _check_forward(results["state_forward"], wid, accepted, counts)
        _check_outcomes(results["outcome_agreement"], wid, accepted, attempts_by_item.get(wid, []))
        _check_unique_attempts(results["unique_attempts"], wid, attempts_by_item.get(wid, []))
        _check_landing(results["one_landing"], item, evs)
        if check_git and address is not None:
            await _check_delivery_branch(results["one_landing"], item, address)
        if histories is not None and wid in histories:
            _check_temporal(results["temporal_agreement"], wid, accepted, histories[wid])

    _check_leases(results["lease_exclusive"], snap.grants)
    for lease in snap.held:
        owner = items.get(lease.holder)
        if owner is not None and WorkItemState(owner.state).terminal:
            results["no_lease_held"].fail(
                f"{lease.key} is still held by {lease.holder} (grant {lease.token}) though it is {owner.state}"
            )
    report.counts = dict(counts)
    return report


def _rank(e: AuditEvent) -> Rank:
    assert e.rank is not None
    return Rank.decode(int(e.rank))


def _check_monotonic(r: InvariantResult, wid: str, accepted: list[AuditEvent], counts: dict[str, int]) -> None:
    high: AuditEvent | None = None
    for e in accepted:
        if high is not None and _rank(e) < _rank(high):
            counts["stale_accepted"] += 1
            r.fail(
                f"{wid}: {e.type} (event {e.id}) was accepted at {_rank(e)} after {high.type} (event {high.id}) "
                f"at {_rank(high)}"
            )
        if high is None or _rank(e) >= _rank(high):
            high = e


def _check_mark(r: InvariantResult, item: AuditItem, accepted: list[AuditEvent]) -> None:
    if not accepted:
        return
    top = max(int(e.rank or 0) for e in accepted)
    # An accepted write that changes nothing leaves no event but raises the mark: a queued item's admission that
    # keeps it queued, or finds it admitted by a hand-off. So, while in flight, the mark may be above every event;
    # never below one, and a terminal item's last write (its final state) is the mark.
    terminal = WorkItemState(item.state).terminal
    if item.fence_rank < top or (terminal and item.fence_rank != top):
        r.fail(
            f"{item.id}: fence mark is {Rank.decode(item.fence_rank)} but the highest accepted write is "
            f"{Rank.decode(top)}"
        )
    if item.has_result and item.result_rank != top:
        r.fail(
            f"{item.id}: the result was stored at {_fmt(item.result_rank)}, yet a write at {Rank.decode(top)} "
            "was accepted"
        )
    if terminal and item.state_rank != top:
        r.fail(
            f"{item.id}: the final state was stored at {_fmt(item.state_rank)}, yet a write at "
            f"{Rank.decode(top)} was accepted"
        )


def _fmt(rank: int | None) -> str:
    return "no rank" if rank is None else str(Rank.decode(rank))


def _check_rejections(r: InvariantResult, wid: str, events: list[AuditEvent]) -> None:
    for e in events:
        if e.type != "stale_write_rejected":
            continue
        p, c = e.data.get("presented") or {}, e.data.get("current") or {}
        try:
            presented, current = Rank(int(p["step"]), int(p["attempt"])), Rank(int(c["step"]), int(c["attempt"]))
        except (KeyError, TypeError, ValueError):
            r.fail(f"{wid}: rejection event {e.id} does not name both ranks: {e.data}")
            continue
        if presented >= current:
            r.fail(f"{wid}: a write at {presented} was rejected though the current rank was {current}")


def _check_forward(r: InvariantResult, wid: str, accepted: list[AuditEvent], counts: dict[str, int]) -> None:
    attempt = 0
    last: tuple[int, int] | None = None
    last_state = ""
    for e in accepted:
        if e.type != "state_changed":
            continue
        state = str(e.data.get("state"))
        if isinstance(e.data.get("attempt"), int):
            attempt = int(e.data["attempt"])
        phase = TERMINAL_PHASE if WorkItemState(state).terminal else PHASES[state]
        key = (attempt if phase != TERMINAL_PHASE else 1 << 30, phase)
        if last is not None and (key < last or last[1] == TERMINAL_PHASE):
            counts["state_regressions"] += 1
            r.fail(f"{wid}: state went from {last_state} to {state} (event {e.id}, attempt {attempt})")
        last, last_state = key, state


def _check_outcomes(r: InvariantResult, wid: str, accepted: list[AuditEvent], attempts: list[AuditAttempt]) -> None:
    finished: dict[int, Any] = {}
    recorded: dict[int, Any] = {}
    for e in accepted:
        if e.type == "agent_finished" and isinstance(e.data.get("attempt"), int):
            finished[int(e.data["attempt"])] = e.data.get("diff_ref")
        elif e.type == "attempt_recorded" and isinstance(e.data.get("number"), int):
            recorded[int(e.data["number"])] = e.data.get("diff_ref")
    for a in attempts:
        diff = ((a.agent or {}).get("diff_ref") or {}).get("id")
        if a.number in finished and finished[a.number] != diff:
            r.fail(
                f"{wid}: attempt {a.number} is recorded with diff {diff}, but its last accepted agent_finished "
                f"names {finished[a.number]}"
            )
        if a.number in recorded and recorded[a.number] != diff:
            r.fail(
                f"{wid}: attempt {a.number} is recorded with diff {diff}, but its attempt_recorded event names "
                f"{recorded[a.number]}"
            )


def _check_unique_attempts(r: InvariantResult, wid: str, attempts: list[AuditAttempt]) -> None:
    seen: set[int] = set()
    for a in attempts:
        if a.number in seen:
            r.fail(f"{wid}: attempt {a.number} was stored twice")
        seen.add(a.number)


def _check_landing(r: InvariantResult, item: AuditItem, events: list[AuditEvent]) -> None:
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


async def _check_delivery_branch(r: InvariantResult, item: AuditItem, address: RemoteAddressPolicy) -> None:
    """The delivery branch of a succeeded code change points at the landed commit (a local path or a remote, read
    through crewwork.repos.remote like every network git command: checked address, pinned, no credential)."""
    if not (item.state == WorkItemState.succeeded.value and item.kind == WorkItemKind.code_change.value):
        return
    if not (item.repo_url and item.delivery_branch):
        return
    ref = f"refs/heads/{item.delivery_branch}"
    try:
        remote = Remote(url=parse_repo_url(item.repo_url), address=address, timeout_s=120)
        at = (await remote.ls_remote(ref)).get(ref, "")
    except (RepoURLError, RemoteError) as exc:
        r.fail(f"{item.id}: cannot read {item.delivery_branch} of {item.repo_url}: {exc}")
        return
    if at != item.landed_commit:
        r.fail(f"{item.id}: {item.delivery_branch} is at {at or 'nothing'}, not the landed commit")


def _check_temporal(r: InvariantResult, wid: str, accepted: list[AuditEvent], completed: list[CompletedStep]) -> None:
    last_outcome: dict[tuple[str, int], Rank] = {}
    for e in accepted:
        if e.type in OUTCOME_EVENTS.values():
            rank = _rank(e)
            last_outcome[(e.type, rank.step)] = rank
    for c in completed:
        kind = OUTCOME_EVENTS.get(c.activity)
        if kind is None:
            continue
        got = last_outcome.get((kind, c.step))
        if got is not None and got.attempt != c.attempt:
            r.fail(
                f"{wid}: the accepted {kind} of step {c.step} came from attempt {got.attempt}, but Temporal "
                f"recorded attempt {c.attempt} as completing it"
            )


def _check_leases(r: InvariantResult, history: Iterable[LeaseGrant]) -> None:
    by_key: dict[str, list[LeaseGrant]] = defaultdict(list)
    for h in history:
        by_key[h.key].append(h)
    for key, grants in by_key.items():
        grants.sort(key=lambda h: (h.acquired_at, h.token))
        open_ = [g for g in grants if g.ended_at is None]
        if len(open_) > 1:
            r.fail(f"{key}: {len(open_)} grants are open at once ({[g.token for g in open_]})")
        for prev, nxt in itertools.pairwise(grants):
            end = prev.ended_at
            if end is None or end > nxt.acquired_at:
                r.fail(
                    f"{key}: {prev.holder} (grant {prev.token}) held it until "
                    f"{'still open' if end is None else f'{end:.6f}'}, overlapping {nxt.holder} "
                    f"(grant {nxt.token}) from {nxt.acquired_at:.6f}"
                )
            if nxt.token <= prev.token:
                r.fail(f"{key}: a later grant is numbered {nxt.token} <= earlier {prev.token}")


def completed_steps(history: Any) -> list[CompletedStep]:
    """The completed activity steps of a Temporal `WorkflowHistory` (temporalio.client): for each activity that
    completed, its type, the step number from its input, and the attempt that completed it."""
    scheduled: dict[int, tuple[str, int]] = {}
    started: dict[int, int] = {}
    out: list[CompletedStep] = []
    for ev in history.events:
        kind = ev.WhichOneof("attributes")
        if kind == "activity_task_scheduled_event_attributes":
            attrs = ev.activity_task_scheduled_event_attributes
            step = _step_of(attrs.input.payloads[0].data if attrs.input.payloads else b"")
            if step is not None:
                scheduled[ev.event_id] = (attrs.activity_type.name, step)
        elif kind == "activity_task_started_event_attributes":
            attrs = ev.activity_task_started_event_attributes
            started[attrs.scheduled_event_id] = attrs.attempt
        elif kind == "activity_task_completed_event_attributes":
            attrs = ev.activity_task_completed_event_attributes
            if attrs.scheduled_event_id in scheduled:
                name, step = scheduled[attrs.scheduled_event_id]
                out.append(CompletedStep(name, step, started.get(attrs.scheduled_event_id, 1)))
    return out


def _step_of(data: bytes) -> int | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return int(value["step"]) if isinstance(value, dict) and isinstance(value.get("step"), int) else None


def summarize(report: InvariantReport) -> dict[str, Any]:
    """A JSON-able summary (for soak benchmarks)."""
    return {
        "ok": report.ok,
        "work_items": len(report.work_item_ids),
        "failed": report.failed(),
        "non_terminal": report.non_terminal,
        "counts": report.counts,
    }
