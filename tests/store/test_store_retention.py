"""Bounded storage in the store, on SQLite and on PostgreSQL: artifacts stored by content (a repeated log prefix or
diff stored once, every artifact read back byte for byte), retention of the items that ended (what goes, what stays,
what is never touched: a live item, a recent one, a held one), late writes after retention, and the collection of
unreferenced chunks racing compactions (crewwork/store/retention.py)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import pytest
from sqlalchemy import text

from crewwork.config import Settings
from crewwork.config.operations import RetentionSettings
from crewwork.config.tenant_policy import TenantPolicy
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.steps.ports import Ports
from crewwork.steps.registry import bound
from crewwork.steps.retain import RetentionPassInput
from crewwork.steps.retain.activity import keep_artifact
from crewwork.store.fencing import FencedWrite, StateChange
from crewwork.store.retention import RetainedItem, RetentionPolicy
from crewwork.store.store import AttemptRecord, Rank, Store

DAY = 86400.0


async def _item(store: Store, tenant: str = "retention") -> tuple[str, str]:
    tid = await store.ensure_tenant(tenant)
    row, _ = await store.create_work_item(
        tenant_id=tid,
        spec=WorkItemSpec.model_validate({"kind": "task", "input": {}}),
        base_commit=None,
        repo_path=None,
    )
    return tid, row.id


async def _end(store: Store, wid: str, *, days_ago: float) -> None:
    """Record the item's end (a fenced write, as `finish` does), then date it `days_ago`."""
    tid = (await store.get_work_item(wid)).tenant_id  # type: ignore[union-attr]
    res = await store.set_state(
        StateChange(
            FencedWrite(wid, tid, Rank(9, 1), "finish#1"),
            state=WorkItemState.succeeded,
            fields={"result": {"work_item_id": wid, "state": "succeeded", "reason": "done"}},
        )
    )
    assert res.ok
    await _sql(store, "UPDATE work_items SET updated_at = updated_at - :s WHERE id = :w", s=days_ago * DAY, w=wid)


async def _sql(store: Store, sql: str, **params: Any) -> Any:
    async with store.session() as s:
        return await s.execute(text(sql), params)


async def _artifact(store: Store, wid: str, tid: str, name: str, data: bytes) -> str:
    return (await store.put_artifact(work_item_id=wid, tenant_id=tid, name=name, data=data)).id


def _log(tail: str, lines: int = 3000) -> bytes:
    """A validation log: the same long setup and test header, then a tail of its own."""
    head = "".join(f"collecting tests/test_mod_{i}.py::test_case_{i} PASSED [{i % 100:3d}%]\n" for i in range(lines))
    return (head + tail).encode()


async def test_compaction_stores_repeats_once_and_every_artifact_reads_back_byte_for_byte(any_store: Store) -> None:
    store = any_store
    # Compaction walks the whole store, and on PostgreSQL this worker's database holds earlier tests' ended items:
    # compact those first, so the figures below are this test's own.
    while (await store.compact_artifacts(settle_s=0, limit=1000)).artifacts:
        pass
    originals: dict[str, bytes] = {}
    for n in range(2):
        tid, wid = await _item(store)
        diff = b"diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-a - b\n+a + b\n" * 50
        for name, data in (
            ("validation.log", _log(f"FAILED test_case_{n}: assert {n} == 1\n" * 20)),
            ("diff.patch", diff),
            ("random.bin", os.urandom(70_000)),
            ("empty.txt", b""),
        ):
            originals[await _artifact(store, wid, tid, name, data)] = data
        await _end(store, wid, days_ago=0)
    # A live item's artifacts are not compacted (the previous release's processes may read them).
    tid, live = await _item(store)
    live_art = await _artifact(store, live, tid, "validation.log", _log("live"))

    done = await store.compact_artifacts(settle_s=0, limit=100)
    # Every artifact of 2 KiB or more; smaller ones stay inline (a chunk and a part would cost more than they hold).
    assert done.artifacts == sum(1 for d in originals.values() if len(d) >= 2048)
    for art_id, data in originals.items():
        assert await store.artifact_content(art_id) == data
    # The second item's log and diff repeat the first's: the chunks stored are far fewer bytes than the artifacts.
    assert done.bytes_new < done.bytes_in / 3, done
    rows = (await _sql(store, "SELECT count(*) FROM artifacts WHERE content IS NOT NULL AND id = :a", a=live_art)).all()
    assert rows[0][0] == 1
    again = await store.compact_artifacts(settle_s=0, limit=100)
    assert (again.artifacts, again.bytes_new) == (0, 0)
    # Reads through the API's path (metadata, then bytes) see the same bytes.
    some = next(iter(originals))
    row = (await _sql(store, "SELECT work_item_id FROM artifacts WHERE id = :a", a=some)).scalar_one()
    art = await store.work_item_artifact(row, some, with_content=True)
    assert art is not None and art.content_bytes == originals[some]
    assert hashlib.sha256(art.content_bytes).hexdigest() == art.sha256


