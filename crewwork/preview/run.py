"""`run_preview`: the one call the validation step makes once an attempt's tests have passed.

Start the change in its own sandbox (the validated workspace, same backend, limits and environment), wait until it
is ready, run the HTTP probes from the host through the tunnel's front door and the browser flows in a sandboxed
Chromium, store what was seen as artifacts, and stop and remove everything. It gathers evidence only; the pure
`crewwork.preview.verdict.grade_preview` decides (through `crewwork.validation.grading.grade`).

A preview that cannot start, never becomes ready, exits or hits a cap is evidence, not an error. Only a failure of
the platform itself (the sandbox machinery, a browser that cannot be launched here) raises `SandboxError`, which the
activity's retry policy handles like any other.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from crewwork.config.sandbox import SandboxSettings
from crewwork.models import ArtifactRef, PreviewOutcome, ProbeResult
from crewwork.models.preview import PreviewSpec
from crewwork.preview.app import AppPreview
from crewwork.preview.detect import NotDetected, detect, read_facts, with_port
from crewwork.preview.httpprobe import run_http, transcript
from crewwork.preview.records import MAX_LOG_TAIL, FlowRecord, HttpExchange, PreviewEvidence, cut
from crewwork.preview.tunnel import Tunnels
from crewwork.preview.verdict import PreviewVerdict, console_errors
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits

HEARTBEAT_EVERY_S = 2.0
"""Well inside the validate activity's heartbeat timeout (10 s)."""
Save = Callable[[str, bytes, str], Awaitable[ArtifactRef]]
"""Stores one artifact of the attempt: (name, content, content type) -> its reference."""


@dataclass
class PreviewRun:
    """What `run_preview` gathered: the evidence grading reads, and the artifacts the outcome links."""

    evidence: PreviewEvidence
    backend: str
    refs: dict[str, dict[str, ArtifactRef]] = field(default_factory=dict)
    """probe id -> role (transcript, screenshot, trace) -> artifact."""
    log_ref: ArtifactRef | None = None
    evidence_ref: ArtifactRef | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def outcome(self, verdict: PreviewVerdict | None) -> PreviewOutcome:
        """The outcome the attempt records: the verdict's per-probe results with their evidence."""
        ev = self.evidence
        flows = {f"preview::browser::{f.name}": f for f in ev.flows}
        probes = []
        for p in verdict.probes if verdict is not None else []:
            refs = self.refs.get(p.id, {})
            flow = flows.get(p.id)
            probes.append(
                ProbeResult(
                    id=p.id,
                    kind=p.kind,
                    passed=p.passed,
                    summary=p.summary,
                    failed=p.failed,
                    seen=p.seen,
                    # Bounded: the outcome travels through Temporal; the transcript artifact has them all.
                    console_errors=[cut(e, 300) for e in console_errors(flow)[:10]] if flow else [],
                    failed_requests=[cut(f"{r.method} {r.url}: {r.failure}", 300) for r in flow.failed_requests[:10]]
                    if flow
                    else [],
                    transcript_ref=refs.get("transcript"),
                    screenshot_ref=refs.get("screenshot"),
                    trace_ref=refs.get("trace"),
                )
            )
        return PreviewOutcome(
            passed=verdict.passed if verdict is not None else False,
            cause=verdict.cause if verdict is not None else "probe_missing",
            reason=verdict.reason if verdict is not None else "the preview was not graded",
            command=ev.command,
            detected=ev.detected,
            backend=self.backend,
            ready_after_s=ev.ready_after_s,
            probes=probes,
            log_ref=self.log_ref,
            evidence_ref=self.evidence_ref,
        )


