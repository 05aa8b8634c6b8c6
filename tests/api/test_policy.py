"""Operator policy at submission (issue 14, point 2), black box over the real API, Temporal and PostgreSQL.

The API runs with the production switches: no fault injection (CREWWORK_TEST_FAULTS off). Every violation is a
422 naming the field, before anything is stored or any workflow starts; on the code before this policy, each of
these submissions was a 202 that failed later (or, for faults, crashed and wedged the shared pools)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.cli.demo import BUGGY, RIGHT, TEST
from crewwork.config import Settings
from crewwork.config.tenant_policy import TenantPolicy
from tests.api.conftest import LiveApi, Stack, make_tenant, task_item, wait_state
from tests.conftest import Crew, make_repo

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.fixture
async def strict(api_settings: Settings, api_crew: Crew) -> AsyncIterator[Stack]:
    """An API of this test's own with the fault switch off, and a tighter policy for its tenant beta, on the module's
    crew."""
    crew = await api_crew.with_new_tenant()
    alpha = await make_tenant(crew, "alpha")
    beta = await make_tenant(crew, "beta")
    admin = await make_tenant(crew, "ops", ("admin",))
    settings = api_settings.model_copy(
        update={
            "test_faults": False,
            "tenant_policies": {
                beta.name: TenantPolicy(agents=["command"]),
                admin.name: TenantPolicy(max_memory_mb=256, max_review_timeout_s=60, max_timeout_s=120),
            },
        }
    )
    api = LiveApi(settings).start()
    try:
        yield Stack(crew, api, alpha, beta, admin)
    finally:
        api.stop()


def field_of(r: Any) -> str:
    body = r.json()
    assert r.status_code == 422, (r.status_code, body)
    assert body["code"] in ("invalid_work_item", "invalid_request"), body
    return str(body["errors"][0]["field"])


FAULTS: list[tuple[dict[str, Any], str]] = [
    ({"crash": True}, "agent.config.crash"),
    ({"stall_s": 100000}, "agent.config.stall_s"),
    ({"fail": "boom"}, "agent.config.fail"),
    ({"on_activity_attempt": "all", "output": {}}, "agent.config.on_activity_attempt"),
    ({"attempts": [{"output": {}}, {"crash": True}]}, "agent.config.attempts[1].crash"),
    ({"attempts": [{"stall_s": 5}]}, "agent.config.attempts[0].stall_s"),
    ({"block_s": 600}, "agent.config.block_s"),
    ({"attempts": [{"output": {}}, {"spin_s": 600}]}, "agent.config.attempts[1].spin_s"),
]


@pytest.mark.parametrize(("config", "field"), FAULTS)
async def test_fault_injection_is_refused_without_the_test_switch(
    strict: Stack, config: dict[str, Any], field: str
) -> None:
    async with strict.client() as c:
        r = await c.post(
            "/v1/work-items", json={"kind": "task", "input": {}, "agent": {"name": "scripted", "config": config}}
        )
        assert field_of(r) == field
        assert "CREWWORK_TEST_FAULTS" in r.json()["detail"]
        assert (await c.get("/v1/work-items")).json()["items"] == []


async def test_every_policy_violation_is_422_at_submission_with_the_field(strict: Stack, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "calc", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
    change = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add()",
        "validation": {"command": ["python", "-m", "pytest", "-q"], "timeout_s": 60},
        "agent": {"name": "scripted", "config": {"files": {"calc.py": RIGHT}}},
    }
    cases: list[tuple[dict[str, Any], str]] = [
        ({"sandbox": {"backend": "LOCAL"}}, "sandbox.backend"),
        ({"sandbox": {"backend": "local"}}, "sandbox.backend"),
        ({"sandbox": {"backend": "Docker"}}, "sandbox.backend"),
        ({"sandbox": {"backend": "nosuch"}}, "sandbox.backend"),
        ({"sandbox": {"memory_mb": 10_000_000}}, "sandbox.memory_mb"),
        ({"sandbox": {"cpus": 1000}}, "sandbox.cpus"),
        ({"sandbox": {"pids": 10_000_000}}, "sandbox.pids"),
        ({"sandbox": {"disk_mb": 10_000_000}}, "sandbox.disk_mb"),
        ({"budget": {"max_attempts": 1000}}, "budget.max_attempts"),
        ({"budget": {"max_wall_clock_s": 1e9}}, "budget.max_wall_clock_s"),
        ({"budget": {"max_tokens": 10**12}}, "budget.max_tokens"),
        ({"budget": {"max_cost_usd": 1e9}}, "budget.max_cost_usd"),
        ({"review": {"required": True, "timeout_s": 1e15}}, "review.timeout_s"),
    ]
    async with strict.client() as c:
        for extra, field in cases:
            for base in (task_item(), change):
                r = await c.post("/v1/work-items", json={**base, **extra})
                assert field_of(r) == field, (extra, r.json())
        assert (await c.get("/v1/work-items")).json()["items"] == []
        # Within policy, the same submissions are accepted (the checks are not refusing everything).
        ok = await c.post(
            "/v1/work-items", json={**change, "sandbox": {"memory_mb": 512}, "budget": {"max_attempts": 2}}
        )
        assert ok.status_code == 202, ok.text
        done = await wait_state(c, ok.json()["id"], {"succeeded", "failed", "dead"}, timeout_s=180)
        assert done["state"] == "succeeded", done["reason"]


async def test_per_tenant_overrides_apply_to_that_tenant_only(strict: Stack) -> None:
    async with strict.client(strict.beta) as c:
        r = await c.post("/v1/work-items", json=task_item())
        assert field_of(r) == "agent.name" and "'scripted' is not allowed" in r.json()["detail"]
    async with strict.client(strict.admin) as c:  # the `ops` tenant: tighter sandbox and review ceilings
        r = await c.post("/v1/work-items", json={**task_item(), "sandbox": {"memory_mb": 512}})
        assert field_of(r) == "sandbox.memory_mb"
        r = await c.post("/v1/work-items", json={**task_item(), "review": {"timeout_s": 120}})
        assert field_of(r) == "review.timeout_s"
        # A named check's run is bounded like the validation's (docs/checks.md).
        checked = {
            "command": ["true"],
            "timeout_s": 60,
            "checks": [{"name": "lint", "command": ["true"]}, {"name": "types", "command": ["true"], "timeout_s": 600}],
        }
        r = await c.post(
            "/v1/work-items",
            json={"kind": "code_change", "repo": {"url": "/nowhere"}, "instruction": "x", "validation": checked},
        )
        assert field_of(r) == "validation.checks[1].timeout_s" and "at most 120" in r.json()["detail"]
    async with strict.client(strict.alpha) as c:
        r = await c.post(
            "/v1/work-items", json={**task_item({"x": 1}), "sandbox": {"memory_mb": 512}, "review": {"timeout_s": 120}}
        )
        assert r.status_code == 202, r.text
        assert (await wait_state(c, r.json()["id"], {"succeeded"}))["result"]["output"] == {"x": 1}


def test_production_defaults_refuse_faults_and_the_compose_file_turns_the_dev_switches_off() -> None:
    from crewwork.admission.policy import Policy, PolicyViolation
    from crewwork.models import WorkItemSpec

    settings = Settings(_env_file=None, test_faults=False, auto_register_repos=False)  # type: ignore[call-arg]
    spec = WorkItemSpec.model_validate({**task_item(), "agent": {"name": "scripted", "config": {"crash": True}}})
    with pytest.raises(PolicyViolation) as exc:
        Policy.for_tenant(settings, "tn_x").check(spec)
    assert exc.value.field == "agent.config.crash"
    assert Settings.model_fields["test_faults"].default is False
    assert Settings.model_fields["auto_register_repos"].default is False
    compose = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()
    assert "CREWWORK_AUTO_REGISTER_REPOS: ${CREWWORK_AUTO_REGISTER_REPOS:-false}" in compose
    assert 'CREWWORK_TEST_FAULTS: "false"' in compose
    agents = compose.split("CREWWORK_POLICY_AGENTS: ${CREWWORK_POLICY_AGENTS:-", 1)[1].split("}", 1)[0]
    assert "scripted" not in agents.split(",")


async def test_the_scripted_agent_ignores_faults_unless_the_worker_runs_with_the_switch() -> None:
    from crewwork.agents.base import AgentContext, AgentInfraError
    from crewwork.agents.scripted import ScriptedAgent
    from crewwork.models import WorkItemKind

    config = {"fail": "injected", "output": {"ok": True}}
    ctx = AgentContext(work_item_id="wi_x", attempt=1, activity_attempt=1, kind=WorkItemKind.task, config=config)
    result = await ScriptedAgent().run(ctx)
    assert result.output == {"ok": True}
    ctx.extra["test_faults"] = True
    with pytest.raises(AgentInfraError):
        await ScriptedAgent().run(ctx)


async def test_a_work_item_declaring_its_own_model_endpoint_is_422_unless_the_operator_allows_it(
    strict: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker would POST wherever the tenant said (an internal service, with a header of the tenant's choosing).
    item = {
        "kind": "task",
        "input": {"question": "hi"},
        "agent": {
            "name": "model",
            "config": {
                "endpoints": {"mine": {"base_url": "http://127.0.0.1:9/internal-service/", "model": "m"}},
                "routes": {"chat": ["mine"]},
            },
        },
    }
    monkeypatch.delenv("CREWWORK_MODEL_ENDPOINTS", raising=False)
    async with strict.client() as c:
        r = await c.post("/v1/work-items", json=item)
        assert r.status_code == 422, r.text
        assert field_of(r) == "agent" and "allow_work_item_endpoints" in r.json()["detail"]
        assert (await c.get("/v1/work-items")).json()["items"] == []


async def test_code_changes_wait_for_review_by_default_unless_the_operator_says_otherwise(
    api_settings: Settings, api_crew: Crew, tmp_path: Path
) -> None:
    """The production default (CREWWORK_REVIEW_REQUIRED_DEFAULT=true): a code change that says nothing about review
    waits for a person; before, it landed unreviewed while the docs promised a review. A tenant whose policy turns the
    default off gets its change landed; a submission that asks, either way, is taken at its word."""
    repo = make_repo(tmp_path / "calc", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
    change = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add()",
        "validation": {"command": ["python", "-m", "pytest", "-q"], "timeout_s": 60},
        "agent": {"name": "scripted", "config": {"files": {"calc.py": RIGHT}}},
    }
    alpha = await make_tenant(api_crew, "alpha")
    beta = await make_tenant(api_crew, "beta")
    settings = api_settings.model_copy(
        update={
            "review_required_default": True,
            "tenant_policies": {beta.name: TenantPolicy(review_required_default=False)},
        }
    )
    assert Settings.model_fields["review_required_default"].default is True
    api = LiveApi(settings).start()
    try:
        async with httpx.AsyncClient(base_url=api.url, headers=alpha.headers, timeout=30) as c:
            r = await c.post("/v1/work-items", json=change)
            assert r.status_code == 202, r.text
            waiting = await wait_state(c, r.json()["id"], {"awaiting_review", "succeeded", "failed"}, 120)
            assert waiting["state"] == "awaiting_review", waiting["reason"]
            assert waiting["spec"]["review"]["required"] is True
            assert waiting["landed_commit"] is None
            # Spelling the default out is the same submission (same idempotency hash).
            key = {"idempotency_key": "same"}
            first = await c.post("/v1/work-items", json={**change, **key})
            again = await c.post("/v1/work-items", json={**change, **key, "review": {"required": True}})
            assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
            # A task has nothing to land: it never waits.
            task = await c.post("/v1/work-items", json=task_item())
            done = await wait_state(c, task.json()["id"], {"succeeded", "failed"})
            assert done["state"] == "succeeded" and done["spec"]["review"]["required"] is False
        # Another repository: alpha's items waiting for review hold the workspace lease of theirs.
        other = make_repo(tmp_path / "calc2", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
        change = {**change, "repo": {"url": str(other), "ref": "main"}}
        async with httpx.AsyncClient(base_url=api.url, headers=beta.headers, timeout=30) as c:
            r = await c.post("/v1/work-items", json=change)
            done = await wait_state(c, r.json()["id"], {"awaiting_review", "succeeded", "failed"}, 120)
            assert done["state"] == "succeeded" and done["spec"]["review"]["required"] is False, done["reason"]
            r = await c.post("/v1/work-items", json={**change, "review": {"required": True}})
            asked = await wait_state(c, r.json()["id"], {"awaiting_review", "succeeded", "failed"}, 120)
            assert asked["state"] == "awaiting_review"
    finally:
        api.stop()


async def test_a_hotfix_report_that_says_only_when_to_review_still_waits_for_a_person(
    api_settings: Settings, api_crew: Crew, tmp_path: Path
) -> None:
    """A hotfix report waits for a person unless it says otherwise, whatever the operator's default for other code
    changes (docs/lifecycle.md). Saying only how long a review may take (`"review": {"timeout_s": 3600}`), or giving
    an empty `review`, is not saying otherwise; before, either left `required` unset, the operator's default (off
    here) filled it in, and the fix landed unreviewed."""
    repo = make_repo(tmp_path / "calc", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
    alpha = await make_tenant(api_crew, "alpha")
    api = LiveApi(api_settings.model_copy(update={"review_required_default": False})).start()
    try:
        async with httpx.AsyncClient(base_url=api.url, headers=alpha.headers, timeout=30) as c:
            for review, required in [({"timeout_s": 3600}, True), ({}, True), ({"required": False}, False)]:
                report = {"message": "add(2, 3) returns -1", "repo": {"url": str(repo)}, "review": review}
                report["agent"] = {"name": "scripted", "config": {"files": {"calc.py": RIGHT}}}
                r = await c.post("/v1/hotfix", json=report)
                assert r.status_code == 202, r.text
                item = (await c.get(f"/v1/work-items/{r.json()['id']}", params={"live": "false"})).json()
                assert item["spec"]["review"]["required"] is required, (review, item["spec"]["review"])
                await c.post(f"/v1/work-items/{r.json()['id']}/cancel")
    finally:
        api.stop()
