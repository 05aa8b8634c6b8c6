"""A forge subscription's settings (`PUT /v1/repositories/{id}/forge`: what triggers work, whom it trusts, what a
triggered work item runs) and what the intake (crewwork/api/forge_intake.py) makes of a trigger with them: the work
item, the polite refusal, the pull request's text while an attempt awaits review. Pure values and functions; kept
apart from the intake's loop for size."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crewwork.forge.intake import IntakeRules, Trigger
from crewwork.forge.untrusted import instruction
from crewwork.models import (
    AgentSpec,
    BudgetSpec,
    PullRequestSpec,
    RepoSpec,
    ReviewSpec,
    ValidationSpec,
    WorkItemKind,
    WorkItemSpec,
)
from crewwork.models.review import clean_line
from crewwork.store.forge import Subscription
from crewwork.store.views import StoredWorkItem
from crewwork.workflows.loop import SUBJECT_MAX_CHARS

DEFAULT_TEST_COMMAND = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$")
WORK_ITEM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ForgeSubscribe(BaseModel):
    """What a subscription triggers on, whom it trusts, and what a triggered work item runs."""

    model_config = ConfigDict(extra="forbid")
    label: str = Field(
        default="crewwork",
        min_length=1,
        max_length=50,
        pattern=r"^[^\s].*$",
        description="An issue labelled with this (case-insensitive) becomes a work item.",
    )
    mention: str = Field(
        default="@crewwork",
        pattern=r"^@[A-Za-z0-9][A-Za-z0-9-]{0,38}$",
        description="A comment with a line starting `<mention> fix` (on an issue) or `<mention> review` (on a pull "
        "request) becomes a work item.",
    )
    min_permission: Literal["triage", "write", "maintain", "admin"] | None = Field(
        default="write",
        description="The weakest repository permission (asked of the forge) that may trigger work; null: only "
        "`allow_users` may.",
    )
    allow_users: list[str] = Field(
        default_factory=list,
        max_length=200,
        description="Forge logins that may trigger work whatever their permission.",
    )
    validation: ValidationSpec = Field(
        default_factory=lambda: ValidationSpec(command=DEFAULT_TEST_COMMAND),
        description="How a triggered item's change is validated (default: the repository's pytest).",
    )
    agent: AgentSpec = Field(default_factory=AgentSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    review_required: bool = Field(
        default=True, description="A triggered item waits for a person's approval before it lands."
    )

    @field_validator("allow_users")
    @classmethod
    def _logins(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not _LOGIN.match(u)]
        if bad:
            raise ValueError(f"not forge logins: {bad[:5]}")
        return sorted({u.lower() for u in v})

    def rules(self) -> IntakeRules:
        return IntakeRules(label=self.label, mention=self.mention)


REFUSAL = (
    "@{actor} thank you. This repository's crewwork only starts work for people with {who}, so nothing was started "
    "for this request and nothing in it was passed on. Someone with that access can label this issue `{label}` or "
    "write a comment that starts with `{mention} fix`."
)
REVIEW_REFUSAL = (
    "@{actor} thank you. This repository's crewwork only reviews pull requests for people with {who}, so no review "
    "was started for this request and nothing in it was passed on. Someone with that access can write a comment "
    "that starts with `{mention} review`."
)


def review_pr_message(item: StoredWorkItem, attempt: int) -> str:
    """What the pull request opened for review says (its title: the instruction's first line, as the landed commit's
    subject; the landing replaces the body with its own, evidence included)."""
    lines = str(item.spec.get("instruction") or "").strip().splitlines()
    title = clean_line(lines[0] if lines else "", SUBJECT_MAX_CHARS) or "change"
    return (
        f"{title}\n\ncrewwork work item {item.id}: attempt {attempt} validated, **awaiting review**. Approve this "
        "pull request, or request changes with line comments (they become the next attempt's review input); closing "
        "it without a merge rejects the change. Nothing lands before a trusted reviewer approves.\n"
    )


def refusal_text(trigger: Trigger, settings: ForgeSubscribe) -> str:
    who = (
        f"at least {settings.min_permission} access to the repository"
        if settings.min_permission
        else "a place on its allowlist"
    )
    text = REVIEW_REFUSAL if trigger.pull_request else REFUSAL
    return text.format(actor=trigger.actor, who=who, label=settings.label, mention=settings.mention)


def work_item_of(sub: Subscription, trigger: Trigger, settings: ForgeSubscribe) -> WorkItemSpec:
    """The one work item a trusted trigger becomes (the same value however often it is built)."""
    return WorkItemSpec(
        kind=WorkItemKind.code_change,
        repo=RepoSpec(id=sub.repository_id, pull_request=PullRequestSpec(body=f"Fixes #{trigger.issue_number}")),
        instruction=instruction(trigger, sub.secret),
        validation=settings.validation,
        agent=settings.agent,
        budget=settings.budget,
        review=ReviewSpec(required=settings.review_required),
        idempotency_key=f"forge:{sub.id}:{trigger.key}"[:200],
        labels={
            "source": "forge",
            "forge.issue": f"{trigger.repository}#{trigger.issue_number}"[:256],
            "forge.trigger": trigger.kind,
            "forge.actor": trigger.actor[:256],
        },
    )


class RetryTrigger(Exception):
    """The trigger cannot be handled now (the forge or Temporal is down, the queue is full): tried again later."""
