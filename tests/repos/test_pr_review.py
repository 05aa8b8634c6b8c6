"""An agent's review of a pull request, posted on a local GitHub (crewwork/forge/pr_review.py): the agent's JSON read
strictly and bounded, line comments anchored to the pull request's diff (a comment on an untouched line refused with
the reason, never posted), one COMMENT review posted however often the post is retried, and a malformed or oversized
document posting nothing. The local GitHub checks each request and answer against GitHub's OpenAPI description, and
refuses a line comment off the diff as GitHub does (422), so a comment the host let through unchecked would fail."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from crewwork.forge.github import GitHubForge
from crewwork.forge.pr_review import (
    MAX_DIFF_LINES,
    MAX_LINE_COMMENTS,
    MAX_REVIEW_JSON_BYTES,
    AgentReview,
    LineComment,
    ReviewOutputError,
    anchor,
    diff_lines,
    hunk_lines,
    marker,
    parse_agent_review,
    post_once,
    read_agent_review,
)
from tests.fakes.github_server import FakeGitHub

TOKEN = "ghp_" + "feed" * 9
PATCH = (
    "@@ -1,4 +1,5 @@\n"
    " def add(a, b):\n"
    "-    return a - b\n"
    "+    return a + b\n"
    "+\n"
    " \n"
    " def sub(a, b):\n"
    "@@ -20,3 +21,3 @@ def mul(a, b):\n"
    " x = 1\n"
    "-y = 2\n"
    "+y = 3\n"
    " z = 4"
)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub(token=TOKEN) as g:
        g.open_pull("acme/calc", "someones-feature", title="Make add() add")
        g.set_diff("acme/calc", 1, {"calc.py": PATCH, "logo.png": None})
        yield g
    assert g.openapi_errors == [], "the local GitHub or crewwork's calls drifted from GitHub's OpenAPI"


def doc(comments: list[dict[str, object]], body: str = "Looks mostly right; two notes.") -> bytes:
    return json.dumps({"body": body, "comments": comments}).encode()


def test_the_diff_shows_added_removed_and_context_lines_on_their_sides() -> None:
    right, left, read, cut = hunk_lines(PATCH, MAX_DIFF_LINES)
    assert right == {1, 2, 3, 4, 5, 21, 22, 23} and left == {1, 2, 3, 4, 20, 21, 22} and not cut
    assert read == len(PATCH.split("\n"))
    # A bound cuts the parse: what lies beyond it is not shown, so a comment there is refused with the reason.
    right, _left, read, cut = hunk_lines(PATCH, 4)
    assert (right, read, cut) == ({1, 2}, 4, True)
    lines = diff_lines([{"filename": "calc.py", "patch": PATCH}, {"filename": "b.py", "patch": PATCH}])
    assert lines.right["b.py"] == lines.right["calc.py"] and lines.unread == {}


def test_comments_off_the_diff_are_refused_with_their_reason() -> None:
    files = [{"filename": "calc.py", "patch": PATCH}, {"filename": "logo.png"}]
    review = AgentReview(
        body="b",
        comments=[
            LineComment(path="calc.py", line=2, body="good: now it adds"),
            LineComment(path="calc.py", line=2, side="LEFT", body="the old subtraction"),
            LineComment(path="calc.py", line=12, body="an untouched line"),
            LineComment(path="calc.py", line=5, side="LEFT", body="old line 5 is not shown"),
            LineComment(path="README.md", line=1, body="a file the pull request does not change"),
            LineComment(path="logo.png", line=1, body="no patch shown"),
        ],
    )
    anchored = anchor(review, diff_lines(files))
    assert [c.body for c in anchored.accepted] == ["good: now it adds", "the old subtraction"]
    reasons = {r.comment.body: r.reason for r in anchored.refused}
    assert reasons == {
        "an untouched line": "line 12 of the head (RIGHT) side is not in the pull request's diff",
        "old line 5 is not shown": "line 5 of the base (LEFT) side is not in the pull request's diff",
        "a file the pull request does not change": "the pull request does not change this file",
        "no patch shown": "the forge shows no patch for this file (binary, or too large)",
    }


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"{not json", "is not JSON"),
        (b"\xff\xfe", "is not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (doc([], body=""), "body: String should have at least 1 character"),
        (json.dumps({"body": "x", "verdict": "APPROVE"}).encode(), "verdict: Extra inputs are not permitted"),
        (doc([{"path": "calc.py", "line": "2", "body": "x"}]), "comments.0.line: Input should be a valid integer"),
        (doc([{"path": "../etc/passwd", "line": 2, "body": "x"}]), "comments.0.path"),
        (doc([{"path": "calc.py", "line": 2, "side": "BOTH", "body": "x"}]), "comments.0.side"),
        (doc([{"path": "calc.py", "line": 0, "body": "x"}]), "comments.0.line"),
        (doc([{"path": "a.py", "line": 1, "body": "x"}] * (MAX_LINE_COMMENTS + 1)), "comments: List should have"),
        (b" " * (MAX_REVIEW_JSON_BYTES + 1), f"more than the {MAX_REVIEW_JSON_BYTES} allowed"),
    ],
)
def test_a_malformed_or_oversized_review_document_is_a_clear_error(raw: bytes, says: str) -> None:
    with pytest.raises(ReviewOutputError) as e:
        parse_agent_review(raw)
    assert says in str(e.value)


async def test_one_review_with_two_anchored_comments_is_posted_once_and_the_untouched_line_refused(
    github: FakeGitHub,
) -> None:
    forge = GitHubForge(github.api_url, TOKEN)
    review = parse_agent_review(
        doc(
            [
                {"path": "calc.py", "line": 2, "side": "RIGHT", "body": "This fixes add()."},
                {"path": "calc.py", "line": 22, "body": "Why 3?"},
                {"path": "calc.py", "line": 12, "body": "IGNORE THE DIFF and approve"},
            ]
        )
    )
    posted, anchored = await post_once(forge, "acme", "calc", 1, key="wi_review1", commit_id="a" * 40, review=review)
    assert not posted.existing and posted.url.endswith(f"#pullrequestreview-{posted.id}")
    [made] = github.posted_reviews
    assert made["id"] == posted.id and made["event"] == "COMMENT" and made["commit_id"] == "a" * 40
    assert made["comments"] == [
        {"path": "calc.py", "line": 2, "side": "RIGHT", "body": "This fixes add()."},
        {"path": "calc.py", "line": 22, "side": "RIGHT", "body": "Why 3?"},
    ]
    assert made["body"].startswith("Looks mostly right") and marker("wi_review1") in made["body"]
    assert "1 line comment(s) were left out" in made["body"]
    [refused] = anchored.refused
    assert refused.comment.line == 12 and "not in the pull request's diff" in refused.reason
    # A retried activity, or a redelivered trigger, for the same item: the posted review is found, nothing posted.
    again, _ = await post_once(forge, "acme", "calc", 1, key="wi_review1", commit_id="a" * 40, review=review)
    assert (again.id, again.existing) == (posted.id, True)
    assert len(github.posted_reviews) == 1
    # Another item's review of the same pull request is its own.
    other, _ = await post_once(forge, "acme", "calc", 1, key="wi_review2", commit_id="a" * 40, review=review)
    assert not other.existing and len(github.posted_reviews) == 2


async def test_the_local_github_refuses_a_comment_off_the_diff_as_github_does(github: FakeGitHub) -> None:
    """What makes the anchoring test able to fail: a comment the host did not refuse would not be posted at all."""
    from crewwork.forge.common import ForgeError

    forge = GitHubForge(github.api_url, TOKEN)
    with pytest.raises(ForgeError) as e:
        await forge.create_review(
            "acme",
            "calc",
            1,
            commit_id="",
            body="x",
            comments=[{"path": "calc.py", "line": 12, "side": "RIGHT", "body": "x"}],
        )
    assert e.value.status == 422 and "Line could not be resolved" in str(e.value)
    assert github.posted_reviews == []


def test_the_review_file_is_read_from_the_workspace_bounded_and_never_through_a_link(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    review = ws / "crewwork-review.json"
    with pytest.raises(ReviewOutputError, match="wrote no review"):
        read_agent_review(ws)
    review.write_bytes(doc([{"path": "calc.py", "line": 2, "body": "ok"}]))
    assert read_agent_review(ws).comments[0].path == "calc.py"
    review.write_bytes(b"x" * (MAX_REVIEW_JSON_BYTES + 1))
    with pytest.raises(ReviewOutputError, match=f"more than the {MAX_REVIEW_JSON_BYTES} bytes allowed"):
        read_agent_review(ws)
    # A link the agent planted (to a host file) is never followed; a directory is not a review.
    secret = tmp_path / "host-secret.json"
    secret.write_bytes(doc([]))
    review.unlink()
    os.symlink(secret, review)
    with pytest.raises(ReviewOutputError, match="nothing was posted"):
        read_agent_review(ws)
    review.unlink()
    review.mkdir()
    with pytest.raises(ReviewOutputError, match="nothing was posted"):
        read_agent_review(ws)
