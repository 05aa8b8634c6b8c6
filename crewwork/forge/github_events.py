"""GitHub's webhooks as a `WebhookDialect` (crewwork/forge/intake.py): the signature, the delivery, the triggers.

**Signature.** GitHub signs the raw body with the webhook's secret: `X-Hub-Signature-256: sha256=` + the hex
HMAC-SHA256. It is recomputed over exactly the bytes received, before anything parses them, and compared with
`hmac.compare_digest` (constant time: how long it takes says nothing about how much of a guess was right). That is
the whole scheme, so the standard library does it; a library (githubkit's `verify`, octokit's) calls the same
primitive underneath and would be a dependency for one line. The legacy SHA-1 `X-Hub-Signature` is never accepted.

**Triggers.** `issues` with action `labeled` and the subscription's label (case-insensitive): key
`issue:<number>:label:<label>`, actor the user who applied the label. `issue_comment` with action `created` whose
body has a line starting with the mention and a known command (`@crewwork fix`): key `comment:<comment id>`, actor
the comment's author. Keys name the trigger, not the delivery: a redelivery, a replay of an old delivery under a new
id, or the label removed and applied again queue nothing new. Comments on pull requests, edited comments, other
actions and other events are not triggers (`Ignored`, with the reason).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from crewwork.forge.intake import (
    MAX_TEXT_CHARS,
    MAX_TITLE_CHARS,
    Delivery,
    Ignored,
    IntakeRules,
    Trigger,
    WebhookRefused,
    cut,
)

SIGNATURE_HEADER = "x-hub-signature-256"
DELIVERY_HEADER = "x-github-delivery"
EVENT_HEADER = "x-github-event"
_HEX_SIGNATURE = re.compile(r"sha256=([0-9a-fA-F]{64})")
_DELIVERY_ID = re.compile(r"[A-Za-z0-9-]{1,100}")
_EVENT = re.compile(r"[a-z_]{1,64}")


def sign(secret: str, body: bytes) -> str:
    """The `X-Hub-Signature-256` value GitHub sends for `body` (and tests send)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _User(_Model):
    # GitHub's login alphabet (an App's bot user ends in `[bot]`): a login is written into the fenced text's labels
    # and the refusal comment, so nothing else gets through.
    login: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9-]*)(?:\[bot\])?$")


class _Repository(_Model):
    full_name: str = Field(min_length=3, max_length=300)


class _Label(_Model):
    name: str = Field(max_length=100)


class _Issue(_Model):
    number: int = Field(ge=1)
    title: str
    body: str | None = None
    html_url: str = Field(max_length=2000, pattern=r"^https?://[^\s<>]+$")
    user: _User
    pull_request: dict[str, Any] | None = None


class _Comment(_Model):
    id: int = Field(ge=1)
    body: str | None = None
    user: _User


class _IssuesEvent(_Model):
    action: str
    issue: _Issue
    label: _Label | None = None
    repository: _Repository
    sender: _User


class _IssueCommentEvent(_Model):
    action: str
    issue: _Issue
    comment: _Comment
    repository: _Repository
    sender: _User


class _Ref(_Model):
    ref: str = Field(max_length=300)
    repo: _Repository | None = None


class _PullRequest(_Model):
    number: int = Field(ge=1)
    title: str
    html_url: str = Field(max_length=2000, pattern=r"^https?://[^\s<>]+$")
    user: _User
    head: _Ref
    merged: bool | None = None
    merged_at: str | None = None
    closed_at: str | None = None


class _Review(_Model):
    id: int = Field(ge=1)
    user: _User | None = None
    body: str | None = None
    state: str = Field(max_length=40)
    commit_id: str | None = Field(default=None, max_length=64)
    submitted_at: str | None = None


class _PullRequestReviewEvent(_Model):
    action: str
    review: _Review
    pull_request: _PullRequest
    repository: _Repository
    sender: _User


class _PullRequestEvent(_Model):
    action: str
    pull_request: _PullRequest
    repository: _Repository
    sender: _User