async def run_preview(
    spec: PreviewSpec,
    *,
    sandbox: Sandbox,
    workspace: Path,
    limits: SandboxLimits,
    env: dict[str, str],
    mounts: Sequence[Mount],
    settings: SandboxSettings,
    scratch: Path,
    save: Save,
    prefix: str,
    heartbeat: Callable[[], None] = lambda: None,
) -> PreviewRun:
    """Start the app of `workspace` in `sandbox`, probe it, store the evidence (artifact names start with `prefix`),
    stop and remove everything. `scratch`: a host directory for the tunnel's sockets and the browser's files."""
    timings: dict[str, float] = {}
    port = 20_000 + secrets.randbelow(40_000)
    try:
        argv, detected = _start_command(spec, workspace, port)
    except NotDetected as exc:
        ev = PreviewEvidence(started=False, start_error=str(exc))
        return await _store(PreviewRun(ev, sandbox.name, timings=timings), save, prefix, b"")

    async def beat() -> None:
        # Readiness waits and browser steps can each take minutes: the activity keeps heartbeating throughout.
        while True:
            heartbeat()
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    beating = asyncio.create_task(beat())
    try:
        return await _run(
            spec,
            sandbox,
            workspace,
            limits,
            env,
            mounts,
            settings,
            scratch,
            save,
            prefix,
            port,
            argv,
            detected,
            timings,
        )
    finally:
        beating.cancel()


async def _run(
    spec: PreviewSpec,
    sandbox: Sandbox,
    workspace: Path,
    limits: SandboxLimits,
    env: dict[str, str],
    mounts: Sequence[Mount],
    settings: SandboxSettings,
    scratch: Path,
    save: Save,
    prefix: str,
    port: int,
    argv: list[str],
    detected: str | None,
    timings: dict[str, float],
) -> PreviewRun:
    run_limits = replace(limits, timeout_s=spec.lifetime_s)
    http: list[HttpExchange] = []
    flows: list[FlowRecord] = []
    shots: dict[str, tuple[bytes | None, bytes | None]] = {}
    async with Tunnels(scratch) as tunnels:
        app = AppPreview(
            sandbox,
            workspace,
            tunnels,
            argv=argv,
            port=port,
            env={**env, **spec.start.env},
            mounts=mounts,
            limits=run_limits,
            owner=settings.owner(),
        )
        started = time.monotonic()
        try:
            await app.start()
            ready, ready_after, detail = await app.wait_ready(spec.ready)
            timings["ready_s"] = time.monotonic() - started
            deadline = started + spec.lifetime_s
            if ready:
                async with app.client() as client:
                    for probe in spec.http:
                        if not app.alive or time.monotonic() > deadline:
                            break
                        x = await run_http(client, probe)
                        timings.setdefault("first_probe_s", time.monotonic() - started)
                        http.append(x)
                if spec.browser and app.alive:
                    from crewwork.preview.browser import Browser

                    async with Browser(settings, tunnels, port, scratch / f"{tunnels.dir.name}-b") as b:
                        timings["browser_launch_s"] = b.launch_s
                        for flow in spec.browser:
                            if not app.alive or time.monotonic() > deadline:
                                break
                            flow_started = time.monotonic()
                            try:
                                record, shot, trace = await b.run_flow(flow)
                            except Exception as exc:
                                # The page took the browser down with it (a renderer or browser crash): the page's
                                # doing, recorded against its flow, never a platform error.
                                why = f"the browser failed during the flow: {type(exc).__name__}: {exc}"
                                record, shot, trace = (
                                    FlowRecord(name=flow.name, page_crashed=True, error=why[:1000]),
                                    None,
                                    None,
                                )
                            timings[f"flow:{flow.name}"] = time.monotonic() - flow_started
                            timings.setdefault("first_probe_s", time.monotonic() - started)
                            flows.append(record)
                            shots[flow.name] = (shot, trace)
            # What the app wrote while answering the probes, and a moment for a crash the last probe caused to
            # show as one.
            log = await app.settled_log() if (http or flows) else app.log()
        finally:
            await app.stop()
        # Read once the app is stopped: its sandbox then reports every cap it hit, also those it survived.
        run = app.run_record()
    tail = log[-MAX_LOG_TAIL:].decode("utf-8", "replace")
    ev = PreviewEvidence(
        command=argv,
        detected=detected,
        port=port,
        ready=ready,
        ready_after_s=round(ready_after, 3) if ready_after is not None else None,
        ready_detail=detail,
        run=run,
        log_tail=tail,
        log_truncated=len(log) >= 4 * 1024 * 1024,
        http=http,
        flows=flows,
    )
    result = PreviewRun(ev, sandbox.name, timings=timings)
    for x in http:
        result.refs[f"preview::http::{x.name}"] = {
            "transcript": await save(f"{prefix}-probe-http-{x.name}.txt", transcript(x), "text/plain")
        }
    for f in flows:
        refs = {"transcript": await save(f"{prefix}-probe-browser-{f.name}.txt", flow_transcript(f), "text/plain")}
        shot, trace = shots.get(f.name, (None, None))
        if shot:
            refs["screenshot"] = await save(f"{prefix}-probe-browser-{f.name}.png", shot, "image/png")
        if trace:
            refs["trace"] = await save(f"{prefix}-probe-browser-{f.name}-trace.zip", trace, "application/zip")
        result.refs[f"preview::browser::{f.name}"] = refs
    return await _store(result, save, prefix, log)


