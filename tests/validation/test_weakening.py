"""Changes that weaken a check instead of satisfying it, found in a diff (crewwork/validation/weakening.py): what is
flagged, where, and what is not. End to end, flagged on a real attempt that still passes:
tests/security/test_runner_tampering.py."""

from __future__ import annotations

from crewwork.validation.grading import ValidationEvidence, grade
from crewwork.validation.weakening import scan_weakening

DIFF = b"""diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,3 +1,4 @@
-import os
+import os  # noqa: F401
+x: int = "s"  # type: ignore[assignment]
 def f():
-    return 1
+    return 1  # pragma: no cover
diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1,5 +1,4 @@
+@pytest.mark.skip(reason="later")
 def test_f():
-    assert f() == 1
-    assert f() != 2
+    assert f()
-    with pytest.raises(ValueError):
-        g()
+    pass
diff --git a/mypy.ini b/mypy.ini
--- a/mypy.ini
+++ b/mypy.ini
@@ -1,2 +1,3 @@
 [mypy]
-strict = true
+strict = false
+ignore_errors = True
diff --git a/README.md b/README.md
--- a/README.md
+++ b/README.md
@@ -1 +1 @@
-skip this
+ignore this, it is prose
"""


def test_each_way_a_change_weakens_a_check_is_named_with_its_line() -> None:
    found, total = scan_weakening(DIFF)
    assert [f.describe() for f in found] == [
        "pkg/core.py:1: silences a linter: import os  # noqa: F401",
        'pkg/core.py:2: silences the type checker: x: int = "s"  # type: ignore[assignment]',
        "pkg/core.py:4: hides code from coverage: return 1  # pragma: no cover",
        'tests/test_core.py:1: skips a test or expects it to fail: @pytest.mark.skip(reason="later")',
        "mypy.ini:2: relaxes a checker's configuration: strict = false",
        "mypy.ini:3: relaxes a checker's configuration: ignore_errors = True",
        "tests/test_core.py:3: removes 2 assertions from a test",
    ]
    assert total == 7


def test_paths_put_back_before_the_run_are_not_flagged() -> None:
    found, _ = scan_weakening(DIFF, skip=frozenset({"pkg/core.py", "tests/test_core.py", "mypy.ini"}))
    assert found == []


def test_an_assertion_rewritten_is_not_a_removal() -> None:
    diff = b"""diff --git a/tests/test_a.py b/tests/test_a.py
--- a/tests/test_a.py
+++ b/tests/test_a.py
@@ -1,2 +1,2 @@
 def test_a():
-    assert add(1, 2) == 3
+    assert add(1, 2) == 3, "adds"
"""
    assert scan_weakening(diff) == ([], 0)


def test_weakening_is_shown_but_never_decides() -> None:
    report = (
        b'<testsuites><testsuite name="pytest" tests="1" failures="0" errors="0" skipped="0">'
        b'<testcase classname="tests.test_a" name="test_x"/></testsuite></testsuites>'
    )
    flagged = ["pkg/core.py:1: silences a linter: import os  # noqa: F401"]
    verdict = grade(ValidationEvidence(diff_nonempty=True, exit_code=0, report=report, weakened=flagged))
    assert verdict.passed and verdict.weakened == flagged and verdict.to_outcome().weakened == flagged
