"""Browser flows: Playwright for Python (host side) drives Debian's Chromium, which runs inside a bubblewrap sandbox.

The browser renders untrusted content, so it gets the bwrap backend's whole boundary (namespaces, the unprivileged
sandbox uid, crewwork's seccomp filter, a per-run cgroup, the `/etc` allowlist) and an empty network namespace of its
own, where the browser relay maps 127.0.0.1:PORT to the tunnel's front door: the app is the only thing it can reach.
Playwright launches `executable_path` = a wrapper script written for this session, which execs exactly that
sandbox with the DevTools pipe (fds 3 and 4) inherited; console messages, failed requests, screenshots and the trace
all arrive over that pipe, through the pipe's guard in the same sandbox (crewwork/preview/pipeguard.py), which
bounds every message the browser sends and checks every request at every hop. The driver itself (Node, on the host)
runs in a cgroup of its own (`DRIVER_LIMITS`), so what it does with what it receives is capped too. The page never
writes to the host: its profile lives in the sandbox's own /tmp.

What a flow keeps of what the page logged is bounded (crewwork/preview/records.py) but counted whole: every error
is counted whatever the bound, the other messages sampled, and what the guard had to drop is named in the flow's
`not_judged`, which fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crewwork.config.sandbox import BwrapConfig, SandboxSettings
from crewwork.models.preview import BrowserFlow, Click, Fill, Open, Press, Target, TextVisible, WaitForText
from crewwork.preview.records import (
    ERROR_TYPES,
    MAX_CONSOLE_ERRORS,
    MAX_CONSOLE_SAMPLE,
    MAX_ENTRY_CHARS,
    MAX_FAILED_REQUESTS,
    MAX_PAGE_ERRORS,
    ConsoleEntry,
    FailedRequest,
    FlowRecord,
    StepRecord,
    cut,
)
from crewwork.preview.tunnel import Tunnels
from crewwork.sandbox.base import Mount, SandboxError, SandboxLimits, hand_over
from crewwork.sandbox.bwrap import SYNTHETIC_ETC, BwrapSandbox
from crewwork.sandbox.cgroups import RunCgroup
from crewwork.sandbox.seccomp import build_filter

CHROMIUM = "/usr/lib/chromium/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
APP_INSIDE = "/crewwork/app"
FONTS_INSIDE = "/crewwork/fonts"
BROWSER_LIMITS = SandboxLimits(memory_mb=2048, pids=1024, cpus=1.0, timeout_s=1800, tmpfs_mb=512)
DRIVER_LIMITS = SandboxLimits(memory_mb=512, pids=256, cpus=1.0, timeout_s=1800)
"""The Playwright driver's cgroup on the host (memory, processes, CPU); the browser leaves it for its own."""
MAX_PAGE_TEXT = 2_000
MAX_TRACE_BYTES = 16 * 1024 * 1024
_DRIVER_START: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


class BrowserUnavailable(SandboxError):
    """Browser flows cannot run on this worker (no Playwright, no Chromium, no bubblewrap): the platform's problem."""


