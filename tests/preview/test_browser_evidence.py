"""A page under preview cannot turn a bound into a pass, nor grow the host through the DevTools pipe, nor reach another
origin through a redirect; a browser flow leaves nothing behind. Real Chromium in its bwrap sandbox, the app in bwrap
(the browser is bwrap on every backend)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from crewwork.models.preview import PreviewSpec
from crewwork.preview.verdict import grade_preview
from tests.preview.conftest import preview

pytestmark = pytest.mark.browser

SERVER = r"""
import gzip, http.server, os
PORT = int(os.environ["PORT"])
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def send(self, status, body, ctype="text/html", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.path = self.path.split("?")[0]
        if self.path == "/away":
            return self.send(302, b"", headers=[("Location", "http://localhost:%d/stolen" % PORT)])
        if self.path == "/img-away":
            return self.send(302, b"", headers=[("Location", "http://127.0.0.2:%d/pixel" % PORT)])
        if self.path == "/ok":
            return self.send(200, b"ok", "text/plain")
        if self.path == "/broken":
            return self.send(500, b"broken", "text/plain")
        if self.path == "/big":
            return self.send(200, b"a" * 70000 + b" SECRET-ERROR", "text/plain")
        if self.path == "/gz":
            return self.send(200, gzip.compress(b"all fine"), "text/plain", [("Content-Encoding", "gzip")])
        return super().do_GET()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
"""

DONE = "document.body.insertAdjacentHTML('beforeend', '<p>done</p>')"
PAGES = {
    # 10,000 ordinary lines, then one real error.
    "logs.html": f"<body><script>for (let i = 0; i < 10000; i++) console.log('line ' + i);"
    f"console.error('the real error after 10,000 lines'); {DONE}</script></body>",
    # The same from inside an iframe.
    "frame.html": "<body><script>for (let i = 0; i < 300; i++) console.log('f ' + i);"
    "console.error('error in an iframe')</script></body>",
    "iframe.html": f"<body><iframe src='/frame.html' onload=\"{DONE}\"></iframe></body>",
    # ... and from a worker: a console error, and an uncaught one.
    "w.js": "for (let i = 0; i < 300; i++) console.log('w ' + i); console.error('error in a worker');"
    "postMessage('x'); setTimeout(() => { throw new Error('uncaught in a worker') }, 10)",
    "worker.html": f"<body><script>const w = new Worker('/w.js'); w.onmessage = () => setTimeout(() => {{{DONE}}}, 300)"
    "</script></body>",
    # ... and from a popup the page opens (an error there is the flow's too).
    "popup.html": f"<body><script>window.open('/frame.html'); setTimeout(() => {{{DONE}}}, 500)</script></body>",
    # A failed console.assert is an error.
    "assert.html": f"<body><script>console.assert(1 === 2, 'total is wrong'); {DONE}</script></body>",
    # One huge error message (8 MiB): counted as an error, its text cut.
    "huge.html": f"<body><script>console.error('E' + 'x'.repeat(8 << 20)); {DONE}</script></body>",
    # A failed request after 1,500 successful ones.
    "requests.html": "<body><script>(async () => { for (let i = 0; i < 1500; i++) await fetch('/ok?' + i);"
    f"await fetch('/broken'); {DONE} }})()</script></body>",
    # 250 uncaught errors (more than are kept), after 250 ordinary lines.
    "uncaught.html": "<body><script>for (let i = 0; i < 250; i++) console.log('l ' + i);"
    "for (let i = 0; i < 250; i++) setTimeout(() => { throw new Error('boom ' + i) }, 0);"
    f"setTimeout(() => {{{DONE}}}, 200)</script></body>",
    # A subresource redirected to another origin.
    "redirect.html": f'<body><img src=\'/img-away\' onerror="{DONE}" onload="{DONE}"></body>',
}


def flow(name: str, page: str, *expect: dict[str, object]) -> dict[str, object]:
    steps = [{"open": page}, {"wait_for_text": "done"}]
    return {"name": name, "steps": steps, "expect": list(expect), "step_timeout_s": 60}


NO_ERRORS = {"no_console_errors": True}
NO_FAILED = {"no_failed_requests": True}


def _spec(**probes: object) -> dict[str, object]:
    return {"start": {"command": ["python3", "server.py"]}, **probes}


async def test_errors_are_counted_whatever_the_bound_and_cut_bodies_are_not_judged(tmp_path: Path) -> None:
    spec = _spec(
        http=[
            {"name": "past-the-cut", "path": "/big", "expect": [{"not_contains": "SECRET-ERROR"}]},
            {"name": "missing-from-the-part", "path": "/big", "expect": [{"contains": "SECRET-ERROR"}]},
            {"name": "regex-at-the-cut", "path": "/big", "expect": [{"regex": "a$"}]},
            {"name": "found-in-the-part", "path": "/big", "expect": [{"contains": "aaaa"}, {"regex": "^a+"}]},
            {"name": "compressed", "path": "/gz", "expect": [{"not_contains": "error"}]},
        ],
        browser=[
            flow("after-10000-lines", "/logs.html", NO_ERRORS),
            flow("in-an-iframe", "/iframe.html", NO_ERRORS),
            flow("in-a-worker", "/worker.html", NO_ERRORS),
            flow("in-a-popup", "/popup.html", NO_ERRORS),
            flow("an-assertion", "/assert.html", NO_ERRORS),
            flow("one-huge-error", "/huge.html", NO_ERRORS),
            flow("after-1500-requests", "/requests.html", NO_FAILED),
            flow("many-uncaught", "/uncaught.html", NO_ERRORS),
        ],
    )
    run, saved = await preview("bwrap", tmp_path, {"server.py": SERVER, **PAGES}, spec)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    verdicts = {p.id.split("::")[-1]: p for p in v.probes}
    assert verdicts["found-in-the-part"].passed, verdicts["found-in-the-part"]
    for name in ("past-the-cut", "missing-from-the-part", "regex-at-the-cut", "compressed"):
        assert not verdicts[name].passed and (verdicts[name].failed or "").startswith("not judged"), verdicts[name]
    flows = {f.name: f for f in run.evidence.flows}
    names = ("after-10000-lines", "in-an-iframe", "in-a-worker", "in-a-popup", "an-assertion", "one-huge-error")
    for name in (*names, "many-uncaught"):
        assert not verdicts[name].passed, (name, verdicts[name], flows[name].steps)
        assert verdicts[name].failed == "no console errors", (name, verdicts[name])
    logs = flows["after-10000-lines"]
    assert logs.console_seen >= 10001 and logs.console_errors_seen == 1
    assert "the real error after 10,000 lines" in (verdicts["after-10000-lines"].seen or "")
    assert len(logs.console) <= 300 and any("not kept" in c for c in logs.cut)
    assert "error in an iframe" in (verdicts["in-an-iframe"].seen or "")
    worker = flows["in-a-worker"]
    assert any("error in a worker" in c.text for c in worker.console), worker.console[-3:]
    assert any("uncaught in a worker" in e for e in worker.page_errors), worker.page_errors
    huge = flows["one-huge-error"]
    assert huge.console_errors_seen == 1 and len(huge.console[0].text) <= 2000
    assert any("cut at the DevTools pipe" in c for c in huge.cut), huge.cut
    assert flows["many-uncaught"].page_errors_seen == 250 and len(flows["many-uncaught"].page_errors) == 100
    assert "250 errors" in (verdicts["many-uncaught"].seen or "")
    failed = verdicts["after-1500-requests"]
    assert not failed.passed and "/broken: HTTP 500" in (failed.seen or ""), failed
    transcript = saved.artifacts["attempt-1-probe-browser-after-10000-lines.txt"][0].decode()
    assert "10001 messages, 1 errors" in transcript and "the real error after 10,000 lines" in transcript


async def test_redirects_to_another_origin_are_aborted_at_every_hop_and_nothing_is_left(tmp_path: Path) -> None:
    spec = _spec(
        browser=[
            {"name": "navigate-away", "steps": [{"open": "/away"}], "expect": []},
            flow("subresource-away", "/redirect.html", NO_FAILED),
        ]
    )
    run, _ = await preview("bwrap", tmp_path, {"server.py": SERVER, **PAGES}, spec)
    flows = {f.name: f for f in run.evidence.flows}
    away = flows["navigate-away"]
    assert away.steps and not away.steps[0].ok, away.steps
    assert "ERR_BLOCKED_BY_CLIENT" in (away.steps[0].error or ""), away.steps[0].error
    sub = flows["subresource-away"]
    blocked = [r for r in sub.failed_requests if "127.0.0.2" in r.url]
    assert blocked and "ERR_BLOCKED_BY_CLIENT" in blocked[0].failure, sub.failed_requests
    assert any("aborted at a redirect hop" in c for c in sub.cut + away.cut), (sub.cut, away.cut)


async def test_a_browser_flow_leaves_nothing_behind(tmp_path: Path) -> None:
    spec = _spec(browser=[flow("plain", "/frame.html")])
    await preview("bwrap", tmp_path, {"server.py": SERVER, "frame.html": f"<body><script>{DONE}</script></body>"}, spec)
    # Nothing of the preview or its browser (sockets, relays, the browser's directory) is left in the scratch space.
    assert list((tmp_path / "scratch").iterdir()) == []


def _vm(pid: int | str, field: str) -> int:
    """A /proc/PID/status figure in bytes (VmHWM: the peak resident set; VmRSS: the current one)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def _driver_pids() -> list[int]:
    """The Playwright drivers this test process started (node ... run-driver)."""
    me = os.getpid()
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                args = (d / "cmdline").read_bytes().split(b"\0")
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if b"run-driver" in args and int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(d.name))
    return found


