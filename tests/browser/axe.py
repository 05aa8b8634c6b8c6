"""Accessibility checks with axe-core (from npm, installed by scripts/test-env.sh into .cache/node): the library is
read from disk and evaluated in the page, nothing is fetched while the tests run. A page passes when axe finds no
violation of `serious` or `critical` impact; lesser ones are listed in the test's output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

AXE = Path(__file__).resolve().parents[2] / ".cache" / "node" / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING = {"serious", "critical"}


def axe_source() -> str:
    if not AXE.exists():
        pytest.skip(f"axe-core is not installed at {AXE}: run scripts/test-env.sh")
    return AXE.read_text()


async def violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is now (rules of WCAG 2.x A and AA, and best practices)."""
    if not await page.evaluate("() => typeof window.axe !== 'undefined'"):
        # Evaluated through the DevTools protocol, which the console's Content-Security-Policy does not govern.
        await page.evaluate(axe_source() + "\n;0")
    found: list[dict[str, Any]] = await page.evaluate(
        """async () => {
            const r = await axe.run(document, { resultTypes: ["violations"] });
            return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map((n) => n.target.join(" ")) }));
        }"""
    )
    return found


async def assert_accessible(page: Any, what: str) -> None:
    found = await violations(page)
    blocking = [v for v in found if v["impact"] in BLOCKING]
    if found:
        print(f"axe on {what}: " + json.dumps(found, indent=1)[:4000])
    assert not blocking, f"{what}: serious or critical accessibility violations: {json.dumps(blocking, indent=1)}"