async def test_retention_removes_the_details_of_an_expired_item_and_keeps_its_record_bundle_and_digests(
    any_store: Store, tmp_path: Any
) -> None:
    store = any_store
    tid, wid = await _item(store)
    long_text = "E" * 5000
    rec = AttemptRecord(
        number=1,
        verdict="passed",
        reason="tests passed",
        cause=None,
        fingerprint="fp",
        agent={"mock": True, "tokens_used": 3, "diff_ref": {"id": "art_x", "size": 9}, "transcript": [1, 2]},
        validation={"passed": True, "exit_code": 0, "tests": [{"name": "t"}] * 50, "stdout_tail": long_text},
    )
    assert (await store.record_attempt(FencedWrite(wid, tid, Rank(5, 1), "r"), record=rec)).ok
    log_id = await _artifact(store, wid, tid, "validation.log", _log("ok"))
    bundle = b'{"statements": ["signed"]}'
    bundle_id = await _artifact(store, wid, tid, "evidence-bundle.json", bundle)
    await store.append_event(wid, tid, "evidence_signed", {"sha256": hashlib.sha256(bundle).hexdigest()})
    await store.append_event(wid, tid, "progress", {"note": "x" * 1000})
    await _end(store, wid, days_ago=40)
    await store.compact_artifacts(settle_s=0, limit=100)  # retention works on compacted and inline artifacts alike

    settings = Settings(data_dir=tmp_path, retention=RetentionSettings(days=30))
    control = bound(Ports.build(store, settings))
    out = await control.retention_pass(RetentionPassInput(kind="retain", batch=10))
    assert out.handled >= 1

    row = await store.get_work_item(wid)
    assert row is not None and row.retained_at is not None and row.state == "succeeded"
    assert row.result is not None and row.result["reason"] == "done"  # the final record stays
    arts = {a.id: a for a in await store.list_artifacts(wid)}
    assert arts[log_id].removed_at is not None and arts[log_id].sha256 and arts[log_id].size > 0  # digest kept
    assert await store.artifact_content(log_id) is None
    assert arts[bundle_id].removed_at is None and await store.artifact_content(bundle_id) == bundle
    [attempt] = await store.list_attempts(wid)
    assert attempt.verdict == "passed" and attempt.fingerprint == "fp"
    assert attempt.agent == {
        "mock": True,
        "tokens_used": 3,
        "diff_ref": {"id": "art_x", "size": 9},
        "retention_removed": ["transcript"],
    }
    assert attempt.validation is not None and "tests" not in attempt.validation and attempt.validation["passed"]
    types = [e.type for e in await store.list_events(wid)]
    assert "progress" not in types and "stale_write_rejected" not in types
    assert {"submitted", "state_changed", "evidence_signed", "retention_applied"} <= set(types)
    # Late writes: a fenced one is refused as after any end; an artifact put outside a fence is refused too.
    late = await store.set_state(StateChange(FencedWrite(wid, tid, Rank(99, 1), "zombie"), state=WorkItemState.running))
    assert late.closed
    with pytest.raises(RetainedItem):
        await _artifact(store, wid, tid, "late.log", b"late")
    # Chunks only the removed log named are collected; the bundle (inline or chunked) still reads.
    while await store.collect_chunks(limit=1000):
        pass
    assert await store.artifact_content(bundle_id) == bundle
    # A second pass finds nothing more to do.
    assert (await control.retention_pass(RetentionPassInput(kind="retain", batch=10))).handled == 0


