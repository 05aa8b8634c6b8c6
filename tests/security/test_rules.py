"""The rules on their own: paths parsed at the edge, the protected set, and the grading of the new causes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from crewwork.boundary.paths import PathPattern, PathRefused, RelPath, ReportPath, diff_paths, is_dotgit
from crewwork.models import ValidationSpec, WorkItemSpec
from crewwork.validation.grading import Cause, ValidationEvidence, grade
from crewwork.validation.protect import (
    Protection,
    addopts_plugins,
    apply_protection,
    conftest_plugins,
    pytest_tables,
    report_paths,
)
from crewwork.workspace.tree import Workspace, gitops
from tests.conftest import make_repo

GIT_SPELLINGS = [
    ".git",
    ".GIT",
    ".Git",
    ".git.",
    ".git ",
    ".git...",
    ".git::$INDEX_ALLOCATION",
    ".git:stream",
    "git~1",
    "GIT~1",
    ".g\u200cit",
    ".\u200dgit",
    "\ufeff.git",
    ".gi\u200et",
]


@pytest.mark.parametrize("name", GIT_SPELLINGS)
def test_every_spelling_of_dotgit_is_recognised(name: str) -> None:
    assert is_dotgit(name)
    for path in (name, f"{name}/config", f"a/{name}/hooks/x", f"./{name}/config"):
        with pytest.raises(PathRefused, match=r"\.git"):
            RelPath.parse(path)


@pytest.mark.parametrize("name", [".gitignore", ".github", "git", ".gitx", "x.git", ".gitattributes", ".gitmodules"])
def test_names_near_dotgit_are_fine(name: str) -> None:
    assert not is_dotgit(name)
    assert RelPath.parse(name) == name


@pytest.mark.parametrize(
    "raw,why",
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../x", r"'\.\.'"),
        ("a/../../x", r"'\.\.'"),
        ("a/../.git", r"'\.\.'"),
        ("a\nb", "control character"),
        ("a\x00b", "control character"),
        ("a\\..\\b", "backslash"),
        (".", "root"),
        ("./", "root"),
        (".crewwork/junit.xml", "platform"),
        ("x" * 2000, "longer"),
        ("\udcff", "UTF-8"),
    ],
)
def test_bad_paths_are_refused_with_a_reason(raw: str, why: str) -> None:
    with pytest.raises(PathRefused, match=why):
        RelPath.parse(raw)


def test_paths_are_normalised() -> None:
    assert RelPath.parse("./a//b/./c/") == "a/b/c"
    assert RelPath.parse("./a//b").parts == ("a", "b")
    assert ReportPath.parse("./.crewwork//junit.xml") == ".crewwork/junit.xml"
    assert PathPattern.parse("tests/").matches("tests/unit/x.py")
    assert PathPattern.parse("*.cfg").matches("sub/setup.cfg")


def test_submission_paths_are_refused_naming_the_field() -> None:
    base = {"kind": "code_change", "repo": {"url": "/r"}, "instruction": "x"}
    cases = {
        ("validation", "junit_path"): {"command": ["x"], "junit_path": "../../../root/x"},
        ("validation", "test_files", 0): {"command": ["x"], "test_files": ["./.git/config"]},
        ("validation", "protect", "paths", 0): {"command": ["x"], "protect": {"paths": ["/etc/"]}},
        ("validation", "protect", "exclude", 0): {"command": ["x"], "protect": {"exclude": ["a/../../b"]}},
    }
    for loc, validation in cases.items():
        with pytest.raises(ValidationError) as info:
            WorkItemSpec.model_validate({**base, "validation": validation})
        assert info.value.errors()[0]["loc"] == loc


def test_protect_patterns_are_bounded() -> None:
    with pytest.raises(ValidationError, match="at most 64"):
        ValidationSpec(command=["x"], protect={"paths": [f"p{i}" for i in range(65)]})  # type: ignore[arg-type]


def test_diff_paths_finds_both_sides_of_renames_and_quoted_names() -> None:
    diff = (
        'diff --git "a/x\\ny" "b/x\\ny"\n--- "a/x\\ny"\n+++ "b/x\\ny"\n'
        "diff --git a/old b/.git/hooks/post-commit\nrename from old\nrename to .git/hooks/post-commit\n"
    )
    assert diff_paths(diff) == ["x\ny", "x\ny", "old", ".git/hooks/post-commit"]


def test_plugin_names_are_found_in_conftests_and_addopts() -> None:
    assert conftest_plugins("pytest_plugins = ['a.b', 'c']\n") == {"a.b", "c"}
    assert conftest_plugins("pytest_plugins: tuple = ('x',)\n") == {"x"}
    assert conftest_plugins("pytest_plugins = 'single'\n") == {"single"}
    assert conftest_plugins("not python (") == set()
    assert addopts_plugins(["-p myplug -pother -p no:cacheprovider --strict-markers"]) == {"myplug", "other"}


def test_configuration_files_python_gives_up_on_are_unreadable_not_a_crash() -> None:
    # A repository's conftest.py or pyproject.toml is untrusted input: Python's own parsers raise RecursionError or
    # MemoryError on some of it (under 1 MiB), which crashed the validation activity instead of being judged.
    for source in ("x = a" + ".b" * 200_000, "x = " + "-" * 200_000 + "1", "x = " + "+".join(["1"] * 200_000)):
        assert conftest_plugins(source) == set()
    for toml in ("a = " + "[" * 100_000 + "]" * 100_000, "a = " + "{b=" * 50_000 + "1" + "}" * 50_000):
        assert pytest_tables(toml.encode()) == ("unparseable",)


async def _protect(tmp_path: Path, base: dict[str, str], change: dict[str, str | None], **spec: object):  # type: ignore[no-untyped-def]
    repo = make_repo(tmp_path / "repo", base)
    commit = (await gitops.git("rev-parse", "HEAD", cwd=repo)).out.strip()
    ws = await Workspace.create(
        git_dir=gitops.git_dir_of(repo), home=tmp_path / "home", commit=commit, disk_mb=None, owner=None
    )
    try:
        for rel, content in change.items():
            target = ws.path / rel
            if content is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content)
        from crewwork.workspace.tree import CaptureLimits

        cap = await ws.capture(CaptureLimits(max_diff_bytes=1 << 20, max_file_bytes=1 << 20))
        changed = await ws.apply(cap.diff)
        assert changed[0] is not None, changed[1]
        vspec = ValidationSpec.model_validate({"command": ["x"], **spec})
        final, resets = await apply_protection(
            ws.git, ws.base, changed[0], Protection.from_spec(vspec), report_paths=report_paths(vspec)
        )
        return {p.decode(): e for p, e in final.items()}, {r.path: (r.action, r.why) for r in resets}
    finally:
        await ws.remove()


async def test_default_protected_set(tmp_path: Path) -> None:
    base = {
        "calc.py": "x = 1\n",
        "conftest.py": "pytest_plugins = ['helpers.plug']\n",
        "helpers/plug.py": "# a plugin the repository ships\n",
        "pytest.ini": "[pytest]\naddopts = -p localplug\n",
        "pyproject.toml": "[project]\nname = 'x'\n[tool.pytest.ini_options]\naddopts = '-q'\n",
    }
    change: dict[str, str | None] = {
        "calc.py": "x = 2\n",
        "conftest.py": "# emptied\n",
        "tests/conftest.py": "# new\n",
        "helpers/plug.py": "# rewritten plugin\n",
        "localplug.py": "# shadows a -p plugin\n",
        "pytest.ini": None,
        "tox.ini": "[pytest]\n",
        "sub/setup.cfg": "[tool:pytest]\n",
        "pytest.py": "# shadows the runner\n",
        "__pycache__/calc.cpython-311.pyc": "bytecode",
        "lib/thing.pyc": "bytecode",
        "pyproject.toml": "[project]\nname = 'x'\n[tool.pytest.ini_options]\naddopts = '-p evil'\n",
        "pkg/pyproject.toml": "[project]\nname = 'inner'\n",
        ".crewwork/junit.xml": "<testsuite/>",
        "src/sitecustomize.py": "# runs before pytest in an editable install\n",
        "src/_pytest/__init__.py": "# shadows pytest's internals from src/\n",
        "crewwork_witness.py": "# would shadow the outcome witness\n",
        "lib/crewwork_witness/__init__.py": "# and from any directory on sys.path\n",
    }
    final, resets = await _protect(tmp_path, base, change)
    assert final["calc.py"] != final["conftest.py"]
    assert set(resets) == {
        "conftest.py",
        "tests/conftest.py",
        "helpers/plug.py",
        "localplug.py",
        "pytest.ini",
        "tox.ini",
        "sub/setup.cfg",
        "pytest.py",
        "__pycache__/calc.cpython-311.pyc",
        "lib/thing.pyc",
        "pyproject.toml",
        "src/sitecustomize.py",
        "src/_pytest/__init__.py",
        "crewwork_witness.py",
        "lib/crewwork_witness/__init__.py",
    }
    assert "would shadow it" in resets["crewwork_witness.py"][1]
    assert "start-up hook" in resets["src/sitecustomize.py"][1]
    assert ".crewwork/junit.xml" not in final  # the capture never takes the platform directory at all
    assert resets["conftest.py"][0] == "restored" and resets["tests/conftest.py"][0] == "removed"
    assert resets["pytest.ini"][0] == "restored" and "plugin" in resets["helpers/plug.py"][1]
    assert "whole file" in resets["pyproject.toml"][1]
    assert "pkg/pyproject.toml" in final  # a pyproject.toml without pytest configuration is ordinary


async def test_the_configuration_of_a_checker_the_command_runs_is_protected(tmp_path: Path) -> None:
    base = {
        "calc.py": "x = 1\n",
        "ruff.toml": "line-length = 100\n",
        "mypy.ini": "[mypy]\nstrict = true\n",
        "pyproject.toml": "[project]\nname = 'x'\n[tool.ruff]\nselect = ['E']\n[tool.black]\nline-length = 100\n",
        ".coveragerc": "[run]\nbranch = true\n",
    }
    change: dict[str, str | None] = {
        "calc.py": "x = 2\n",
        "ruff.toml": "line-length = 100\nignore = ['E501']\n",
        "mypy.ini": "[mypy]\nignore_errors = true\n",
        "pyproject.toml": "[project]\nname = 'x'\n[tool.ruff]\nselect = []\n[tool.black]\nline-length = 100\n",
        ".coveragerc": "[run]\nomit = *\n",
    }
    command = ["sh", "-c", "ruff check . && .venv/bin/mypy calc.py && python -m pytest --cov=calc"]
    _final, resets = await _protect(tmp_path, base, change, command=command)
    assert set(resets) == {"ruff.toml", "mypy.ini", "pyproject.toml", ".coveragerc"}
    assert resets["ruff.toml"][1] == "configuration of ruff, which the validation command runs (ruff.toml)"
    assert "[tool.coverage, tool.mypy, tool.ruff]" in resets["pyproject.toml"][1]
    # A command that runs no checker leaves their configuration to the change (flagged, not reset: weakening.py).
    _final, resets = await _protect(tmp_path / "plain", base, change, command=["python", "-m", "pytest"])
    assert resets == {}
    # Only the tables of the checkers the command runs count.
    black = {"pyproject.toml": base["pyproject.toml"].replace("black]\nline-length = 100", "black]\nline-length = 80")}
    _final, resets = await _protect(tmp_path / "black", base, black, command=["ruff", "check", "."])
    assert resets == {}


async def test_pyproject_change_outside_the_pytest_tables_is_kept(tmp_path: Path) -> None:
    base = {"pyproject.toml": "[project]\nname = 'x'\nversion = '1'\n[tool.pytest.ini_options]\naddopts = '-q'\n"}
    change: dict[str, str | None] = {
        "pyproject.toml": "[project]\nname = 'x'\nversion = '2'\n[tool.pytest.ini_options]\naddopts = '-q'\n"
    }
    _final, resets = await _protect(tmp_path, base, change)
    assert resets == {}


async def test_submission_widens_and_narrows_the_protected_set(tmp_path: Path) -> None:
    base = {"setup.cfg": "[metadata]\nname = x\n", "data/fixture.json": "{}\n", "tests/test_a.py": "def test(): pass\n"}
    change: dict[str, str | None] = {
        "setup.cfg": "[metadata]\nname = y\n",
        "data/fixture.json": '{"cheat": 1}\n',
        "tests/test_a.py": "# gone\n",
    }
    _final, resets = await _protect(
        tmp_path,
        base,
        change,
        test_files=["tests/test_a.py"],
        protect={"paths": ["data/"], "exclude": ["setup.cfg", "tests/"]},
    )
    # exclude lifts the default setup.cfg protection but never test_files; paths widens.
    assert set(resets) == {"data/fixture.json", "tests/test_a.py"}


async def test_report_location_in_the_tree_never_reaches_the_workspace(tmp_path: Path) -> None:
    final, resets = await _protect(
        tmp_path, {"calc.py": "x\n", "reports": "a file where the report directory goes\n"}, {"calc.py": "y\n"},
        junit_path="reports/junit.xml",
    )  # fmt: skip
    assert "reports" not in final and resets["reports"][0] == "removed"


@pytest.mark.parametrize(
    "evidence,cause",
    [
        ({"effective_change": False, "protected_reset": ["conftest.py (x)"]}, Cause.no_effective_change),
        ({"disk_limited": True, "exit_code": 1}, Cause.disk),
        ({"command_not_found": True, "exit_code": 127}, Cause.command_not_found),
        ({"exit_code": 0, "report_refused": "r.xml: a symbolic link"}, Cause.report_unparseable),
        ({"disk_limited": True, "timed_out": True, "exit_code": None}, Cause.timeout),
    ],
)
def test_new_causes_are_graded_purely_from_evidence(evidence: dict[str, object], cause: Cause) -> None:
    verdict = grade(ValidationEvidence(diff_nonempty=True, **evidence))  # type: ignore[arg-type]
    assert verdict.cause == cause and not verdict.passed
    assert (
        grade(
            ValidationEvidence.model_validate_json(ValidationEvidence(diff_nonempty=True, **evidence).model_dump_json())
        )
        == verdict
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message,code",
    [
        (
            'OCI runtime create failed: unable to start container process: exec: "pytestx": executable file not found in $PATH: unknown',
            127,
        ),
        ('unable to start container process: exec: "./run.sh": permission denied: unknown', 126),
        (
            'starting sandbox: error finding executable "nope" in PATH [/usr/bin]: no such file or directory: unknown',
            127,
        ),
        ("starting sandbox: creating process: failed to load /w/run.sh: permission denied: unknown", 126),
        ("error mounting /srv/x: no such file or directory", None),
        ("image not found", None),
    ],
)
def test_runtime_start_errors_are_classified(message: str, code: int | None) -> None:
    from crewwork.sandbox.docker import command_not_found_code

    assert command_not_found_code(message) == code


def test_gvisor_task_counts_include_threads_and_survive_runscs_chatter() -> None:
    from crewwork.sandbox.containerstats import tasks

    # As runsc 20221219 prints it: its own lines (with a Go formatting slip) before the JSON list of processes.
    out = (
        b"Found sandbox [\"85227dbb\" 'x'], PID: %!d(MISSING)\nRetrieving process list\n"
        b'%!(EXTRA []interface {}=[])[[\n  {"uid": 65532, "pid": 1, "ppid": 0, "threads": [1, 2, 3, 4, 5, 6],'
        b' "cmd": "python3"},\n  {"uid": 65532, "pid": 7, "ppid": 1, "threads": [7], "cmd": "python3"}\n]\n'
    )
    assert tasks(out) == 7
    assert tasks(b"no list here") == 0 and tasks(b"[{broken") == 0
