"""A forge's `@crewwork review` as a `pr_review` work item, and the agent's review posted on the pull request once
the item succeeds (docs/forge.md, "Agents review pull requests"). Called by the intake (crewwork/api/forge_intake.py):
`review_request` when a trusted request is handled (with the subscription's agent and budget), `post_review` from
the item's progress."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from crewwork.forge import ForgeError
from crewwork.forge.intake import IntakeForge, Trigger
from crewwork.forge.pr_review import AgentReview, post_once
from crewwork.forge.untrusted import review_instruction
from crewwork.models import AgentSpec, BudgetSpec, RepoSpec, ReviewSpec, WorkItemKind, WorkItemSpec
from crewwork.store.forge import Subscription
from crewwork.store.store import Store
from crewwork.store.views import StoredWorkItem

PR_REVIEW_POSTED = "pr_review_posted"
"""The event of a `pr_review` item whose review was posted: the review's id and URL, the comments posted and refused."""
PR_REVIEW_REFUSED = "pr_review_refused"


def pr_review_of(
    sub: Subscription, trigger: Trigger, agent: AgentSpec, budget: BudgetSpec, head_ref: str
) -> WorkItemSpec:
    """The `pr_review` work item a trusted `@crewwork review` becomes: the pull request's head branch checked out,
    its text fenced as untrusted, nothing validated, reviewed by a person or landed (the review is only posted)."""
    return WorkItemSpec(
        kind=WorkItemKind.pr_review,
        repo=RepoSpec(id=sub.repository_id, ref=head_ref),
        instruction=review_instruction(trigger, sub.secret),
        agent=agent,
        budget=budget,
        review=ReviewSpec(required=False),
        idempotency_key=f"forge:{sub.id}:{trigger.key}"[:200],
        labels={
            "source": "forge",
            "forge.pull": f"{trigger.repository}#{trigger.issue_number}"[:256],
            "forge.trigger": "review",
            "forge.actor": trigger.actor[:256],
        },
    )


async def review_request(
    sub: Subscription,
    agent: AgentSpec,
    budget: BudgetSpec,
    trigger: Trigger,
    forge: IntakeForge,
    owner: str,
    name: str,
) -> WorkItemSpec | str:
    """The `pr_review` work item a trusted `@crewwork review` becomes, or why it cannot be one: the pull request
    as the forge says now must be open, and its head a branch of the registered repository (the agent's workspace
    is that branch, checked out from the repository's mirror)."""
    pull = await forge.pull_request(owner, name, trigger.issue_number)
    raw_head = pull.get("head")
    head: dict[str, Any] = raw_head if isinstance(raw_head, dict) else {}
    ref = head.get("ref") if isinstance(head.get("ref"), str) else ""
    raw_repo = head.get("repo")
    head_repo: dict[str, Any] = raw_repo if isinstance(raw_repo, dict) else {}
    if pull.get("state") != "open":
        return f"pull request #{trigger.issue_number} is not open"
    if str(head_repo.get("full_name") or "").lower() != f"{owner}/{name}".lower() or not ref:
        return (
            f"pull request #{trigger.issue_number} comes from another repository (a fork); only pull requests "
            "whose head is a branch of this repository are reviewed so far"
        )
    return pr_review_of(sub, trigger, agent, budget, ref)


async def post_review(
    store: Store, item: StoredWorkItem, forge: IntakeForge, owner: str, name: str, number: int
) -> str:
    """Post the agent's review of a succeeded `pr_review` item on its pull request, once: the posted review is
    recorded as the item's `pr_review_posted` event (its id, URL, the comments posted and those refused, with
    why), and a review carrying the item's marker on the pull request is taken for it (a crash between the post
    and the record). Returns the review's URL. A review the host cannot read is recorded as refused, once."""
    done = await store.events_of_type(item.id, PR_REVIEW_POSTED, limit=1)
    if done:
        return str(done[0].data.get("url") or "")
    refused = await store.events_of_type(item.id, PR_REVIEW_REFUSED, limit=1)
    if refused:
        return ""
    output = (item.result or {}).get("output") or {}
    try:
        review = AgentReview.model_validate(output.get("review") if isinstance(output, dict) else None)
    except ValidationError as exc:
        await store.append_event(
            item.id, item.tenant_id, PR_REVIEW_REFUSED, {"error": f"the agent's review is not valid: {exc}"[:2000]}
        )
        return ""
    try:
        posted, anchored = await post_once(
            forge, owner, name, number, key=item.id, commit_id=item.base_commit or "", review=review
        )
    except ForgeError as exc:
        if exc.retryable:
            raise
        # The forge will not take it (the pull request is gone, or its diff moved under the comments): said once,
        # never retried.
        await store.append_event(
            item.id, item.tenant_id, PR_REVIEW_REFUSED, {"error": f"the forge refused the review: {exc}"[:2000]}
        )
        return ""
    await store.append_event(
        item.id,
        item.tenant_id,
        PR_REVIEW_POSTED,
        {
            "review_id": posted.id,
            "url": posted.url,
            "found_posted": posted.existing,
            "commit": item.base_commit,
            "posted_comments": [c.model_dump(exclude={"body"}) for c in anchored.accepted],
            "refused_comments": [
                {**r.comment.model_dump(exclude={"body"}), "reason": r.reason} for r in anchored.refused
            ],
        },
    )
    return posted.url
