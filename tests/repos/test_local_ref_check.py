"""A local repository's ref is checked at submission by a confined git: a ref that is not there and a repository
that cannot be read are two different answers, each naming what is wrong."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from crewwork.config import Settings
from crewwork.repos.registration import RepoPolicyError, RepositoryChecks

SANDBOX_UID = 65532
GIT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README").write_text("x\n")
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "base"]):
        subprocess.run(cmd, cwd=path, check=True, env={**os.environ, **GIT})
    return path


def _checks(tmp_path: Path) -> RepositoryChecks:
    return RepositoryChecks(Settings(data_dir=tmp_path / "data", database_url=f"sqlite+aiosqlite:///{tmp_path}/x.db"))


async def test_a_missing_ref_is_named(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "r")
    checks = _checks(tmp_path)
    _url, sha = await checks.check(str(repo), "main")
    assert len(sha) == 40
    with pytest.raises(RepoPolicyError, match=r"repo.ref 'no-such-branch' does not exist in "):
        await checks.check(str(repo), "no-such-branch")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
async def test_a_repository_the_confined_git_cannot_read_is_not_called_a_missing_ref(tmp_path: Path) -> None:
    # A directory on the way that only another user may enter (a sandbox run once chowned a benchmark's temporary
    # directory so): the confined git cannot reach the repository, whatever the ref.
    closed = tmp_path / "closed"
    repo = _repo(closed / "r")
    os.chown(closed, SANDBOX_UID, SANDBOX_UID)
    closed.chmod(0o700)
    with pytest.raises(RepoPolicyError) as err:
        await _checks(tmp_path).check(str(repo), "HEAD")
    assert "could not be read" in str(err.value) and "does not exist" not in str(err.value), err.value