class Browser:
    """One sandboxed Chromium for a preview's flows: `async with Browser(...) as b: await b.run_flow(flow)`."""

    def __init__(self, settings: SandboxSettings, tunnels: Tunnels, port: int, work: Path) -> None:
        self.settings = settings
        self.tunnels = tunnels
        self.port = port
        self.work = work
        self.origin = f"http://127.0.0.1:{port}"
        self._pw: Any = None
        self._browser: Any = None
        self._cdp: Any = None
        self._cgroup: Any = None
        self._driver_cgroup: RunCgroup | None = None
        self.launch_s = 0.0

    async def __aenter__(self) -> Browser:
        try:
            import playwright.async_api  # noqa: F401  # the preview extra is there
        except ImportError as exc:
            raise BrowserUnavailable("browser flows need Playwright: install crewwork[preview]") from exc
        if not Path(CHROMIUM).exists():
            raise BrowserUnavailable(f"browser flows need Chromium at {CHROMIUM}: apt-get install -y chromium")
        wrapper = await self._wrapper()
        started = time.monotonic()
        self._pw = await self._start_driver()
        try:
            self._browser = await self._pw.chromium.launch(
                executable_path=str(wrapper), args=CHROMIUM_ARGS, env={}, timeout=60_000, headless=True
            )
            self._cdp = await self._browser.new_browser_cdp_session()
        except Exception as exc:
            await self.__aexit__()
            raise BrowserUnavailable(f"the sandboxed browser did not start: {cut(str(exc), 1000)}") from exc
        self.launch_s = time.monotonic() - started
        return self

    async def _start_driver(self) -> Any:
        """Start Playwright's driver (Node) inside its own cgroup: Playwright starts the program named by
        PLAYWRIGHT_NODEJS_PATH, here a script that joins the group and execs the real Node. The variable is set only
        while this driver starts (one start at a time per event loop)."""
        from playwright._impl._driver import compute_driver_executable
        from playwright.async_api import async_playwright

        node, _cli = compute_driver_executable()
        prefix: list[str] = []
        config = self.settings.backend_config("bwrap")
        if isinstance(config, BwrapConfig) and config.cgroups:
            with contextlib.suppress(OSError):
                self._driver_cgroup = RunCgroup.create(DRIVER_LIMITS)
                prefix = self._driver_cgroup.exec_prefix()
        script = self.work / "node"
        script.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in [*prefix, node]) + ' "$@"\n')
        script.chmod(0o700)
        loop = asyncio.get_running_loop()
        lock = _DRIVER_START.setdefault(loop, asyncio.Lock())
        async with lock:
            before = os.environ.get("PLAYWRIGHT_NODEJS_PATH")
            os.environ["PLAYWRIGHT_NODEJS_PATH"] = str(script)
            try:
                return await async_playwright().start()
            finally:
                if before is None:
                    os.environ.pop("PLAYWRIGHT_NODEJS_PATH", None)
                else:
                    os.environ["PLAYWRIGHT_NODEJS_PATH"] = before

    @property
    def driver_cgroup(self) -> RunCgroup | None:
        """The driver's cgroup (None where cgroups are not usable: then the driver runs without a memory cap)."""
        return self._driver_cgroup

    async def __aexit__(self, *exc: object) -> None:
        if self._browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._browser.close(), 15)
            self._browser = None
        if self._pw is not None:
            with contextlib.suppress(Exception):
                await self._pw.stop()
            self._pw = None
        for cgroup in (self._cgroup, self._driver_cgroup):
            if cgroup is not None:
                await asyncio.to_thread(cgroup.kill_all)
                await asyncio.to_thread(cgroup.remove)
        self._cgroup = self._driver_cgroup = None
        self._cdp = None
        await asyncio.to_thread(shutil.rmtree, self.work, True)

    async def _wrapper(self) -> Path:
        """The executable Playwright launches: this session's bwrap sandbox around the browser relay + Chromium."""
        try:
            sandbox = BwrapSandbox(self.settings)
        except SandboxError as exc:
            raise BrowserUnavailable(f"browser flows run Chromium in bubblewrap: {exc}") from exc
        toolchain = await sandbox.toolchain()
        self.work.mkdir(parents=True, mode=0o700)
        home = self.work / "home"
        home.mkdir(mode=0o755)
        await asyncio.to_thread(hand_over, home, self.settings.owner())
        files: list[tuple[int, Path]] = []
        seccomp_fd = None
        program = build_filter() if sandbox.config.seccomp else None
        if program is not None:
            (self.work / "seccomp.bpf").write_bytes(program)
            seccomp_fd = 10
            files.append((10, self.work / "seccomp.bpf"))
        data_fds = []
        for i, (dest, data) in enumerate(SYNTHETIC_ETC.items(), start=11):
            (self.work / f"etc-{i}").write_bytes(data)
            files.append((i, self.work / f"etc-{i}"))
            data_fds.append((i, dest))
        mounts = [Mount(self.tunnels.front_dir, APP_INSIDE)]
        env = {"PATH": toolchain.path("/opt/crewwork/python"), "LANG": "C.UTF-8", "HOME": "/tmp"}
        if Path("/etc/fonts/fonts.conf").exists():
            mounts.append(Mount(Path("/etc/fonts"), FONTS_INSIDE))
            env["FONTCONFIG_FILE"] = f"{FONTS_INSIDE}/fonts.conf"
        argv = ["python3", f"{APP_INSIDE}/browser-relay.py", f"{APP_INSIDE}/front.sock", str(self.port), "--", CHROMIUM]
        cmd = sandbox.command(argv, home, BROWSER_LIMITS, mounts, toolchain, seccomp_fd, data_fds)
        prefix: list[str] = []
        if sandbox.config.cgroups:
            with contextlib.suppress(OSError):
                self._cgroup = RunCgroup.create(BROWSER_LIMITS)
                prefix = self._cgroup.exec_prefix()
        opens = " ".join(f"{fd}<{shlex.quote(str(path))}" for fd, path in files)
        script = "#!/bin/bash\n"  # dash cannot name descriptors above 9
        script += f"exec {opens}\n" if opens else ""
        script += "exec /usr/bin/env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        script += " " + " ".join(shlex.quote(a) for a in [*prefix, *cmd]) + ' "$@"\n'
        wrapper = self.work / "chromium"
        wrapper.write_text(script)
        wrapper.chmod(0o700)
        return wrapper

    async def run_flow(self, flow: BrowserFlow) -> tuple[FlowRecord, bytes | None, bytes | None]:
        """Run one flow in a fresh browser context: (its record, a PNG screenshot at its end, the trace zip)."""
        context = await self._browser.new_context(
            base_url=self.origin,
            service_workers="block",
            accept_downloads=False,
            viewport={"width": 1280, "height": 800},
        )
        await context.route("**/*", self._same_origin_only)
        await context.tracing.start(screenshots=True, snapshots=True)
        seen = _Seen()
        crashed = asyncio.Event()
        # Context-wide: the flow's page, any page it opens, their frames and workers.
        context.on("console", seen.console)
        context.on("weberror", seen.page_error)
        context.on("requestfailed", seen.request_failed)
        context.on("response", seen.response)
        context.on("page", lambda p: p.on("crash", lambda _p: crashed.set()))
        await self._guard("Crewwork.reset")
        page = await context.new_page()
        page.on("crash", lambda _p: crashed.set())
        timeout_ms = flow.step_timeout_s * 1000
        steps: list[StepRecord] = []
        error: str | None = None
        for step in flow.steps:
            action, target = _describe(step)
            started = time.monotonic()
            try:
                await self._do(page, step, timeout_ms)
                steps.append(
                    StepRecord(action=action, target=target, ok=True, duration_s=round(time.monotonic() - started, 3))
                )
            except Exception as exc:
                error = cut(_first_line(exc), 1000)
                steps.append(
                    StepRecord(
                        action=action,
                        target=target,
                        ok=False,
                        error=error,
                        duration_s=round(time.monotonic() - started, 3),
                    )
                )
                break
        visible: dict[str, bool] = {}
        if error is None and not crashed.is_set():
            for a in flow.expect:
                if isinstance(a, TextVisible):
                    visible[a.text_visible] = await _visible(page, a.text_visible, timeout_ms)
        url = page.url
        screenshot = page_text = None
        if not crashed.is_set():
            with contextlib.suppress(Exception):
                screenshot = await page.screenshot(type="png", timeout=timeout_ms)
            with contextlib.suppress(Exception):
                # Cut in the page, so a page with megabytes of text sends no more (a page that tampers with this only
                # spoils its own evidence text, which decides nothing; the pipe's guard bounds the answer anyway).
                page_text = await page.locator("body").evaluate(
                    f"b => (b.innerText || '').slice(0, {MAX_PAGE_TEXT})", timeout=2_000
                )
        trace_path = self.work / f"trace-{flow.name}.zip"
        trace: bytes | None = None
        with contextlib.suppress(Exception):
            await context.tracing.stop(path=str(trace_path))
            if trace_path.stat().st_size <= MAX_TRACE_BYTES:
                trace = trace_path.read_bytes()
            else:
                size = trace_path.stat().st_size
                seen.cut.append(f"the trace ({size} bytes) is over {MAX_TRACE_BYTES} bytes: not kept")
        with contextlib.suppress(Exception):
            trace_path.unlink()
        with contextlib.suppress(Exception):
            await context.close()
        seen.guard(await self._guard("Crewwork.reset"))
        parts = urlsplit(url)
        record = FlowRecord(
            name=flow.name,
            steps=steps,
            visible=visible,
            final_url=parts.path + (f"?{parts.query}" if parts.query else "") if url else None,
            final_origin_ok=f"{parts.scheme}://{parts.netloc}" == self.origin,
            page_crashed=crashed.is_set(),
            page_text=cut(page_text or "", MAX_PAGE_TEXT),
            error=error,
            **seen.fields(),
        )
        return record, screenshot, trace

    async def _guard(self, command: str) -> dict[str, Any] | None:
        """The pipe guard's counts since the last reset (crewwork/preview/pipeguard.py); None if it did not answer."""
        try:
            answer = await asyncio.wait_for(self._cdp.send(command), 10)
        except Exception:
            return None
        return answer if isinstance(answer, dict) else None

    async def _same_origin_only(self, route: Any) -> None:
        # The browser's network namespace has nothing else anyway; aborting here names the request in the evidence.
        if route.request.url.startswith(self.origin + "/") or route.request.url == self.origin:
            await route.continue_()
        else:
            await route.abort("blockedbyclient")

    async def _do(self, page: Any, step: Any, timeout_ms: float) -> None:
        if isinstance(step, Open):
            await page.goto(step.open, timeout=timeout_ms, wait_until="load")
        elif isinstance(step, Click):
            await _locate(page, step.click).click(timeout=timeout_ms)
        elif isinstance(step, Fill):
            await _locate(page, step.fill).fill(step.value, timeout=timeout_ms)
        elif isinstance(step, Press):
            await _locate(page, step.press).press(step.key, timeout=timeout_ms)
        elif isinstance(step, WaitForText):
            await page.get_by_text(step.wait_for_text).first.wait_for(state="visible", timeout=timeout_ms)


