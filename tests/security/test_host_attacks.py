"""The attacks of issue 13, end to end on every isolating backend: real Temporal, PostgreSQL, git and sandboxes.

Each test is an attack a tenant with an API key can mount; each asserts first that the host was not harmed
(no marker a host-side command would create, no victim deleted, no secret in any stored artifact), then what
the platform reports instead. Run against the code of main at 4f681e0, every test here failed at its first
(harm) assertion or at submission (see docs/sandbox.md, "Attacks tried").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.temporal.devserver import DevServer
from tests.security.conftest import (
    PYTEST,
    RIGHT,
    VALIDATION,
    RssSampler,
    artifact_named,
    artifacts_of,
    code_change,
    command_agent,
    crew_on,
    markers,
    scripted,
)

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

# A command agent that plants a git directory of its own choosing behind the workspace's `.git` entry: every
# way host git could run a command from configuration (fsmonitor, hooks, clean/smudge/process filters, an
# external diff, textconv, ssh, an included config file), each one creating its own marker on the host.
GIT_TRAP = r"""
import os, pathlib, shutil, stat, sys
mark = sys.argv[1]
dotgit = pathlib.Path(".git")
if dotgit.is_dir() and not dotgit.is_symlink():
    shutil.rmtree(dotgit)
elif dotgit.exists() or dotgit.is_symlink():
    dotgit.unlink()
dotgit.write_text("gitdir: tests\n")
t = pathlib.Path("tests")
for d in ("objects/info", "objects/pack", "refs/heads", "hooks", "info"):
    (t / d).mkdir(parents=True, exist_ok=True)
(t / "HEAD").write_text("ref: refs/heads/main\n")
(t / "commondir").unlink(missing_ok=True)
(t / "extra.config").write_text(f'[alias]\n\tadd = "!touch {mark}/include-alias"\n[core]\n\tpager = touch {mark}/include-pager\n')
(t / "config").write_text(f'''[core]
	repositoryformatversion = 0
	bare = false
	fsmonitor = "touch {mark}/fsmonitor; false"
	hooksPath = hooks
	sshCommand = touch {mark}/ssh
	worktree = ..
[filter "evil"]
	clean = touch {mark}/filter-clean
	smudge = touch {mark}/filter-smudge
	process = touch {mark}/filter-process
	required = true
[diff "evil"]
	textconv = touch {mark}/textconv
	command = touch {mark}/diff-driver
[diff]
	external = touch {mark}/diff-external
[include]
	path = {pathlib.Path.cwd()}/tests/extra.config
[safe]
	directory = *
''')
for hook in ("pre-commit", "post-index-change", "post-checkout", "reference-transaction", "pre-auto-gc"):
    p = t / "hooks" / hook
    p.write_text(f"#!/bin/sh\ntouch {mark}/hook-{hook}\n")
    p.chmod(0o755)
