"""A local repository under one tenant's root must not serve another tenant's repository, nor run anything on the host.

Two roots, `a` (the attacker's) and `b` (the victim's, holding a secret). Each attack is a git directory under `a`
that sends git elsewhere without a symlink on the path the root check resolves: alternates, a `gitdir:` file, a
`commondir` file, a `.git` inside the git directory, symlinks inside it (`objects`, `refs`, a pack file). Each is
refused at the submission check (`Repositories.check`, which registration and every submission run), and again
by the mirror fetch itself when it is planted after the check (the real `MirrorCache` fetch through `Remote`), so
the victim's content never reaches the mirror work items are made from; and when it is planted in the moment
between the last check and git opening the repository (made as long as it gets by skipping the check), git runs
confined to the git directory and finds nothing it names. Then the repository's config: landing a
change pushes into the local repository, and nothing its config names (alternateRefsCommand, fsmonitor, filters of
a work-tree update) runs on the host. Last, the API: a 422 naming the problem, at registration and at submission.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from crewwork.config import Settings
from crewwork.repos.git import LocalRepositoryRefused
from crewwork.repos.landing import LandingConflictError
from crewwork.repos.registration import RepoPolicyError
from crewwork.repos.worker import Repositories
from tests.api.conftest import api_crew, api_settings  # noqa: F401  (fixtures)
from tests.api.test_repositories import CALC, Tenancy, change, register, tenancy  # noqa: F401  (fixture)
from tests.conftest import GIT_ENV, make_repo

SECRET = "B-SECRET-5d1e\n"


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


@dataclass
class Two:
    root_a: Path
    attacker: Path
    victim: Path
    victim_commit: str
    repos: Repositories

    def victim_readable_in(self, gitdir: Path) -> bool:
        if not gitdir.exists():
            return False
        res = subprocess.run(
            ["git", f"--git-dir={gitdir}", "cat-file", "-p", f"{self.victim_commit}:secret.txt"],
            env=GIT_ENV,
            capture_output=True,
            text=True,
        )
        return res.stdout == SECRET


@pytest.fixture
def two(tmp_path: Path) -> Two:
    root_a, root_b = tmp_path / "roots" / "a", tmp_path / "roots" / "b"
    victim = make_repo(root_b / "victim", {"secret.txt": SECRET})
    git("repack", "-adq", cwd=victim)
    attacker = make_repo(root_a / "evil", {"f.txt": "mine\n"})
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    return Two(root_a.resolve(), attacker, victim, git("rev-parse", "HEAD", cwd=victim).strip(), Repositories(settings))


def _point_main_at(two: Two) -> None:
    (two.attacker / ".git" / "refs" / "heads" / "main").write_text(two.victim_commit + "\n")


def alternates(two: Two) -> None:
    (two.attacker / ".git" / "objects" / "info" / "alternates").write_text(f"{two.victim / '.git' / 'objects'}\n")
    _point_main_at(two)


def http_alternates(two: Two) -> None:
    (two.attacker / ".git" / "objects" / "info" / "http-alternates").write_text(f"{two.victim / '.git'}/objects\n")


def gitfile(two: Two) -> None:
    shutil.rmtree(two.attacker / ".git")
    (two.attacker / ".git").write_text(f"gitdir: {two.victim / '.git'}\n")


def commondir(two: Two) -> None:
    (two.attacker / ".git" / "commondir").write_text(f"{two.victim / '.git'}\n")


def dotgit_symlink_over_bare(two: Two) -> None:
    # The top of the path looks like a bare repository of the attacker's; upload-pack prefers `<path>/.git`.
    real = two.attacker / ".git"
    for entry in real.iterdir():
        shutil.move(str(entry), str(two.attacker / entry.name))
    real.rmdir()
    (two.attacker / ".git").symlink_to(two.victim / ".git")


def dotgit_inside_gitdir(two: Two) -> None:
    (two.attacker / ".git" / ".git").write_text(f"gitdir: {two.victim / '.git'}\n")


def broken_head_and_a_sibling(two: Two) -> None:
    # A HEAD git cannot read: upload-pack, given the path, refuses `evil/.git` and `evil` and goes on to
    # `evil.git/.git` and `evil.git`, next to the repository.
    (two.attacker / ".git" / "HEAD").write_text("garbage\n")
    Path(f"{two.attacker}.git").symlink_to(two.victim / ".git")


def broken_head_and_a_git_git(two: Two) -> None:
    # The same, given the git directory (as crewwork now does): `.git.git/.git` and `.git.git`.
    (two.attacker / ".git" / "HEAD").write_text("garbage\n")
    (two.attacker / ".git.git").symlink_to(two.victim / ".git")


def objects_symlink(two: Two) -> None:
    shutil.rmtree(two.attacker / ".git" / "objects")
    (two.attacker / ".git" / "objects").symlink_to(two.victim / ".git" / "objects")
    _point_main_at(two)


def refs_and_objects_symlinks(two: Two) -> None:
    # The whole of the victim without knowing any of its commits.
    for name in ("refs", "objects"):
        shutil.rmtree(two.attacker / ".git" / name)
        (two.attacker / ".git" / name).symlink_to(two.victim / ".git" / name)


def pack_symlinks(two: Two) -> None:
    for f in (two.victim / ".git" / "objects" / "pack").iterdir():
        (two.attacker / ".git" / "objects" / "pack" / f.name).symlink_to(f)
    _point_main_at(two)


ATTACKS: dict[str, tuple[Callable[[Two], None], str]] = {
    "alternates": (alternates, "objects/info/alternates"),
    "http-alternates": (http_alternates, "objects/info/http-alternates"),
    "gitdir-file": (gitfile, "`.git` is a file"),
    "commondir": (commondir, "commondir"),
    "dotgit-symlink-over-bare": (dotgit_symlink_over_bare, "`.git` is a symlink"),
    "dotgit-inside-gitdir": (dotgit_inside_gitdir, "`.git/.git`"),
    "broken-head-and-a-sibling": (broken_head_and_a_sibling, "`.git/HEAD` is neither"),
    "broken-head-and-a-git-git": (broken_head_and_a_git_git, "`.git.git` exists"),
    "objects-symlink": (objects_symlink, "`.git/objects` is a symlink"),
    "refs-and-objects-symlinks": (refs_and_objects_symlinks, "is a symlink that leads out of the git directory"),
    "pack-symlinks": (pack_symlinks, "`.git/objects/pack/pack-"),
}


async def _fetch(two: Two, locator: str, commit: str) -> BaseException | None:
    """Make the mirror of `locator` hold `commit` (what an activity does before making a workspace)."""
    try:
        hold = await two.repos.hold(locator, commit)
    except Exception as exc:
        return exc
    hold.release()
    return None


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_a_redirecting_git_directory_is_refused_by_the_submission_check(two: Two, attack: str) -> None:
    plant, named = ATTACKS[attack]
    plant(two)
    try:
        url, commit = await two.repos.check(str(two.attacker), "main", roots=[two.root_a])
    except RepoPolicyError as exc:
        refused: RepoPolicyError | None = exc
    else:  # let through: whatever happens next, the victim's content must not reach the mirror
        refused = None
        await _fetch(two, url.url, commit)
    assert not two.victim_readable_in(two.repos.mirrors.path(two.repos.locate(str(two.attacker)))), "victim leaked"
    assert refused is not None, "the check let the repository through"
    assert named in str(refused), str(refused)
    # The message names the tenant's own repository, never where a link of it leads.
    assert str(two.victim) not in str(refused)


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_a_redirect_planted_after_the_check_is_refused_by_the_mirror_fetch(two: Two, attack: str) -> None:
    url, commit = await two.repos.check(str(two.attacker), "main", roots=[two.root_a])
    plant, named = ATTACKS[attack]
    plant(two)
    err = await _fetch(two, url.url, commit)
    assert not two.victim_readable_in(two.repos.mirrors.path(url)), "victim leaked"
    tmp = two.repos.mirrors.root / ".tmp"
    assert not tmp.exists() or not any(two.victim_readable_in(d) for d in tmp.iterdir())
    assert isinstance(err, LocalRepositoryRefused), repr(err)
    assert named in str(err) and not err.retryable, str(err)


@pytest.mark.parametrize("attack", ["alternates", "commondir", "objects-symlink", "pack-symlinks", "gitdir-file"])
async def test_a_redirect_planted_between_the_check_and_git_names_nothing_in_the_confinement(
    two: Two, attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moment between the last check and git opening the repository, made as long as it gets: the check
    passes (it ran on the clean repository), then the redirect appears. Git's server command runs confined to the
    git directory (bubblewrap), where what it names does not exist."""
    from crewwork.repos import local, registration, remote

    if local._bwrap() is None:
        pytest.skip("bubblewrap cannot confine git on this host")
    url, commit = await two.repos.check(str(two.attacker), "main", roots=[two.root_a])
    checked = local.local_git_dir(two.attacker)
    monkeypatch.setattr(remote, "local_git_dir", lambda _path: checked)
    monkeypatch.setattr(registration, "checked_local_git_dir", lambda _url: checked)
    ATTACKS[attack][0](two)
    err = await _fetch(two, url.url, commit)
    assert not two.victim_readable_in(two.repos.mirrors.path(url)), "victim leaked"
    assert err is not None
    # The submission check's own git (resolving the ref) does not see the victim either: not even its commit id.
    try:
        _, resolved = await two.repos.check(str(two.attacker), "main", roots=[two.root_a])
    except RepoPolicyError:
        resolved = None
    assert resolved != two.victim_commit