async def _store(result: PreviewRun, save: Save, prefix: str, log: bytes) -> PreviewRun:
    if log:
        result.log_ref = await save(f"{prefix}-preview.log", log, "text/plain")
    doc = result.evidence.model_dump(mode="json")
    result.evidence_ref = await save(f"{prefix}-preview.json", json.dumps(doc, indent=1).encode(), "application/json")
    return result


def _start_command(spec: PreviewSpec, workspace: Path, port: int) -> tuple[list[str], str | None]:
    if spec.start.command is not None:
        return with_port(spec.start.command, port), None
    facts = read_facts(workspace, spec.start.directory)
    found = detect(facts, spec.start.framework, spec.start.directory)
    return with_port(found.command, port), found.framework


def flow_transcript(f: FlowRecord) -> bytes:
    """A browser flow as a person reads it: steps, assertions seen, console, failed requests."""
    lines = [f"flow {f.name}", ""]
    for s in f.steps:
        lines.append(f"{'ok  ' if s.ok else 'FAIL'} {s.action} {s.target} ({s.duration_s:.3f} s)")
        if s.error:
            lines.append(f"     {s.error}")
    if f.error:
        lines.append(f"stopped: {f.error}")
    for text, seen in f.visible.items():
        lines.append(f"text {text!r}: {'visible' if seen else 'NOT visible'}")
    lines.append(f"final url: {f.final_url if f.final_origin_ok else '(another origin)'}")
    if f.page_crashed:
        lines.append("the page crashed")
    lines.append("")
    lines.append(
        f"console ({max(f.console_seen, len(f.console))} messages, {f.console_errors_seen} errors; "
        f"{len(f.console)} kept):"
    )
    lines += [
        f"  {'#' + str(c.seq) + ' ' if c.seq else ''}[{c.type}] {c.text}" + (f"  ({c.location})" if c.location else "")
        for c in f.console
    ]
    lines.append(f"uncaught errors ({max(f.page_errors_seen, len(f.page_errors))}; {len(f.page_errors)} kept):")
    lines += [f"  [uncaught] {e}" for e in f.page_errors]
    failed_seen = max(f.failed_requests_seen, len(f.failed_requests))
    lines.append(f"failed requests ({failed_seen}; {len(f.failed_requests)} kept):")
    lines += [f"  {r.method} {r.url}: {r.failure}" for r in f.failed_requests]
    if f.cut:
        lines.append("cut by a bound (cannot change the verdict):")
        lines += [f"  {c}" for c in f.cut]
    if f.not_judged:
        lines.append("NOT JUDGED (a bound cut what could decide the verdict):")
        lines += [f"  {c}" for c in f.not_judged]
    lines.append("")
    lines.append("page text at the end:")
    lines.append(f.page_text)
    return "\n".join(lines).encode() + b"\n"
