"""What a step's failure means for the work item (`crewwork.steps.step.outcome`, the one mapping the workflow's call
path applies to every step): a pure function, tested without Temporal."""

from __future__ import annotations

import asyncio

from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, RetryState

from crewwork.steps.agent import RUN_AGENT
from crewwork.steps.errors import BAD_INPUT, LANDING_CONFLICT, REPOSITORY_ERROR
from crewwork.steps.land import LAND
from crewwork.steps.record import RECORD_ATTEMPT
from crewwork.steps.step import Dead, Failed, outcome
from crewwork.steps.validate import VALIDATE


def failed_with(cause: BaseException, retry_state: RetryState = RetryState.NON_RETRYABLE_FAILURE) -> ActivityError:
    exc = ActivityError(
        "activity error",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type="x",
        activity_id="1",
        retry_state=retry_state,
    )
    exc.__cause__ = cause
    return exc


def test_a_repository_refusal_ends_the_item_failed_naming_the_remote() -> None:
    exc = failed_with(ApplicationError("remote said no", type=REPOSITORY_ERROR))
    got = outcome(RUN_AGENT, exc, "attempt 2: agent")
    assert isinstance(got, Failed)
    assert str(got) == "attempt 2: agent: RepositoryError: remote said no"


def test_a_landing_conflict_ends_the_item_failed() -> None:
    got = outcome(LAND, failed_with(ApplicationError("moved", type=LANDING_CONFLICT)), "land attempt 1")
    assert isinstance(got, Failed) and "LandingConflict: moved" in str(got)


def test_bad_input_to_the_agent_step_is_named_as_such() -> None:
    got = outcome(RUN_AGENT, failed_with(ApplicationError("no such agent", type=BAD_INPUT)), "attempt 1: agent")
    assert isinstance(got, Dead) and str(got) == "bad input: BadInput: no such agent"


def test_exhausted_execution_retries_say_how_many_tries() -> None:
    exc = failed_with(ApplicationError("sandbox died", type="SandboxError"), RetryState.MAXIMUM_ATTEMPTS_REACHED)
    got = outcome(VALIDATE, exc, "attempt 1: validate")
    assert isinstance(got, Dead) and str(got) == "validation failed after 3 tries: SandboxError: sandbox died"


def test_a_control_step_that_keeps_failing_ends_the_item_dead_with_its_summary() -> None:
    exc = failed_with(ApplicationError("database gone", type="OperationalError"), RetryState.MAXIMUM_ATTEMPTS_REACHED)
    got = outcome(RECORD_ATTEMPT, exc, "record attempt 3")
    assert isinstance(got, Dead)
    assert str(got) == "record attempt 3 failed after retries: OperationalError: database gone"


def test_a_cancelled_step_is_the_workflows_cancellation_not_a_failure() -> None:
    got = outcome(RUN_AGENT, failed_with(CancelledError("cancelled")), "attempt 1: agent")
    assert isinstance(got, asyncio.CancelledError)
