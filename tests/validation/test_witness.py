"""The outcome witness and the scan for runner code, without a sandbox: the plugin loaded into real pytest runs (this
interpreter's pytest and pytest-xdist) as the validate step loads it, the streams it writes judged with the report
beside them, and the pure rules on crafted streams and diffs. End to end through a crew and a sandbox:
tests/security/test_runner_tampering.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crewwork.steps.validate.witnessing import STREAMS_REL, install_plugin, read_streams
from crewwork.validation.grading import Cause, ValidationEvidence, grade
from crewwork.validation.parsers import parse_junit
from crewwork.validation.reach import is_test_path, scan_diff
from crewwork.validation.witness import MAX_STREAMS, expects_witness, witness_doubts
from tests.security.test_runner_tampering import ATTACKS, HIDDEN

BUGGY = "def add(a, b):\n    return a - b\n"
RIGHT = "def add(a, b):\n    return a + b\n"
TEST = (
    "from calc import add\n\n\ndef test_adds_positive_numbers():\n    assert add(2, 3) == 5\n\n\n"
    "def test_adds_negative_numbers():\n    assert add(-1, -2) == -3\n"
)
# Every way an honest suite ends a test: xfail (failing and strict-passing), skip, a parametrized id with dots and
# dashes, a class, a unittest case, an error in setup, an error in teardown.
MIXED = """
import unittest

import pytest

from calc import add


@pytest.mark.xfail(reason="known")
def test_known_bug():
    assert add(0.1, 0.2) == 0.3


@pytest.mark.xfail(strict=True, reason="was a bug")
def test_fixed_but_strict():
    assert add(1, 1) == 2


def test_imperative_xfail():
    pytest.xfail("not yet")


@pytest.mark.skip(reason="later")
def test_later():
    assert False


def test_imperative_skip():
    pytest.skip("no network")


@pytest.mark.parametrize("a,b", [(1.5, 2), ("x.y", "z-w")])
def test_param(a, b):
    assert add(a, b) == a + b


class TestGroup:
    def test_in_class(self):
        assert add(1, 1) == 2


class TestCaseStyle(unittest.TestCase):
    def test_unittest(self):
        self.assertEqual(add(2, 2), 4)

    @unittest.skip("unittest skip")
    def test_unittest_skip(self):
        pass


@pytest.fixture
def broken():
    raise RuntimeError("setup broke")


@pytest.fixture
def leaky():
    yield
    raise RuntimeError("teardown broke")


def test_setup_error(broken):
    pass


def test_teardown_error(leaky):
    pass
