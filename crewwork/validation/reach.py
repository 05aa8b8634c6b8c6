"""Code in a change that reaches into the test runner: a pure scan of the diff's added lines.

Code under test runs inside the test process, so a module the tests import can rewrite what the runner reports. The
outcome witness (crewwork.validation.witness) catches the rewrites it can see; this scan names the code that could do
them, so the evidence shows it and grading can refuse to pass it (`suspected_tampering`, unless the submission allows
runner code with `validation.protect.runner_code: "allow"`, for a repository that is itself a pytest plugin).

Only Python files are scanned, and only lines the change adds to paths that reach the run (protected paths are put
back first, so what the change did to them never runs). Two sets of patterns:

- anywhere, test files included: pytest hook names (`pytest_runtest_makereport`, `pytest_report_teststatus`, any
  `pytest_*` hook or `pytest_plugins`), plugin machinery (`hookimpl`, `hookwrapper`, `pluginmanager`, `pluggy`),
  pytest internals (`_pytest`), report objects (`TestReport`, `CallInfo`, `longrepr`, `.outcome =`), `sys.modules`
  together with pytest, hunting objects through `gc`, patching unittest's assertions or the builtins
  (`TestCase.assertEqual = ...`, `setattr(builtins, ...)`), ending the process without cleanup (`os._exit`), and
  names of crewwork's own evidence (`crewwork`, `junit`);
- in code that is not a test (no `test_*.py`, `*_test.py`, `conftest.py`, nor a `test`/`tests`/`testing` directory):
  also importing pytest at all, and `pytest.skip` / `xfail` / `fail` / `exit` / `importorskip`: code under test has
  no business deciding how a test ends.

A scan of text, not of meaning: code built at run time (`exec` of an encoded string) escapes it. The witness and
review are there for that; docs/lifecycle.md says what remains.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from crewwork.workspace.gitops import Tree

MAX_FINDINGS = 50
"""Findings kept (the first ones, in diff order); `scan_diff` still counts them all."""
MAX_LINE_SHOWN = 160

_ANYWHERE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), why)
    for p, why in (
        (r"\bpytest_[a-z][a-z0-9_]*", "names a pytest hook"),
        (r"\b(hookimpl|hookwrapper|hookspec|pluginmanager|PluginManager|pluggy)\b", "uses pytest's plugin machinery"),
        (r"\b_pytest\b", "reaches into pytest's internals (_pytest)"),
        (r"\b(TestReport|CallInfo|CollectReport|longrepr)\b|\.outcome\s*=(?!=)", "touches test report objects"),
        (r"\bsys\.modules\b.*\b(pytest|pluggy|unittest)|\b(pytest|pluggy|unittest)\b.*\bsys\.modules\b",
         "manipulates the test runner in sys.modules"),
        (r"\bgc\.(get_objects|get_referrers|get_referents)\b", "hunts live objects through gc"),
        (r"\b(TestCase|unittest|builtins)\.\w+\s*=(?!=)|\bsetattr\(\s*(TestCase|unittest|builtins)\b",
         "patches unittest's assertions or the builtins"),
        (r"\bos\._exit\b", "ends the process without cleanup (os._exit)"),
        (r"crewwork|junit", "names crewwork's evidence (the report or the witness)"),
    )
)  # fmt: skip
_NON_TEST: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^\s*(import\s+pytest\b|from\s+pytest\b)"), "imports pytest in code that is not a test"),
    (
        re.compile(r"\bpytest\s*\.\s*(skip|xfail|fail|exit|importorskip)\b"),
        "decides how a test ends (pytest.skip/xfail/fail/exit) from code that is not a test",
    ),
)
_TEST_DIRS = frozenset({"test", "tests", "testing"})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    why: str
    text: str

    def describe(self) -> str:
        return f"{self.path}:{self.line}: {self.why}" + (f": {self.text}" if self.text else "")


def is_test_path(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (
        name == "conftest.py"
        or name.startswith("test_")
        or name.endswith("_test.py")
        or any(p in _TEST_DIRS for p in parts[:-1])
    )


def _path_of(header: str) -> str | None:
    """The new path of a `+++ b/path` header (None for `/dev/null`); git quotes odd names in C style."""
    rest = header[4:].strip()
    if rest == "/dev/null":
        return None
    if rest.startswith('"') and rest.endswith('"'):
        try:
            rest = rest[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode()
        except (UnicodeError, ValueError):
            rest = rest[1:-1]
    return rest[2:] if rest.startswith("b/") else rest


_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def diff_lines(diff: bytes) -> Iterator[tuple[str, int, str, str]]:
    """(new path, line, tag, text) of every added (`+`) and removed (`-`) line of a git diff; `line` is the new file's
    line number (for a removed line: where it was). Hunks are read by their line counts, so an added line that looks
    like a header (`++ b/x.txt` added is `+++ b/x.txt`) is still an added line."""
    path: str | None = None
    line_no = old_left = new_left = 0
    for raw in diff.decode("utf-8", "replace").split("\n"):
        if old_left > 0 or new_left > 0:
            tag, text = raw[:1], raw[1:]
            if tag == "\\":
                continue
            if tag == "-":
                old_left -= 1
                if path is not None:
                    yield path, line_no, "-", text
                continue
            new_left -= 1
            if tag == "+":
                if path is not None:
                    yield path, line_no, "+", text
            else:
                old_left -= 1
            line_no += 1
            continue
        if raw.startswith("diff --git"):
            path = None
        elif raw.startswith("+++ "):
            path = _path_of(raw)
        elif raw.startswith("@@"):
            m = _HUNK.match(raw)
            if m is not None:
                old_left = int(m.group(1)) if m.group(1) is not None else 1
                line_no = int(m.group(2))
                new_left = int(m.group(3)) if m.group(3) is not None else 1


def unprotected_conftests(base: Tree, final: Tree) -> list[str]:
    """`conftest.py` files the run sees changed: only where the submission lifted the default protection."""
    return sorted(
        p.decode("utf-8", "replace")
        for p in set(base) | set(final)
        if p.rsplit(b"/", 1)[-1] == b"conftest.py" and base.get(p) != final.get(p) and p in final
    )


def scan_diff(
    diff: bytes, *, skip: frozenset[str] = frozenset(), unprotected: list[str] | None = None
) -> tuple[list[Finding], int]:
    """Findings in the lines `diff` adds to Python files outside `skip` (paths put back before the run), at most
    MAX_FINDINGS, and how many there were in all; each of `unprotected` (changed conftest.py files the run sees) is a
    finding of its own."""
    found = [
        Finding(p, 0, "a conftest.py the change adds or edits runs unprotected (validation.protect lifted it)", "")
        for p in (unprotected or [])[:MAX_FINDINGS]
    ]
    total = len(unprotected or [])
    for path, line_no, tag, text in diff_lines(diff):
        if tag != "+" or path in skip or not path.endswith(".py"):
            continue
        patterns = _ANYWHERE if is_test_path(path) else (*_ANYWHERE, *_NON_TEST)
        for pattern, why in patterns:
            if pattern.search(text):
                total += 1
                if len(found) < MAX_FINDINGS:
                    found.append(Finding(path, line_no, why, text.strip()[:MAX_LINE_SHOWN]))
                break
    return found, total
