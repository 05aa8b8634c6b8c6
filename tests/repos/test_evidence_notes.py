"""A change landed on a remote (smart HTTP with credentials, a forge that opens pull requests) carries its signed
evidence bundle as a git note in its own notes ref, and the pull request's body links it and says how to verify it."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.attestation.keys import generate
from crewwork.cli.demo import RIGHT
from crewwork.config.attestation import EvidenceSettings
from crewwork.config.repos import ForgeConfig, RepoCredential
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_settings, running_crew
from tests.evidence.test_landed import item
from tests.fakes.github_server import FakeGitHub
from tests.repos.conftest import Served
from tests.repos.servers import SmartHttp, git

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def test_a_remote_change_carries_its_note_and_the_pull_request_links_it(
    tmp_path: Path,
    temporal_server: DevServer,
    pg_url: str,
    sandbox_backend: str,
    served: Served,
    secret_dir: Path,
    http_password: str,
    smart_http: SmartHttp,
) -> None:
    token = "ghp_" + "e1" * 18
    (secret_dir / "http-token").write_text(http_password + "\n")
    (secret_dir / "forge-token").write_text(token + "\n")
    scope = f"http://127.0.0.1:{smart_http.port}/"
    key = tmp_path / "evidence.key"
    generate(key)
    with FakeGitHub(token=token, branch_exists=lambda *a: True) as forge:
        settings = make_settings(
            tmp_path / "data",
            temporal_server,
            pg_url,
            sandbox_backend=sandbox_backend,
            repo_credentials={
                "http": RepoCredential(
                    kind="https_token", match=[scope], secret_file=secret_dir / "http-token", username="crew"
                ),
                "forge": RepoCredential(
                    kind="https_token", match=[forge.api_url + "/"], secret_file=secret_dir / "forge-token"
                ),
            },
            forges=[ForgeConfig(match=[scope + "acme/"], api_url=forge.api_url, credential="forge")],
            evidence=EvidenceSettings(signing_key_file=key, public_url="https://crewwork.example.com"),
        )
        async with running_crew(settings) as crew:
            url = smart_http.url(served.name)
            wid = await crew.submit(
                item(url, [{"files": {"calc.py": RIGHT}}], repo={"url": url, "ref": "main", "pull_request": {}})
            )
            result = await crew.result(wid)
            assert result.state == "succeeded", result.reason
            arts = [a for a in await crew.store.list_artifacts(wid) if a.name == "evidence-bundle.json"]
            bundle = await crew.store.artifact_content(arts[0].id)
        body = forge.pulls[("acme", "calc")][0]["body"]
    commit = result.landed_commit
    assert f"refs/notes/crewwork/{wid}" in body and f"crewwork verify bundle.json --repo . --commit {commit}" in body
    assert f"https://crewwork.example.com/v1/work-items/{wid}/evidence-bundle" in body
    note = git(served.bare, "notes", f"--ref=crewwork/{wid}", "show", commit)
    assert note.encode() + b"\n" == bundle
    assert http_password not in body and token not in (bundle or b"").decode()
