"""An agent's review of a pull request, from the data it writes to the one review posted on the forge.

The agent never talks to the forge. It writes a JSON document (`AgentReview`: a body and line comments, each on a
file, a line and a side of the diff) in its sandbox; the host reads that document as data only: bounded in size
(`MAX_REVIEW_JSON_BYTES`), parsed strictly (unknown fields, wrong types, empty or oversized texts are errors with a
clear message, never a traceback), and never executed or followed. What the host then does with it is fixed here:

1. every line comment is checked against the pull request's diff as the forge lists it (`GET /repos/{owner}/{repo}/
   pulls/{pull_number}/files`, each file's `patch`): a comment whose line the diff does not show on that side (an
   untouched line, a file the pull request does not change, a file whose patch the forge left out or that the bound
   on reading it cut) is refused, dropped from the review and kept with its reason (`Anchored.refused`);
2. the review is posted once, with the event `COMMENT` (the agent never approves nor requests changes: a person
   decides that), its body carrying a hidden marker of the work item (`marker`). Before posting, the pull request's
   reviews are listed and one carrying the marker is taken for the posted one, so a retried activity or a
   redelivered trigger never posts a second review (`post_once`).

Parsing the diff is bounded: at most `MAX_DIFF_FILES` files and `MAX_DIFF_LINES` lines of patch in all are read;
what lies beyond is treated as not shown, so a comment there is refused with the reason, never posted unchecked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from crewwork.boundary.safefs import Refused as PathRefused
from crewwork.boundary.safefs import TooLarge, read_bytes

MAX_REVIEW_JSON_BYTES = 262_144
"""The agent's review document, as bytes: a bigger one is refused whole (nothing is posted)."""
MAX_REVIEW_BODY_CHARS = 60_000
"""The review's body (GitHub's own bound on a body is 65,536; the marker and the refusals' note need room)."""
MAX_LINE_COMMENTS = 50
MAX_COMMENT_CHARS = 8_000
MAX_PATH_CHARS = 1_024
MAX_DIFF_FILES = 300
"""Files of the pull request read (three pages of the forge's listing)."""
MAX_DIFF_LINES = 200_000
"""Lines of patch parsed over all the files."""

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
MARKER = "<!-- crewwork-pr-review:{key} -->"
REVIEW_FILE = "crewwork-review.json"
"""Where the agent writes its review, relative to the workspace's root (the pull request's head checked out)."""


class ReviewOutputError(ValueError):
    """The agent's review document is not one the host takes: the message says why, and nothing is posted."""


class LineComment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    line: int = Field(ge=1, le=10_000_000)
    side: Literal["RIGHT", "LEFT"] = "RIGHT"
    """RIGHT: the line in the pull request's head (added or unchanged); LEFT: in its base (removed or unchanged)."""
    body: str = Field(min_length=1, max_length=MAX_COMMENT_CHARS)

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or "\x00" in v or any(p in ("", ".", "..") for p in v.split("/")):
            raise ValueError("must be a file's path relative to the repository's root")
        return v


class AgentReview(BaseModel):
    """What the agent writes: its review's body and its line comments. Nothing else is accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    body: str = Field(min_length=1, max_length=MAX_REVIEW_BODY_CHARS)
    comments: list[LineComment] = Field(default_factory=list, max_length=MAX_LINE_COMMENTS)


def parse_agent_review(raw: bytes) -> AgentReview:
    """The agent's review document, or ReviewOutputError saying what is wrong with it."""
    if len(raw) > MAX_REVIEW_JSON_BYTES:
        raise ReviewOutputError(
            f"the agent's review is {len(raw)} bytes, more than the {MAX_REVIEW_JSON_BYTES} allowed; nothing was posted"
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReviewOutputError(f"the agent's review is not JSON ({str(exc)[:200]}); nothing was posted") from None
    if not isinstance(data, dict):
        raise ReviewOutputError("the agent's review must be a JSON object with `body` and `comments`")
    try:
        return AgentReview.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise ReviewOutputError(
            f"the agent's review is not valid: {where}: {first['msg']} ({exc.error_count()} error(s)); "
            "nothing was posted"
        ) from None


def read_agent_review(workspace: Path) -> AgentReview:
    """The review the agent wrote in `workspace` (REVIEW_FILE), read on the host as data: beneath the workspace
    with no link followed on the way (crewwork.boundary.safefs), a regular file, at most MAX_REVIEW_JSON_BYTES
    (never read whole beyond), then parsed strictly. ReviewOutputError with the reason otherwise."""
    try:
        raw = read_bytes(workspace, REVIEW_FILE, max_bytes=MAX_REVIEW_JSON_BYTES)
    except TooLarge:
        raise ReviewOutputError(
            f"the agent's review {REVIEW_FILE} is more than the {MAX_REVIEW_JSON_BYTES} bytes allowed; "
            "nothing was posted"
        ) from None
    except FileNotFoundError:
        raise ReviewOutputError(f"the agent wrote no review ({REVIEW_FILE} is missing); nothing was posted") from None
    except PathRefused as exc:
        raise ReviewOutputError(f"the agent's review is not read: {exc.reason}; nothing was posted") from None
    except OSError as exc:
        raise ReviewOutputError(f"the agent's review is not read ({exc.strerror or exc}); nothing was posted") from None
    return parse_agent_review(raw)


@dataclass
class DiffLines:
    """The lines a review may comment on: per file, the head's lines the diff shows (RIGHT: added or context) and
    the base's (LEFT: removed or context); and the files whose patch was not read, with why."""

    right: dict[str, set[int]] = field(default_factory=dict)
    left: dict[str, set[int]] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)
    files_cut: bool = False
    """More files than MAX_DIFF_FILES: those beyond were not read."""