async def test_a_clean_local_repository_with_internal_symlinks_still_works(two: Two) -> None:
    """Symlinks that stay inside the git directory (old-style HEAD, a hooks link) are the repository's own."""
    dot = two.attacker / ".git"
    (dot / "hooks-elsewhere").mkdir()
    shutil.rmtree(dot / "hooks", ignore_errors=True)
    (dot / "hooks").symlink_to("hooks-elsewhere")
    url, commit = await two.repos.check(str(two.attacker), "main", roots=[two.root_a])
    hold = await two.repos.hold(url.url, commit)
    try:
        assert git(f"--git-dir={hold.gitdir}", "cat-file", "-p", f"{commit}:f.txt", cwd=hold.gitdir) == "mine\n"
    finally:
        hold.release()


async def test_landing_into_a_local_repository_runs_nothing_its_config_names(two: Two, tmp_path: Path) -> None:
    repo = two.attacker
    (repo / ".gitattributes").write_text("* filter=evil\n")
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "attributes", cwd=repo)
    url, base = await two.repos.check(str(repo), "main", roots=[two.root_a])
    hold = await two.repos.hold(url.url, base)
    hold.release()
    markers = tmp_path / "markers"
    markers.mkdir()
    for key, value in {
        # receive-pack's connectivity check runs it on every push, alternates or not.
        "core.alternateRefsCommand": f"touch {markers}/alternateRefsCommand; true",
        "core.fsmonitor": f"touch {markers}/fsmonitor; true",
        "filter.evil.clean": f"sh -c 'touch {markers}/clean; cat'",
        "filter.evil.smudge": f"sh -c 'touch {markers}/smudge; cat'",
        "receive.denyCurrentBranch": "updateInstead",
        "gc.auto": "1",
    }.items():
        git("config", key, value, cwd=repo)
    hook = repo / ".git" / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\ntouch {markers}/pre-receive\n")
    hook.chmod(0o755)
    diff = "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-mine\n+changed\n"
    # A delivery branch the work tree does not have checked out lands, running nothing of the repository's.
    landed = await two.repos.land(
        url.url, tenant=None, work_item_id="one", base_commit=base, diff=diff, message="m", scratch=tmp_path / "s1"
    )
    assert landed.created and git("rev-parse", "refs/heads/crewwork/one", cwd=repo).strip() == landed.commit
    assert sorted(os.listdir(markers)) == []
    # The work tree checked out on the branch a landing pushes (updateInstead would check the change out there,
    # through the repository's filters and fsmonitor): the push is refused instead.
    git("symbolic-ref", "HEAD", "refs/heads/crewwork/two", cwd=repo)
    with pytest.raises(LandingConflictError, match="checked out"):
        await two.repos.land(
            url.url,
            tenant=None,
            work_item_id="two",
            base_commit=base,
            diff=diff,
            message="m",
            scratch=tmp_path / "s2",
        )
    assert (repo / "f.txt").read_text() == "mine\n"
    assert sorted(os.listdir(markers)) == []