REVIEW_BRANCH_PREFIX = "crewwork/"
"""The head branch of every pull request crewwork opens (`crewwork/<work item id>`)."""
DECISIONS = ("approved", "changes_requested")
PR_REVIEW_COMMAND = "review"


class GitHubWebhooks:
    name = "github"

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str) -> Delivery:
        signature = headers.get(SIGNATURE_HEADER)
        if not signature:
            raise WebhookRefused(
                401, "signature_missing", "X-Hub-Signature-256 is missing: set the webhook's secret on GitHub"
            )
        if not _HEX_SIGNATURE.fullmatch(signature.strip()):
            raise WebhookRefused(401, "signature_invalid", "X-Hub-Signature-256 must be `sha256=` and 64 hex digits")
        if not hmac.compare_digest(sign(secret, body).encode(), signature.strip().lower().encode()):
            raise WebhookRefused(401, "signature_invalid", "X-Hub-Signature-256 does not match the body")
        delivery = headers.get(DELIVERY_HEADER, "").strip()
        event = headers.get(EVENT_HEADER, "").strip()
        if not _DELIVERY_ID.fullmatch(delivery):
            raise WebhookRefused(400, "delivery_missing", "X-GitHub-Delivery must be the delivery's id")
        if not _EVENT.fullmatch(event):
            raise WebhookRefused(400, "event_missing", "X-GitHub-Event must name the event")
        return Delivery(delivery, event)

    def trigger(self, delivery: Delivery, payload: Any, rules: IntakeRules, repository: str) -> Trigger | Ignored:
        if not isinstance(payload, dict):
            raise WebhookRefused(422, "invalid_payload", "the payload must be a JSON object")
        if delivery.event == "ping":
            return Ignored("ping")
        if delivery.event in ("pull_request_review", "pull_request"):
            return self._pull_request(delivery, payload, repository)
        if delivery.event not in ("issues", "issue_comment"):
            return Ignored(f"{delivery.event} events are not triggers")
        try:
            if delivery.event == "issues":
                event: _IssuesEvent | _IssueCommentEvent = _IssuesEvent.model_validate(payload)
            else:
                event = _IssueCommentEvent.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise WebhookRefused(
                422, "invalid_payload", f"not a GitHub {delivery.event} payload: {where}: {first['msg']}"
            ) from None
        if event.repository.full_name.lower() != repository.lower():
            raise WebhookRefused(
                422,
                "repository_mismatch",
                f"the payload is about {event.repository.full_name}, not this subscription's {repository}",
            )
        if isinstance(event, _IssuesEvent):
            if event.issue.pull_request is not None:
                return Ignored("pull requests are not triggers here")
            return self._labelled(event, rules)
        return self._commented(event, rules)

    def _pull_request(self, delivery: Delivery, payload: dict[str, Any], repository: str) -> Trigger | Ignored:
        """A review submitted on, or the closing of, a pull request crewwork opened: its head is the work item's
        branch `crewwork/<id>` in this very repository (a fork's branch of the same name is not crewwork's)."""
        try:
            if delivery.event == "pull_request_review":
                event: _PullRequestReviewEvent | _PullRequestEvent = _PullRequestReviewEvent.model_validate(payload)
            else:
                event = _PullRequestEvent.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise WebhookRefused(
                422, "invalid_payload", f"not a GitHub {delivery.event} payload: {where}: {first['msg']}"
            ) from None
        if event.repository.full_name.lower() != repository.lower():
            raise WebhookRefused(
                422,
                "repository_mismatch",
                f"the payload is about {event.repository.full_name}, not this subscription's {repository}",
            )
        pr = event.pull_request
        if not _crewworks(pr, repository):
            return Ignored(
                "a pull request crewwork did not open (its head is not a crewwork/ branch of this repository)"
            )
        if isinstance(event, _PullRequestReviewEvent):
            if event.action != "submitted":
                return Ignored(f"pull_request_review.{event.action[:40]} is not a decision")
            return review_trigger(event.review, pr, event.repository.full_name) or Ignored(
                f"a review in state {event.review.state.lower()[:40]} is not a decision"
            )
        if event.action != "closed":
            return Ignored(f"pull_request.{event.action[:40]} is not a decision")
        if pr.merged or pr.merged_at:
            return Ignored("the pull request was merged")
        return closed_trigger(pr, event.sender.login, event.repository.full_name)

    def _labelled(self, event: _IssuesEvent, rules: IntakeRules) -> Trigger | Ignored:
        if event.action != "labeled":
            return Ignored(f"issues.{event.action[:40]} is not a trigger")
        if event.label is None or event.label.name.lower() != rules.label.lower():
            return Ignored("another label")
        return _trigger(event, "label", f"issue:{event.issue.number}:label:{rules.label.lower()}", event.sender.login)

    def _commented(self, event: _IssueCommentEvent, rules: IntakeRules) -> Trigger | Ignored:
        if event.action != "created":
            return Ignored(f"issue_comment.{event.action[:40]} is not a trigger")
        command = parse_command(event.comment.body or "", rules)
        if command is None:
            return Ignored("no command for the bot")
        on_pull = event.issue.pull_request is not None
        # `review` asks for an agent's review of a pull request (a `pr_review` work item); `fix`, an issue's fix.
        if on_pull and command != PR_REVIEW_COMMAND:
            return Ignored(f"`{command}` is not a command on a pull request (`{PR_REVIEW_COMMAND}` is)")
        if not on_pull and command == PR_REVIEW_COMMAND:
            return Ignored(f"`{PR_REVIEW_COMMAND}` is a command on a pull request, not an issue")
        return _trigger(
            event,
            "comment",
            f"comment:{event.comment.id}",
            event.comment.user.login,
            command=command,
            comment=event.comment,
        )


