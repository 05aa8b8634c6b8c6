"""Opening pull requests through GitHub's REST API, against a real local server speaking that protocol."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crewwork.boundary.urls import parse_repo_url
from crewwork.config.repos import ForgeConfig
from crewwork.forge import ForgeError, forge_for
from crewwork.forge.github import GitHubForge
from tests.fakes.github_server import FakeGitHub

TOKEN = "ghp_" + "ab12" * 9


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub(token=TOKEN, branch_exists=lambda o, r, b: b.startswith("crewwork/")) as g:
        yield g


async def test_opens_a_draft_and_a_retry_returns_the_same_pull_request(github: FakeGitHub) -> None:
    forge = GitHubForge(github.api_url, TOKEN)
    first = await forge.open_pull_request(
        "acme", "calc", head="crewwork/wi1", base="main", title="Fix add", body="b", draft=True
    )
    assert first.created and first.draft and first.url.endswith("/acme/calc/pull/1")
    again = await forge.open_pull_request(
        "acme", "calc", head="crewwork/wi1", base="main", title="Fix add", body="b", draft=True
    )
    assert (again.url, again.created) == (first.url, False)
    assert len(github.pulls[("acme", "calc")]) == 1
    posts = [r for r in github.requests if r.method == "POST"]
    assert len(posts) == 1 and posts[0].json["head"] == "crewwork/wi1" and posts[0].json["draft"] is True
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in github.requests)
    assert all(r.headers["x-github-api-version"] == "2022-11-28" for r in github.requests)


async def test_without_a_base_the_default_branch_is_used(github: FakeGitHub) -> None:
    github.default_branch = "trunk"
    pr = await GitHubForge(github.api_url, TOKEN).open_pull_request(
        "acme", "calc", head="crewwork/wi2", base=None, title="t", body="b"
    )
    assert github.pulls[("acme", "calc")][0]["base"]["ref"] == "trunk" and pr.created


async def test_errors_say_whether_a_retry_can_help_and_never_show_the_token(github: FakeGitHub) -> None:
    github.fail_next(502, "Bad Gateway")
    with pytest.raises(ForgeError) as err:
        await GitHubForge(github.api_url, TOKEN).open_pull_request(
            "acme", "calc", head="crewwork/x", base="main", title="t", body=""
        )
    assert err.value.retryable and err.value.status == 502
    with pytest.raises(ForgeError) as err:
        await GitHubForge(github.api_url, "ghp_wrong" + "0" * 30).open_pull_request(
            "acme", "calc", head="crewwork/x", base="main", title="t", body=""
        )
    assert not err.value.retryable and "Bad credentials" in str(err.value) and "ghp_wrong" not in str(err.value)
    with pytest.raises(ForgeError, match="invalid") as err:
        await GitHubForge(github.api_url, TOKEN).open_pull_request(
            "acme", "calc", head="other", base="main", title="t", body=""
        )
    assert not err.value.retryable and err.value.status == 422


def test_the_forge_is_chosen_by_the_longest_scope() -> None:
    broad = ForgeConfig(match=["https://github.com/"], credential="a")
    narrow = ForgeConfig(match=["https://github.com/acme/"], api_url="https://ghe.example/api/v3", credential="b")
    assert forge_for(parse_repo_url("https://github.com/acme/x.git"), [broad, narrow]) is narrow
    assert forge_for(parse_repo_url("https://github.com/other/x.git"), [broad, narrow]) is broad
    assert forge_for(parse_repo_url("https://gitlab.com/acme/x.git"), [broad, narrow]) is None
