"""SARIF 2.1.0 in and out, on the host, bounded: read the results a scanner's log holds (nothing else of it), and write
the evidence log of everything the scanners saw, each result marked `baselineState` new or unchanged.

Reading trusts nothing: the bytes were written in the sandbox (by the built-in runner, or by a team's own scanner)
and are read at most MAX_SARIF_BYTES (crewwork/steps/execution.read_report_bounded); `json.loads` runs on them once
(a nesting bomb is a RecursionError, caught), and only `runs[].tool.driver.name` and `runs[].results[]` (rule,
level, message, first location, partial fingerprint, properties) are looked at, each string cut to its bound, at
most MAX_RESULTS results in all (more: a cut, which is decisive when the scanner's findings could block).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_SARIF_BYTES = 4 * 1024 * 1024
"""Bytes of one scanner's SARIF log the host reads (over it: the scanner gave no evidence, a decisive cut)."""
MAX_RESULTS = 10_000
"""Results read from one SARIF log (more: the rest are not read, a decisive cut)."""
MAX_TEXT = 500
LEVELS = ("error", "warning", "note", "none")


@dataclass(frozen=True)
class Result:
    tool: str
    rule: str
    level: str
    path: str
    line: int
    message: str
    fingerprint: str
    tree: str = "after"
    severity: str | None = None


@dataclass
class Parsed:
    results: list[Result]
    errors: list[str]
    truncated: int = 0
    """Results the log held beyond MAX_RESULTS (or the runner itself dropped), not read."""


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _s(v: Any, limit: int = MAX_TEXT) -> str:
    return v[:limit] if isinstance(v, str) else ""


def normalise_uri(uri: str, roots: tuple[str, ...] = ()) -> str:
    """A workspace-relative path from a SARIF artifact URI (`file:///workspace/a.py`, `/workspace/a.py`, `./a.py`)."""
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    for root in roots:
        r = root.rstrip("/") + "/"
        if uri.startswith(r):
            uri = uri[len(r) :]
            break
    while uri.startswith("./"):
        uri = uri[2:]
    return uri


def parse(data: bytes, *, default_tool: str, roots: tuple[str, ...] = (), keep_unlocated: bool = False) -> Parsed:
    """The results of a SARIF log, or errors saying why there are none to believe. `keep_unlocated`: results with
    no file location are kept (path empty, line 0), not dropped; a named check's verdict counts them (a scanner's
    findings are about the diff's lines, so it drops them)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        return Parsed([], [f"{default_tool}: the SARIF log is not JSON ({type(exc).__name__})"])
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        return Parsed([], [f"{default_tool}: the SARIF log has no runs"])
    out = Parsed([], [])
    for run in doc["runs"]:
        if not isinstance(run, dict):
            continue
        driver = run.get("tool", {}).get("driver", {}) if isinstance(run.get("tool"), dict) else {}
        tool = _s(driver.get("name") if isinstance(driver, dict) else None, 64) or default_tool
        for inv in _list(run.get("invocations")):
            if isinstance(inv, dict) and inv.get("executionSuccessful") is False:
                notes = [
                    _s(n.get("message", {}).get("text"))
                    for n in _list(inv.get("toolExecutionNotifications"))
                    if isinstance(n, dict) and isinstance(n.get("message"), dict)
                ]
                out.errors.append(f"{tool}: did not finish" + (f": {notes[0]}" if notes and notes[0] else ""))
        props = run.get("properties")
        if isinstance(props, dict) and isinstance(props.get("crewwork/truncated"), int) and props["crewwork/truncated"]:
            out.truncated += props["crewwork/truncated"]
        results = run.get("results")
        if not isinstance(results, list):
            continue
        for r in results:
            if len(out.results) >= MAX_RESULTS:
                out.truncated += 1
                continue
            if not isinstance(r, dict):
                continue
            res = _result(r, tool, roots, keep_unlocated)
            if res is not None:
                out.results.append(res)
    return out


def _result(r: dict[str, Any], tool: str, roots: tuple[str, ...], keep_unlocated: bool = False) -> Result | None:
    locs = r.get("locations")
    path, line = "", 0
    if isinstance(locs, list) and locs and isinstance(locs[0], dict):
        phys = locs[0].get("physicalLocation")
        if isinstance(phys, dict):
            art = phys.get("artifactLocation")
            if isinstance(art, dict):
                path = normalise_uri(_s(art.get("uri"), 4096), roots)
            region = phys.get("region")
            if isinstance(region, dict) and isinstance(region.get("startLine"), int):
                line = max(0, region["startLine"])
    if not path and not keep_unlocated:
        return None
    message = r.get("message")
    text = _s(message.get("text")) if isinstance(message, dict) else ""
    fps = r.get("partialFingerprints")
    fp = _s(fps.get("crewwork/v1"), 200) if isinstance(fps, dict) else ""
    props = r.get("properties") if isinstance(r.get("properties"), dict) else {}
    assert isinstance(props, dict)
    level = r.get("level") if r.get("level") in LEVELS else "warning"
    severity = props.get("severity") if props.get("severity") in ("low", "medium", "high") else None
    return Result(
        tool=tool,
        rule=_s(r.get("ruleId"), 128) or "unnamed",
        level=str(level),
        path=path,
        line=line,
        message=text,
        fingerprint=fp,
        tree="base" if props.get("tree") == "base" else "after",
        severity=severity,
    )


def write_log(rows: list[tuple[Result, bool, bool]], tools: dict[str, str | None]) -> bytes:
    """The evidence log: one run per tool, each result with `baselineState` (`new` when introduced, `unchanged` when
    it was already at the base) and `properties.blocking`. `rows` are (result, introduced, blocking)."""
    runs: dict[str, dict[str, Any]] = {}
    for name, version in tools.items():
        runs[name] = {"tool": {"driver": {"name": name, **({"version": version} if version else {})}}, "results": []}
    for res, introduced, blocking in rows:
        run = runs.setdefault(res.tool, {"tool": {"driver": {"name": res.tool}}, "results": []})
        run["results"].append(
            {
                "ruleId": res.rule,
                "level": res.level,
                "message": {"text": res.message or res.rule},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": res.path},
                            "region": {"startLine": max(1, res.line)},
                        }
                    }
                ],
                "baselineState": "new" if introduced else "unchanged",
                **({"partialFingerprints": {"crewwork/v1": res.fingerprint}} if res.fingerprint else {}),
                "properties": {"blocking": blocking, **({"severity": res.severity} if res.severity else {})},
            }
        )
    log = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0", "runs": list(runs.values())}
    return json.dumps(log, indent=1).encode()