def from_issue_event(event: Any, rules: IntakeRules, repository: str) -> Trigger | None:
    """The trigger an item of `GET /repos/{owner}/{repo}/issues/events` is (a `labeled` event of the label on an
    issue), read as the webhook's `issues.labeled` would be: the same key, so a delivery and a poll meet."""
    if not isinstance(event, dict) or event.get("event") != "labeled" or not isinstance(event.get("issue"), dict):
        return None
    payload = {
        "action": "labeled",
        "issue": event["issue"],
        "label": event.get("label"),
        "repository": {"full_name": repository},
        "sender": event.get("actor"),
    }
    try:
        found = GitHubWebhooks().trigger(Delivery("poll", "issues"), payload, rules, repository)
    except WebhookRefused:
        return None
    return found if isinstance(found, Trigger) else None


def from_comment(comment: Any, issue: Any, rules: IntakeRules, repository: str) -> Trigger | None:
    """The trigger an item of `GET /repos/{owner}/{repo}/issues/comments` is, with its issue, read as the webhook's
    `issue_comment.created` would be."""
    payload = {
        "action": "created",
        "issue": issue,
        "comment": comment,
        "repository": {"full_name": repository},
        "sender": comment.get("user") if isinstance(comment, dict) else None,
    }
    try:
        found = GitHubWebhooks().trigger(Delivery("poll", "issue_comment"), payload, rules, repository)
    except WebhookRefused:
        return None
    return found if isinstance(found, Trigger) else None


def _crewworks(pr: _PullRequest, repository: str) -> bool:
    head_repo = pr.head.repo.full_name.lower() if pr.head.repo is not None else ""
    return (
        pr.head.ref.startswith(REVIEW_BRANCH_PREFIX)
        and len(pr.head.ref) > len(REVIEW_BRANCH_PREFIX)
        and head_repo == repository.lower()
    )


def review_trigger(review: _Review, pr: _PullRequest, repository: str) -> Trigger | None:
    """The trigger of a review that decides (approved, changes requested); None for any other (a comment)."""
    state = review.state.lower()
    if state not in DECISIONS or review.user is None:
        return None
    body, cut_body = cut(review.body or "", MAX_TEXT_CHARS)
    return _pull_trigger(
        pr,
        repository,
        kind="review",
        key=f"review:{review.id}",
        actor=review.user.login,
        review_id=review.id,
        review_state=state,
        review_body=body,
        review_commit=review.commit_id or "",
        at=_epoch(review.submitted_at),
        truncated=cut_body,
    )


