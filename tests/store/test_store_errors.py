"""Error intake's store (crewwork/store/errors.py) on SQLite and PostgreSQL: concurrent reports of one new error make
one group with the exact count, a project's open errors are capped, and a claimed group is hidden from a second
claimer until its claim expires."""

from __future__ import annotations

import asyncio
import uuid

from crewwork.store.errors import ErrorStore, Project
from crewwork.store.store import Store


async def registered(store: Store) -> tuple[ErrorStore, Project]:
    tenant_id = await store.ensure_tenant(f"errors-{uuid.uuid4().hex[:6]}")
    repo = await store.create_repository(tenant_id=tenant_id, url=f"https://github.com/acme/{uuid.uuid4().hex[:6]}")
    errors = ErrorStore(store)
    project, made = await errors.register(tenant_id=tenant_id, repository_id=repo.id, settings={"x": 1})
    assert made
    again, made = await errors.register(tenant_id=tenant_id, repository_id=repo.id, settings={"x": 2})
    assert not made and (again.id, again.public_key, again.settings) == (project.id, project.public_key, {"x": 2})
    return errors, project


async def test_concurrent_reports_of_a_new_error_make_one_group_with_the_exact_count(any_store: Store) -> None:
    errors, project = await registered(any_store)
    for round_ in range(3):
        fp = f"fp{round_}"
        outcomes = await asyncio.gather(
            *(errors.record(project, fp, "E", {"i": i}, max_open_groups=100, times=2) for i in range(10))
        )
        assert [o.outcome for o in outcomes].count("new") == 1, outcomes
    groups = await errors.groups(project.id)
    assert sorted(g.count for g in groups) == [20, 20, 20] and {g.status for g in groups} == {"pending"}


async def test_new_errors_beyond_the_open_limit_are_not_recorded_but_repeats_are(any_store: Store) -> None:
    errors, project = await registered(any_store)
    assert (await errors.record(project, "a", "A", {}, max_open_groups=2)).outcome == "new"
    assert (await errors.record(project, "b", "B", {}, max_open_groups=2)).outcome == "new"
    assert (await errors.record(project, "c", "C", {}, max_open_groups=2)).outcome == "over_limit"
    assert (await errors.record(project, "a", "A", {}, max_open_groups=2)).count == 2
    assert sorted(g.fingerprint for g in await errors.groups(project.id)) == ["a", "b"]


async def test_a_claimed_group_is_not_claimed_again_until_its_claim_expires(any_store: Store) -> None:
    errors, project = await registered(any_store)
    await errors.record(project, "a", "A", {"m": 1}, max_open_groups=5)
    first = [g for g in await errors.claim_groups(100, claim_s=60) if g.project_id == project.id]
    assert len(first) == 1 and first[0].sample == {"m": 1}
    assert [g for g in await errors.claim_groups(100, claim_s=60) if g.project_id == project.id] == []
    await errors.finish_group(first[0].id, first[0].generation, "submitted", work_item_id="wi_x")
    (group,) = await errors.groups(project.id)
    assert group.status == "submitted" and group.work_item_id == "wi_x"
    # Its item is not a work item the store knows: counted as ended, the next report starts generation 2.
    again = await errors.record(project, "a", "A", {"m": 2}, max_open_groups=5)
    assert again.outcome == "reopened"
    (group,) = await errors.groups(project.id)
    assert (group.generation, group.count, group.total, group.previous_work_item_id) == (2, 1, 2, "wi_x")


async def test_a_group_whose_submission_failed_is_tried_again_by_its_next_report(any_store: Store) -> None:
    errors, project = await registered(any_store)
    await errors.record(project, "a", "A", {}, max_open_groups=5)
    (claimed,) = [g for g in await errors.claim_groups(100, claim_s=60) if g.project_id == project.id]
    await errors.finish_group(claimed.id, claimed.generation, "failed", error="policy_violation: budget")
    (group,) = await errors.groups(project.id)
    assert group.status == "failed" and group.last_error == "policy_violation: budget"
    assert (await errors.record(project, "a", "A", {}, max_open_groups=5)).outcome == "reopened"
    (group,) = await errors.groups(project.id)
    assert (group.status, group.generation, group.last_error) == ("pending", 2, None)
