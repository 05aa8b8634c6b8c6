"""The land step's activity: commit the passing attempt's diff on the item's delivery branch and push it by
compare-and-swap, sign its evidence (a git note next to the branch, and the item's `evidence-bundle.json`), open
the pull request where asked, and record `landed` once.

Each phase is a function of its own; `land_change` reads as their list. The landed diff is the attempt's own diff
artifact (the result's `patch_ref`): it is read once, to apply it, and not stored again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from temporalio.exceptions import ApplicationError

from crewwork.attestation.facts import ReviewFact
from crewwork.attestation.format import MAX_BUNDLE_BYTES
from crewwork.attestation.publish import BUNDLE_ARTIFACT, EvidenceUnavailable, Signed
from crewwork.attestation.statements import rfc3339
from crewwork.config import Settings
from crewwork.forge import ForgeError
from crewwork.models import WorkItemState
from crewwork.repos.landing import Landed, LandingConflictError, notes_ref
from crewwork.repos.worker import REPO_ERRORS
from crewwork.steps.attempt import AttemptWriter, artifact_bytes
from crewwork.steps.errors import EVIDENCE_UNAVAILABLE, LANDING_CONFLICT, PULL_REQUEST_FAILED, STALE_ATTEMPT, bad_input
from crewwork.steps.execution import repo_failure
from crewwork.steps.land import LandInput, LandResult
from crewwork.steps.ports import Ports
from crewwork.store.fencing import REVIEW_EVENT


async def land_change(ports: Ports, inp: LandInput) -> LandResult:
    w = AttemptWriter.of(ports.store, inp)
    started = await w.set_state(WorkItemState.landing, "landing")
    if started.stale:
        raise w.stale(started, "land_change")
    # Evidence hook (crewwork/attestation): a bundle that cannot be signed stops the landing before anything is pushed.
    with _refusals(ports):
        signs = ports.evidence.ready() is not None
    diff = (await artifact_bytes(ports.store, inp.diff_ref.id)).decode()
    await _keep_workspace_lease(ports, inp, w)
    landed = await _push(ports, inp, w, diff)
    # Evidence hook (crewwork/attestation): sign the landed change, push the bundle as a git note, keep it.
    evidence_text = await _publish_evidence(ports, inp, w, landed) if signs else None
    if not signs:
        await _note_unsigned(ports, inp, w, landed.commit)
    pr_url = await _open_pull_request(ports, inp, landed.branch, evidence_text)
    await _record_landed(ports, inp, w, landed, pr_url)
    return LandResult(
        branch=landed.branch,
        commit=landed.commit,
        created=landed.created,
        pull_request_url=pr_url,
        patch_ref=inp.diff_ref,
    )


@contextlib.contextmanager
def _refusals(ports: Ports) -> Iterator[None]:
    """A repository's, the landing's or the signer's refusal as the error type the workflow's policy names."""
    try:
        yield
    except LandingConflictError as exc:
        raise ApplicationError(ports.repos.redact(str(exc)), type=LANDING_CONFLICT, non_retryable=True) from None
    except REPO_ERRORS as exc:
        raise repo_failure(exc) from None
    except EvidenceUnavailable as exc:
        raise ApplicationError(str(exc), type=EVIDENCE_UNAVAILABLE, non_retryable=True) from None


async def _keep_workspace_lease(ports: Ports, inp: LandInput, w: AttemptWriter) -> None:
    if inp.workspace_grant is None or not inp.workspace_key:
        return
    store, key, ttl_s = ports.store, inp.workspace_key, ports.settings.lease_ttl_s * 10
    if await store.renew_lease(key, inp.workspace_grant, ttl_s):
        return
    # The lease expired while the item waited (typically for a slow review). Landing stays safe without it: it
    # writes only this item's own delivery branch, by compare-and-swap, and this attempt's first write was accepted
    # (nothing scheduled later has written). Take the lease back if it is free.
    again, holder = await store.acquire_lease(key, inp.work_item_id, ttl_s)
    await w.event(
        "workspace_lease_expired",
        {"key": key, "expired_grant": inp.workspace_grant, "regranted": again, "holder": holder},
    )


async def _push(ports: Ports, inp: LandInput, w: AttemptWriter, diff: str) -> Landed:
    scratch = ports.settings.resolved_worktree_dir() / inp.work_item_id / f"land-{inp.step}-{w.rank.attempt}"
    with _refusals(ports):
        return await ports.repos.land(
            inp.repo_path,
            tenant=await ports.store.tenant_ref(inp.tenant_id),
            credential=await ports.store.repository_credential(inp.tenant_id, inp.repo_path),
            work_item_id=inp.work_item_id,
            base_commit=inp.base_commit,
            diff=diff,
            message=inp.message,
            scratch=scratch,
        )


async def _note_unsigned(ports: Ports, inp: LandInput, w: AttemptWriter, commit: str) -> None:
    if await ports.store.has_event(inp.work_item_id, "evidence_unsigned", commit=commit):
        return
    await w.event(
        "evidence_unsigned",
        {"commit": commit, "reason": "no evidence signing key is configured (CREWWORK_EVIDENCE_SIGNING_KEY_FILE)"},
    )


async def _open_pull_request(ports: Ports, inp: LandInput, branch: str, evidence: str | None) -> str | None:
    try:
        pr = await ports.repos.open_pull_request(
            inp.repo_path,
            tenant=await ports.store.tenant_ref(inp.tenant_id),
            branch=branch,
            spec=inp.pull_request,
            ref=inp.ref,
            message=inp.message,
            work_item_id=inp.work_item_id,
            evidence=evidence,
        )
    except ForgeError as exc:
        raise ApplicationError(
            f"{branch} was pushed, but the pull request could not be opened: {ports.repos.redact(str(exc))}",
            type=PULL_REQUEST_FAILED,
            non_retryable=not exc.retryable,
        ) from None
    except REPO_ERRORS as exc:
        raise repo_failure(exc) from None
    return pr.url if pr is not None else None


async def _record_landed(
    ports: Ports, inp: LandInput, w: AttemptWriter, landed: Landed, pull_request_url: str | None
) -> None:
    """A retried landing (the ref moved but the activity did not complete) finds the same commit: record the landing
    once, so the event log holds exactly one `landed` per delivered change."""
    if await ports.store.has_event(inp.work_item_id, "landed", commit=landed.commit):
        return
    done = await w.event(
        "landed",
        {
            "branch": landed.branch,
            "commit": landed.commit,
            "created": landed.created,
            "remote": landed.remote,
            "pull_request_url": pull_request_url,
        },
    )
    if done.stale:
        raise w.stale(done, "land_change")


# ---------------------------------------------------------------------------------------------------- evidence


async def _publish_evidence(ports: Ports, inp: LandInput, w: AttemptWriter, landed: Landed) -> str:
    """Sign the landed change's evidence (crewwork/attestation), push it as a git note next to the delivery branch
    (unless CREWWORK_EVIDENCE_NOTES=off), store it as the item's `evidence-bundle.json` and record
    `evidence_signed`. Returns the paragraph for the pull request's body. Deterministic: a retried landing signs
    the same bytes and pushes nothing new."""
    attempt = inp.attempt or await _passed_attempt(ports, inp.work_item_id)
    review = await _review_fact(ports, inp)
    bundle, note = await _sign_and_note(ports, inp, w, landed, attempt, review)
    await _still_current(w, "publishes no evidence")
    await _keep_bundle(ports, inp, bundle)
    if not await ports.store.has_event(inp.work_item_id, "evidence_signed", sha256=bundle.sha256):
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
    return evidence_paragraph(ports.settings, inp.work_item_id, landed.commit, bundle, bool(note))


async def _review_fact(ports: Ports, inp: LandInput) -> ReviewFact:
    """Who let the change land: the reviewer's decision (with its line comments, the diff it was about and the
    decisions before it, as the item's `review_decided` events recorded them: what the console and `crewwork status`
    show), or none where no review was required."""
    row = await ports.store.get_work_item(inp.work_item_id)
    required = bool(((row.spec if row is not None else {}).get("review") or {}).get("required"))
    d = inp.review
    recorded = [e.data for e in await ports.store.events_of_type(inp.work_item_id, REVIEW_EVENT)]
    approval = next(
        (
            r
            for r in reversed(recorded)
            if r.get("action") == "approve" and r.get("decided_at") == inp.review_decided_at
        ),
        None,
    )
    earlier = [r for r in recorded if r is not approval and (r.get("decided_at") or 0) <= (inp.review_decided_at or 0)]
    return ReviewFact(
        required=required or d is not None,
        decision=d.action if d is not None else ("approve" if required else None),
        reviewer=d.reviewer if d is not None else None,
        api_key_id=d.api_key_id if d is not None else None,
        comment=d.comment if d is not None else None,
        decided_at=inp.review_decided_at,
        diff_sha256=(approval or {}).get("diff_sha256") or inp.diff_ref.sha256,
        line_comments=tuple(c.model_dump() for c in d.line_comments) if d is not None else (),
        history=tuple(
            {
                "decision": r.get("action"),
                "attempt": r.get("attempt"),
                "reviewer": r.get("reviewer"),
                "apiKey": r.get("api_key_id"),
                "comment": r.get("comment"),
                "decidedAt": rfc3339(float(r["decided_at"])) if r.get("decided_at") is not None else None,
                "lineComments": len(r.get("line_comments") or []),
            }
            for r in earlier
        ),
    )


async def _sign_and_note(
    ports: Ports, inp: LandInput, w: AttemptWriter, landed: Landed, attempt: int, review: ReviewFact
) -> tuple[Signed, dict[str, Any]]:
    """The signed bundle, and where its git note went (empty when notes are off)."""
    signed: list[Signed] = []
    tenant = await ports.store.tenant_ref(inp.tenant_id)
    credential = await ports.store.repository_credential(inp.tenant_id, inp.repo_path)

    async def make_note(gitdir: Path) -> bytes:
        s = await ports.evidence.landed_bundle(
            ports.store,
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
    with _refusals(ports):
        if ports.settings.evidence.notes == "per-item":
            pushed = await ports.repos.publish_note(
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
            hold = await ports.repos.hold(inp.repo_path, landed.commit, tenant, credential)
            try:
                await make_note(hold.gitdir)
            finally:
                hold.release()
    return signed[-1], note


async def _keep_bundle(ports: Ports, inp: LandInput, bundle: Signed) -> None:
    """Store the bundle as the item's `evidence-bundle.json`, unless these very bytes are there already."""
    if any(
        a.name == BUNDLE_ARTIFACT and a.sha256 == bundle.sha256
        for a in await ports.store.list_artifacts(inp.work_item_id)
    ):
        return
    await ports.store.put_artifact(
        work_item_id=inp.work_item_id,
        tenant_id=inp.tenant_id,
        name=BUNDLE_ARTIFACT,
        data=bundle.bundle,
        content_type="application/json",
        # A bundle is bounded by construction (statements, embedded files) to what a verifier reads.
        max_bytes=max(ports.settings.max_artifact_bytes, MAX_BUNDLE_BYTES),
    )


async def _passed_attempt(ports: Ports, work_item_id: str) -> int:
    passed = [a.number for a in await ports.store.list_attempts(work_item_id) if a.verdict == "passed"]
    if not passed:
        raise bad_input(f"work item {work_item_id} has no passing attempt to sign the evidence of")
    return max(passed)


async def _still_current(w: AttemptWriter, what: str) -> None:
    """Raise STALE_ATTEMPT if a later attempt has written or the item ended. A landing attempt that stalled past its
    first write (a zombie) may wake after a later attempt landed and published, or after the item ended: what it would
    still write (its evidence bundle, signed with another key or by another version, the note's compare-and-swap
    being against whatever is there) must not replace or add to theirs, on the remote or in the store. So the rank
    decides, just before each such write."""
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