def _locate(page: Any, t: Target) -> Any:
    if t.role is not None:
        return page.get_by_role(t.role, name=t.name) if t.name is not None else page.get_by_role(t.role)
    if t.text is not None:
        return page.get_by_text(t.text)
    if t.test_id is not None:
        return page.get_by_test_id(t.test_id)
    return page.get_by_label(t.label)


async def _visible(page: Any, text: str, timeout_ms: float) -> bool:
    try:
        await page.get_by_text(text).first.wait_for(state="visible", timeout=timeout_ms)
        return True
    except Exception:
        return False


def _describe(step: Any) -> tuple[str, str]:
    if isinstance(step, Open):
        return "open", step.open
    if isinstance(step, WaitForText):
        return "wait_for_text", repr(step.wait_for_text)
    action = type(step).__name__.lower()
    t: Target = getattr(step, action)
    how = next(f"{k}={getattr(t, k)!r}" for k in ("role", "text", "test_id", "label") if getattr(t, k) is not None)
    return action, how + (f" name={t.name!r}" if t.name else "")


def _path(url: str) -> str:
    """A URL as evidence: the path on the app's origin, or the whole URL when it is another origin."""
    parts = urlsplit(url)
    if parts.hostname == "127.0.0.1":
        return parts.path + (f"?{parts.query}" if parts.query else "")
    return url


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("=")]
    return " ".join(lines[:3]) if lines else type(exc).__name__


