"""The ref and path grammar of crewwork.repos.trees, pure: what a tenant may name before git sees anything."""

from __future__ import annotations

import pytest

from crewwork.repos.trees import TreeError, _lexical, parse_path, parse_ref


@pytest.mark.parametrize(
    ("raw", "base", "suffix"),
    [
        ("main", "main", ""),
        ("HEAD", "HEAD", ""),
        ("feature/x-1.2", "feature/x-1.2", ""),
        ("refs/heads/main", "refs/heads/main", ""),
        ("refs/tags/v1.0", "refs/tags/v1.0", ""),
        ("main~3^2", "main", "~3^2"),
        ("deadbeef", "deadbeef", ""),
        ("a" * 40 + "^", "a" * 40, "^"),
    ],
)
def test_refs_a_tenant_may_name(raw: str, base: str, suffix: str) -> None:
    ref = parse_ref(raw)
    assert (ref.base, ref.suffix) == (base, suffix)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "-p",
        "--output=/tmp/x",
        "HEAD:../",
        "HEAD:README.md",
        "main@{1}",
        "@",
        "main..other",
        "HEAD^{tree}",
        "main~x",
        "a b",
        ".hidden",
        "a/.b",
        "a//b",
        "a/",
        "x.lock",
        "refs/crewwork/landed/x",
        "refs/remotes/origin/main",
        "main\n",
        "x" * 300,
        None,
    ],
)
def test_refs_that_are_refused(raw: object) -> None:
    with pytest.raises(TreeError) as exc:
        parse_ref(raw)
    assert exc.value.code == "invalid_ref"


def test_paths() -> None:
    assert parse_path("src/./a.py") == ("src", "a.py")
    assert parse_path(".crewwork/x") == (".crewwork", "x")  # an ordinary directory of a repository here
    assert parse_path("", allow_root=True) == ()
    assert parse_path("/", allow_root=True) == ()
    for bad in ("", "/etc/passwd", "../x", "a/../../x", ".git", "a/.GIT/config", "git~1", "a\\b", "a\x00b"):
        with pytest.raises(TreeError):
            parse_path(bad)


def test_symlink_targets_are_resolved_lexically_inside_the_tree() -> None:
    assert _lexical(["src"], "util.py") == ["src", "util.py"]
    assert _lexical(["src", "deep"], "../util.py") == ["src", "util.py"]
    assert _lexical([], "./a/./b") == ["a", "b"]
    assert _lexical(["src"], "../..") is None
    assert _lexical([], "/etc/passwd") is None
    assert _lexical(["a"], "..") == []
