"""Changes that weaken a check instead of satisfying it: a pure scan of the diff, shown in the evidence.

A lint disable, a type-ignore, a skipped or expected-to-fail test, a deleted assertion, an ignore list grown in a
checker's configuration: each can be right, so none fails an attempt, but a reviewer (and the next attempt's
diagnostics) should see every one the change makes. The findings are the outcome's `weakened`, `path:line: what: text`.

What is looked for, in lines the change adds to paths that reach the run (protected paths are put back first, so what
the change did to them never runs):

- silencing a linter: `# noqa`, `# ruff: noqa`, `# flake8: noqa`, `# pylint: disable`, `# nosec`, `eslint-disable`;
- silencing the type checker: `# type: ignore`, `# pyright: ignore`, `# mypy: ignore-errors`, `@no_type_check`,
  `@ts-ignore`, `@ts-nocheck`, `@ts-expect-error`;
- hiding code from coverage: `# pragma: no cover`;
- in tests: a skip or an expected failure added (`pytest.mark.skip`/`skipif`/`xfail`, `pytest.skip(`/`xfail(`/
  `importorskip(`, `unittest.skip`, `skipTest(`, `expectedFailure`), and per file, assertions removed beyond those
  added (`assert`, `self.assert…`, `pytest.raises`);
- in a checker's configuration (`mypy.ini`, `.flake8`, `ruff.toml`, `.pylintrc`, `.coveragerc`, `pyproject.toml`,
  `setup.cfg`, `tox.ini`, `.pre-commit-config.yaml`, `.eslintrc*`, `tsconfig.json`): a line that ignores, disables,
  excludes or skips something, or turns strictness off.

A scan of text: a check weakened some other way (a test made trivially true) is for review and, later, for the
baseline of issue 45 to see.
"""

from __future__ import annotations

import re
from collections import Counter

from crewwork.validation.reach import MAX_FINDINGS, MAX_LINE_SHOWN, Finding, diff_lines, is_test_path

_ANY_FILE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), why)
    for p, why in (
        (r"#\s*(noqa\b|ruff:\s*noqa|flake8:\s*noqa|pylint:\s*(disable|skip-file)|nosec\b)|eslint-disable",
         "silences a linter"),
        (r"#\s*(type:\s*ignore|pyright:\s*ignore|mypy:\s*ignore-errors)|@no_type_check\b"
         r"|@ts-(ignore|nocheck|expect-error)", "silences the type checker"),
        (r"#\s*pragma:\s*no\s*cover", "hides code from coverage"),
    )
)  # fmt: skip
_IN_TESTS = re.compile(
    r"pytest\.mark\.(skip|skipif|xfail)\b|pytest\.(skip|xfail|importorskip)\s*\(|unittest\.skip|\.skipTest\s*\("
    r"|expectedFailure\b"
)
_ASSERTION = re.compile(r"^\s*(assert\b|self\.assert[A-Z]\w*\s*\(|with\s+pytest\.raises\b|pytest\.raises\s*\()")
_CONFIG_NAMES = frozenset(
    {"mypy.ini", ".mypy.ini", ".flake8", "ruff.toml", ".ruff.toml", ".pylintrc", "pylintrc", ".coveragerc",
     "pyproject.toml", "setup.cfg", "tox.ini", ".pre-commit-config.yaml", "tsconfig.json"}
)  # fmt: skip
_CONFIG_RELAX = re.compile(
    r"ignore|disable|exclude|skip|allow_untyped|allow-untyped|strict\w*\s*[=:]\s*(false|0)\b", re.IGNORECASE
)


def _is_config(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name in _CONFIG_NAMES or name.startswith(".eslintrc")


def scan_weakening(diff: bytes, *, skip: frozenset[str] = frozenset()) -> tuple[list[Finding], int]:
    """Findings of checks the change weakens in paths outside `skip`, at most MAX_FINDINGS, and how many in all."""
    found: list[Finding] = []
    total = 0
    removed: Counter[str] = Counter()
    added: Counter[str] = Counter()
    first_removed: dict[str, int] = {}

    def add(path: str, line: int, why: str, text: str) -> None:
        nonlocal total
        total += 1
        if len(found) < MAX_FINDINGS:
            found.append(Finding(path, line, why, text.strip()[:MAX_LINE_SHOWN]))

    for path, line, tag, text in diff_lines(diff):
        if path in skip:
            continue
        test = is_test_path(path)
        if test and _ASSERTION.search(text):
            (added if tag == "+" else removed)[path] += 1
            if tag == "-":
                first_removed.setdefault(path, line)
        if tag != "+":
            continue
        if _is_config(path):
            if _CONFIG_RELAX.search(text) and not text.lstrip().startswith("#"):
                add(path, line, "relaxes a checker's configuration", text)
            continue
        why = next((why for pattern, why in _ANY_FILE if pattern.search(text)), None)
        if why is None and test and _IN_TESTS.search(text):
            why = "skips a test or expects it to fail"
        if why is not None:
            add(path, line, why, text)
    for path in sorted(removed):
        net = removed[path] - added[path]
        if net > 0:
            add(path, first_removed[path], f"removes {net} assertion{'s' if net > 1 else ''} from a test", "")
    return found, total