async def test_a_page_logging_huge_strings_does_not_grow_the_worker_or_the_driver(tmp_path: Path) -> None:
    """Four 48 MiB console messages (and a 48 MiB page error): before the pipe's guard they took the worker from ~170
    to ~650 MiB and the driver to ~860 MiB."""
    huge = (
        "<body><script>const s = 'x'.repeat(48 << 20);"
        "for (let i = 0; i < 3; i++) console.log(i + s); console.error('E' + s);"
        f"setTimeout(() => {{ throw new Error(s) }}, 0); setTimeout(() => {{{DONE}}}, 100)</script></body>"
    )
    spec = _spec(browser=[flow("huge", "/huge48.html", NO_ERRORS)])
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the current resident set
    worker_before = _vm("self", "VmRSS")
    peaks: dict[int, int] = {}
    done = asyncio.Event()

    async def watch_drivers() -> None:
        while not done.is_set():
            for pid in _driver_pids():
                try:
                    peaks[pid] = max(peaks.get(pid, 0), _vm(pid, "VmHWM"))
                except (OSError, AssertionError):
                    pass
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_drivers())
    try:
        run, _ = await preview("bwrap", tmp_path, {"server.py": SERVER, "huge48.html": huge}, spec)
    finally:
        done.set()
        await watcher
    worker_growth = _vm("self", "VmHWM") - worker_before
    f = run.evidence.flows[0]
    assert f.console_errors_seen == 1 and f.page_errors_seen == 1, (f.console_seen, f.page_errors, f.steps)
    assert not grade_preview(PreviewSpec.model_validate(spec), run.evidence).passed
    assert peaks, "the driver was seen"
    mib = 1024 * 1024
    assert max(peaks.values()) < 300 * mib, f"the driver peaked at {max(peaks.values()) // mib} MiB"
    assert worker_growth < 120 * mib, f"the worker grew by {worker_growth // mib} MiB"


