"""Control-pool activities: admission, fenced state and attempt records, workspace leases, landing, cleanup.

Short store and git operations. Most run as local activities of the workflow that calls them. Each writes at the
rank of its step (`AttemptWriter`), so a late copy of any of them is refused once a later step has written.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crewwork.activities.common import AttemptWriter, artifact_bytes
from crewwork.config import Settings
from crewwork.evidence.facts import ReviewFact
from crewwork.evidence.format import MAX_BUNDLE_BYTES
from crewwork.evidence.publish import BUNDLE_ARTIFACT, EvidenceUnavailable, Publisher, Signed
from crewwork.forge import ForgeError
from crewwork.limits import check_within_ceilings, effective_budget
from crewwork.models import ArtifactRef, WorkItemState
from crewwork.repos.landing import Landed, LandingConflictError, notes_ref
from crewwork.repos.service import REPO_ERRORS, Repositories, repo_failure
from crewwork.steps.admit import AdmitInput, AdmitResult
from crewwork.steps.errors import (
    EVIDENCE_UNAVAILABLE,
    LANDING_CONFLICT,
    PULL_REQUEST_FAILED,
    STALE_ATTEMPT,
    bad_input,
)
from crewwork.steps.finish import FinishInput
from crewwork.steps.land import LandInput, LandResult
from crewwork.steps.record import RecordInput, RecordResult
from crewwork.steps.state import SetStateInput
from crewwork.steps.step import WriteOutcome
from crewwork.steps.workspace import CleanupInput, ReleaseInput, WorkspaceLeaseInput, WorkspaceLeaseResult
from crewwork.store.fencing import HandedOff
from crewwork.store.store import AttemptRecord, Store
from crewwork.workspace import remove_tree

log = logging.getLogger("crewwork.activities.control")

HAND_OFF_CAP = 3
"""At most this many of the tenant's queued items are admitted by one item leaving its place (more than one only when
the in-flight limit was raised, or places were freed without a hand-off: an item ended some other way)."""


async def tell_admitted(client: Any, handed: list[HandedOff] | None) -> None:
    """Tell the workflows of the queued items a write admitted (`FencingStore.hand_off`) that they may go on.
    Best effort: the admission is in the store already, and a queued item that misses the signal finds it there
    at its next admission poll (crewwork.workflows.policies.QUEUE_POLL)."""
    if not handed or client is None:
        return
    for item in handed:
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(item.workflow_id).signal("admitted")


def attempt_record(inp: RecordInput) -> AttemptRecord:
    return AttemptRecord(
        number=inp.attempt,
        verdict=inp.verdict,
        reason=inp.reason,
        cause=inp.cause,
        fingerprint=inp.fingerprint,
        agent=inp.agent.model_dump(mode="json") if inp.agent else None,
        validation=inp.validation.model_dump(mode="json") if inp.validation else None,
    )


class ControlActivities:
    def __init__(self, store: Store, settings: Settings, client: Any = None) -> None:
        """`client` (a Temporal client) lets a write that hands a freed place on tell the queued items it admitted
        at once, instead of at their next poll."""
        self.store = store
        self.settings = settings
        self.client = client
        self.repos = Repositories(settings)
        self.evidence = Publisher(settings.evidence)

    @activity.defn(name="admit")
    async def admit(self, inp: AdmitInput) -> AdmitResult:
        w = AttemptWriter.of(self.store, inp)
        ceilings = self.settings.operator_ceilings()
        try:
            # The API refuses these at submission; this catches items submitted before a ceiling was lowered.
            check_within_ceilings(inp.spec.budget, ceilings)
        except ValueError as exc:
            if await self.store.get_work_item(inp.work_item_id, inp.tenant_id) is None:
                raise bad_input(f"work item {inp.work_item_id} is not in the store") from None
            return AdmitResult(admitted=False, reason=str(exc))
        res = await self.store.admit(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            rank=w.rank,
            writer=w.writer,
            max_in_flight=self.settings.tenant_max_in_flight,
            fingerprints=self.store.fingerprints_in,
        )
        if res.missing:
            raise bad_input(f"work item {inp.work_item_id} is not in the store")
        if res.closed:
            return AdmitResult(admitted=False, reason=f"already {res.state}")
        if res.value is None:
            raise w.stale(res, "admit")
        adm = res.value
        review = inp.spec.review.timeout_s
        ceiling = self.settings.max_review_timeout_s_ceiling
        # What the item runs under, also when it is queued: a queued item that a freed place is handed to
        # (`FencingStore.hand_off`) goes on with these, without asking again.
        budget = effective_budget(inp.spec.budget, ceilings)
        review_timeout_s = min(review, ceiling) if review is not None else ceiling
        fingerprints = adm.fingerprints
        if adm.admitted and inp.resumed and not fingerprints:
            # Admitted out of `queued` (a fresh admission carries no fingerprints): the item's attempts so far.
            fingerprints = await self.store.fingerprints(inp.work_item_id)
        if not adm.admitted:
            return AdmitResult(
                admitted=False,
                reason=f"queued behind the tenant's in-flight limit ({self.settings.tenant_max_in_flight})",
                queued_position=adm.queued_position,
                budget=budget,
                review_timeout_s=review_timeout_s,
            )
        return AdmitResult(
            admitted=True,
            past_fingerprints=fingerprints,
            attempts_recorded=len(fingerprints),
            budget=budget,
            review_timeout_s=review_timeout_s,
        )

    @activity.defn(name="set_state")
    async def set_state(self, inp: SetStateInput) -> WriteOutcome:
        w = AttemptWriter.of(self.store, inp)
        # Awaiting review holds no place: it goes to the first queued item, in this write.
        res = await w.set_state(
            inp.state,
            inp.reason,
            event_data={"attempt": inp.attempt} if inp.attempt is not None else None,
            max_in_flight=self.settings.tenant_max_in_flight,
            hand_off_cap=HAND_OFF_CAP,
        )
        await tell_admitted(self.client, res.value)
        return WriteOutcome(ok=res.ok, stale=res.stale)

    @activity.defn(name="acquire_workspace")
    async def acquire_workspace(self, inp: WorkspaceLeaseInput) -> WorkspaceLeaseResult:
        grant, holder = await self.store.acquire_lease(inp.key, inp.work_item_id, inp.ttl_s)
        if grant is not None:
            await AttemptWriter.of(self.store, inp).event("workspace_acquired", {"key": inp.key, "grant": grant})
        return WorkspaceLeaseResult(grant=grant, holder=holder)

    @activity.defn(name="renew_workspace")
    async def renew_workspace(self, inp: ReleaseInput) -> bool:
        if inp.grant is None:
            return False
        return await self.store.renew_lease(inp.key, inp.grant, inp.ttl_s or self.settings.lease_ttl_s * 10)

    @activity.defn(name="release_workspace")
    async def release_workspace(self, inp: ReleaseInput) -> bool:
        released = await self.store.release_lease(inp.key, grant=inp.grant, holder=inp.work_item_id)
        if not released:
            # Landing may have taken the lease again under a new grant after it expired: free what this item holds.
            released = await self.store.release_lease(inp.key, holder=inp.work_item_id)
        if released:
            await self.store.append_event(inp.work_item_id, inp.tenant_id, "workspace_released", {"key": inp.key})
        return released

    @activity.defn(name="record_attempt")
    async def record_attempt(self, inp: RecordInput) -> RecordResult:
        w = AttemptWriter.of(self.store, inp)
        res = await self.store.record_attempt(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            rank=w.rank,
            record=attempt_record(inp),
            writer=w.writer,
        )
        # Rejected: report the recorded history as it stands.
        fingerprints = res.value if res.value is not None else await self.store.fingerprints(inp.work_item_id)
        return RecordResult(ok=res.ok, stale=res.stale, fingerprints=fingerprints)

    @activity.defn(name="land_change")
    async def land_change(self, inp: LandInput) -> LandResult:
        w = AttemptWriter.of(self.store, inp)
        started = await w.set_state(WorkItemState.landing, "landing")
        if started.stale:
            raise w.stale(started, "land_change")
        # Evidence hook (crewwork/evidence): a bundle that cannot be signed stops the landing before anything is pushed.
        try:
            signer = self.evidence.ready()
        except EvidenceUnavailable as exc:
            raise ApplicationError(str(exc), type=EVIDENCE_UNAVAILABLE, non_retryable=True) from None
        diff = (await artifact_bytes(self.store, inp.diff_ref.id)).decode()
        if inp.workspace_grant is not None and inp.workspace_key:
            key = inp.workspace_key
            if not await self.store.renew_lease(key, inp.workspace_grant, self.settings.lease_ttl_s * 10):
                # The lease expired while the item waited (typically for a slow review). Landing stays safe without
                # it: it writes only this item's own delivery branch, by compare-and-swap, and this attempt's first
                # write was accepted (nothing scheduled later has written). Take the lease back if it is free.
                again, holder = await self.store.acquire_lease(key, inp.work_item_id, self.settings.lease_ttl_s * 10)
                await w.event(
                    "workspace_lease_expired",
                    {"key": key, "expired_grant": inp.workspace_grant, "regranted": again, "holder": holder},
                )
        scratch = self.settings.resolved_worktree_dir() / inp.work_item_id / f"land-{inp.step}-{w.rank.attempt}"
        try:
            landed = await self.repos.land(
                inp.repo_path,
                tenant=await self.store.tenant_ref(inp.tenant_id),
                credential=await self.store.repository_credential(inp.tenant_id, inp.repo_path),
                work_item_id=inp.work_item_id,
                base_commit=inp.base_commit,
                diff=diff,
                message=inp.message,
                scratch=scratch,
            )
        except LandingConflictError as exc:
            raise ApplicationError(self.repos.redact(str(exc)), type=LANDING_CONFLICT, non_retryable=True) from None
        except REPO_ERRORS as exc:
            raise repo_failure(exc) from None
        branch, commit, created = landed.branch, landed.commit, landed.created
        # Evidence hook (crewwork/evidence): sign the landed change, push the bundle as a git note, keep it.
        evidence_text = await self._publish_evidence(inp, w, landed) if signer is not None else None
        if signer is None and not await self.store.has_event(inp.work_item_id, "evidence_unsigned", commit=commit):
            await w.event(
                "evidence_unsigned",
                {
                    "commit": commit,
                    "reason": "no evidence signing key is configured (CREWWORK_EVIDENCE_SIGNING_KEY_FILE)",
                },
            )
        pr_url: str | None = None
        try:
            pr = await self.repos.open_pull_request(
                inp.repo_path,
                tenant=await self.store.tenant_ref(inp.tenant_id),
                branch=branch,
                spec=inp.pull_request,
                ref=inp.ref,
                message=inp.message,
                work_item_id=inp.work_item_id,
                evidence=evidence_text,
            )
        except ForgeError as exc:
            raise ApplicationError(
                f"{branch} was pushed, but the pull request could not be opened: {self.repos.redact(str(exc))}",
                type=PULL_REQUEST_FAILED,
                non_retryable=not exc.retryable,
            ) from None
        except REPO_ERRORS as exc:
            raise repo_failure(exc) from None
        if pr is not None:
            pr_url = pr.url
        await _still_current(w, "stores nothing")
        patch = await self.store.put_artifact(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            name="landed.patch",
            data=diff.encode(),
            content_type="text/x-diff",
        )
        # A retried landing (the ref moved but the activity did not complete) finds the same commit: record the
        # landing once, so the event log holds exactly one `landed` per delivered change.
        if not await self.store.has_event(inp.work_item_id, "landed", commit=commit):
            done = await w.event(
                "landed",
                {
                    "branch": branch,
                    "commit": commit,
                    "created": created,
                    "remote": landed.remote,
                    "pull_request_url": pr_url,
                },
            )
            if done.stale:
                raise w.stale(done, "land_change")
        return LandResult(
            branch=branch,
            commit=commit,
            created=created,
            pull_request_url=pr_url,
            patch_ref=ArtifactRef(
                id=patch.id, name=patch.name, size=patch.size, sha256=patch.sha256, content_type=patch.content_type
            ),
        )

    async def _publish_evidence(self, inp: LandInput, w: AttemptWriter, landed: Landed) -> str:
        """Sign the landed change's evidence (crewwork/evidence), push it as a git note next to the delivery branch
        (unless CREWWORK_EVIDENCE_NOTES=off), store it as the item's `evidence-bundle.json` and record
        `evidence_signed`. Returns the paragraph for the pull request's body. Deterministic: a retried landing signs
        the same bytes and pushes nothing new."""
        row = await self.store.get_work_item(inp.work_item_id)
        required = bool(((row.spec if row is not None else {}).get("review") or {}).get("required"))
        attempt = inp.attempt or await self._passed_attempt(inp.work_item_id)
        d = inp.review
        review = ReviewFact(
            required=required or d is not None,
            decision=d.action if d is not None else ("approve" if required else None),
            reviewer=d.reviewer if d is not None else None,
            api_key_id=d.api_key_id if d is not None else None,
            comment=d.comment if d is not None else None,
            decided_at=inp.review_decided_at,
        )
        signed: list[Signed] = []
        tenant = await self.store.tenant_ref(inp.tenant_id)
        credential = await self.store.repository_credential(inp.tenant_id, inp.repo_path)

        async def make_note(gitdir: Path) -> bytes:
            s = await self.evidence.landed_bundle(
                self.store,
                gitdir=gitdir,
                work_item_id=inp.work_item_id,
                attempt=attempt,
                commit=landed.commit,
                branch=landed.branch,
                review=review,
            )
            signed.append(s)
            return s.bundle

        async def still_current() -> None:
            await _still_current(w, "publishes no evidence")

        note: dict[str, Any] = {}
        try:
            if self.settings.evidence.notes == "per-item":
                pushed = await self.repos.publish_note(
                    inp.repo_path,
                    tenant=tenant,
                    credential=credential,
                    work_item_id=inp.work_item_id,
                    commit=landed.commit,
                    make_note=make_note,
                    before_push=still_current,
                )
                note = {"note_ref": pushed.ref, "note_commit": pushed.commit, "note_created": pushed.created}
            else:
                hold = await self.repos.hold(inp.repo_path, landed.commit, tenant, credential)
                try:
                    await make_note(hold.gitdir)
                finally:
                    hold.release()
        except LandingConflictError as exc:
            raise ApplicationError(self.repos.redact(str(exc)), type=LANDING_CONFLICT, non_retryable=True) from None
        except REPO_ERRORS as exc:
            raise repo_failure(exc) from None
        except EvidenceUnavailable as exc:
            raise ApplicationError(str(exc), type=EVIDENCE_UNAVAILABLE, non_retryable=True) from None
        bundle = signed[-1]
        await still_current()
        if not any(
            a.name == BUNDLE_ARTIFACT and a.sha256 == bundle.sha256
            for a in await self.store.list_artifacts(inp.work_item_id)
        ):
            await self.store.put_artifact(
                work_item_id=inp.work_item_id,
                tenant_id=inp.tenant_id,
                name=BUNDLE_ARTIFACT,
                data=bundle.bundle,
                content_type="application/json",
                # A bundle is bounded by construction (statements, embedded files) to what a verifier reads.
                max_bytes=max(self.settings.max_artifact_bytes, MAX_BUNDLE_BYTES),
            )
        if not await self.store.has_event(inp.work_item_id, "evidence_signed", sha256=bundle.sha256):
            await w.event(
                "evidence_signed",
                {
                    "commit": landed.commit,
                    "attempt": attempt,
                    "sha256": bundle.sha256,
                    "size": len(bundle.bundle),
                    "keyids": bundle.keyids,
                    **note,
                },
            )
        return evidence_paragraph(self.settings, inp.work_item_id, landed.commit, bundle, bool(note))

    async def _passed_attempt(self, work_item_id: str) -> int:
        passed = [a.number for a in await self.store.list_attempts(work_item_id) if a.verdict == "passed"]
        if not passed:
            raise bad_input(f"work item {work_item_id} has no passing attempt to sign the evidence of")
        return max(passed)

    @activity.defn(name="finish")
    async def finish(self, inp: FinishInput) -> WriteOutcome:
        """Write the workflow's terminal decision (with a `task` item's passing attempt record, in one transaction).
        Once the item is terminal every later write is rejected, zombies included."""
        w = AttemptWriter.of(self.store, inp)
        r = inp.result
        record = attempt_record(inp.record) if inp.record is not None else None
        fields: dict[str, Any] = {
            "result": r.model_dump(mode="json"),
            "delivery_branch": r.delivery_branch,
            "landed_commit": r.landed_commit,
            "mock": r.mock,
        }
        res = await w.set_state(
            r.state,
            r.reason,
            fields=fields,
            attempt=record,
            max_in_flight=self.settings.tenant_max_in_flight,
            hand_off_cap=HAND_OFF_CAP,
        )
        await tell_admitted(self.client, res.value)
        # Already terminal (a retried finish whose first write landed): nothing left to do.
        return WriteOutcome(ok=res.ok or res.closed, stale=not (res.ok or res.closed))

    @activity.defn(name="cleanup")
    async def cleanup(self, inp: CleanupInput) -> None:
        # Unmounts the item's workspace disks first; deletion never follows a link a sandbox left behind.
        await remove_tree(self.settings.resolved_worktree_dir() / inp.work_item_id)
        if inp.repo_path:
            # Forget worktrees of this host's mirror whose directories are gone (none are made any more; older
            # releases made them).
            await self.repos.prune(inp.repo_path)


async def _still_current(w: AttemptWriter, what: str) -> None:
    """Raise STALE_ATTEMPT if a later attempt has written or the item ended. A landing attempt that stalled past its
    first write (a zombie) may wake after a later attempt landed and published, or after the item ended: what it would
    still write (its evidence bundle, signed with another key or by another version, the note's compare-and-swap
    being against whatever is there; another landed.patch) must not replace or add to theirs, on the remote or in
    the store. So the rank decides, just before each such write."""
    why = await w.superseded()
    if why is not None:
        raise ApplicationError(f"land_change: {w.writer} {what}: {why}", type=STALE_ATTEMPT, non_retryable=True)


def evidence_paragraph(settings: Settings, work_item_id: str, commit: str, bundle: Signed, noted: bool) -> str:
    """What a pull request's body says about the change's signed evidence, and how to verify it offline."""
    ref = notes_ref(work_item_id)
    short = ref.removeprefix("refs/notes/")
    api = f"/v1/work-items/{work_item_id}/evidence-bundle"
    link = f"{settings.evidence.public_url.rstrip('/')}{api}" if settings.evidence.public_url else f"`{api}` on the API"
    lines = [
        "**Evidence**: a signed bundle (in-toto statements in DSSE envelopes: provenance, test result, review; key "
        f"`{bundle.keyids[0][:16]}…`, sha256 `{bundle.sha256[:16]}…`) covers this change.",
        f"Download it from {link}" + (f", or from the git note `{ref}` on `{commit[:12]}`:" if noted else "."),
    ]
    if noted:
        lines += [
            "",
            "```",
            f"git fetch origin {ref}:{ref}",
            f"git notes --ref={short} show {commit} > bundle.json",
            f"crewwork verify bundle.json --repo . --commit {commit} --key crewwork-evidence.pub",
            "```",
        ]
    return "\n".join(lines)