pathlib.Path(".gitattributes").write_text("* filter=evil diff=evil\n")
pathlib.Path("calc.py").write_text("def add(a, b):\n    return a + b\n")
"""


async def test_agent_planted_git_config_never_runs_on_the_host(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path, host_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    agent = command_agent(monkeypatch, "trap", GIT_TRAP, str(host_dir / "markers"))
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, agent))
        result = await crew.result(wid, timeout_s=300)
    assert markers(host_dir) == [], f"host git ran agent-planted commands: {markers(host_dir)}"
    # The agent's files are plain content of its change; its `.git` entry is not (the host never reads it).
    assert result.state == "succeeded", result.reason
    stats = result.attempts[0].agent.diff_stats
    assert stats is not None and "calc.py" in stats.files and ".git" not in stats.files
    assert any(i.startswith(".git:") for i in stats.ignored)


async def test_scripted_files_key_reaching_git_is_refused_at_submission(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc: Path, host_dir: Path
) -> None:
    from crewwork.api.service import SubmissionRejected

    config = '[core]\n\tfsmonitor = "touch ' + str(host_dir / "markers" / "fsmonitor") + '; false"\n'
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        for key in ("./.git/config", ".GIT/config", "a/../.git/config", ".git./config", "tests/.g\u200cit/config"):
            with pytest.raises(SubmissionRejected, match="git") as info:
                await crew.submit(code_change(calc, scripted({"files": {key: config, "calc.py": RIGHT}})))
            assert info.value.field == "agent"
    assert markers(host_dir) == []


# ------------------------------------------------------------------------------------------------ reading


def _symlink_report_to(target: str) -> list[str]:
    code = (
        "import os, sys; os.makedirs('.crewwork', exist_ok=True); "
        "p = '.crewwork/junit.xml'; os.path.lexists(p) and os.unlink(p); os.symlink(sys.argv[1], p)"
    )
    return ["python3", "-c", code, target]


@pytest.mark.parametrize("target", ["secret", "/proc/self/environ"])
async def test_report_symlinked_to_a_host_file_is_refused_not_stored(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path, host_dir: Path,
    worker_secret: str, target: str,
) -> None:  # fmt: skip
    path = str(host_dir / "secret.txt") if target == "secret" else target
    validation = {**VALIDATION, "command": _symlink_report_to(path)}
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, scripted({"files": {"calc.py": RIGHT}}), validation))
        result = await crew.result(wid, timeout_s=300)
        stored = b"".join(await artifacts_of(crew, wid))
    assert b"HOST-SECRET-7f3a9c" not in stored
    # /proc/self/environ shows the environment the worker process started with (not later changes).
    started_with = [e for e in Path("/proc/self/environ").read_bytes().split(b"\0") if len(e) > 12]
    assert not any(e in stored for e in started_with), "the worker's environment was stored as a report"
    assert worker_secret.encode() not in stored
    v = result.attempts[0].validation
    assert result.state == "failed" and v is not None and v.cause == "report_unparseable", v
    assert "symbolic link" in v.reason and v.report_ref is None


ATEXIT_CONFTEST = """
import atexit, os

def _swap():
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".crewwork", "junit.xml")
    try:
        os.unlink(p)
    except OSError:
        pass
    os.symlink({target!r}, p)

