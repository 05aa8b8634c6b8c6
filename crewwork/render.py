"""Plain-text rendering of a work item, shared by the CLI (`crewwork status`) and the demo's summary."""

from __future__ import annotations

import json
from typing import Any


def render_item(item: dict[str, Any], *, temporal_link: bool = True) -> str:
    """`temporal_link`: end with the workflow's Temporal Web UI link (False where the UI is not up to follow it)."""
    lines = [
        f"work item   {item['id']}  ({item['kind']}{', MOCK agent' if item.get('mock') else ''})",
        f"state       {item['state']}  {item['reason']}",
        f"attempts    {item['attempt_count']}",
    ]
    if item.get("delivery_branch"):
        lines.append(f"delivered   {item['delivery_branch']} @ {(item.get('landed_commit') or '')[:12]}")
    if item.get("pull_request_url"):
        lines.append(f"pull req.   {item['pull_request_url']}")
    for a in item.get("attempts") or []:
        val = a.get("validation") or {}
        tests = val.get("tests") or []
        # Counted from the tests that ran, not from the listed ones: without a JUnit report only failing tests are
        # named (the terminal summary counts the rest), which read as `1 test of 2 failed ... [0/1 tests passed]`.
        # Failing tests are listed first, so they are all here.
        executed = int(val.get("tests_executed") or 0) or len(tests)
        failing = sum(1 for t in tests if t["outcome"] in ("failed", "error"))
        lines.append(
            f"  attempt {a['number']}: {a['verdict']:7} {a['reason']}"
            + (f"  [{executed - failing}/{executed} tests passed, exit {val.get('exit_code')}]" if executed else "")
        )
    if item.get("result") and item["result"].get("output") is not None:
        lines.append(f"output      {json.dumps(item['result']['output'])}")
    if temporal_link:
        lines.append(f"temporal    {item['links'].get('temporal_ui', '')}")
    return "\n".join(lines)
