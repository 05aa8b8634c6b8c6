"""Two real repositories whose bug the tests cannot see, repaired through a failing probe: a Flask app whose route
answers 500 (seen over HTTP), and a static page whose button's handler throws (seen in the browser). The scripted
agent's attempt 1 keeps the tests green but leaves the bug; the probe fails it, its diagnostics reach attempt 2,
which fixes it. End to end on real Temporal, PostgreSQL, sandboxes (every backend CI runs) and Chromium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crewwork.attestation.gather import gather
from crewwork.attestation.statements import validation_statement
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_repo, make_settings, running_crew
from tests.preview.conftest import require
from tests.repos.pkgindex import PackageIndex, packages_ready

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

SHOP = 'def total(items):\n    return round(sum(float(i["price"]) * i["qty"] for i in items), 2)\n'
SHOP_TOUCHED = '"""Prices."""\n\n\n' + SHOP
APP = """from flask import Flask, jsonify

from shop import total

app = Flask(__name__)
CART = [{"price": "2.50", "qty": 3}]


@app.get("/")
def home():
    return "shop"


@app.get("/api/total")
def api_total():
    items = [{"price": i["price"], "qty": i["quantity"]} for i in CART]
    return jsonify(total=total(items))
"""
APP_FIXED = APP.replace('i["quantity"]', 'i["qty"]')
SHOP_TEST = 'from shop import total\n\n\ndef test_total():\n    assert total([{"price": "2.50", "qty": 3}]) == 7.5\n'

INDEX = """<!doctype html>
<html><head><title>Counter</title><script src="app.js" defer></script></head>
<body><h1>Counter</h1><p id="count">Count: 0</p><button id="add">Add</button></body></html>
"""
JS = """let n = 0;
document.getElementById("add").addEventListener("click", () => {
  n += 1;
  document.getElementById("counter").textContent = `Count: ${n}`;
});
"""
JS_FIXED = JS.replace('getElementById("counter")', 'getElementById("count")')
SITE_TEST = (
    "from pathlib import Path\n\n\ndef test_page_loads_its_script():\n"
    "    page = Path('index.html').read_text()\n    assert 'app.js' in page and '<button' in page\n"
)
PYTEST = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml", "tests"]


def item(repo: Path, steps: list[dict[str, Any]], preview: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix the bug users see (the tests pass)",
        "validation": {"command": PYTEST, "junit_path": ".crewwork/junit.xml", "timeout_s": 120, "preview": preview},
        "agent": {"name": "scripted", "config": {"attempts": steps}},
        "budget": {"max_attempts": 3},
        "review": {"required": False},
        **kw,
    }


async def _repaired(crew: Any, wid: str, cause_1: str) -> tuple[Any, Any, dict[str, Any]]:
    result = await crew.result(wid, timeout_s=600)
    attempts = await crew.store.list_attempts(wid)
    assert result.state == "succeeded", (result.reason, [a.validation for a in attempts])
    assert [a.verdict for a in result.attempts] == ["failed", "passed"]
    first, second = (a.validation for a in attempts)
    assert first["cause"] == cause_1 and first["tests_executed"] >= 1, first
    assert first["preview"]["cause"] == cause_1 and not first["preview"]["passed"]
    assert second["cause"] == "passed" and second["preview"]["passed"], second
    assert "Acceptance probes" in first["diagnostics"], "attempt 2 was told about the probe"
    # For people: both attempts' validation records, as the API shows them (test-artifacts/ is not committed).
    ARTIFACTS.mkdir(exist_ok=True)
    record = {"work_item": wid, "attempts": [first, second]}
    (ARTIFACTS / f"preview-repair-{first['preview']['detected']}-{first['preview']['backend']}.json").write_text(
        json.dumps(record, indent=1, default=str)
    )
    # The evidence bundle names the probes: their results with the tests, their transcripts as subjects.
    facts = await gather(crew.store, wid, 2)
    statement = validation_statement(facts, "urn:test")
    probe_ids = [p["id"] for p in second["preview"]["probes"]]
    assert set(probe_ids) <= set(statement["predicate"]["passedTests"])
    subjects = {s["name"] for s in statement["subject"]}
    assert "attempt-2-preview.json" in subjects
    assert all(f"attempt-2-probe-{i.split('::')[1]}-{i.split('::')[2]}.txt" in subjects for i in probe_ids), subjects
    return first, second, {a.name: a for a in await crew.store.list_artifacts(wid)}


async def test_a_flask_route_that_500s_is_repaired_through_a_failing_http_probe(
    backend: str, tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    ok, why = packages_ready()
    if not ok:
        pytest.skip(why)
    repo = make_repo(tmp_path / "shop", {"app.py": APP, "shop.py": SHOP, "tests/test_shop.py": SHOP_TEST})
    with PackageIndex(tmp_path / "index") as index:
        settings = make_settings(
            tmp_path / "data", temporal_server, pg_url, sandbox_backend=backend, setup_network_allowlist=index.hostport
        )
        install = ["python", "-m", "pip", "install", "--no-cache-dir", "-q", "--index-url", index.url]
        environment = {
            "python": "python3",
            "setup": [[*install, "flask==3.1.3", "pytest==8.3.5"]],
            "network": True,
        }
        preview = {
            "http": [{"name": "total", "path": "/api/total", "expect": [{"json_path": "$.total", "equals": 7.5}]}]
        }
        steps = [{"files": {"shop.py": SHOP_TOUCHED}}, {"files": {"app.py": APP_FIXED}}]
        async with running_crew(settings) as crew:
            wid = await crew.submit(item(repo, steps, preview, environment=environment))
            first, second, artifacts = await _repaired(crew, wid, "probe_failure")
    probe = first["preview"]["probes"][0]
    assert probe["id"] == "preview::http::total" and probe["failed"] == "status 200", probe
    assert "500" in probe["seen"]
    assert first["preview"]["detected"] == "flask", "the start command came from the detection table"
    transcript = await crew.store.artifact_content(artifacts["attempt-1-probe-http-total.txt"].id)
    assert transcript is not None and b"< HTTP 500" in transcript
    log = await crew.store.artifact_content(artifacts["attempt-1-preview.log"].id)
    assert log is not None and b"KeyError: 'quantity'" in log, "the app's own traceback is evidence"
    assert second["preview"]["probes"][0]["summary"] == "GET /api/total -> 200"


async def test_a_button_whose_handler_throws_is_repaired_through_a_failing_browser_flow(
    backend: str, tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    repo = make_repo(tmp_path / "site", {"index.html": INDEX, "app.js": JS, "tests/test_site.py": SITE_TEST})
    settings = make_settings(tmp_path / "data", temporal_server, pg_url, sandbox_backend=backend)
    preview = {
        "browser": [
            {
                "name": "add",
                "steps": [{"open": "/"}, {"click": {"role": "button", "name": "Add"}}],
                "expect": [{"text_visible": "Count: 1"}, {"no_console_errors": True}, {"no_failed_requests": True}],
            }
        ]
    }
    steps = [
        {"files": {"index.html": INDEX.replace("<title>Counter", "<title>The counter")}},
        {"files": {"app.js": JS_FIXED}},
    ]
    spec = item(repo, steps, preview)
    spec["validation"]["command"] = ["python3", *PYTEST[1:]]
    async with running_crew(settings) as crew:
        wid = await crew.submit(spec)
        first, _second, artifacts = await _repaired(crew, wid, "probe_failure")
    probe = first["preview"]["probes"][0]
    assert probe["id"] == "preview::browser::add" and probe["failed"] == "text visible 'Count: 1'", probe
    assert any("Cannot set properties of null" in e for e in probe["console_errors"]), probe
    assert first["preview"]["detected"] == "static"
    for name in (
        "attempt-1-probe-browser-add.png",
        "attempt-1-probe-browser-add-trace.zip",
        "attempt-2-probe-browser-add.png",
    ):
        assert name in artifacts, sorted(artifacts)
    shot = await crew.store.artifact_content(artifacts["attempt-1-probe-browser-add.png"].id)
    assert shot is not None and shot.startswith(b"\x89PNG")
    assert "TypeError" in first["diagnostics"] or "Cannot set properties of null" in first["diagnostics"]


async def test_the_same_probe_failure_trips_the_breaker(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    backend = require("bwrap")
    repo = make_repo(tmp_path / "site", {"index.html": INDEX, "app.js": JS, "tests/test_site.py": SITE_TEST})
    settings = make_settings(tmp_path / "data", temporal_server, pg_url, sandbox_backend=backend)
    preview = {"http": [{"name": "home", "path": "/", "expect": [{"contains": "Counter v2"}]}]}
    # Five different changes, none of which gives the page what the probe wants.
    steps = [{"files": {"index.html": INDEX.replace("<title>Counter", f"<title>Counter {n}")}} for n in range(5)]
    spec = item(repo, steps, preview, budget={"max_attempts": 5})
    spec["validation"]["command"] = ["python3", *PYTEST[1:]]
    async with running_crew(settings) as crew:
        wid = await crew.submit(spec)
        result = await crew.result(wid, timeout_s=600)
        attempts = await crew.store.list_attempts(wid)
    assert result.state == "failed" and result.reason.startswith("breaker:"), result.reason
    assert len(attempts) == 3, "the breaker stopped the run before the budget did"
    prints = {a.fingerprint for a in attempts}
    assert len(prints) == 1 and next(iter(prints)).startswith("probe_failure:")