async def test_live_recent_and_held_items_keep_everything_and_a_tenant_period_overrides_the_default(
    any_store: Store,
) -> None:
    store = any_store
    tid, live = await _item(store, "keep-a")
    await _sql(store, "UPDATE work_items SET updated_at = updated_at - :s WHERE id = :w", s=90 * DAY, w=live)
    _, recent = await _item(store, "keep-a")
    await _end(store, recent, days_ago=2)
    _, held = await _item(store, "keep-a")
    await _end(store, held, days_ago=90)
    hold, retained = await store.set_legal_hold(held, tid, reason="litigation 42", actor="key_1")
    assert hold is not None and hold["reason"] == "litigation 42" and retained is None
    # Another tenant's key cannot touch the hold.
    other = await store.ensure_tenant("keep-b")
    with pytest.raises(Exception, match="no work item"):
        await store.set_legal_hold(held, other, reason=None, actor="key_2")
    _, b_old = await _item(store, "keep-b")
    await _end(store, b_old, days_ago=5)

    policy = RetentionPolicy(default_days=30, tenant_days={other: 3})
    for wid in (live, recent, held):
        res = await store.apply_retention(wid, policy, keep_artifact=keep_artifact)
        assert not res.applied, res
    assert {r for r in await store.retention_candidates(policy, limit=100)} >= {b_old}
    assert not {live, recent, held} & set(await store.retention_candidates(policy, limit=100))
    assert (await store.apply_retention(b_old, policy, keep_artifact=keep_artifact)).applied

    await store.set_legal_hold(held, tid, reason=None, actor="key_1")
    assert (await store.apply_retention(held, policy, keep_artifact=keep_artifact)).applied
    kinds = [e.type for e in await store.list_events(held)]
    assert "legal_hold_set" in kinds and "legal_hold_cleared" in kinds  # the holds' audit stays


async def test_the_tenant_policy_key_may_be_the_tenant_name(any_store: Store, tmp_path: Any) -> None:
    store = any_store
    name = f"named-{os.urandom(3).hex()}"
    _tid, wid = await _item(store, name)
    await _end(store, wid, days_ago=10)
    settings = Settings(
        data_dir=tmp_path,
        retention=RetentionSettings(days=0),
        tenant_policies={name: TenantPolicy(retention_days=7)},
    )
    control = bound(Ports.build(store, settings))
    assert (await control.retention_pass(RetentionPassInput(kind="retain", batch=50))).handled >= 1
    assert (await store.get_work_item(wid)).retained_at is not None  # type: ignore[union-attr]


@pytest.mark.postgres
async def test_collecting_chunks_never_removes_one_a_concurrent_compaction_names(pg_store: Store) -> None:
    """Each round: an item's artifact is compacted and then retained (its chunks named by nothing), and another
    item's artifact with the same bytes is compacted while the collection runs. Whatever the interleaving, the second
    artifact reads back whole."""
    store = pg_store
    policy = RetentionPolicy(default_days=1)
    for n in range(12):
        data = _log(f"round {n}\n", lines=400 + n)
        tid, first = await _item(store, "race")
        await _artifact(store, first, tid, "a.log", data)
        await _end(store, first, days_ago=2)
        await store.compact_artifacts(settle_s=0, limit=1000)
        assert (await store.apply_retention(first, policy, keep_artifact=keep_artifact)).applied
        _, second = await _item(store, "race")
        art = await _artifact(store, second, tid, "b.log", data)
        await _end(store, second, days_ago=0)
        await asyncio.gather(
            store.compact_artifacts(settle_s=0, limit=1000),
            store.collect_chunks(limit=1000),
            store.collect_chunks(limit=1000),
        )
        await store.collect_chunks(limit=1000)
        assert await store.artifact_content(art) == data, f"round {n}"
