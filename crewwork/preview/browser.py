"""Browser flows: Playwright for Python (host side) drives Debian's Chromium, which runs inside a bubblewrap sandbox.

The browser renders untrusted content, so it gets the bwrap backend's whole boundary (namespaces, the unprivileged
sandbox uid, crewwork's seccomp filter, a per-run cgroup, the `/etc` allowlist) and an empty network namespace of its
own, where the browser relay maps 127.0.0.1:PORT to the tunnel's front door: the app is the only thing it can reach.
Playwright launches `executable_path` = a wrapper script written for this session, which execs exactly that
sandbox with the DevTools pipe (fds 3 and 4) inherited; console messages, failed requests, screenshots and the trace
all arrive over that pipe. The page never writes to the host: its profile lives in the sandbox's own /tmp.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crewwork.config.sandbox import SandboxSettings
from crewwork.models.preview import BrowserFlow, Click, Fill, Open, Press, Target, TextVisible, WaitForText
from crewwork.preview.evidence import (
    MAX_CONSOLE,
    MAX_ENTRY_CHARS,
    MAX_FAILED_REQUESTS,
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
MAX_PAGE_TEXT = 2_000
MAX_TRACE_BYTES = 16 * 1024 * 1024


class BrowserUnavailable(SandboxError):
    """Browser flows cannot run on this worker (no Playwright, no Chromium, no bubblewrap): the platform's problem."""


class Browser:
    """One sandboxed Chromium for a preview's flows: `async with Browser(...) as b: await b.run_flow(flow)`."""

    def __init__(self, settings: SandboxSettings, tunnels: Tunnels, port: int, work: Path) -> None:
        self.settings = settings
        self.tunnels = tunnels
        self.port = port
        self.work = work / "browser"
        self.origin = f"http://127.0.0.1:{port}"
        self._pw: Any = None
        self._browser: Any = None
        self._cgroup: Any = None
        self.launch_s = 0.0

    async def __aenter__(self) -> Browser:
        try:
            from playwright.async_api import async_playwright
        except ImportError as exc:
            raise BrowserUnavailable("browser flows need Playwright: install crewwork[preview]") from exc
        if not Path(CHROMIUM).exists():
            raise BrowserUnavailable(f"browser flows need Chromium at {CHROMIUM}: apt-get install -y chromium")
        wrapper = await self._wrapper()
        started = time.monotonic()
        self._pw = await async_playwright().start()
        try:
            self._browser = await self._pw.chromium.launch(
                executable_path=str(wrapper), args=CHROMIUM_ARGS, env={}, timeout=60_000, headless=True
            )
        except Exception as exc:
            await self.__aexit__()
            raise BrowserUnavailable(f"the sandboxed browser did not start: {cut(str(exc), 1000)}") from exc
        self.launch_s = time.monotonic() - started
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._browser.close(), 15)
            self._browser = None
        if self._pw is not None:
            with contextlib.suppress(Exception):
                await self._pw.stop()
            self._pw = None
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.kill_all)
            await asyncio.to_thread(self._cgroup.remove)
            self._cgroup = None
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
        page = await context.new_page()
        console: list[ConsoleEntry] = []
        errors: list[str] = []
        failed: list[FailedRequest] = []
        crashed = asyncio.Event()

        def on_console(msg: Any) -> None:
            if len(console) < MAX_CONSOLE:
                loc = msg.location or {}
                where = f"{_path(loc.get('url', ''))}:{loc.get('lineNumber', '')}" if loc.get("url") else ""
                console.append(ConsoleEntry(type=msg.type, text=cut(msg.text, MAX_ENTRY_CHARS), location=where))

        def on_request_failed(req: Any) -> None:
            if len(failed) < MAX_FAILED_REQUESTS:
                failed.append(
                    FailedRequest(
                        method=req.method, url=cut(_path(req.url), 500), failure=cut(req.failure or "failed", 300)
                    )
                )

        def on_response(resp: Any) -> None:
            if resp.status >= 400 and len(failed) < MAX_FAILED_REQUESTS:
                req = resp.request
                failed.append(
                    FailedRequest(method=req.method, url=cut(_path(resp.url), 500), failure=f"HTTP {resp.status}")
                )

        page.on("console", on_console)

        def on_page_error(exc: Any) -> None:
            if len(errors) < MAX_CONSOLE:
                errors.append(cut(str(exc), MAX_ENTRY_CHARS))

        page.on("pageerror", on_page_error)
        page.on("requestfailed", on_request_failed)
        page.on("response", on_response)
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
                page_text = await page.inner_text("body", timeout=2_000)
        trace_path = self.work / f"trace-{flow.name}.zip"
        trace: bytes | None = None
        with contextlib.suppress(Exception):
            await context.tracing.stop(path=str(trace_path))
            if trace_path.stat().st_size <= MAX_TRACE_BYTES:
                trace = trace_path.read_bytes()
            trace_path.unlink()
        with contextlib.suppress(Exception):
            await context.close()
        parts = urlsplit(url)
        record = FlowRecord(
            name=flow.name,
            steps=steps,
            visible=visible,
            final_url=parts.path + (f"?{parts.query}" if parts.query else "") if url else None,
            final_origin_ok=f"{parts.scheme}://{parts.netloc}" == self.origin,
            console=console,
            page_errors=errors,
            failed_requests=failed,
            page_crashed=crashed.is_set(),
            page_text=cut(page_text or "", MAX_PAGE_TEXT),
            error=error,
        )
        return record, screenshot, trace

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