async def test_registration_and_submission_refuse_a_redirect_with_a_422_naming_it(tenancy: Tenancy) -> None:  # noqa: F811
    t = tenancy
    victim = t.alpha_repo
    cases = {
        "alternates": ("objects/info/alternates", f"{victim / '.git' / 'objects'}\n"),
        "gitfile": ("", f"gitdir: {victim / '.git'}\n"),
        "commondir": ("commondir", f"{victim / '.git'}\n"),
    }
    for name, (rel, text) in cases.items():
        repo = make_repo(t.roots.beta / name, CALC)
        if rel:
            (repo / ".git" / rel).write_text(text)
        else:
            shutil.rmtree(repo / ".git")
            (repo / ".git").write_text(text)
        r = await register(t, t.stack.beta, str(repo), default_ref="main")
        assert r.status_code == 422, (name, r.text)
        problem = r.json()
        assert problem["code"] == "invalid_repository" and problem["errors"][0]["field"] == "url", problem
        assert (rel or "`.git` is a file") in problem["detail"] and str(victim) not in problem["detail"], problem
    linked = make_repo(t.roots.beta / "linked", CALC)
    shutil.rmtree(linked / ".git" / "objects")
    (linked / ".git" / "objects").symlink_to(victim / ".git" / "objects")
    r = await register(t, t.stack.beta, str(linked))
    assert r.status_code == 422 and "`.git/objects` is a symlink" in r.json()["detail"], r.text
    # Registered clean, then redirected: refused at the next submission, before anything starts.
    own = make_repo(t.roots.beta / "mine", CALC)
    reg = await register(t, t.stack.beta, str(own), default_ref="main")
    assert reg.status_code == 201, reg.text
    (own / ".git" / "objects" / "info" / "alternates").write_text(f"{victim / '.git' / 'objects'}\n")
    async with t.stack.client(t.stack.beta) as c:
        r = await c.post("/v1/work-items", json=change({"id": reg.json()["id"]}))
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "repo", r.text
        assert "no longer usable" in r.json()["detail"] and "alternates" in r.json()["detail"], r.text
        assert (await c.get("/v1/work-items")).json()["items"] == []
