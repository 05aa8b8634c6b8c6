"""Hotfix intake: turn an error report (message, stack trace, repository, optional failing test command) into a
`hotfix` work item whose instruction and validation are derived from the report."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, ServiceDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError, refuse_unstorable_body
from crewwork.api.schemas import SubmitResponse
from crewwork.api.work_items import submit_spec
from crewwork.models import AgentSpec, BudgetSpec, RepoSpec, ReviewSpec, ValidationSpec, WorkItemKind, WorkItemSpec

router = APIRouter(prefix="/v1", tags=["work items"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute)

MAX_TRACE_CHARS = 12_000
DEFAULT_TEST_COMMAND = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]


class HotfixReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = Field(min_length=1, max_length=2000, description="The error message, e.g. `ZeroDivisionError`.")
    stack_trace: str = Field(default="", max_length=MAX_TRACE_CHARS, description="The stack trace as text.")
    repo: RepoSpec
    test_command: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="argv of a command that fails now and must pass after the fix (default: the repo's pytest).",
    )
    fail_to_pass: list[str] = Field(default_factory=list, max_length=200, description="Test ids that must pass.")
    agent: AgentSpec = Field(default_factory=AgentSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    review: ReviewSpec = Field(
        default_factory=lambda: ReviewSpec(required=True),
        description="A hotfix waits for a person unless this says otherwise (whatever the operator's default for "
        "other code changes).",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def implicated_files(trace: str) -> list[str]:
    """Relative source files named in a Python stack trace, innermost last, without duplicates."""
    seen: list[str] = []
    for path, _line in _FRAME.findall(trace):
        if path.startswith("/") or "site-packages" in path or path.startswith("<"):
            continue
        if path not in seen:
            seen.append(path)
    return seen


def derive_spec(report: HotfixReport) -> WorkItemSpec:
    files = implicated_files(report.stack_trace)
    lines = [
        "Fix the error reported below so that it no longer occurs, with the smallest correct change.",
        "Do not weaken or delete tests.",
        "",
        f"Error: {report.message}",
    ]
    if files:
        lines.append(f"Files in the stack trace: {', '.join(files)}")
    if report.stack_trace:
        lines += ["", "Stack trace:", report.stack_trace.strip()]
    if report.test_command:
        lines += ["", f"This command fails now and must pass after the fix: {' '.join(report.test_command)}"]
    labels = {"source": "hotfix", **report.labels}
    return WorkItemSpec(
        kind=WorkItemKind.hotfix,
        repo=report.repo,
        instruction="\n".join(lines),
        validation=ValidationSpec(
            command=report.test_command or DEFAULT_TEST_COMMAND, fail_to_pass=list(report.fail_to_pass)
        ),
        agent=report.agent,
        budget=report.budget,
        # Only an explicit `required` opts out; a review that sets a timeout alone (or nothing) still waits.
        review=report.review
        if report.review.required is not None
        else report.review.model_copy(update={"required": True}),
        idempotency_key=report.idempotency_key,
        labels=labels,
    )


@router.post(
    "/hotfix",
    status_code=202,
    response_model=SubmitResponse,
    summary="Hand off an error report: becomes a `hotfix` work item",
    responses={
        200: {"model": SubmitResponse, "description": "Already submitted (same idempotency key and report)"},
        409: {"description": "The idempotency key was used with a different submission (idempotency_conflict)"},
    },
)
async def hotfix(
    request: Request,
    response: Response,
    report: HotfixReport,
    principal: PrincipalDep,
    service: ServiceDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> SubmitResponse:
    refuse_unstorable_body(report)  # named by the report's own fields, not the derived instruction's
    try:
        spec = derive_spec(report)
    except ValueError as exc:
        raise ProblemError(422, "invalid_hotfix", str(exc)) from exc
    return await submit_spec(request, response, spec, principal, service, idempotency_key)
