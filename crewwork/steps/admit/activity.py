"""The admit step's activity: the operator's ceilings, then the tenant's in-flight limit, in one fenced write."""

from __future__ import annotations

from crewwork.admission.starts import terms
from crewwork.models.limits import check_within_ceilings
from crewwork.steps.admit import AdmitInput, AdmitResult
from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.errors import bad_input
from crewwork.steps.ports import Ports


async def admit(ports: Ports, inp: AdmitInput) -> AdmitResult:
    store, settings = ports.store, ports.settings
    w = AttemptWriter.of(store, inp)
    ceilings = settings.operator_ceilings()
    try:
        # The API refuses these at submission; this catches items submitted before a ceiling was lowered.
        check_within_ceilings(inp.spec.budget, ceilings)
    except ValueError as exc:
        if await store.get_work_item(inp.work_item_id, inp.tenant_id) is None:
            raise bad_input(f"work item {inp.work_item_id} is not in the store") from None
        return AdmitResult(admitted=False, reason=str(exc))
    res = await store.admit(w.write, settings.tenant_max_in_flight, store.fingerprints_in)
    if res.missing:
        raise bad_input(f"work item {inp.work_item_id} is not in the store")
    if res.closed:
        return AdmitResult(admitted=False, reason=f"already {res.state}")
    if res.value is None:
        raise w.stale(res, "admit")
    adm = res.value
    # What the item runs under, also when it is queued: a queued item that a freed place is handed to
    # (`hand_off` in crewwork/store/fencing/reference.py) goes on with these, without asking again.
    agreed = terms(inp.spec, settings)
    budget, review_timeout_s = agreed.budget, agreed.review_timeout_s
    if not adm.admitted:
        return AdmitResult(
            admitted=False,
            reason=f"queued behind the tenant's in-flight limit ({settings.tenant_max_in_flight})",
            queued_position=adm.queued_position,
            budget=budget,
            review_timeout_s=review_timeout_s,
        )
    fingerprints = adm.fingerprints
    if inp.resumed and not fingerprints:
        # Admitted out of `queued` (a fresh admission carries no fingerprints): the item's attempts so far.
        fingerprints = await store.fingerprints(inp.work_item_id)
    return AdmitResult(
        admitted=True,
        past_fingerprints=fingerprints,
        attempts_recorded=len(fingerprints),
        budget=budget,
        review_timeout_s=review_timeout_s,
    )