def hunk_lines(patch: str, budget: int) -> tuple[set[int], set[int], int, bool]:
    """The RIGHT and LEFT lines one file's patch shows, the patch lines read, and whether `budget` cut it."""
    right: set[int] = set()
    left: set[int] = set()
    old = new = 0
    read = 0
    in_hunk = False
    for line in patch.split("\n"):
        if read >= budget:
            return right, left, read, True
        read += 1
        m = _HUNK.match(line)
        if m:
            old, new, in_hunk = int(m.group(1)), int(m.group(3)), True
            continue
        if not in_hunk or line.startswith("\\"):
            continue
        tag = line[:1]
        if tag == "+":
            right.add(new)
            new += 1
        elif tag == "-":
            left.add(old)
            old += 1
        elif tag == " ":
            right.add(new)
            left.add(old)
            new += 1
            old += 1
    return right, left, read, False


def diff_lines(files: list[dict[str, Any]], *, more: bool = False) -> DiffLines:
    """The commentable lines of the files the forge listed (each `{filename, patch?, status}`), bounded."""
    out = DiffLines(files_cut=more or len(files) > MAX_DIFF_FILES)
    budget = MAX_DIFF_LINES
    for f in files[:MAX_DIFF_FILES]:
        name = f.get("filename")
        if not isinstance(name, str):
            continue
        patch = f.get("patch")
        if not isinstance(patch, str):
            out.unread[name] = "the forge shows no patch for this file (binary, or too large)"
            continue
        if budget <= 0:
            out.unread[name] = f"not read: the diff is larger than {MAX_DIFF_LINES} lines"
            continue
        right, left, read, cut = hunk_lines(patch, budget)
        budget -= read
        out.right[name], out.left[name] = right, left
        if cut:
            out.unread[name] = f"read in part: the diff is larger than {MAX_DIFF_LINES} lines"
    return out


@dataclass(frozen=True)
class Refused:
    comment: LineComment
    reason: str


@dataclass(frozen=True)
class Anchored:
    accepted: list[LineComment]
    refused: list[Refused]


def anchor(review: AgentReview, diff: DiffLines) -> Anchored:
    """Each line comment kept if the diff shows its line on its side, else refused with the reason."""
    accepted: list[LineComment] = []
    refused: list[Refused] = []
    for c in review.comments:
        lines = (diff.right if c.side == "RIGHT" else diff.left).get(c.path)
        if lines is not None and c.line in lines:
            accepted.append(c)
            continue
        if c.path in diff.unread:
            reason = diff.unread[c.path]
        elif c.path not in diff.right:
            reason = "the pull request does not change this file" + (
                f" (or it is beyond the first {MAX_DIFF_FILES} files read)" if diff.files_cut else ""
            )
        else:
            side = "head (RIGHT)" if c.side == "RIGHT" else "base (LEFT)"
            reason = f"line {c.line} of the {side} side is not in the pull request's diff"
        refused.append(Refused(c, reason))
    return Anchored(accepted, refused)


def marker(key: str) -> str:
    return MARKER.format(key=re.sub(r"[^A-Za-z0-9_:.-]", "_", key)[:120])


def review_body(review: AgentReview, anchored: Anchored, key: str) -> str:
    body = review.body.strip()
    if anchored.refused:
        body += (
            f"\n\n_{len(anchored.refused)} line comment(s) were left out: they were not on lines this pull request "
            "changes._"
        )
    return f"{body}\n\n{marker(key)}"


@dataclass(frozen=True)
class PostedReview:
    id: int
    url: str
    existing: bool
    """True when the review was found already posted (a retry): nothing was posted this time."""


class ReviewForge(Protocol):
    async def pull_request_files(self, owner: str, repo: str, number: int) -> tuple[list[dict[str, Any]], bool]:
        """The pull request's changed files (`filename`, `patch`), at most MAX_DIFF_FILES, and whether more exist."""
        ...

    async def pull_request_reviews(self, owner: str, repo: str, number: int) -> list[dict[str, Any]]:
        """The pull request's reviews (`id`, `body`, `html_url`), the first pages."""
        ...

    async def create_review(
        self, owner: str, repo: str, number: int, *, commit_id: str, body: str, comments: list[dict[str, Any]]
    ) -> PostedReview:
        """`POST …/pulls/{pull_number}/reviews` with the event COMMENT."""
        ...


async def find_posted(forge: ReviewForge, owner: str, repo: str, number: int, key: str) -> PostedReview | None:
    mark = marker(key)
    for r in await forge.pull_request_reviews(owner, repo, number):
        if isinstance(r.get("id"), int) and mark in str(r.get("body") or ""):
            return PostedReview(int(r["id"]), str(r.get("html_url") or ""), existing=True)
    return None


async def post_once(
    forge: ReviewForge, owner: str, repo: str, number: int, *, key: str, commit_id: str, review: AgentReview
) -> tuple[PostedReview, Anchored]:
    """Post `review` on pull request `number` as one COMMENT review of `commit_id`, exactly once for `key` (the
    work item): a review of the pull request carrying `key`'s marker is taken for it. Its comments are anchored to
    the diff first; the refused ones are returned, never posted."""
    files, more = await forge.pull_request_files(owner, repo, number)
    anchored = anchor(review, diff_lines(files, more=more))
    found = await find_posted(forge, owner, repo, number, key)
    if found is not None:
        return found, anchored
    posted = await forge.create_review(
        owner,
        repo,
        number,
        commit_id=commit_id,
        body=review_body(review, anchored, key),
        comments=[{"path": c.path, "line": c.line, "side": c.side, "body": c.body} for c in anchored.accepted],
    )
    return posted, anchored
