"""One batch of the retention workflow over the store (rules and their safety: crewwork/store/retention.py)."""

from __future__ import annotations

import contextlib
import logging

from temporalio import activity

from crewwork.attestation.publish import BUNDLE_ARTIFACT
from crewwork.config import Settings
from crewwork.steps.ports import Ports
from crewwork.steps.retain.contract import RetentionPassInput, RetentionPassResult
from crewwork.store.retention import RetentionPolicy

log = logging.getLogger("crewwork.retention")


def keep_artifact(name: str) -> bool:
    """The artifacts retention keeps whole: the evidence bundles (the landed change's, and any attempt's signed on
    request), which anyone may need to verify offline long after the details are gone."""
    return name == BUNDLE_ARTIFACT or name.endswith("-" + BUNDLE_ARTIFACT)


async def policy(ports: Ports) -> RetentionPolicy:
    """The operator's default period and every tenant's own (`retention_days` in CREWWORK_TENANT_POLICIES, keyed by
    tenant id or name), by tenant id."""
    settings: Settings = ports.settings
    own = {k: p.retention_days for k, p in settings.tenant_policies.items() if p.retention_days is not None}
    ids = await ports.store.tenant_ids(list(own))
    by_id: dict[str, float] = {}
    for key, days in own.items():
        tenant_id = ids.get(key)
        if tenant_id is not None and days is not None:
            # An id key wins over a name key for the same tenant (Settings.tenant_setting).
            if key == tenant_id or tenant_id not in by_id:
                by_id[tenant_id] = days
    return RetentionPolicy(default_days=settings.retention.days, tenant_days=by_id)


async def retention_pass(ports: Ports, inp: RetentionPassInput) -> RetentionPassResult:
    store = ports.store
    if inp.kind == "compact":
        done = await store.compact_artifacts(settle_s=ports.settings.retention.compact_after_s, limit=inp.batch)
        return RetentionPassResult(
            handled=done.artifacts, examined=done.artifacts, bytes_in=done.bytes_in, bytes_stored=done.bytes_new
        )
    if inp.kind == "collect":
        n = await store.collect_chunks(limit=inp.batch)
        return RetentionPassResult(handled=n, examined=n)
    rules = await policy(ports)
    candidates = await store.retention_candidates(rules, limit=inp.batch)
    out = RetentionPassResult(examined=len(candidates))
    for wid in candidates:
        res = await store.apply_retention(wid, rules, keep_artifact=keep_artifact)
        with contextlib.suppress(RuntimeError):  # outside an activity (a tool, a test): nobody to tell
            activity.heartbeat(wid)
        if res.applied:
            out.handled += 1
            out.bytes_in += res.bytes_removed
            out.events_removed += res.events_removed
        else:
            log.info("retention skipped %s: %s", wid, res.why)
    return out