atexit.register(_swap)
"""


async def test_conftest_that_swaps_the_report_for_a_symlink_at_exit_is_reset(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path, host_dir: Path
) -> None:
    conftest = ATEXIT_CONFTEST.format(target=str(host_dir / "secret.txt"))
    agent = scripted({"files": {"calc.py": RIGHT, "conftest.py": conftest}})
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, agent))
        result = await crew.result(wid, timeout_s=300)
        stored = b"".join(await artifacts_of(crew, wid))
    assert b"HOST-SECRET-7f3a9c" not in stored
    # The conftest the change edited was put back before the run, so the real report judged the real fix.
    assert result.state == "succeeded", result.reason
    v = result.attempts[0].validation
    assert v is not None and any(r.path == "conftest.py" and r.action == "restored" for r in v.protected_reset)


async def test_sparse_two_gib_report_is_refused_without_reading_it(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path
) -> None:
    code = "import os; os.makedirs('.crewwork', exist_ok=True); f = open('.crewwork/junit.xml', 'wb'); f.truncate(2 << 30); f.close()"
    validation = {**VALIDATION, "command": ["python3", "-c", code]}
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        with RssSampler() as rss:
            wid = await crew.submit(code_change(calc, scripted({"files": {"calc.py": RIGHT}}), validation))
            result = await crew.result(wid, timeout_s=300)
    grew = rss.growth
    assert grew < 512 * 1024 * 1024, f"the worker's peak memory grew by {grew >> 20} MiB reading a report"
    v = result.attempts[0].validation
    # Not read, so not judged: a bound that cut the evidence never passes, and the outcome says which bound.
    assert v is not None and v.cause == "not_judged" and "MAX_REPORT_BYTES" in v.reason, v
    assert [(c.bound, c.seen, c.decisive) for c in v.cuts] == [("MAX_REPORT_BYTES", 2 << 30, True)]


# ------------------------------------------------------------------------------------------------ deleting


async def test_report_path_outside_the_workspace_is_refused_at_submission(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc: Path, host_dir: Path
) -> None:
    from pydantic import ValidationError

    victim = host_dir / "victim.txt"
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        for bad in ("../../../host/victim.txt", "../../../../host/victim.txt", str(victim), ".git/index"):
            with pytest.raises(ValidationError, match="junit_path"):
                await crew.submit(
                    code_change(calc, scripted({"files": {"calc.py": RIGHT}}), {**VALIDATION, "junit_path": bad})
                )
    assert victim.read_text() == "do not delete\n"


async def test_committed_symlink_on_the_report_path_cannot_delete_through_it(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, host_dir: Path
) -> None:
    from tests.conftest import make_repo
    from tests.security.conftest import BUGGY, TEST

    (host_dir / "junit.xml").write_text("victim report\n")
    repo = make_repo(tmp_path / "linked", {"calc.py": BUGGY, "tests/test_calc.py": TEST})
    import subprocess

    from tests.conftest import GIT_ENV

    (repo / ".crewwork").symlink_to(host_dir)
    subprocess.run(["git", "add", ".crewwork"], cwd=repo, check=True, env=GIT_ENV)
    subprocess.run(["git", "commit", "-qm", "report dir"], cwd=repo, check=True, env=GIT_ENV)
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(repo, scripted({"files": {"calc.py": RIGHT}})))
        result = await crew.result(wid, timeout_s=300)
    assert (host_dir / "junit.xml").read_text() == "victim report\n"
    assert (host_dir / "victim.txt").exists()
    assert result.state == "succeeded", result.reason


# ------------------------------------------------------------------------------------------------ writing


async def test_scripted_agent_cannot_write_or_delete_through_a_committed_symlink(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc: Path, host_dir: Path
) -> None:
    import subprocess

    from tests.conftest import GIT_ENV

    (calc / "outside").symlink_to(host_dir)
    subprocess.run(["git", "add", "outside"], cwd=calc, check=True, env=GIT_ENV)
    subprocess.run(["git", "commit", "-qm", "a link a first change landed"], cwd=calc, check=True, env=GIT_ENV)
    diff = (
        "diff --git a/outside/planted.txt b/outside/planted.txt\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/outside/planted.txt\n@@ -0,0 +1 @@\n+planted\n"
    )
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        writes = await crew.submit(code_change(calc, scripted({"files": {"outside/pwned.txt": "pwned\n"}})))
        deletes = await crew.submit(code_change(calc, scripted({"files": {"outside/victim.txt": None}})))
        diffs = await crew.submit(code_change(calc, scripted({"diff": diff})))
        results = [await crew.result(w, timeout_s=300) for w in (writes, deletes, diffs)]
    assert not (host_dir / "pwned.txt").exists()
    assert (host_dir / "victim.txt").read_text() == "do not delete\n"
    assert not (host_dir / "planted.txt").exists()
    for r in results:
        assert r.state == "failed"
        assert r.attempts[0].agent is not None and r.attempts[0].agent.error, r.attempts[0]
    assert "symbolic link" in (results[0].attempts[0].agent.error or "")


# ------------------------------------------------------------------------------------------------ exhaustion


async def test_agent_file_larger_than_the_artifact_limit_fails_the_attempt_with_bounded_memory(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = "import os; open('blob.bin', 'wb').write(os.urandom(64 << 20)); open('calc.py', 'w').write('def add(a, b):\\n    return a + b\\n')"
    agent = command_agent(monkeypatch, "bloat", code)
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        with RssSampler() as rss:
            wid = await crew.submit(code_change(calc, agent))
            result = await crew.result(wid, timeout_s=300)
    grew = rss.growth
    assert grew < 48 * 1024 * 1024, f"the worker's peak memory grew by {grew >> 20} MiB capturing a 64 MiB file"
    assert result.state == "failed"
    error = result.attempts[0].agent.error if result.attempts[0].agent else None
    assert error and "limit" in error, result.attempts[0]


async def test_filling_the_workspace_hits_its_disk_cap_not_the_hosts(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path
) -> None:
    import shutil

    code = (
        "import os\nf = open('filler.bin', 'wb')\nchunk = b'x' * (1 << 20)\n"
        "for _ in range(1024):\n    f.write(chunk)\n    f.flush()\n"
    )
    validation = {**VALIDATION, "command": ["python3", "-c", code]}
    free_before = shutil.disk_usage(tmp_path).free
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(
            code_change(calc, scripted({"files": {"calc.py": RIGHT}}), validation, sandbox={"disk_mb": 48})
        )
        result = await crew.result(wid, timeout_s=300)
    v = result.attempts[0].validation
    assert v is not None and v.cause == "disk", v
    assert v.sandbox is not None and v.sandbox.disk_limited
    assert free_before - shutil.disk_usage(tmp_path).free < 512 * 1024 * 1024


async def test_setup_filling_its_prepared_environment_hits_the_prepare_disk_cap_not_the_hosts(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from crewwork.sandbox.disk import loop_available

    if not loop_available()[0]:
        pytest.skip(f"loop images cannot be made here: {loop_available()[1]}")
    monkeypatch.setenv("CREWWORK_SANDBOX_PREPARE_DISK_MB", "48")
    fill = 'dd if=/dev/zero of="$CREWWORK_ENV/filler.bin" bs=64k count=16384'  # 1 GiB
    validation = {**VALIDATION, "setup": [["sh", "-c", fill]]}
    free_before = shutil.disk_usage(tmp_path).free
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, scripted({"files": {"calc.py": RIGHT}}), validation))
        result = await crew.result(wid, timeout_s=300)
        prepared = crew.settings.data_dir / "prepared"
        leftovers = [p.name for p in prepared.iterdir() if not p.name.endswith(".lock")] if prepared.exists() else []
    v = result.attempts[0].validation
    assert v is not None and v.sandbox is not None and v.sandbox.disk_limited, v
    assert v.cause == "disk" and "CREWWORK_SANDBOX_PREPARE_DISK_MB" in v.reason, v
    assert v.sandbox.workspace_disk == "loop-48m"
    assert "CREWWORK_SANDBOX_PREPARE_DISK_MB" in v.sandbox.stderr_tail
    assert free_before - shutil.disk_usage(tmp_path).free < 512 * 1024 * 1024
    assert leftovers == []


async def test_filling_tmp_hits_the_scratch_cap(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path
) -> None:
    code = "f = open('/tmp/filler.bin', 'wb')\nfor _ in range(4096):\n    f.write(b'x' * (1 << 20))\n"
    validation = {**VALIDATION, "command": ["python3", "-c", code]}
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, scripted({"files": {"calc.py": RIGHT}}), validation))
        result = await crew.result(wid, timeout_s=300)
    v = result.attempts[0].validation
    assert v is not None and v.cause in ("disk", "oom"), v


# ------------------------------------------------------------------------------------------------ evidence


CHEAT = """
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
"""


@pytest.mark.parametrize("where", ["conftest.py", "tests/conftest.py"])
async def test_conftest_that_turns_failures_into_passes_is_reset(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path, where: str
) -> None:
    # The change leaves the bug in place and adds (or edits) a conftest.py that reports every failure as a pass.
    validation = {**VALIDATION, "test_files": ["tests/test_calc.py", "tests/conftest.py"]}
    agent = scripted({"files": {"calc.py": "def add(a, b):\n    return a - b  # untouched bug\n", where: CHEAT}})
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, agent, validation))
        result = await crew.result(wid, timeout_s=300)
    assert result.state == "failed", "a conftest.py cheat must not make a failing change pass"
    v = result.attempts[0].validation
    assert v is not None and v.cause == "test_failure", v
    action = "restored" if where == "conftest.py" else "removed"
    assert any(r.path == where and r.action == action for r in v.protected_reset), v.protected_reset


async def test_change_to_protected_paths_only_is_no_effective_change(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc: Path
) -> None:
    agent = scripted({"files": {"tests/test_calc.py": "def test_nothing():\n    pass\n", "conftest.py": CHEAT}})
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        wid = await crew.submit(code_change(calc, agent))
        result = await crew.result(wid, timeout_s=300)
    v = result.attempts[0].validation
    assert result.state == "failed" and v is not None and v.cause == "no_effective_change", v
    assert {r.path for r in v.protected_reset} == {"tests/test_calc.py", "conftest.py"}


# ------------------------------------------------------------------------------------------------ commands


@pytest.mark.parametrize(
    ("command", "attempts_made"),
    [
        # A program looked up on the sandbox's PATH: no change can make it exist, so the first attempt ends the item.
        (["no-such-test-runner", "-q"], 1),
        # A file of the repository: a later attempt's change could make it executable, so the loop goes on.
        (["./run_tests.sh"], 2),
    ],
)
async def test_missing_or_non_executable_validation_command_fails_the_item_not_dead(
    tmp_path: Path,
    temporal_server: DevServer,
    pg_url: str,
    backend: str,
    calc: Path,
    command: list[str],
    attempts_made: int,
) -> None:
    validation = {**VALIDATION, "command": command}
    agent = scripted({"files": {"calc.py": RIGHT, "run_tests.sh": "python3 -m pytest\n"}})
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, agent, validation, budget={"max_attempts": 2}))
        result = await crew.result(wid, timeout_s=300)
        attempts = await crew.store.list_attempts(wid)
        diff = await artifact_named(crew, wid, "attempt-1.diff")
    assert result.state == "failed", result.reason
    assert [a.cause for a in attempts] == ["command_not_found"] * attempts_made
    assert diff is not None and b"return a + b" in diff
    if attempts_made == 1:
        assert "`no-such-test-runner`" in result.reason and "stopped after attempt 1" in result.reason, result.reason


async def test_pytest_still_works_after_all_that(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str, calc: Path
) -> None:
    """The honest path through the same machinery: a real fix, a real pytest run, a pass that lands."""
    validation = {**VALIDATION, "command": PYTEST}
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(calc, scripted({"files": {"calc.py": RIGHT}}), validation))
        result = await crew.result(wid, timeout_s=300)
    assert result.state == "succeeded", result.reason


# ------------------------------------------------------------------------------------------------ git content


async def test_host_repository_filters_named_by_agent_attributes_never_run(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc: Path, host_dir: Path
) -> None:
    import subprocess

    from tests.conftest import GIT_ENV

    mark = host_dir / "markers"
    for key, value in (
        ("filter.evil.clean", f"touch {mark}/clean"),
        ("filter.evil.smudge", f"touch {mark}/smudge"),
        ("diff.evil.textconv", f"touch {mark}/textconv"),
    ):
        subprocess.run(["git", "config", key, value], cwd=calc, check=True, env=GIT_ENV)
    agent = scripted({"files": {".gitattributes": "* filter=evil diff=evil\n", "calc.py": RIGHT}})
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        wid = await crew.submit(code_change(calc, agent))
        result = await crew.result(wid, timeout_s=300)
    assert markers(host_dir) == [], markers(host_dir)
    assert result.state == "succeeded", result.reason


NEWLINE_NAMES = r"""
import pathlib
pathlib.Path("calc.py").write_text("def add(a, b):\n    return a + b\n")
pathlib.Path("notes\nwith newline.txt").write_text("one\n")
pathlib.Path("0\t0\tcalc.py").write_text("two\n")
"""


async def test_file_names_with_newlines_and_tabs_survive_capture_validation_and_landing(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    agent = command_agent(monkeypatch, "names", NEWLINE_NAMES)
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        wid = await crew.submit(code_change(calc, agent))
        result = await crew.result(wid, timeout_s=300)
    assert result.state == "succeeded", result.reason
    stats = result.attempts[0].agent.diff_stats
    assert stats is not None and sorted(stats.files) == sorted(["calc.py", "notes\nwith newline.txt", "0\t0\tcalc.py"])
    assert stats.files_changed == 3
    names = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "--name-only", f"crewwork/{wid}"], cwd=calc, capture_output=True, check=True
    ).stdout.split(b"\0")
    assert b"notes\nwith newline.txt" in names and b"0\t0\tcalc.py" in names


MANY_FILES = """
import os, pathlib
pathlib.Path("calc.py").write_text("def add(a, b):\\n    return a + b\\n")
for i in range(20_000):
    d = f"generated/d{i % 50}"
    os.makedirs(d, exist_ok=True)
    pathlib.Path(f"{d}/{'x' * 200}{i}.txt").write_text("")
"""


async def test_a_change_of_twenty_thousand_long_named_files_still_fits_its_payloads(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every name of this change is ~220 bytes: 4.4 MB of names, past Temporal's 2 MiB payload limit, which the
    # attempt's statistics crossed when they named every file.
    agent = command_agent(monkeypatch, "many", MANY_FILES)
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        wid = await crew.submit(code_change(calc, agent))
        result = await crew.result(wid, timeout_s=600)
    assert result.state == "succeeded", result.reason
    stats = result.attempts[0].agent.diff_stats
    assert stats is not None and stats.files_changed == 20_001 and len(stats.files) == 500
