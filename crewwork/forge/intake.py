"""What every forge dialect provides to intake (docs/forge.md), so that GitLab or Gitea is a second dialect beside
GitHub and nothing above this package names a forge:

- `WebhookDialect`: authenticate a delivery from its headers and raw body (`verify`), then read the trigger it
  carries, if any (`trigger`): an issue labelled with the subscription's label, or a comment whose line starts with
  the bot's mention and a command. Everything a payload says is parsed here, once, into a `Trigger`; a payload that
  is not what its event promises is a `WebhookRefused` (a 4xx), never an exception further up.
- `IntakeForge`: the REST calls intake makes, done by the intake, never in the webhook request: the actor's
  permission on the repository, one comment on the issue (a refusal, or the item's progress, edited in place), a
  pull request's head (a "done" is checked against it), and the recent triggers listed by the API (the catch-up
  poll, for deliveries that never arrived).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

PERMISSIONS = ("none", "read", "triage", "write", "maintain", "admin")
"""Repository permissions, weakest first (GitHub's role names; other dialects map theirs onto these)."""

Permission = Literal["read", "triage", "write", "maintain", "admin"]

MAX_REVIEW_COMMENTS = 100
"""Line comments read of one review (one page of the forge's API); a review with more says so to the agent."""
MAX_TITLE_CHARS = 1024
MAX_TEXT_CHARS = 65_536
"""GitHub's own bound on an issue's or a comment's body; longer text (another dialect's) is cut, and says so."""


class WebhookRefused(ValueError):
    """A delivery intake will not take: the HTTP status, a stable code and a message safe to show the sender."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class IntakeRules:
    """A subscription's trigger settings, as the dialect reads them."""

    label: str
    """An issue labelled with this (case-insensitive) is a trigger."""
    mention: str
    """A comment line starting with this and a command (`@crewwork fix`) is a trigger."""
    commands: tuple[str, ...] = ("fix", "review")
    """`fix` on an issue; `review` on a pull request (an agent's review of it: a `pr_review` work item)."""


@dataclass(frozen=True)
class Delivery:
    """An authenticated delivery: the forge's id for it (the same on every retry and redelivery) and its event."""

    id: str
    event: str


@dataclass(frozen=True)
class Trigger:
    """One trigger, everything intake needs from the payload. `key` identifies the trigger itself (the issue and
    label, the comment), never the delivery. Every text field except `actor` and the ids is UNTRUSTED: written by
    people on the forge, handed to an agent only as marked data (crewwork.forge.untrusted)."""

    kind: Literal["label", "comment", "review", "closed"]
    key: str
    repository: str
    """`owner/name` on the forge."""
    actor: str
    """Who caused it (labelled the issue, wrote the comment): the user whose permission decides."""
    issue_number: int
    issue_url: str
    issue_title: str
    issue_body: str
    issue_author: str
    command: str = "fix"
    comment_id: int | None = None
    comment_body: str = ""
    truncated: bool = False
    pull_request: bool = False
    """The comment is on a pull request (command `review`): the `issue_*` fields describe the pull request."""
    # A review of, or the closing of, a pull request crewwork opened (kinds `review`, `closed`): the `issue_*` fields
    # then describe the pull request (a pull request is an issue on the forge; refusals would go to it).
    pull_head: str = ""
    """The pull request's head branch (`crewwork/<work item id>`): which work item it is about."""
    review_id: int | None = None
    review_state: str = ""
    """`approved` or `changes_requested` (kind `review`)."""
    review_body: str = ""
    review_commit: str = ""
    """The commit the reviewer looked at (the pull request's head then)."""
    at: float = 0.0
    """When the review was submitted or the pull request closed (epoch seconds, the forge's clock; 0: unknown)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trigger:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class PostedComment:
    id: int
    url: str


@dataclass(frozen=True)
class ReviewComment:
    """A reviewer's comment on one line of a pull request's diff, as the forge's review comments API gives it. Its
    `body` is UNTRUSTED (the reviewer's words): it reaches an agent only fenced."""

    path: str
    line: int | None
    """The line on `side` of the diff (None: a comment on the whole file)."""
    side: Literal["new", "old"]
    body: str


@dataclass(frozen=True)
class Ignored:
    """A delivery that carries no trigger, and why (answered 202 with the reason, so the forge's log shows it)."""

    reason: str


class WebhookDialect(Protocol):
    name: str

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str) -> Delivery:
        """The delivery, if its signature is the subscription secret's over exactly `body`; WebhookRefused (401 for
        a missing or wrong signature, 400 for a missing id or event) otherwise."""
        ...

    def trigger(self, delivery: Delivery, payload: Any, rules: IntakeRules, repository: str) -> Trigger | Ignored:
        """The trigger `payload` carries for the subscription of `repository` (`owner/name`); WebhookRefused (422)
        when the payload is not the event's shape or names another repository."""
        ...


class IntakeForge(Protocol):
    async def permission(self, owner: str, repo: str, user: str) -> str:
        """`user`'s permission on the repository (one of PERMISSIONS; `none` for a user who has none)."""
        ...

    async def comment(self, owner: str, repo: str, issue_number: int, body: str) -> PostedComment:
        """Post a comment on the issue."""
        ...

    async def edit_comment(self, owner: str, repo: str, comment_id: int, body: str) -> PostedComment:
        """Replace a comment's body (the progress comment, edited in place)."""
        ...

    async def pull_request_head(self, owner: str, repo: str, number: int) -> str:
        """The head commit of a pull request, as the forge says now."""
        ...

    async def pull_request(self, owner: str, repo: str, number: int) -> dict[str, Any]:
        """The pull request as the forge says now (its `state`, `head.ref`, `head.sha`, `head.repo.full_name`)."""
        ...

    async def pull_request_files(self, owner: str, repo: str, number: int) -> tuple[list[dict[str, Any]], bool]:
        """The pull request's changed files (`filename`, `patch`), bounded, and whether more exist."""
        ...

    async def pull_request_reviews(self, owner: str, repo: str, number: int) -> list[dict[str, Any]]:
        """The pull request's reviews (`id`, `body`, `html_url`), the first pages."""
        ...

    async def create_review(
        self, owner: str, repo: str, number: int, *, commit_id: str, body: str, comments: list[dict[str, Any]]
    ) -> Any:
        """One review with the event COMMENT (crewwork/forge/pr_review.py `PostedReview`)."""
        ...

    async def review_comments(self, owner: str, repo: str, number: int, review_id: int) -> list[ReviewComment]:
        """The line comments of one review of a pull request (at most one page: MAX_REVIEW_COMMENTS)."""
        ...

    async def recent_triggers(self, owner: str, repo: str, rules: IntakeRules, since: float) -> list[Trigger]:
        """The triggers of the repository since `since` (epoch seconds) as the forge's REST API lists them now,
        newest first, at most one page of each kind: the catch-up for deliveries that never arrived."""
        ...


def at_least(permission: str, minimum: str) -> bool:
    """`permission` is `minimum` or stronger (an unknown permission is none)."""
    have = PERMISSIONS.index(permission) if permission in PERMISSIONS else 0
    return have >= PERMISSIONS.index(minimum)


def cut(text: str, limit: int) -> tuple[str, bool]:
    """`text` at most `limit` characters, and whether it was cut; NUL removed (the store keeps no NUL)."""
    text = text.replace("\x00", "")
    return (text, False) if len(text) <= limit else (text[:limit], True)
