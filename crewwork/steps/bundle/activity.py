"""The evidence step's activity, in the control pool: one attempt's signed bundle, on request (crewwork/attestation).

A landed change's bundle is signed by `land_change` itself (crewwork/steps/land/activity.py); this signs any attempt's,
for an auditor looking at a failed one, say. The key stays in the control pool: the API starts
EvidenceBundleWorkflow and reads the artifact this stores."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from crewwork.attestation.format import MAX_BUNDLE_BYTES
from crewwork.attestation.gather import NothingToSign
from crewwork.attestation.publish import EvidenceUnavailable, attempt_artifact
from crewwork.models import ArtifactRef
from crewwork.steps.bundle import AttemptBundleInput
from crewwork.steps.errors import EVIDENCE_UNAVAILABLE, NOTHING_TO_SIGN
from crewwork.steps.ports import Ports


async def sign_attempt_bundle(ports: Ports, inp: AttemptBundleInput) -> ArtifactRef:
    row = await ports.store.get_work_item(inp.work_item_id, inp.tenant_id)
    if row is None:
        raise ApplicationError(f"no work item {inp.work_item_id}", type=NOTHING_TO_SIGN, non_retryable=True)
    name = attempt_artifact(inp.attempt)
    try:
        signer = ports.evidence.signer()
        # Already signed with the current key (an attempt's evidence does not change once recorded): that bundle,
        # without reading, signing or recording anything again. A tenant's POSTs cost the shared control pool
        # nothing more, and its item's log no event more, than the first one did; after a key rotation the
        # next request signs again.
        done = [a for a in await ports.store.list_artifacts(inp.work_item_id) if a.name == name]
        if (
            signer is not None
            and done
            and await ports.store.has_event(
                inp.work_item_id,
                "evidence_signed",
                attempt=inp.attempt,
                scope="attempt",
                sha256=done[-1].sha256,
                keyids=[signer.public_key.keyid],
            )
        ):
            return done[-1].ref()
        signed = await ports.evidence.attempt_bundle(ports.store, inp.work_item_id, inp.attempt)
    except NothingToSign as exc:
        raise ApplicationError(str(exc), type=NOTHING_TO_SIGN, non_retryable=True) from None
    except EvidenceUnavailable as exc:
        raise ApplicationError(str(exc), type=EVIDENCE_UNAVAILABLE, non_retryable=True) from None
    for a in await ports.store.list_artifacts(inp.work_item_id):
        if a.name == name and a.sha256 == signed.sha256:
            art = a
            break
    else:
        art = await ports.store.put_artifact(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            name=name,
            data=signed.bundle,
            content_type="application/json",
            # A bundle is bounded by construction (statements, embedded files) to what a verifier reads.
            max_bytes=max(ports.settings.max_artifact_bytes, MAX_BUNDLE_BYTES),
        )
    await ports.store.append_event(
        inp.work_item_id,
        inp.tenant_id,
        "evidence_signed",
        {
            "attempt": inp.attempt,
            "sha256": signed.sha256,
            "size": len(signed.bundle),
            "keyids": signed.keyids,
            "scope": "attempt",
        },
    )
    return art.ref()