async def test_a_flood_of_console_messages_is_counted_and_the_driver_survives_it(tmp_path: Path) -> None:
    """30,000 messages with object arguments, then one error: the driver records each one for the flow's trace, and
    took 417 MiB and died of it after ~8,400 (at 100,000) before the pipe's guard withheld what is past its per-flow
    bound (counted by type)."""
    page = (
        "<body><script>for (let i = 0; i < 30000; i++) console.log('m', i, {a: i, b: [i]});"
        f"console.error('the error at the end'); {DONE}</script></body>"
    )
    spec = _spec(browser=[{**flow("flood", "/flood.html", NO_ERRORS), "step_timeout_s": 120}])
    peaks: dict[int, int] = {}
    done = asyncio.Event()

    async def watch_drivers() -> None:
        while not done.is_set():
            for pid in _driver_pids():
                try:
                    peaks[pid] = max(peaks.get(pid, 0), _vm(pid, "VmHWM"))
                except (OSError, AssertionError):
                    pass
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_drivers())
    try:
        run, _ = await preview("bwrap", tmp_path, {"server.py": SERVER, "flood.html": page}, spec)
    finally:
        done.set()
        await watcher
    f = run.evidence.flows[0]
    assert all(s.ok for s in f.steps) and not f.page_crashed, (f.steps, f.error)
    assert f.console_seen == 30001 and f.console_errors_seen == 1, (f.console_seen, f.console_errors_seen)
    assert any("counted but not passed to the driver" in c for c in f.cut), f.cut
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert not v.passed and v.probes[0].failed == "no console errors", v.probes[0]
    assert max(peaks.values()) < 300 * 1024 * 1024, f"the driver peaked at {max(peaks.values()) >> 20} MiB"