def closed_trigger(pr: _PullRequest, actor: str, repository: str) -> Trigger:
    """The trigger of a pull request closed without being merged: its key is the pull request's, so closing it
    again (after reopening) is the same trigger."""
    return _pull_trigger(
        pr, repository, kind="closed", key=f"pull:{pr.number}:closed", actor=actor, at=_epoch(pr.closed_at)
    )


def _pull_trigger(pr: _PullRequest, repository: str, **fields: Any) -> Trigger:
    title, cut_title = cut(pr.title, MAX_TITLE_CHARS)
    truncated = bool(fields.pop("truncated", False)) or cut_title
    return Trigger(
        repository=repository,
        issue_number=pr.number,
        issue_url=pr.html_url,
        issue_title=title,
        issue_body="",
        issue_author=pr.user.login,
        pull_head=pr.head.ref,
        truncated=truncated,
        **fields,
    )


def from_review(review: Any, pull: Any, repository: str) -> Trigger | None:
    """The trigger an item of `GET /repos/{owner}/{repo}/pulls/{pull_number}/reviews` is (with its pull request),
    read as the webhook's `pull_request_review.submitted` would be: the same key."""
    return _polled(
        "pull_request_review",
        {
            "action": "submitted",
            "review": review,
            "pull_request": pull,
            "repository": {"full_name": repository},
            "sender": review.get("user") if isinstance(review, dict) else None,
        },
        repository,
    )


def from_closed(pull: Any, closed_by: Any, repository: str) -> Trigger | None:
    """The trigger a pull request closed without merging is, as the webhook's `pull_request.closed` would be (the
    actor: the issue's `closed_by`)."""
    return _polled(
        "pull_request",
        {"action": "closed", "pull_request": pull, "repository": {"full_name": repository}, "sender": closed_by},
        repository,
    )


def _polled(event: str, payload: dict[str, Any], repository: str) -> Trigger | None:
    try:
        found = GitHubWebhooks()._pull_request(Delivery("poll", event), payload, repository)
    except WebhookRefused:
        return None
    return found if isinstance(found, Trigger) else None


def _epoch(stamp: str | None) -> float:
    """GitHub's `2011-04-14T16:00:49Z` as epoch seconds (0 for anything else)."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def mentions_command(comment: Any, rules: IntakeRules) -> bool:
    return isinstance(comment, dict) and parse_command(str(comment.get("body") or ""), rules) is not None


def parse_command(body: str, rules: IntakeRules) -> str | None:
    """The command of the first line that starts with the mention and a known command (`@crewwork fix`), else None.
    A mention inside a sentence, or quoted (`> @crewwork fix`), is not a command."""
    mention = rules.mention.lower()
    for line in body.splitlines():
        words = line.strip().lower().split()
        if len(words) >= 2 and words[0] == mention and words[1] in rules.commands:
            return words[1]
    return None


def _trigger(
    event: _IssuesEvent | _IssueCommentEvent,
    kind: Any,
    key: str,
    actor: str,
    *,
    command: str = "fix",
    comment: _Comment | None = None,
) -> Trigger:
    title, cut_title = cut(event.issue.title, MAX_TITLE_CHARS)
    body, cut_body = cut(event.issue.body or "", MAX_TEXT_CHARS)
    said, cut_comment = cut(comment.body or "", MAX_TEXT_CHARS) if comment else ("", False)
    return Trigger(
        kind=kind,
        key=key,
        repository=event.repository.full_name,
        actor=actor,
        issue_number=event.issue.number,
        issue_url=event.issue.html_url,
        issue_title=title,
        issue_body=body,
        issue_author=event.issue.user.login,
        command=command,
        comment_id=comment.id if comment else None,
        comment_body=said,
        truncated=cut_title or cut_body or cut_comment,
        pull_request=event.issue.pull_request is not None,
    )
