"""The one table of the steps' activities: each step's policy and the function that runs it. Which pool serves an
activity follows from the policy (local activities run in the workflow's own, the control pool)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from crewwork.steps.admit import ADMIT
from crewwork.steps.admit.activity import admit
from crewwork.steps.agent import RUN_AGENT
from crewwork.steps.agent.activity import run_agent
from crewwork.steps.bundle import SIGN_ATTEMPT_BUNDLE
from crewwork.steps.bundle.activity import sign_attempt_bundle
from crewwork.steps.finish import FINISH
from crewwork.steps.finish.activity import finish
from crewwork.steps.land import LAND
from crewwork.steps.land.activity import land_change
from crewwork.steps.lease import ACQUIRE_WORKSPACE, CLEANUP, RELEASE_WORKSPACE, RENEW_WORKSPACE
from crewwork.steps.lease.activity import acquire_workspace, cleanup, release_workspace, renew_workspace
from crewwork.steps.ports import Ports, bind
from crewwork.steps.record import RECORD_ATTEMPT
from crewwork.steps.record.activity import record_attempt
from crewwork.steps.replay import REPLAY_ATTEMPT
from crewwork.steps.replay.activity import replay
from crewwork.steps.retain import RETENTION_PASS
from crewwork.steps.retain.activity import retention_pass
from crewwork.steps.review import RECORD_REVIEW
from crewwork.steps.review.activity import record_review
from crewwork.steps.state import SET_STATE
from crewwork.steps.state.activity import set_state
from crewwork.steps.step import Pool, Step
from crewwork.steps.validate import VALIDATE
from crewwork.steps.validate.activity import validate_change

ACTIVITIES: tuple[tuple[Step[Any, Any], Callable[[Ports, Any], Awaitable[Any]]], ...] = (
    (ADMIT, admit),
    (SET_STATE, set_state),
    (ACQUIRE_WORKSPACE, acquire_workspace),
    (RENEW_WORKSPACE, renew_workspace),
    (RELEASE_WORKSPACE, release_workspace),
    (RECORD_ATTEMPT, record_attempt),
    (RECORD_REVIEW, record_review),
    (LAND, land_change),
    (FINISH, finish),
    (CLEANUP, cleanup),
    (SIGN_ATTEMPT_BUNDLE, sign_attempt_bundle),
    (RETENTION_PASS, retention_pass),
    (RUN_AGENT, run_agent),
    (VALIDATE, validate_change),
    (REPLAY_ATTEMPT, replay),
)


def pool_of(step: Step[Any, Any]) -> Pool:
    """The pool whose worker serves the step: local activities and steps on the workflow's own queue run in the
    control pool, with the workflows."""
    return "control" if step.local or step.pool is None else step.pool


def activities(pool: Pool, ports: Ports) -> list[Callable[..., Awaitable[Any]]]:
    """The activities `pool`'s worker registers, bound to its ports."""
    return [bind(step, fn, ports) for step, fn in ACTIVITIES if pool_of(step) == pool]


def bound(ports: Ports) -> Any:
    """Every step's activity bound to `ports`, as attributes named after the activities (for tools and tests that
    call one directly: `bound(ports).admit(inp)`)."""
    return SimpleNamespace(**{step.name: bind(step, fn, ports) for step, fn in ACTIVITIES})