"""


NO_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:schemathesis", "-p", "no:hypothesispytest")


def run_pytest(repo: Path, plugin_dir: Path, *args: str, command: str | None = None) -> tuple[int, dict[str, bytes]]:
    """Run pytest in `repo` as the validate step does (plugin on PYTHONPATH, named in PYTEST_ADDOPTS) and return its
    exit code and the streams the host reads back."""
    (repo / ".crewwork" / "witness").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(plugin_dir),
        "PYTEST_ADDOPTS": "-p crewwork_witness",
        "CREWWORK_WITNESS_DIR": str(repo / STREAMS_REL),
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    # The repository's run needs none of the plugins this venv has for crewwork's own suite; schemathesis's and
    # hypothesis's cost each run about 1.5 s of CPU (more than the run itself), so they are left out like the cache.
    base = [sys.executable, "-m", "pytest", "-q", *NO_PLUGINS, "--junitxml=.crewwork/junit.xml", *args]
    argv = ["sh", "-c", command.replace("PYTEST", " ".join(base))] if command else base
    done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, timeout=120, check=False)
    return done.returncode, read_streams(repo).streams


def make(tmp_path: Path, calc: str, tests: dict[str, str] | None = None) -> Path:
    repo = tmp_path / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    for rel, text in {"calc.py": calc, "tests/test_calc.py": TEST, **(tests or {})}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    return repo


def judge(repo: Path, code: int, streams: dict[str, bytes], **kw: object) -> list[str]:
    report = (repo / ".crewwork" / "junit.xml").read_bytes()
    kw.setdefault("report_path", ".crewwork/junit.xml")
    return witness_doubts(expected=True, streams=streams, parsed=parse_junit(report), exit_code=code, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("data"))


# ---------------------------------------------------------------- honest runs: no doubt


def test_an_honest_suite_with_every_kind_of_ending_raises_no_doubt(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, RIGHT, {"tests/test_mixed.py": MIXED})
    code, streams = run_pytest(repo, plugin, "tests")
    assert code == 1, "the setup and teardown errors fail the run"
    assert len(streams) == 1
    assert judge(repo, code, streams) == []
    text = next(iter(streams.values()))
    assert text.count(b'"k": "test"') == 14 and b'"exitstatus": 1' in text


def test_an_honest_failing_run_raises_no_doubt_and_fails_as_usual(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, BUGGY)
    code, streams = run_pytest(repo, plugin, "tests")
    assert code == 1 and judge(repo, code, streams) == []


def test_xdist_workers_each_write_a_stream_and_agree(tmp_path: Path, plugin: Path) -> None:
    pytest.importorskip("xdist")
    repo = make(tmp_path, RIGHT, {"tests/test_mixed.py": MIXED})
    code, streams = run_pytest(repo, plugin, "-n", "2", "tests")
    assert code == 1 and len(streams) == 3, "the controller and two workers"
    assert judge(repo, code, streams) == []


def test_a_command_that_runs_pytest_twice_or_asks_its_version_raises_no_doubt(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, RIGHT)
    code, streams = run_pytest(repo, plugin, command="PYTEST --version && PYTEST --collect-only && PYTEST tests")
    assert code == 0 and len(streams) >= 2
    assert judge(repo, code, streams) == []


INNER = """
import subprocess
import sys


