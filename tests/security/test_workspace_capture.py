"""Host-side handling of what a workspace holds: capture, materialise, apply, land, never trusting the content.

Everything here is what the host does after (or before) a sandbox ran, so it is the same on every backend; the
workspace is filled directly, as a sandbox would leave it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crewwork.boundary import safefs
from crewwork.config.sandbox import SandboxSettings
from crewwork.repos.landing import _tree_of_change
from crewwork.sandbox.disk import workspace_disk_mb
from crewwork.workspace.tree import CaptureLimits, CaptureRefused, DiffTooLarge, Workspace, gitops
from tests.conftest import GIT_ENV, make_repo

LIMITS = CaptureLimits(max_diff_bytes=1 << 20, max_file_bytes=1 << 20)


async def new_ws(repo: Path, home: Path, *, disk: bool = True) -> Workspace:
    settings = SandboxSettings()
    commit = (await gitops.git("rev-parse", "HEAD", cwd=repo)).out.strip()
    return await Workspace.create(
        git_dir=gitops.git_dir_of(repo),
        home=home,
        commit=commit,
        disk_mb=workspace_disk_mb(settings, settings.default_limits()) if disk else None,
        owner=settings.owner(),
    )


@pytest.fixture
async def ws(tmp_path: Path) -> AsyncIterator[Workspace]:
    repo = make_repo(tmp_path / "repo", {"calc.py": "x = 1\n", "docs/a.txt": "a\n", ".gitignore": "*.log\n"})
    w = await new_ws(repo, tmp_path / "home")
    yield w
    await w.remove()


async def test_deep_directory_tree_is_refused_not_walked_forever(ws: Workspace) -> None:
    d = ws.path
    for i in range(LIMITS.max_depth + 10):
        d = d / f"d{i % 10}"
    d.mkdir(parents=True)
    (d / "leaf.txt").write_text("deep\n")
    with pytest.raises(CaptureRefused, match="deeper than"):
        await ws.capture(LIMITS)


async def test_sparse_huge_agent_file_is_refused_by_its_size_without_reading(ws: Workspace) -> None:
    with open(ws.path / "sparse.bin", "wb") as f:
        f.truncate(2 << 30)
    with pytest.raises(DiffTooLarge, match="more than the limit"):
        await asyncio.wait_for(ws.capture(LIMITS), 30)


async def test_diff_larger_than_the_artifact_limit_is_a_clear_failure(ws: Workspace) -> None:
    for i in range(40):
        (ws.path / f"chunk{i}.txt").write_bytes(os.urandom(16 * 1024).hex().encode())
    with pytest.raises(DiffTooLarge, match="artifact limit"):
        await ws.capture(CaptureLimits(max_diff_bytes=256 * 1024, max_file_bytes=1 << 20))


async def test_file_names_with_newlines_and_tabs_round_trip_without_injection(ws: Workspace, tmp_path: Path) -> None:
    tricky = ["new\nline.txt", "tab\there.txt", 'docs/quote"d.txt', "0\t0\tfake.txt"]
    for name in tricky:
        (ws.path / name).write_text(f"content of {name!r}\n")
    cap = await ws.capture(LIMITS)
    assert sorted(cap.stats.files) == sorted(tricky)
    assert cap.stats.files_changed == len(tricky)
    other = await new_ws(Path(str(ws.git.source).removesuffix("/.git")), tmp_path / "home2")
    try:
        tree, err = await other.apply(cap.diff)
        assert tree is not None, err
        assert sorted(p.decode() for p in tree if p not in other.base) == sorted(tricky)
    finally:
        await other.remove()


async def test_special_files_git_entries_and_hard_links_are_not_captured(ws: Workspace, tmp_path: Path) -> None:
    os.mkfifo(ws.path / "fifo")
    (ws.path / ".git").mkdir()
    (ws.path / ".git" / "config").write_text("[core]\n\tfsmonitor = touch /nonexistent\n")
    (ws.path / "sub").mkdir()
    (ws.path / "sub" / ".GIT").write_text("gitdir: ..\n")
    os.symlink(tmp_path / "repo" / ".gitignore", ws.path / "docs" / ".gitignore")
    (ws.path / "calc.py").write_text("x = 2\n")
    cap = await ws.capture(LIMITS)
    assert cap.stats.files == ["calc.py"]
    reasons = "\n".join(cap.stats.ignored)
    assert "fifo: a FIFO" in reasons and ".git: a .git entry" in reasons and "sub/.GIT" in reasons
    assert "docs/.gitignore: a symbolic link named like a git control file" in reasons


async def test_hard_links_are_taken_only_on_a_private_file_system(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"calc.py": "x = 1\n"})
    for disk in (True, False):
        w = await new_ws(repo, tmp_path / f"home-{disk}", disk=disk)
        try:
            os.link(w.path / "calc.py", w.path / "alias.py")
            cap = await w.capture(LIMITS)
            if w.private_fs:
                assert "alias.py" in cap.stats.files
            else:
                assert "alias.py" not in cap.stats.files and any("hard link" in i for i in cap.stats.ignored)
        finally:
            await w.remove()


async def test_gitignored_new_files_stay_out_and_tracked_ones_stay_in(ws: Workspace) -> None:
    (ws.path / "debug.log").write_text("noise\n")
    (ws.path / "docs" / "a.txt").write_text("changed\n")
    cap = await ws.capture(LIMITS)
    assert cap.stats.files == ["docs/a.txt"]


async def test_repository_filters_and_attributes_never_run_on_capture_apply_or_land(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    repo = make_repo(tmp_path / "repo", {"calc.py": "x = 1\n"})
    # The *host repository's own* configuration defines drivers; an agent's .gitattributes names them.
    for key, value in (
        ("filter.evil.clean", f"touch {marker}-clean"),
        ("filter.evil.smudge", f"touch {marker}-smudge"),
        ("filter.evil.process", f"touch {marker}-process"),
        ("diff.evil.textconv", f"touch {marker}-textconv"),
        ("diff.evil.command", f"touch {marker}-diff"),
        ("core.fsmonitor", f"touch {marker}-fsmonitor"),
    ):
        subprocess.run(["git", "config", key, value], cwd=repo, check=True, env=GIT_ENV)
    w = await new_ws(repo, tmp_path / "home")
    try:
        (w.path / ".gitattributes").write_text("* filter=evil diff=evil\n")
        (w.path / "calc.py").write_text("x = 2\n")
        cap = await w.capture(LIMITS)
        tree, err = await w.apply(cap.diff)
        assert tree is not None, err
        # Landing builds the change's tree on the host, in the repository's git directory: no filter runs there.
        await _tree_of_change(gitops.git_dir_of(repo), w.base_commit, cap.diff.decode(), tmp_path / "land")
    finally:
        await w.remove()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("marker")) == []


async def test_submodules_are_empty_directories_and_gitmodules_urls_are_never_used(tmp_path: Path) -> None:
    marker = tmp_path / "marker-submodule"
    repo = make_repo(tmp_path / "repo", {"calc.py": "x = 1\n"})
    gitmodules = f'[submodule "evil"]\n\tpath = evil\n\turl = ext::sh -c touch% {marker}\n'
    (repo / ".gitmodules").write_text(gitmodules)
    blob = "0" * 39 + "1"
    subprocess.run(
        ["git", "update-index", "--add", "--cacheinfo", f"160000,{blob},evil"], cwd=repo, check=True, env=GIT_ENV
    )
    subprocess.run(["git", "add", ".gitmodules"], cwd=repo, check=True, env=GIT_ENV)
    subprocess.run(["git", "commit", "-qm", "submodule"], cwd=repo, check=True, env=GIT_ENV)
    w = await new_ws(repo, tmp_path / "home")
    try:
        assert (w.path / "evil").is_dir() and os.listdir(w.path / "evil") == []
        (w.path / "evil" / "inside.txt").write_text("not part of the parent's change\n")
        (w.path / "calc.py").write_text("x = 2\n")
        cap = await w.capture(LIMITS)
        assert cap.stats.files == ["calc.py"]
        assert cap.entries[b"evil"].mode == "160000"
    finally:
        await w.remove()
    assert not marker.exists()


async def test_remove_never_follows_links_out_of_the_workspace(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    os.symlink(outside, ws.path / "escape")
    os.symlink(outside / "keep.txt", ws.path / "keep-link")
    await ws.remove()
    assert (outside / "keep.txt").read_text() == "keep\n"
    assert not ws.home.exists()


def test_reads_racing_a_symlink_swap_never_return_the_target(tmp_path: Path) -> None:
    """Host-side TOCTOU: while another thread swaps the path between a regular file and a link to a secret,
    every read returns the file's content or a refusal, never the secret."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("SECRET")
    stop = threading.Event()

    def swap() -> None:
        p = root / "d" / "r.xml"
        tmp = root / "d" / "r.tmp"
        while not stop.is_set():
            for make in (lambda q: q.write_text("<ok/>"), lambda q: os.symlink(secret, q)):
                if tmp.is_symlink() or tmp.exists():
                    tmp.unlink()
                make(tmp)
                os.replace(tmp, p)

    t = threading.Thread(target=swap)
    t.start()
    seen = set()
    try:
        for _ in range(3000):
            try:
                seen.add(safefs.read_bytes(root, "d/r.xml", max_bytes=100))
            except (safefs.Refused, FileNotFoundError):
                seen.add(b"refused")
    finally:
        stop.set()
        t.join()
    assert b"SECRET" not in seen
    assert seen <= {b"<ok/>", b"refused", b""}


def test_chown_tree_changes_links_not_their_targets(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing owners needs root")
    target = tmp_path / "host-file"
    target.write_text("x")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(target, ws / "link")
    safefs.chown_tree(ws, (65532, 65532))
    assert os.stat(target).st_uid == 0
    assert os.lstat(ws / "link").st_uid == 65532


def test_device_nodes_are_refused_without_being_opened(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    import stat as st

    root = tmp_path / "root"
    root.mkdir()
    # /dev/zero's numbers: opening and reading it would never end; the host must not even open it.
    os.mknod(root / "report.xml", st.S_IFCHR | 0o666, os.makedev(1, 5))
    with pytest.raises(safefs.Refused, match="character device"):
        safefs.read_bytes(root, "report.xml", max_bytes=1 << 20)
