"""The baseline cache and the flaky list in the store (crewwork/store/baselines.py), on SQLite and PostgreSQL: a
baseline is found only by its own tenant, repository, base commit and definition, the first one written wins, and a
test seen flaky again is counted, per tenant."""

from __future__ import annotations

from crewwork.store.store import Store


async def test_a_baseline_is_kept_per_tenant_repository_commit_and_definition(any_store: Store) -> None:
    a = await any_store.ensure_tenant("baseline-a")
    b = await any_store.ensure_tenant("baseline-b")
    facts = {"facts": {"label": "baseline", "usable": True, "cause": "test_failure", "failing": ["t::x"]}}
    await any_store.put_baseline(a, "repo_1", "c" * 40, "d" * 64, facts)
    await any_store.put_baseline(a, "repo_1", "c" * 40, "d" * 64, {"facts": {"other": True}})  # first one wins
    assert await any_store.get_baseline(a, "repo_1", "c" * 40, "d" * 64) == facts
    assert await any_store.get_baseline(b, "repo_1", "c" * 40, "d" * 64) is None, "never another tenant's"
    assert await any_store.get_baseline(a, "repo_2", "c" * 40, "d" * 64) is None
    assert await any_store.get_baseline(a, "repo_1", "e" * 40, "d" * 64) is None
    assert await any_store.get_baseline(a, "repo_1", "c" * 40, "f" * 64) is None


async def test_the_flaky_list_counts_each_validation_that_saw_a_test_flaky(any_store: Store) -> None:
    a = await any_store.ensure_tenant("flaky-a")
    b = await any_store.ensure_tenant("flaky-b")
    runs = {"t::x": "t::x: failed in the change's run; passed in rerun 1"}
    await any_store.record_flaky(a, "repo_1", runs, work_item_id="wi_1", attempt=1)
    await any_store.record_flaky(
        a, "repo_1", {"t::x": "t::x: failed in ...; passed in rerun 2"}, work_item_id="wi_2", attempt=3
    )
    await any_store.record_flaky(b, "repo_1", runs, work_item_id="wi_9", attempt=1)
    (row,) = await any_store.list_flaky(a, "repo_1")
    assert (row.test_id, row.times, row.last_work_item_id, row.last_attempt) == ("t::x", 2, "wi_2", 3)
    assert row.last_runs.endswith("passed in rerun 2") and row.first_seen_at <= row.last_seen_at
    assert [r.times for r in await any_store.list_flaky(b, "repo_1")] == [1]
    assert await any_store.list_flaky(a, "repo_2") == []
