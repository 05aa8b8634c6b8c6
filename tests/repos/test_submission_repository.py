"""The repository part of a submission, in one call (crewwork/repos/submission.py, `resolve_submission`): what runs is
the tenant's registration (its id, URL and ref, its protected paths), at the commit the ref names now; what cannot
run is refused naming the field, as a `SubmissionRejected` the API answers with its 422 problem, or as the 404 of a
repository the tenant never registered. A real local repository and a real store; nothing is started."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from crewwork.config import Settings
from crewwork.models import WorkItemSpec
from crewwork.models.errors import SubmissionRejected
from crewwork.repos.submission import RepositoryRefused, resolve_submission
from crewwork.repos.tenancy import Registration, RepositoryNotFound, RepositoryRegistry
from crewwork.store.store import Store
from tests.conftest import make_repo
from tests.integration.test_lifecycle import code_change


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", auto_register_repos=False)


async def _registered(store: Store, settings: Settings, repo: Path, **kw: object) -> tuple[str, str]:
    tid = await store.ensure_tenant(f"submission-{uuid.uuid4().hex[:8]}")
    registration = Registration(url=str(repo), **kw)  # type: ignore[arg-type]
    row = await RepositoryRegistry(store, settings).register(tid, registration)
    return tid, row.id


def _spec(path: Path | str, **kw: object) -> WorkItemSpec:
    return WorkItemSpec.model_validate({**code_change(Path(path), [{"files": {"calc.py": "x = 2\n"}}]), **kw})


async def test_a_submission_runs_on_its_registration_at_the_commit_its_ref_names(
    any_store: Store, settings: Settings, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "calc", {"calc.py": "x = 1\n", "tests/test_calc.py": ""})
    tid, repo_id = await _registered(any_store, settings, repo, protect_paths=["conftest.py"])
    # The tenant spells the path its own way; what runs is the registration.
    resolved = await resolve_submission(_spec(f"{repo}/../calc"), tid, any_store, settings)
    head = subprocess.run(["git", "rev-parse", "main"], cwd=repo, check=True, capture_output=True, text=True)
    assert resolved.commit == head.stdout.strip()
    assert resolved.locator == str(repo.resolve())
    assert resolved.spec.repo is not None and resolved.spec.validation is not None
    assert (resolved.spec.repo.id, resolved.spec.repo.url, resolved.spec.repo.ref) == (
        repo_id,
        resolved.locator,
        "main",
    )
    assert resolved.spec.validation.protect.paths[-1] == "conftest.py", "the registration's protected paths are added"


async def test_what_cannot_run_is_refused_naming_the_field(
    any_store: Store, settings: Settings, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "calc", {"calc.py": "x = 1\n"})
    tid, _ = await _registered(any_store, settings, repo)
    cases = [
        (_spec(repo, repo={"url": str(repo), "ref": "no-such-branch"}), "repo", "does not exist"),
        (_spec(repo, repo={"url": str(repo), "ref": "main", "pull_request": {}}), "repo.pull_request", "no forge"),
        (_spec(repo, environment={"network": True, "setup": [["true"]]}), "environment", "allows setup no network"),
    ]
    for spec, field, words in cases:
        with pytest.raises(RepositoryRefused, match=words) as refused:
            await resolve_submission(spec, tid, any_store, settings)
        # The service's refusal, which the API answers as its 422 problem with the field.
        assert isinstance(refused.value, SubmissionRejected)
        assert (refused.value.field, refused.value.code) == (field, "invalid_work_item")
    with pytest.raises(RepositoryNotFound):
        await resolve_submission(_spec(make_repo(tmp_path / "other", {"a": "b"})), tid, any_store, settings)