class _Seen:
    """What the page logged and which requests failed in one flow: counted whole, kept within bounds (every error up
    to MAX_CONSOLE_ERRORS, the other messages sampled first and last), plus what the pipe's guard reported."""

    def __init__(self) -> None:
        self.count = 0
        self.errors: list[ConsoleEntry] = []
        self.error_count = 0
        self.first: list[ConsoleEntry] = []
        self.last: deque[ConsoleEntry] = deque(maxlen=MAX_CONSOLE_SAMPLE // 2)
        self.page_errors: list[str] = []
        self.page_error_count = 0
        self.failed: list[FailedRequest] = []
        self.failed_count = 0
        self.cut: list[str] = []
        self.not_judged: list[str] = []

    def console(self, msg: Any) -> None:
        self.count += 1
        kind = str(msg.type)
        loc = msg.location or {}
        where = f"{_path(loc.get('url', ''))}:{loc.get('lineNumber', '')}" if loc.get("url") else ""
        entry = ConsoleEntry(type=kind, text=cut(msg.text, MAX_ENTRY_CHARS), location=cut(where, 500), seq=self.count)
        if kind in ERROR_TYPES:
            self.error_count += 1
            if len(self.errors) < MAX_CONSOLE_ERRORS:
                self.errors.append(entry)
        elif len(self.first) < MAX_CONSOLE_SAMPLE // 2:
            self.first.append(entry)
        else:
            self.last.append(entry)

    def page_error(self, err: Any) -> None:
        self.page_error_count += 1
        if len(self.page_errors) < MAX_PAGE_ERRORS:
            self.page_errors.append(cut(str(getattr(err, "error", err)), MAX_ENTRY_CHARS))

    def _failed(self, method: str, url: str, failure: str) -> None:
        self.failed_count += 1
        if len(self.failed) < MAX_FAILED_REQUESTS:
            self.failed.append(FailedRequest(method=method, url=cut(_path(url), 500), failure=cut(failure, 300)))

    def request_failed(self, req: Any) -> None:
        self._failed(req.method, req.url, req.failure or "failed")

    def response(self, resp: Any) -> None:
        if resp.status >= 400:
            self._failed(resp.request.method, resp.url, f"HTTP {resp.status}")

    def guard(self, stats: dict[str, Any] | None) -> None:
        """What the pipe's guard did during the flow: cuts are noted; a dropped event (it could have been a console
        error) or no answer at all makes the flow not judged."""
        if stats is None:
            self.not_judged.append("the DevTools pipe's guard did not report what it cut: the flow cannot be judged")
            return
        dropped = stats.get("dropped") or {}
        if dropped:
            what = ", ".join(f"{n} {m}" for m, n in sorted(dropped.items()))
            self.not_judged.append(
                f"the browser sent events over the DevTools pipe's bounds that were dropped ({cut(what, 300)}); "
                "any of them could have been an error"
            )
        for method, n in sorted((stats.get("cut") or {}).items()):
            self.cut.append(f"{n} {cut(str(method), 100)} event(s) had strings cut at the DevTools pipe")
        if stats.get("refused"):
            self.cut.append(f"{stats['refused']} answer(s) from the browser over the pipe's size bound were refused")
        withheld = {str(k): int(v) for k, v in (stats.get("withheld") or {}).items() if isinstance(v, int)}
        if withheld:
            # Counted, never seen: errors among them count as errors (the verdict reads the counts).
            exceptions = withheld.pop("exception", 0)
            errors = sum(n for kind, n in withheld.items() if kind in ERROR_TYPES)
            self.count += sum(withheld.values())
            self.error_count += errors
            self.page_error_count += exceptions
            what = f"{sum(withheld.values())} console messages ({errors} errors) and {exceptions} uncaught errors"
            self.cut.append(f"{what} past the pipe's per-flow bound were counted but not passed to the driver")
        if stats.get("blocked"):
            self.cut.append(f"{stats['blocked']} request(s) to another origin were aborted at a redirect hop")

    def fields(self) -> dict[str, Any]:
        others = self.first + list(self.last)
        if self.count > len(self.errors) + len(others):
            dropped = self.count - len(self.errors) - len(others)
            kept = f"{len(self.errors)} errors and {len(others)} other messages"
            self.cut.append(f"{dropped} of {self.count} console messages not kept (kept: {kept}; all counted)")
        if self.page_error_count > len(self.page_errors):
            self.cut.append(f"{self.page_error_count - len(self.page_errors)} uncaught errors not kept (all counted)")
        if self.failed_count > len(self.failed):
            self.cut.append(f"{self.failed_count - len(self.failed)} failed requests not kept (all counted)")
        return dict(
            console=sorted([*self.errors, *others], key=lambda c: c.seq or 0),
            console_seen=self.count,
            console_errors_seen=self.error_count,
            page_errors=self.page_errors,
            page_errors_seen=self.page_error_count,
            failed_requests=self.failed,
            failed_requests_seen=self.failed_count,
            cut=self.cut,
            not_judged=self.not_judged,
        )
