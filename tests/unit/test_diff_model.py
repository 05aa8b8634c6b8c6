"""The diff model the console draws and line comments point at: git's diff as files, hunks and numbered lines, read
in one bounded pass; what a bound cuts is marked, never dropped silently."""

from __future__ import annotations

import pytest

from crewwork.models.diff import DiffLimits, DiffTooLarge, git_path, parse_unified_diff

DIFF = """diff --git a/calc.py b/calc.py
index 1111111..2222222 100644
--- a/calc.py
+++ b/calc.py
@@ -1,4 +1,5 @@ import math
 def add(a, b):
-    return a - b
+    \"\"\"The sum.\"\"\"
+    return a + b
<SPACE>
 x = 1
@@ -10,2 +11,2 @@ def sub(a, b):
-    return a + b
+    return a - b
 # end
diff --git a/notes b/notes
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/notes
@@ -0,0 +1,2 @@
+one
+two
\\ No newline at end of file
diff --git "a/t\\303\\251st file.txt" "b/t\\303\\251st file.txt"
deleted file mode 100644
--- "a/t\\303\\251st file.txt"
+++ /dev/null
@@ -1 +0,0 @@
-gone
diff --git a/old name.py b/new name.py
similarity index 90%
rename from old name.py
rename to new name.py
diff --git a/logo.png b/logo.png
index 4..5 100644
Binary files a/logo.png and b/logo.png differ
""".replace("<SPACE>", " ")


def test_files_hunks_and_line_numbers() -> None:
    m = parse_unified_diff(DIFF)
    assert [(f.path, f.status, f.additions, f.deletions) for f in m.files] == [
        ("calc.py", "modified", 3, 2),
        ("notes", "added", 2, 0),
        ("tést file.txt", "deleted", 0, 1),
        ("new name.py", "renamed", 0, 0),
        ("logo.png", "modified", 0, 0),
    ]
    assert (m.additions, m.deletions) == (5, 3)
    calc = m.files[0]
    assert [h.section for h in calc.hunks] == ["import math", "def sub(a, b):"]
    lines = [(ln.kind, ln.old, ln.new) for ln in calc.hunks[0].lines]
    assert lines == [
        ("context", 1, 1),
        ("del", 2, None),
        ("add", None, 2),
        ("add", None, 3),
        ("context", 3, 4),
        ("context", 4, 5),
    ]
    assert [(ln.kind, ln.old, ln.new) for ln in calc.hunks[1].lines] == [
        ("del", 10, None),
        ("add", None, 11),
        ("context", 11, 12),
    ]
    assert m.files[1].hunks[0].lines[-1].kind == "note"
    assert m.files[3].old_path == "old name.py" and m.files[4].binary


def test_a_line_comment_is_placed_by_path_side_and_line() -> None:
    m = parse_unified_diff(DIFF)
    assert m.locate("calc.py", 3) is not None and m.locate("calc.py", 3).text == "    return a + b"  # type: ignore[union-attr]
    assert m.locate("calc.py", 2, "old") is not None and m.locate("calc.py", 2, "old").kind == "del"  # type: ignore[union-attr]
    assert m.locate("calc.py", 99) is None and m.locate("nope.py", 1) is None


def test_git_quoted_paths_are_decoded() -> None:
    assert git_path('"a/t\\303\\251st\\ttab\\"q\\\\"') == 'a/tést\ttab"q\\'
    assert git_path("plain/path.py") == "plain/path.py"


def test_bounds_cut_visibly_and_refuse_the_oversized() -> None:
    big = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -0,0 +1,50 @@\n" + "".join(f"+l{n}\n" for n in range(50))
    m = parse_unified_diff(big, DiffLimits(max_lines=10))
    (f,) = m.files
    assert f.additions == 50 and sum(len(h.lines) for h in f.hunks) == 10
    assert f.truncated and m.truncated and "10 diff lines" in (m.note or "")
    many = "".join(f"diff --git a/f{n} b/f{n}\n--- a/f{n}\n+++ b/f{n}\n@@ -1 +1 @@\n-a\n+b\n" for n in range(5))
    assert len(parse_unified_diff(many, DiffLimits(max_files=3)).files) == 3
    with pytest.raises(DiffTooLarge):
        parse_unified_diff("x" * 100, DiffLimits(max_bytes=10))
    long_line = parse_unified_diff(
        "--- a/m\n+++ b/m\n@@ -1 +1 @@\n-a\n+" + "z" * 50 + "\n", DiffLimits(max_line_chars=8)
    )
    assert long_line.files[0].hunks[0].lines[1].text == "z" * 8
