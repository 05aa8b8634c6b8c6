"""Dependency changes: a bounded host-side read of the diff text (never of the workspace) for requirements the change
adds or changes, each flagged with its package and version.

Files read: `requirements*.txt`, `constraints*.txt`, `*.in` and `*.txt` under a `requirements/` directory,
`pyproject.toml`, `setup.cfg`, `setup.py` and `Pipfile`. A line the change adds counts when it parses as a PEP 508
requirement (`packaging`): in requirement files, the line itself (options such as `-r`, `-e`, `--hash` and comments
aside); in pyproject.toml and setup.py, a quoted list item (`"requests>=2.31",`); in setup.cfg, an indented
continuation line (`install_requires =` lists); in a Pipfile, `name = "spec"`. A requirement the same file also
loses (same name) is `changed` (old and new specifier shown), else `added`. Lines over MAX_LINE_CHARS are skipped;
at most MAX_DEPENDENCY_FINDINGS are kept. A text scan: a requirement built at run time (setup.py code), a Poetry
table (`requests = "^2"`) or a lock file is not read; docs/scanners.md says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from crewwork.validation.reach import diff_lines

MAX_LINE_CHARS = 500
MAX_DEPENDENCY_FINDINGS = 200
_QUOTED = re.compile(r"""^\s*(?:"([^"]{1,400})"|'([^']{1,400})')\s*,?\s*(#.*)?$""")
_CFG_KEY = re.compile(r"^\s*[A-Za-z_][\w.-]*\s*=(?!=)")
_PIPFILE = re.compile(r"""^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*=\s*["']([^"']{0,200})["']\s*$""")


@dataclass(frozen=True)
class DependencyChange:
    path: str
    line: int
    name: str
    spec: str
    old_spec: str | None
    """The specifier it replaced (None: a new requirement)."""

    @property
    def rule(self) -> str:
        return "dependency-changed" if self.old_spec is not None else "dependency-added"

    def message(self) -> str:
        spec = self.spec or "(any version)"
        if self.old_spec is not None:
            return f"{self.name} changed: {self.old_spec or '(any version)'} -> {spec}"
        return f"{self.name} {spec} added"


def _kind(path: str) -> str | None:
    parts = path.split("/")
    name = parts[-1]
    if name in ("pyproject.toml", "setup.py"):
        return "quoted"
    if name == "setup.cfg":
        return "cfg"
    if name == "Pipfile":
        return "pipfile"
    if (name.startswith(("requirements", "constraints")) and name.endswith((".txt", ".in"))) or (
        "requirements" in parts[:-1] and name.endswith((".txt", ".in"))
    ):
        return "plain"
    return None


def _requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text.strip())
    except InvalidRequirement:
        return None


def _parse(kind: str, text: str) -> tuple[str, str] | None:
    """(canonical name, specifier text with extras and marker) of one line, or None."""
    if len(text) > MAX_LINE_CHARS:
        return None
    if kind == "plain":
        body = text.split(" #", 1)[0].strip()
        if not body or body.startswith(("#", "-")):
            return None
    elif kind == "quoted":
        m = _QUOTED.match(text)
        if m is None:
            return None
        body = m.group(1) or m.group(2)
    elif kind == "cfg":
        # an indented continuation line (`install_requires =` lists), not a `key = value` line
        if not text[:1].isspace() or _CFG_KEY.match(text):
            return None
        body = text.split(" #", 1)[0].strip()
        if not body or body.startswith(("#", "[", ";")):
            return None
    else:  # pipfile
        m = _PIPFILE.match(text)
        if m is None:
            return None
        spec = m.group(2).strip()
        body = m.group(1) + ("" if spec in ("", "*") else spec)
    req = _requirement(body)
    if req is None:
        return None
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    spec_text = (
        extras + str(req.specifier) + (f"; {req.marker}" if req.marker else "") + (f" @ {req.url}" if req.url else "")
    )
    return canonicalize_name(req.name), spec_text


def dependency_changes(diff: bytes) -> tuple[list[DependencyChange], int]:
    """Requirements the diff adds or changes (at most MAX_DEPENDENCY_FINDINGS), and how many there were in all."""
    added: list[tuple[str, int, str, str]] = []
    removed: dict[tuple[str, str], str] = {}
    for path, line, tag, text in diff_lines(diff):
        kind = _kind(path)
        if kind is None:
            continue
        parsed = _parse(kind, text)
        if parsed is None:
            continue
        name, spec = parsed
        if tag == "+":
            added.append((path, line, name, spec))
        else:
            removed.setdefault((path, name), spec)
    out: list[DependencyChange] = []
    total = 0
    for path, line, name, spec in added:
        old = removed.get((path, name))
        if old is not None and old == spec:
            continue  # moved, not changed
        total += 1
        if len(out) < MAX_DEPENDENCY_FINDINGS:
            out.append(DependencyChange(path, line, name, spec, old))
    return out, total