def test_the_cli_reports_a_failing_suite(tmp_path):
    (tmp_path / "test_inner.py").write_text("def test_inner():\\n    assert False\\n")
    no_plugins = ["-p", "no:cacheprovider", "-p", "no:schemathesis", "-p", "no:hypothesispytest"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", *no_plugins, str(tmp_path)])
    assert done.returncode == 1
"""


def test_a_test_that_runs_pytest_itself_raises_no_doubt(tmp_path: Path, plugin: Path) -> None:
    # The inner session (its own stream, writing no report) fails on purpose; only the outer one wrote the report.
    repo = make(tmp_path, RIGHT, {"tests/test_cli.py": INNER})
    code, streams = run_pytest(repo, plugin, "tests")
    assert code == 0 and len(streams) == 2
    assert judge(repo, code, streams) == []


def test_the_listed_tests_are_found_under_their_node_ids(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, RIGHT, {"tests/test_mixed.py": MIXED})
    code, streams = run_pytest(repo, plugin, "tests")
    listed = ["tests/test_mixed.py::test_param[x.y-z-w]", "tests/test_mixed.py::TestCaseStyle::test_unittest"]
    assert judge(repo, code, streams, listed=listed) == []


# ---------------------------------------------------------------- attacks: doubts


@pytest.mark.parametrize("attack", [*ATTACKS, "hidden"])
def test_every_attack_leaves_a_doubt(tmp_path: Path, plugin: Path, attack: str) -> None:
    repo = make(tmp_path, BUGGY + (HIDDEN if attack == "hidden" else ATTACKS[attack]))
    code, streams = run_pytest(repo, plugin, "tests")
    report = parse_junit((repo / ".crewwork" / "junit.xml").read_bytes())
    assert code == 0 and report.not_passing == 0, "the attack fooled pytest"
    doubts = judge(repo, code, streams)
    assert doubts, "the witness saw through it"
    if attack == "witness-erased":
        assert streams == {} and "recorded nothing" in doubts[0]
    else:
        assert (
            "tests/test_calc.py::test_adds_positive_numbers: the report says passed, the witness saw it failed"
            in doubts
        )


UNITTEST = """
import unittest

from calc import add


class TestAdd(unittest.TestCase):
    def test_adds(self):
        self.assertEqual(add(2, 3), 5)

    def test_zero(self):
        self.assertEqual(add(0, 0), 0)
"""


def test_a_rewritten_unittest_failure_is_a_doubt(tmp_path: Path, plugin: Path) -> None:
    # A TestCase's failure reaches pytest's report only inside makereport (no pyfunc_call to see it below).
    repo = make(tmp_path, BUGGY + ATTACKS["makereport-hook"])
    (repo / "tests" / "test_calc.py").write_text(UNITTEST)
    code, streams = run_pytest(repo, plugin, "tests")
    assert code == 0, "the attack fooled pytest"
    assert judge(repo, code, streams) == [
        "tests/test_calc.py::TestAdd::test_adds: the report says passed, the witness saw it failed",
        "the report shows 2 passing tests, the witness saw 1 pass: passes were added after the runner decided",
    ]


def test_a_truncated_or_rewritten_stream_is_a_doubt(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, BUGGY)
    code, streams = run_pytest(repo, plugin, "tests")
    ((name, data),) = streams.items()
    cut = data[: data.rindex(b"\n", 0, len(data) - 1) + 1]
    assert any("never finished" in d for d in judge(repo, code, {name: cut}))
    assert any("not a record the witness writes" in d for d in judge(repo, code, {name: b"junk\n" + data}))
    assert any("out of place" in d for d in judge(repo, code, {name: data + data}))
    assert any(
        "an outcome the witness never writes" in d
        for d in judge(repo, code, {name: data.replace(b'"raised"', b'"fine"')})
    )


ZERO = "from calc import add\n\n\ndef test_adds_zero():\n    assert add(0, 0) == 0\n"
# Code under test that skips the tests it would fail, and names nothing a scan of the diff matches.
SKIPS_WHAT_FAILS = BUGGY.replace(
    "    return a - b\n",
    "    if a - b != a + b:\n        __import__('pytest').skip('flaky upstream')\n    return a - b\n",
)
SKIPS_MODULE = BUGGY + "\nimport pytest\n\npytest.skip('not on this platform', allow_module_level=True)\n"
DROPS_FAILING = (
    BUGGY
    + """
import gc as _gc
import sys as _sys
from _pytest.config import Config as _Config


def pytest_collection_modifyitems(items):
    items[:] = [i for i in items if "positive" not in i.name and "negative" not in i.name]


for _o in _gc.get_objects():
    if isinstance(_o, _Config):
        _o.pluginmanager.register(_sys.modules[__name__], "calc-helper")
        break
"""
)


def test_tests_skipped_by_the_changed_code_under_test_are_doubted(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, SKIPS_WHAT_FAILS, {"tests/test_zero.py": ZERO})
    code, streams = run_pytest(repo, plugin, "tests")
    report = parse_junit((repo / ".crewwork" / "junit.xml").read_bytes())
    assert code == 0 and {k: n for k, n in report.counts.items() if n} == {"passed": 1, "skipped": 2}, (
        "without the witness, this passes"
    )
    doubts = judge(repo, code, streams, changed=["calc.py"])
    assert doubts == [
        "tests/test_calc.py::test_adds_negative_numbers: skipped by code the change touched, not by a test (calc.py:3)",
        "tests/test_calc.py::test_adds_positive_numbers: skipped by code the change touched, not by a test (calc.py:3)",
    ]
    assert judge(repo, code, streams, changed=["tests/test_calc.py"]) == [], "a test may skip itself"


def test_a_module_skipped_by_the_changed_code_under_test_is_doubted(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, SKIPS_MODULE, {"tests/test_zero.py": "def test_zero():\n    assert 0 == 0\n"})
    code, streams = run_pytest(repo, plugin, "tests")
    assert code == 0
    assert judge(repo, code, streams, changed=["calc.py"]) == [
        "tests/test_calc.py: skipped at collection by code the change touched, not by a test (calc.py:6)"
    ]


def test_tests_dropped_between_collection_and_the_run_are_doubted(tmp_path: Path, plugin: Path) -> None:
    repo = make(tmp_path, DROPS_FAILING, {"tests/test_zero.py": ZERO})
    code, streams = run_pytest(repo, plugin, "tests")
    assert code == 0
    assert any(
        "2 collected tests were dropped before the run without being deselected" in d
        for d in judge(repo, code, streams)
    )
    # Deselecting with -k is the runner's own and says so.
    repo = make(tmp_path, RIGHT, {"tests/test_zero.py": ZERO})
    code, streams = run_pytest(repo, plugin, "-k", "zero", "tests")
    assert code == 0 and judge(repo, code, streams) == []


def test_a_module_named_like_the_witness_at_the_root_would_shadow_it(tmp_path: Path, plugin: Path) -> None:
    """Why the validate step removes anything named crewwork_witness from the tree (crewwork.validation.protect): under
    `python -m pytest` the workspace root comes before PYTHONPATH on sys.path."""
    repo = make(tmp_path, BUGGY + HIDDEN, {"crewwork_witness.py": "# an impostor that records nothing\n"})
    code, streams = run_pytest(repo, plugin, "tests")
    assert code == 0 and streams == {}, "the impostor was imported instead of the witness"


# ---------------------------------------------------------------- pure rules


def test_a_missing_witness_is_a_doubt_only_when_the_command_runs_pytest() -> None:
    assert expects_witness(["sh", "-c", "cd src && python -m pytest -q"]) and expects_witness(["py.test"])
    assert expects_witness([".venv/bin/pytest", "-q"]) and expects_witness(["sh", "-c", "exec pytest;"])
    assert not expects_witness(["make", "test"])
    assert not expects_witness(["python3", "-c", "...", "/tmp/pytest-of-root/pytest-3/x/secret.txt"])
    assert not expects_witness(["python", "-m", "pytest_cov"]) and not expects_witness(["./run-pytests.sh"])
    assert witness_doubts(expected=False, streams={}, parsed=None, exit_code=0) == []
    assert witness_doubts(expected=True, streams=None, parsed=None, exit_code=0)


def test_more_streams_than_processes_is_a_doubt() -> None:
    start = b'{"k": "start"}\n'
    streams = {f"{i}.jsonl": start for i in range(MAX_STREAMS + 1)}
    assert any(
        "more than pytest processes write" in d
        for d in witness_doubts(expected=True, streams=streams, parsed=None, exit_code=0)
    )


def test_a_process_that_ran_no_test_may_end_without_an_end_record() -> None:
    streams = {"1.jsonl": b'{"k": "start"}\n{"k": "configure", "worker": null}\n'}
    assert witness_doubts(expected=True, streams=streams, parsed=None, exit_code=4) == []


def evidence(**kw: object) -> ValidationEvidence:
    report = (
        b'<testsuites><testsuite name="pytest" tests="1" failures="0" errors="0" skipped="0">'
        b'<testcase classname="tests.test_a" name="test_x"/></testsuite></testsuites>'
    )
    base: dict[str, object] = {"diff_nonempty": True, "exit_code": 0, "report": report}
    return ValidationEvidence(**{**base, **kw})  # type: ignore[arg-type]


def test_grading_never_passes_a_doubted_run_and_says_why() -> None:
    assert grade(evidence()).passed
    missing = grade(evidence(witness_expected=True, witness_streams={}))
    assert missing.cause == Cause.suspected_tampering and not missing.passed
    assert "recorded nothing" in missing.reason and missing.doubts
    refused = grade(evidence(witness_refused=["1.jsonl: a FIFO, not a regular file"]))
    assert refused.cause == Cause.suspected_tampering
    reach = ["calc.py:3: names a pytest hook: def pytest_runtest_makereport(item, call):"]
    suspect = grade(evidence(runner_reach=reach, runner_reach_total=1))
    assert suspect.cause == Cause.suspected_tampering and suspect.runner_reach == reach
    allowed = grade(evidence(runner_reach=reach, runner_reach_total=1, runner_code_allowed=True))
    assert allowed.passed and allowed.runner_reach == reach and allowed.to_outcome().runner_reach == reach


def test_a_witness_over_its_bound_is_not_judged_not_doubted() -> None:
    from crewwork.models import EvidenceCut

    cut = EvidenceCut(what="witness streams", bound="MAX_WITNESS_BYTES", limit=1, unit="bytes", kept=0, decisive=True)
    verdict = grade(evidence(witness_expected=True, witness_streams={}, cuts=[cut]))
    assert verdict.cause == Cause.not_judged


def test_doubts_are_bounded_and_counted() -> None:
    lines = [b'{"k": "start"}']
    report = [b'<testsuites><testsuite name="pytest">']
    for i in range(30):
        lines.append(b'{"k": "test", "id": "tests/test_a.py::test_%d", "call": "raised"}' % i)
        report.append(b'<testcase classname="tests.test_a" name="test_%d"/>' % i)
    lines.append(b'{"k": "end", "exitstatus": 1, "worker": null}')
    report.append(b"</testsuite></testsuites>")
    verdict = grade(evidence(witness_streams={"1.jsonl": b"\n".join(lines)}, report=b"".join(report), exit_code=0))
    assert verdict.cause == Cause.suspected_tampering
    assert len(verdict.doubts) == 21 and verdict.doubts[-1].startswith("... and ")


# ---------------------------------------------------------------- the scan


DIFF = b"""diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,2 +1,8 @@
 import os
+++ b/notes.txt
+import pytest
+from _pytest import runner
+x = sys.modules["pytest"]
+def helper():
+    pytest.skip("not today")
 y = 1
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1,4 @@
+import pytest
+def test_x():
+    pytest.skip("flaky")
+def pytest_collection_modifyitems(items): pass
diff --git "a/pkg/we\\303\\244rd.py" "b/pkg/we\\303\\244rd.py"
--- "a/pkg/we\\303\\244rd.py"
+++ "b/pkg/we\\303\\244rd.py"
@@ -1 +1 @@
-a = 1
+import gc; gc.get_objects()
diff --git a/pkg/compat.py b/pkg/compat.py
--- a/pkg/compat.py
+++ b/pkg/compat.py
@@ -1,2 +1,4 @@
 import builtins
+unittest.TestCase.assertEqual = lambda *a, **k: None
+setattr(builtins, "AssertionError", KeyError)
 x = builtins.open
"""


def test_the_scan_names_each_line_that_reaches_into_the_runner() -> None:
    found, total = scan_diff(DIFF)
    assert [f.describe() for f in found] == [
        "pkg/core.py:3: imports pytest in code that is not a test: import pytest",
        "pkg/core.py:4: reaches into pytest's internals (_pytest): from _pytest import runner",
        'pkg/core.py:5: manipulates the test runner in sys.modules: x = sys.modules["pytest"]',
        "pkg/core.py:7: decides how a test ends (pytest.skip/xfail/fail/exit) from code that is not a test: "
        'pytest.skip("not today")',
        "tests/test_new.py:4: names a pytest hook: def pytest_collection_modifyitems(items): pass",
        "pkg/weärd.py:1: hunts live objects through gc: import gc; gc.get_objects()",
        "pkg/compat.py:2: patches unittest's assertions or the builtins: "
        "unittest.TestCase.assertEqual = lambda *a, **k: None",
        'pkg/compat.py:3: patches unittest\'s assertions or the builtins: setattr(builtins, "AssertionError", KeyError)',
    ]
    assert total == 8
    skip = frozenset({"pkg/core.py", "tests/test_new.py", "pkg/weärd.py", "pkg/compat.py"})
    assert scan_diff(DIFF, skip=skip) == ([], 0)


def test_the_scan_reports_unprotected_conftests_and_knows_test_paths() -> None:
    found, total = scan_diff(b"", unprotected=["sub/conftest.py"])
    assert total == 1 and found[0].describe().startswith("sub/conftest.py:0: a conftest.py the change adds or edits")
    assert is_test_path("pkg/tests/helpers.py") and is_test_path("test_x.py") and not is_test_path("pkg/core.py")


def test_the_host_refuses_odd_files_in_the_witness_directory(tmp_path: Path) -> None:
    d = tmp_path / STREAMS_REL
    d.mkdir(parents=True)
    (d / "1.jsonl").write_text('{"k": "start"}\n')
    os.mkfifo(d / "2.jsonl")
    (d / "3.jsonl").symlink_to("/etc/passwd")
    got = read_streams(tmp_path)
    assert list(got.streams) == ["1.jsonl"]
    assert [r.split(":", 1)[0] for r in got.refused] == ["2.jsonl", "3.jsonl"]
