"""Which scanner results the change introduces, and which of them the policy blocks (pure; the stage that gathers them
is crewwork/steps/validate/scanning.py, docs/scanners.md)."""

from __future__ import annotations

from collections import Counter

from crewwork.models.scan import ScannersSpec
from crewwork.validation.reach import diff_lines
from crewwork.validation.scanners import sarif

_SEVERITY = {"low": 1, "medium": 2, "high": 3}


def blocking(res: sarif.Result, spec: ScannersSpec) -> bool:
    """Whether the policy makes this introduced result fail the attempt."""
    if res.tool == "secrets":
        return spec.secrets == "block"
    if res.tool == "bandit":
        sev = _SEVERITY.get(res.severity or "", 0)
        return spec.python == "block" and sev >= _SEVERITY[spec.python_block_severity]
    if res.tool == "dependencies":
        return spec.dependencies == "block"
    custom = {c.name: c for c in spec.custom}.get(res.tool)
    return custom is not None and custom.on_finding == "block" and res.level == "error"


def introduced(after: list[sarif.Result], base: list[sarif.Result]) -> list[tuple[sarif.Result, bool]]:
    """Each after-result and whether it is new: base results cancel after-results with the same key, one for one."""
    left = Counter((r.tool, r.rule, r.path, r.fingerprint) for r in base)
    out = []
    for r in after:
        key = (r.tool, r.rule, r.path, r.fingerprint)
        if left[key] > 0:
            left[key] -= 1
            out.append((r, False))
        else:
            out.append((r, True))
    return out


def added_lines(diff: bytes) -> dict[str, set[int]]:
    lines: dict[str, set[int]] = {}
    for path, line, tag, _text in diff_lines(diff):
        if tag == "+":
            lines.setdefault(path, set()).add(line)
    return lines
