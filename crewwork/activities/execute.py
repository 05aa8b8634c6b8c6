"""Agent-pool and validate-pool activities: run the agent in its own workspace, then judge the change.

The agent runs in a fresh workspace per activity attempt (named by its rank), so a zombie attempt still
writing files cannot touch the workspace of the attempt that superseded it. The platform captures the diff itself,
treating everything in the workspace as untrusted input (`crewwork.workspace`: no host git in the workspace, no
link followed, every read bounded).

Validation never runs in the agent's workspace: the captured diff is applied to the base tree in the host's
private git directory, protected test infrastructure is put back to the base commit (a change must not weaken
the tests that judge it; `crewwork.validation.protect`), the result is written into a fresh workspace, the
command runs in a fresh sandbox, the report is read back without trusting it (`crewwork.safefs`), and the saved
evidence is graded with a pure function.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crewwork import gitops, safefs
from crewwork.activities.common import AttemptWriter, artifact_bytes, watch
from crewwork.activities.errors import AGENT_ERROR, bad_input
from crewwork.agents.base import AgentConfigError, AgentContext, AgentError, AgentInfraError
from crewwork.agents.isolation import AgentProcesses, call_for
from crewwork.agents.registry import get_agent_class
from crewwork.config import Settings
from crewwork.contracts import AgentStepInput, ValidateInput
from crewwork.models import (
    AgentOutcome,
    ArtifactRef,
    EnvironmentSpec,
    SandboxSpec,
    ValidationOutcome,
    WorkItemKind,
    WorkItemState,
)
from crewwork.repos.environment import EnvironmentRejected, setup_plan
from crewwork.repos.mirror import MirrorHold
from crewwork.repos.service import REPO_ERRORS, Repositories, repo_failure
from crewwork.sandbox.base import Sandbox, SandboxError, SandboxLimits
from crewwork.sandbox.config import SandboxSettings
from crewwork.sandbox.disk import DiskError
from crewwork.sandbox.prepare import PreparedEnvCache, SetupFailed
from crewwork.store.artifacts import artifact_row
from crewwork.store.store import Store
from crewwork.store.tables import Artifact
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.grading import ValidationEvidence, grade
from crewwork.validation.protect import Protection, apply_protection, strip_platform
from crewwork.workers.slots import agent_done
from crewwork.workspace import CaptureLimits, CaptureRefused, Workspace, WorkspaceError

log = logging.getLogger("crewwork.activities.execute")

REPORT_DIR = gitops.PLATFORM_DIR
# The largest test report the host reads back (never more than the artifact limit either).
MAX_REPORT_BYTES = 16 * 1024 * 1024


def read_report(workspace: Path, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
    """The report a test run left at `rel`, read the only way the host reads a workspace file: beneath the
    workspace, no link followed, a single-link regular file, at most `max_bytes`. (content, None), (None, None)
    when there is none, or (None, why it was refused)."""
    try:
        return safefs.read_bytes(workspace, rel, max_bytes=max_bytes), None
    except FileNotFoundError:
        return None, None
    except safefs.Refused as exc:
        return None, f"{rel}: {exc.reason}"


def _ref(a: Artifact) -> ArtifactRef:
    return ArtifactRef(id=a.id, name=a.name, size=a.size, sha256=a.sha256, content_type=a.content_type)


def pick_sandbox(spec: SandboxSpec | None, settings: Settings, image: str | None = None) -> Sandbox:
    from crewwork.sandbox.registry import best_available, get_sandbox

    name = (spec.backend if spec and spec.backend else None) or settings.sandbox.backend
    if name is None:
        name, _why = best_available(settings.sandbox)
    if name == "local" and not settings.allow_unsafe_sandbox:
        raise bad_input(
            "sandbox backend `local` has no isolation and is refused unless the operator sets "
            "CREWWORK_ALLOW_UNSAFE_SANDBOX=true"
        )
    if image is not None and name not in ("docker", "gvisor"):
        raise bad_input(f"environment.image {image!r} needs the docker or gvisor sandbox backend, not {name!r}")
    try:
        if image is not None:
            return get_sandbox(
                name,
                allow_unsafe=settings.allow_unsafe_sandbox,
                settings=settings.sandbox.model_copy(update={"docker_image": image}),
            )
        return get_sandbox(name, allow_unsafe=settings.allow_unsafe_sandbox, settings=settings.sandbox)
    except ValueError as exc:
        raise bad_input(str(exc)) from exc


def sandbox_limits(spec: SandboxSpec | None, timeout_s: float | None, settings: SandboxSettings) -> SandboxLimits:
    from crewwork.sandbox.config import resolve_limits

    try:
        return resolve_limits(spec, settings, timeout_s=timeout_s)
    except ValueError as exc:
        raise bad_input(str(exc)) from exc


class ExecuteActivities:
    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.repos = Repositories(settings)
        self.agent_processes = AgentProcesses(settings.agent_concurrency)
        """The agent slots' child processes (crewwork.agents.isolation)."""

    async def _mirror(self, w: AttemptWriter, locator: str, commit: str, attempt: int) -> MirrorHold:
        """This host's mirror of the repository, holding `commit` (fetched when it lacks it), kept from eviction
        until the hold is released: the git directory workspaces are made from (docs/repositories.md)."""
        try:
            # The registered repository's credential (crewwork.repos.tenancy), never one the tenant names.
            credential = await self.store.repository_credential(w.tenant_id, locator)
            hold = await self.repos.hold(locator, commit, w.tenant_id, credential)
        except REPO_ERRORS as exc:
            raise repo_failure(exc) from None
        if hold.stats.fetched:
            fetched = await w.event(
                "repository_fetched",
                {"attempt": attempt, "cloned": hold.stats.cloned, "seconds": round(hold.stats.seconds, 3)},
            )
            if fetched.stale:
                # The item ended (or a later attempt wrote) while this one fetched: it must not make a workspace the
                # item's cleanup has already been through.
                hold.release()
                raise w.stale(fetched, "fetching the repository")
        return hold

    async def _forget_item_dir(self, w: AttemptWriter) -> None:
        """Remove the item's (now empty) worktree directory if the item has ended: an attempt that outlived the
        item's cleanup (it was cancelled while it made its workspace) must not leave it behind. Only once the item
        has ended, so no other attempt can be creating a workspace in it."""
        found = await self.store.current_rank(w.work_item_id)
        if found is not None and WorkItemState(found[1]).terminal:
            with contextlib.suppress(OSError):
                (self.settings.resolved_worktree_dir() / w.work_item_id).rmdir()

    async def _save(self, work_item_id: str, tenant_id: str, name: str, data: bytes, ctype: str) -> ArtifactRef:
        if len(data) > self.settings.max_artifact_bytes:
            keep = self.settings.max_artifact_bytes - 200
            data = data[:keep] + f"\n[truncated: {len(data)} bytes in all]\n".encode()
        art = await self.store.put_artifact(
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            name=name,
            data=data,
            content_type=ctype,
            max_bytes=self.settings.max_artifact_bytes,
        )
        return _ref(art)

    def _pending(self, inp: AgentStepInput, name: str, data: bytes, ctype: str) -> tuple[ArtifactRef, dict[str, Any]]:
        """An artifact the attempt's last write inserts (`_agent_finished`), and its ref: it exists only if that
        write is accepted, in the same transaction."""
        if len(data) > self.settings.max_artifact_bytes:
            keep = self.settings.max_artifact_bytes - 200
            data = data[:keep] + f"\n[truncated: {len(data)} bytes in all]\n".encode()
        row = artifact_row(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            name=name,
            data=data,
            content_type=ctype,
            max_bytes=self.settings.max_artifact_bytes,
        )
        ref = ArtifactRef(id=row["id"], name=name, size=row["size"], sha256=row["sha256"], content_type=ctype)
        return ref, row

    @activity.defn(name="run_agent")
    async def run_agent(self, inp: AgentStepInput) -> AgentOutcome:
        info = activity.info()
        spec = inp.spec
        from crewwork.agents.command import choose_agent

        chosen, why = choose_agent(
            spec.agent.name, spec.agent.config, repo=spec.repo.url if spec.repo else None, labels=spec.labels
        )
        config = spec.agent.config
        if chosen != spec.agent.name:
            # The command agent's config carries the built-in agent's config to fall back on.
            config = dict(spec.agent.config.get("model") or {})
        try:
            agent_cls = get_agent_class(chosen)
            agent_cls.validate_config(spec.kind, config)
        except AgentConfigError as exc:
            raise bad_input(str(exc)) from exc

        w = AttemptWriter.of(self.store, inp)
        # The attempt's first write, before anything else: refused if a later-scheduled attempt has written.
        started = await w.set_state(
            WorkItemState.running,
            f"attempt {inp.attempt}: agent {spec.agent.name} running",
            event_data={"attempt": inp.attempt, "activity_attempt": info.attempt},
        )
        if started.stale:
            raise w.stale(started, "run_agent")
        ws: Workspace | None = None
        workspace: Path | None = None
        sandbox = None
        limits = None
        if agent_cls.needs_sandbox:
            sandbox = pick_sandbox(spec.sandbox, self.settings)
            limits = sandbox_limits(spec.sandbox, None, self.settings.sandbox)
        mirror: MirrorHold | None = None
        if spec.kind != WorkItemKind.task:
            assert inp.repo_path and inp.base_commit
            mirror = await self._mirror(w, inp.repo_path, inp.base_commit, inp.attempt)
            try:
                ws = await self._workspace(
                    mirror.gitdir,
                    inp.work_item_id,
                    f"attempt-{inp.attempt}-s{inp.step}a{info.attempt}",
                    inp.base_commit,
                    limits or sandbox_limits(spec.sandbox, None, self.settings.sandbox),
                )
            except BaseException:
                mirror.release()
                raise
            workspace = ws.path
        started_at = time.monotonic()

        async def save(name: str, data: bytes, ctype: str = "text/plain") -> ArtifactRef:
            return await self._save(inp.work_item_id, inp.tenant_id, name, data, ctype)

        try:
            async with watch(w, workspace_ttl_s=self.settings.lease_ttl_s * 10 if workspace else None) as live:
                ctx = AgentContext(
                    work_item_id=inp.work_item_id,
                    attempt=inp.attempt,
                    activity_attempt=info.attempt,
                    kind=spec.kind,
                    config=config,
                    instruction=spec.instruction,
                    input=spec.input,
                    workspace=workspace,
                    diagnostics=inp.diagnostics,
                    review_comment=inp.review_comment,
                    sandbox=sandbox,
                    limits=limits,
                    host_workspace=ws,
                    heartbeat=live.heartbeat,
                    ensure_current=live.ensure_current,
                    resume_details=(info.heartbeat_details[0] if info.heartbeat_details else None),
                    save_artifact=save,
                    extra={
                        "repo": spec.repo.url if spec.repo else None,
                        "labels": dict(spec.labels),
                        # Test-only fault injection (the scripted agent's `stall_s`): turn this attempt into a zombie.
                        "fault_partition": live.simulate_partition,
                        "test_faults": self.settings.test_faults,
                    },
                )
                try:
                    if agent_cls.runs_inline or self.settings.agent_isolation == "inline":
                        result = await agent_cls().run(ctx)
                    else:
                        call = call_for(
                            chosen, self.settings.agent_plugins, ctx, allow_unsafe=self.settings.allow_unsafe_sandbox
                        )
                        result = await self.agent_processes.run(
                            call, ctx, deaf=lambda: live.partitioned and live.superseded_because is None
                        )
                except AgentError as exc:
                    failed = AgentOutcome(
                        agent=agent_cls.name,
                        mock=agent_cls.mock,
                        error=str(exc),
                        selected_because=why,
                        tokens_used=int(getattr(exc, "tokens_used", 0) or 0),
                        cost_usd=float(getattr(exc, "cost_usd", 0.0) or 0.0),
                    )
                    transcript = getattr(exc, "transcript", None)
                    left: list[dict[str, Any]] = []
                    if transcript:
                        failed.transcript_ref, row = self._pending(
                            inp, f"attempt-{inp.attempt}-transcript.txt", str(transcript).encode(), "text/plain"
                        )
                        left.append(row)
                    return await self._agent_finished(w, inp, failed, left)
                except AgentInfraError as exc:
                    delay = timedelta(seconds=min(exc.retry_after_s, 600)) if exc.retry_after_s else None
                    raise ApplicationError(str(exc), type="AgentInfraError", next_retry_delay=delay) from exc
                except SandboxError as exc:
                    raise ApplicationError(f"sandbox failure: {exc}", type="SandboxError") from exc
                outcome = AgentOutcome(
                    agent=agent_cls.name,
                    mock=agent_cls.mock,
                    output=result.output,
                    claims=result.claims,
                    selected_because=why,
                    tokens_used=result.tokens_used,
                    cost_usd=result.cost_usd,
                )
                pending: list[dict[str, Any]] = []
                if result.transcript:
                    # Inserted by the attempt's last write, in its transaction.
                    outcome.transcript_ref, row = self._pending(
                        inp, f"attempt-{inp.attempt}-transcript.txt", result.transcript.encode(), "text/plain"
                    )
                    pending.append(row)
                if ws is not None:
                    try:
                        captured = await ws.capture(
                            CaptureLimits(
                                max_diff_bytes=self.settings.max_artifact_bytes,
                                max_file_bytes=self.settings.max_artifact_bytes,
                            )
                        )
                    except CaptureRefused as exc:
                        # What the agent left cannot be a change (too large, too deep, ...): the attempt fails
                        # with that reason, recorded like any agent error; the loop goes on.
                        outcome.error = f"the change could not be captured: {exc}"
                        return await self._agent_finished(w, inp, outcome, pending)
                    outcome.diff_stats = captured.stats
                    outcome.diff_ref = await save(f"attempt-{inp.attempt}.diff", captured.diff, "text/x-diff")
                log.info(
                    "agent %s finished attempt %s of %s in %.2fs",
                    agent_cls.name,
                    inp.attempt,
                    inp.work_item_id,
                    time.monotonic() - started_at,
                )
                return await self._agent_finished(w, inp, outcome, pending)
        finally:
            if ws is not None:
                await ws.remove()
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._forget_item_dir(w))
            if mirror is not None:
                mirror.release()

    async def _agent_finished(
        self, w: AttemptWriter, inp: AgentStepInput, outcome: AgentOutcome, pending: list[dict[str, Any]]
    ) -> AgentOutcome:
        """The attempt's last write: the refs of what it produced, and the `pending` artifacts (its transcript) in
        the same transaction. Refused (and the attempt ends) if a later attempt has written meanwhile, so the event
        log only ever names the accepted attempt's artifacts."""
        agent_done()  # what is left is this write and the completion: the slot may poll for its next task
        done = await w.event(
            "agent_finished",
            {
                "attempt": inp.attempt,
                "activity_attempt": w.rank.attempt,
                "diff_ref": outcome.diff_ref.id if outcome.diff_ref else None,
                "transcript_ref": outcome.transcript_ref.id if outcome.transcript_ref else None,
                "error": outcome.error,
            },
            pending,
        )
        if done.stale:
            raise w.stale(done, "run_agent")
        return outcome

    # ------------------------------------------------------------------ validation

    @activity.defn(name="validate_change")
    async def validate_change(self, inp: ValidateInput) -> ValidationOutcome:
        w = AttemptWriter.of(self.store, inp)
        started = await w.set_state(
            WorkItemState.validating,
            f"attempt {inp.attempt}: validating",
            event_data={"attempt": inp.attempt, "activity_attempt": w.rank.attempt},
        )
        if started.stale:
            raise w.stale(started, "validate_change")
        async with watch(w, workspace_ttl_s=self.settings.lease_ttl_s * 10) as live:
            outcome = await self._validate(inp, w, live.heartbeat)
        done = await w.event(
            "validation_finished",
            {
                "attempt": inp.attempt,
                "activity_attempt": w.rank.attempt,
                "passed": outcome.passed,
                "cause": outcome.cause,
                "log_ref": outcome.log_ref.id if outcome.log_ref else None,
            },
        )
        if done.stale:
            raise w.stale(done, "validate_change")
        return outcome

    async def _workspace(
        self,
        git_dir: Path,
        work_item_id: str,
        name: str,
        commit: str,
        limits: SandboxLimits,
        *,
        materialise: bool = True,
    ) -> Workspace:
        """A fresh workspace for one agent run or validation, with the operator's disk cap and sandbox owner."""
        sandbox_settings = self.settings.sandbox
        try:
            return await Workspace.create(
                git_dir=git_dir,
                home=self.settings.resolved_worktree_dir() / work_item_id / name,
                commit=commit,
                disk_mb=sandbox_settings.workspace_disk_mb(limits),
                owner=sandbox_settings.owner(),
                materialise=materialise,
            )
        except WorkspaceError as exc:
            raise bad_input(str(exc)) from exc
        except DiskError as exc:
            raise ApplicationError(f"workspace disk: {exc}", type="SandboxError") from exc

    async def _validate(self, inp: ValidateInput, w: AttemptWriter, heartbeat: Any) -> ValidationOutcome:
        spec = inp.validation
        diff = await artifact_bytes(self.store, inp.diff_ref.id) if inp.diff_ref else b""
        ev: dict[str, Any] = {
            "diff_nonempty": bool(diff.strip()),
            "patch_applied": True,
            "fail_to_pass": spec.fail_to_pass,
            "pass_to_pass": spec.pass_to_pass,
        }
        outcome_extra: dict[str, Any] = {}
        if not diff.strip():
            evidence = ValidationEvidence(**ev)
            return self._judge(inp, evidence, outcome_extra)
        environment: EnvironmentSpec | None = inp.environment
        sandbox = pick_sandbox(inp.sandbox, self.settings, environment.image if environment else None)
        limits = sandbox_limits(inp.sandbox, spec.timeout_s, self.settings.sandbox)
        setup_commands = [*(environment.setup if environment else []), *spec.setup]
        needs_setup = bool(setup_commands) or (environment is not None and environment.python is not None)
        mirror = await self._mirror(w, inp.repo_path, inp.base_commit, inp.attempt)
        try:
            ws = await self._workspace(
                mirror.gitdir,
                inp.work_item_id,
                f"validate-{inp.attempt}-s{inp.step}a{w.rank.attempt}",
                inp.base_commit,
                limits,
                materialise=False,
            )
        except BaseException:
            mirror.release()
            raise
        try:
            # Everything below works on trees in the host's private git directory: the diff is applied there
            # (never by git in a work tree), protected paths are put back there, and only the result is written
            # into the fresh workspace.
            changed, err = await ws.apply(diff)
            if changed is None:
                evidence = ValidationEvidence(**{**ev, "patch_applied": False, "stderr_tail": err[-4000:]})
                return self._judge(inp, evidence, outcome_extra)
            base, _ = strip_platform(ws.base, spec.junit_path)
            final, resets = await apply_protection(
                ws.git, ws.base, changed, Protection.from_spec(spec), report_path=spec.junit_path
            )
            outcome_extra["protected_reset"] = resets
            ev["protected_reset"] = [f"{r.path} ({r.why})" for r in resets]
            if final == base:
                evidence = ValidationEvidence(**ev, effective_change=False)
                return self._judge(inp, evidence, outcome_extra)
            heartbeat()
            run_env: dict[str, str] = {}
            mounts: list[Path] = []
            try:
                await ws.write_entries(base if needs_setup else final)
            except WorkspaceError as exc:
                evidence = ValidationEvidence(**ev, disk_limited=True, stderr_tail=str(exc)[-4000:])
                return self._judge(inp, evidence, outcome_extra)
            if needs_setup:
                # Setup runs once per (repository, base commit, environment) on this host, on the base content;
                # every later attempt and validation mounts the result read-only instead of reinstalling.
                plan = None
                setup_limits = limits
                if environment is not None:
                    try:
                        plan = setup_plan(
                            environment,
                            self.settings,
                            inp.tenant_id,
                            exposed=self.repos.credentials.exposed,
                            redact=self.repos.redact,
                        )
                    except EnvironmentRejected as exc:
                        raise bad_input(str(exc)) from exc
                    setup_limits = dataclasses.replace(limits, timeout_s=environment.setup_timeout_s)
                try:
                    prepared = await PreparedEnvCache(self.settings.data_dir.resolve() / "prepared").get_or_prepare(
                        sandbox=sandbox,
                        repo=inp.repo_path,
                        base_commit=inp.base_commit,
                        setup=setup_commands,
                        source=ws.path,
                        limits=setup_limits,
                        plan=plan,
                    )
                except SetupFailed as exc:
                    setup = exc.results[-1]
                    outcome_extra["log_ref"] = await self._save(
                        inp.work_item_id,
                        inp.tenant_id,
                        f"attempt-{inp.attempt}-setup.log",
                        exc.log or (setup.stdout + b"\n--- stderr ---\n" + setup.stderr),
                        "text/plain",
                    )
                    setup_report = setup.report(4000)
                    # The setup's own exit code says why; the test command never ran.
                    evidence = ValidationEvidence.from_sandbox(
                        setup_report.model_copy(update={"exit_code": None, "command_not_found": False}),
                        **ev,
                        setup_exit_code=setup.exit_code if setup.exit_code not in (None, 0) else 1,
                    )
                    return self._judge(inp, evidence, outcome_extra, sandbox_report=setup_report)
                run_env.update(prepared.env())
                mounts.extend(prepared.mounts())
                prepared_ev: dict[str, Any] = {"attempt": inp.attempt, **prepared.evidence()}
                if prepared.cold:
                    log_ref = await self._save(
                        inp.work_item_id,
                        inp.tenant_id,
                        f"attempt-{inp.attempt}-setup.log",
                        prepared.setup_log(),
                        "text/plain",
                    )
                    prepared_ev["log_ref"] = log_ref.id
                await w.event("environment_prepared", prepared_ev)
                try:
                    await ws.update(base, final)
                except WorkspaceError as exc:
                    evidence = ValidationEvidence(**ev, disk_limited=True, stderr_tail=str(exc)[-4000:])
                    return self._judge(inp, evidence, outcome_extra)
            # The platform's directory, owned by the sandbox user; the report path's parent exists too. Whatever
            # the run leaves there is read back without following anything.
            ws.make_dir(gitops.PLATFORM_DIR)
            if spec.junit_path is not None and len(spec.junit_path.parts) > 1:
                ws.make_dir("/".join(spec.junit_path.parts[:-1]))
            heartbeat()
            run = await sandbox.run(spec.command, workspace=ws.path, limits=limits, env=run_env, ro_mounts=mounts)
            heartbeat()
            rep = run.report(8000).model_copy(update={"workspace_disk": ws.disk_enforcement})
            outcome_extra["log_ref"] = await self._save(
                inp.work_item_id,
                inp.tenant_id,
                f"attempt-{inp.attempt}-validation.log",
                b"$ " + " ".join(spec.command).encode() + b"\n" + run.stdout + b"\n--- stderr ---\n" + run.stderr,
                "text/plain",
            )
            report_bytes = None
            refused = None
            if spec.junit_path is not None:
                report_bytes, refused = await asyncio.to_thread(
                    read_report, ws.path, spec.junit_path, min(MAX_REPORT_BYTES, self.settings.max_artifact_bytes)
                )
            if report_bytes is not None:
                outcome_extra["report_ref"] = await self._save(
                    inp.work_item_id,
                    inp.tenant_id,
                    f"attempt-{inp.attempt}-junit.xml",
                    report_bytes,
                    "application/xml",
                )
            evidence = ValidationEvidence.from_sandbox(
                rep,
                **ev,
                report=report_bytes,
                report_refused=refused,
                # With a configured report path a missing report is not evidence of anything: it fails.
                report_format="junit" if spec.junit_path else None,
            )
            return self._judge(inp, evidence, outcome_extra, sandbox_report=rep)
        finally:
            await ws.remove()
            with contextlib.suppress(Exception):
                await asyncio.shield(self._forget_item_dir(w))
            mirror.release()

    def _judge(
        self,
        inp: ValidateInput,
        evidence: ValidationEvidence,
        extra: dict[str, Any],
        sandbox_report: Any = None,
    ) -> ValidationOutcome:
        verdict = grade(evidence)
        diagnostics = None
        if not verdict.passed:
            diagnostics = build_diagnostics(
                verdict, evidence, inp.attempt, inp.diff_stats, review_comment=inp.review_comment
            )
        return verdict.to_outcome(
            sandbox=sandbox_report,
            log_ref=extra.get("log_ref"),
            report_ref=extra.get("report_ref"),
            diagnostics=diagnostics,
            protected_reset=extra.get("protected_reset"),
        )


__all__ = ["AGENT_ERROR", "ExecuteActivities"]
