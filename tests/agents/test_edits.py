"""The SEARCH/REPLACE edit format: parsing, all-or-nothing application, and the workspace boundary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crewwork.agents.edits import EditApplyError, EditFormatError, apply_edit_text, parse_edits


def block(path: str, search: str, replace: str) -> str:
    return f"{path}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\ny = 2\nx = 1\n")
    (tmp_path / "b.txt").write_text("hello\nworld\n")
    return tmp_path


def test_parse_tolerates_fences_and_commentary_and_keeps_exact_text():
    text = (
        "I will fix it.\n\n```python\npkg/a.py\n<<<<<<< SEARCH\n    indented\n=======\n    new\n"
        ">>>>>>> REPLACE\n```\n\n`b.txt`\n<<<<<<< SEARCH\n=======\nnew file\n>>>>>>> REPLACE\n"
    )
    blocks = parse_edits(text)
    assert [(b.path, b.search, b.replace) for b in blocks] == [
        ("pkg/a.py", "    indented\n", "    new\n"),
        ("b.txt", "", "new file\n"),
    ]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("just prose, no edits", "no edit blocks found"),
        ("<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n", "no file path"),
        ("a.py\n<<<<<<< SEARCH\nx\n>>>>>>> REPLACE\n", "expected '======='"),
        ("a.py\n<<<<<<< SEARCH\nx\n=======\ny\n", "missing '>>>>>>> REPLACE'"),
        ("a.py\n=======\n", "without a preceding"),
    ],
)
def test_malformed_responses_are_refused_with_a_reason(text: str, reason: str):
    with pytest.raises(EditFormatError, match=reason):
        parse_edits(text)


def test_applies_blocks_in_order_and_creates_files(ws: Path):
    text = block("b.txt", "world\n", "there\n") + block("b.txt", "hello\n", "hi\n") + block("new/c.py", "", "z\n")
    assert apply_edit_text(ws, text) == ["b.txt", "new/c.py"]
    assert (ws / "b.txt").read_text() == "hi\nthere\n"
    assert (ws / "new" / "c.py").read_text() == "z\n"


def test_search_must_match_exactly_once_and_nothing_is_written_otherwise(ws: Path):
    good = block("b.txt", "hello\n", "changed\n")
    with pytest.raises(EditApplyError, match="occurs 2 times"):
        apply_edit_text(ws, good + block("pkg/a.py", "x = 1\n", "x = 3\n"))
    with pytest.raises(EditApplyError, match="not found"):
        apply_edit_text(ws, good + block("pkg/a.py", "y = 3\n", "y = 4\n"))
    with pytest.raises(EditApplyError, match="whitespace or order differs"):
        apply_edit_text(ws, good + block("pkg/a.py", "  y = 2\n  x = 1\n", "q\n"))
    # All-or-nothing: the good first block was not written either.
    assert (ws / "b.txt").read_text() == "hello\nworld\n"


def test_create_refuses_existing_file_and_edit_refuses_missing_file(ws: Path):
    with pytest.raises(EditApplyError, match="file exists"):
        apply_edit_text(ws, block("b.txt", "", "x\n"))
    with pytest.raises(EditApplyError, match="does not exist"):
        apply_edit_text(ws, block("nope.py", "a\n", "b\n"))


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.txt", "pkg/../../outside.txt", ".git/config"])
def test_paths_outside_the_workspace_are_refused(ws: Path, path: str):
    with pytest.raises(EditApplyError):
        apply_edit_text(ws, block(path, "", "pwned\n"))
    assert not (ws.parent / "outside.txt").exists()


def test_symlink_pointing_outside_is_refused(ws: Path, tmp_path_factory: pytest.TempPathFactory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("keep\n")
    os.symlink(outside, ws / "link")
    with pytest.raises(EditApplyError, match="outside the workspace"):
        apply_edit_text(ws, block("link/secret.txt", "keep\n", "changed\n"))
    assert (outside / "secret.txt").read_text() == "keep\n"


def test_search_matches_whole_lines_only_and_last_line_without_newline(ws: Path):
    (ws / "c.py").write_text("    return a - b\nend")
    with pytest.raises(EditApplyError, match="not found"):
        apply_edit_text(ws, block("c.py", "return a - b\n", "return a + b\n"))
    apply_edit_text(ws, block("c.py", "end\n", "finish\n"))
    assert (ws / "c.py").read_text() == "    return a - b\nfinish"
