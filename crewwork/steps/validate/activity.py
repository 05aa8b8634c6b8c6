"""The validate step's activity: judge one attempt's change.

Validation never runs in the agent's workspace: the captured diff is applied to the base tree in the host's private
git directory, protected test infrastructure is put back to the base commit (a change must not weaken the tests that
judge it; `crewwork.validation.protect`), the result is written into a fresh workspace, the repository's environment
is prepared (once per host and base commit, `crewwork.sandbox.prepare`), the command runs in a fresh sandbox, the
report is read back without trusting it (`crewwork.safefs`), the preview probes run where declared, and the saved
evidence is graded with a pure function (`crewwork.validation.grading`).

Each of those is a phase of `Validation`; a phase that already decides the verdict (no change, a patch that does not
apply, a setup that fails) returns its evidence, and `judge` grades whatever evidence the attempt ended with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crewwork import gitops
from crewwork.config import Settings
from crewwork.evidence.sandbox_spec import sandbox_spec
from crewwork.gitops import Tree
from crewwork.models import (
    ArtifactRef,
    EnvironmentSpec,
    SandboxReport,
    TenantRef,
    ValidationOutcome,
    WorkItemState,
)
from crewwork.preview.run import PreviewRun, run_preview
from crewwork.repos.credentials import CredentialError, read_secret
from crewwork.repos.environment import EnvironmentRejected, check_environment
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits
from crewwork.sandbox.disk import prepare_disk_cap_mb
from crewwork.sandbox.prepare import CacheOwner, PreparedEnv, PreparedEnvCache, SetupFailed, SetupPlan
from crewwork.steps.attempt import AttemptWriter, artifact_bytes, watch
from crewwork.steps.errors import bad_input
from crewwork.steps.execution import (
    MAX_REPORT_BYTES,
    forget_item_dir,
    hold_mirror,
    make_workspace,
    pick_sandbox,
    read_report,
    sandbox_limits,
    save,
)
from crewwork.steps.ports import Ports
from crewwork.steps.validate import ValidateInput
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.grading import ValidationEvidence, grade
from crewwork.validation.protect import Protection, apply_protection, strip_platform
from crewwork.workspace import Workspace, WorkspaceError


async def validate_change(ports: Ports, inp: ValidateInput) -> ValidationOutcome:
    w = AttemptWriter.of(ports.store, inp)
    started = await w.set_state(
        WorkItemState.validating,
        f"attempt {inp.attempt}: validating",
        event_data={"attempt": inp.attempt, "activity_attempt": w.rank.attempt},
    )
    if started.stale:
        raise w.stale(started, "validate_change")
    async with watch(w, workspace_ttl_s=ports.settings.lease_ttl_s * 10) as live:
        outcome = await validate(ports, inp, w, live.heartbeat)
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


async def validate(
    ports: Ports, inp: ValidateInput, w: AttemptWriter, heartbeat: Callable[[], None]
) -> ValidationOutcome:
    diff = await artifact_bytes(ports.store, inp.diff_ref.id) if inp.diff_ref else b""
    v = Validation(ports, inp, w, heartbeat)
    if not diff.strip():
        return v.judge(v.evidence(diff_nonempty=False))
    async with v.workspace():
        verdict = await v.apply(diff)
        if verdict is None and v.needs_setup:
            verdict = await v.prepare_environment()
        if verdict is None:
            verdict = await v.run_tests()
        return v.judge(*verdict)


Verdict = tuple[ValidationEvidence, SandboxReport | None]
"""The evidence a validation ended with, and the sandbox report of the run that produced it (if one ran)."""


@dataclass
class Validation:
    """One validation attempt's state, as its phases build it up."""

    ports: Ports
    inp: ValidateInput
    w: AttemptWriter
    heartbeat: Callable[[], None]
    facts: dict[str, Any] = field(default_factory=dict)
    """What grading sees besides the run (ValidationEvidence's fields)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What the outcome carries besides the verdict (artifact refs, protected paths put back, the preview)."""
    sandbox: Sandbox = field(init=False)
    limits: SandboxLimits = field(init=False)
    ws: Workspace = field(init=False)
    base: Tree = field(init=False)
    final: Tree = field(init=False)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    prepared: PreparedEnv | None = None

    def __post_init__(self) -> None:
        spec = self.inp.validation
        self.facts = {
            "diff_nonempty": True,
            "patch_applied": True,
            "fail_to_pass": spec.fail_to_pass,
            "pass_to_pass": spec.pass_to_pass,
        }

    @property
    def needs_setup(self) -> bool:
        env = self.inp.environment
        return bool(self.setup_commands) or (env is not None and env.python is not None)

    @property
    def setup_commands(self) -> list[list[str]]:
        return [*(self.inp.environment.setup if self.inp.environment else []), *self.inp.validation.setup]

    def evidence(self, **facts: Any) -> ValidationEvidence:
        return ValidationEvidence(**{**self.facts, **facts})

    async def save(self, name: str, data: bytes, ctype: str = "text/plain") -> ArtifactRef:
        return await save(self.ports, self.w, f"attempt-{self.inp.attempt}-{name}", data, ctype)

    @contextlib.asynccontextmanager
    async def workspace(self) -> AsyncIterator[None]:
        """A fresh, not yet written workspace on the base commit, with the sandbox and limits it runs under; all
        removed (and the prepared environment released) when the validation ends."""
        inp, ports = self.inp, self.ports
        image = inp.environment.image if inp.environment else None
        self.sandbox = pick_sandbox(inp.sandbox, ports.settings, image)
        self.limits = sandbox_limits(inp.sandbox, inp.validation.timeout_s, ports.settings.sandbox)
        mirror = await hold_mirror(ports, self.w, inp.repo_path, inp.base_commit, inp.attempt)
        try:
            self.ws = await make_workspace(
                ports,
                mirror.gitdir,
                inp.work_item_id,
                f"validate-{inp.attempt}-s{inp.step}a{self.w.rank.attempt}",
                inp.base_commit,
                self.limits,
                materialise=False,
            )
        except BaseException:
            mirror.release()
            raise
        try:
            yield
        finally:
            if self.prepared is not None:
                self.prepared.release()
            await self.ws.remove()
            with contextlib.suppress(Exception):
                await asyncio.shield(forget_item_dir(ports, self.w))
            mirror.release()

    async def apply(self, diff: bytes) -> Verdict | None:
        """The change as the tests will see it: the diff applied to the base tree (in the host's private git
        directory, never by git in a work tree), protected paths put back there, and only the result written into
        the workspace (the base content first, when the environment is set up on it)."""
        spec, ws = self.inp.validation, self.ws
        changed, err = await ws.apply(diff)
        if changed is None:
            return self.evidence(patch_applied=False, stderr_tail=err[-4000:]), None
        self.base, _ = strip_platform(ws.base, spec.junit_path)
        self.final, resets = await apply_protection(
            ws.git, ws.base, changed, Protection.from_spec(spec), report_path=spec.junit_path
        )
        self.extra["protected_reset"] = resets
        self.facts["protected_reset"] = [f"{r.path} ({r.why})" for r in resets]
        if self.final == self.base:
            return self.evidence(effective_change=False), None
        self.heartbeat()
        try:
            await ws.write_entries(self.base if self.needs_setup else self.final)
        except WorkspaceError as exc:
            return self.evidence(disk_limited=True, stderr_tail=str(exc)[-4000:]), None
        return None

    async def prepare_environment(self) -> Verdict | None:
        """Setup runs once per (repository, base commit, environment) on this host, on the base content; every later
        attempt and validation mounts the result read-only instead of reinstalling. Then the change goes in."""
        inp, ports = self.inp, self.ports
        plan, setup_limits = None, self.limits
        if inp.environment is not None:
            try:
                plan = setup_plan(
                    inp.environment,
                    ports.settings,
                    await ports.store.tenant_ref(inp.tenant_id),
                    exposed=ports.repos.credentials.exposed,
                    redact=ports.repos.redact,
                )
            except EnvironmentRejected as exc:
                raise bad_input(str(exc)) from exc
            setup_limits = dataclasses.replace(self.limits, timeout_s=inp.environment.setup_timeout_s)
        cache = PreparedEnvCache(
            ports.settings.data_dir.resolve() / "prepared", disk_mb=prepare_disk_cap_mb(ports.settings.sandbox)
        )
        registration = await ports.store.find_repository(inp.tenant_id, inp.repo_path)
        owner = CacheOwner(
            tenant_id=inp.tenant_id,
            repository=registration.id if registration is not None else f"unregistered:{inp.repo_path}",
        )
        try:
            self.prepared = await cache.get_or_prepare(
                owner=owner,
                sandbox=self.sandbox,
                repo=inp.repo_path,
                base_commit=inp.base_commit,
                setup=self.setup_commands,
                source=self.ws.path,
                limits=setup_limits,
                plan=plan,
                # Kept from eviction while the tests run on it (released when the workspace goes).
                hold=True,
            )
        except SetupFailed as exc:
            return await self._setup_failed(exc, cache)
        prepared = self.prepared
        self.env.update(prepared.env())
        self.mounts.extend(prepared.mounts())
        event: dict[str, Any] = {"attempt": inp.attempt, **prepared.evidence()}
        if prepared.cold:
            event["log_ref"] = (await self.save("setup.log", prepared.setup_log())).id
        await self.w.event("environment_prepared", event)
        try:
            await self.ws.update(self.base, self.final)
        except WorkspaceError as exc:
            return self.evidence(disk_limited=True, stderr_tail=str(exc)[-4000:]), None
        return None

    async def _setup_failed(self, exc: SetupFailed, cache: PreparedEnvCache) -> Verdict:
        """The setup's own exit code says why; the test command never ran."""
        setup = exc.results[-1]
        self.extra["log_ref"] = await self.save(
            "setup.log", exc.log or (setup.stdout + b"\n--- stderr ---\n" + setup.stderr)
        )
        report = setup.report(4000).model_copy(update={"workspace_disk": cache.disk_enforcement})
        evidence = ValidationEvidence.from_sandbox(
            report.model_copy(update={"exit_code": None, "command_not_found": False}),
            **self.facts,
            setup_exit_code=setup.exit_code if setup.exit_code not in (None, 0) else 1,
        )
        return evidence, report

    async def run_tests(self) -> Verdict:
        """The validation command in a fresh sandbox; its log and report kept; then, once the tests pass, the
        preview probes (docs/preview.md)."""
        spec, ws, settings = self.inp.validation, self.ws, self.ports.settings
        # The platform's directory, owned by the sandbox user; the report path's parent exists too. Whatever the
        # run leaves there is read back without following anything.
        ws.make_dir(gitops.PLATFORM_DIR)
        if spec.junit_path is not None and len(spec.junit_path.parts) > 1:
            ws.make_dir("/".join(spec.junit_path.parts[:-1]))
        self.heartbeat()
        run = await self.sandbox.run(
            spec.command, workspace=ws.path, limits=self.limits, env=self.env, mounts=self.mounts
        )
        self.heartbeat()
        rep = run.report(8000).model_copy(
            # evidence hook: what the run was given, signed in the item's evidence bundle (crewwork/evidence)
            update={
                "workspace_disk": ws.disk_enforcement,
                "spec": sandbox_spec(self.sandbox, self.limits, self.mounts),
            }
        )
        self.extra["log_ref"] = await self.save(
            "validation.log",
            b"$ " + " ".join(spec.command).encode() + b"\n" + run.stdout + b"\n--- stderr ---\n" + run.stderr,
        )
        report, refused = None, None
        if spec.junit_path is not None:
            report, refused = await asyncio.to_thread(
                read_report, ws.path, spec.junit_path, min(MAX_REPORT_BYTES, settings.max_artifact_bytes)
            )
        if report is not None:
            self.extra["report_ref"] = await self.save("junit.xml", report, "application/xml")
        evidence = ValidationEvidence.from_sandbox(
            rep,
            **self.facts,
            report=report,
            report_refused=refused,
            # With a configured report path a missing report is not evidence of anything: it fails.
            report_format="junit" if spec.junit_path else None,
            preview_spec=spec.preview,
        )
        if spec.preview is not None and grade(evidence.model_copy(update={"preview_spec": None})).passed:
            evidence = await self.preview(evidence)
        return evidence, rep

    async def preview(self, evidence: ValidationEvidence) -> ValidationEvidence:
        """Preview hook: the one call into crewwork/preview, once the tests passed, in this workspace, with this
        sandbox, its limits and prepared environment (docs/preview.md)."""
        spec, settings, inp = self.inp.validation, self.ports.settings, self.inp
        assert spec.preview is not None
        preview = await run_preview(
            spec.preview,
            sandbox=self.sandbox,
            workspace=self.ws.path,
            limits=self.limits,
            env=self.env,
            mounts=self.mounts,
            settings=settings.sandbox,
            scratch=settings.data_dir.resolve() / "preview",
            save=lambda name, data, ctype: save(self.ports, self.w, name, data, ctype),
            prefix=f"attempt-{inp.attempt}",
            heartbeat=self.heartbeat,
        )
        self.extra["preview"] = preview
        return evidence.model_copy(update={"preview": preview.evidence})

    def judge(self, evidence: ValidationEvidence, sandbox_report: SandboxReport | None = None) -> ValidationOutcome:
        """Grade the evidence (a pure function) and say what the next attempt needs to know when it failed."""
        inp = self.inp
        verdict = grade(evidence)
        diagnostics = None
        if not verdict.passed:
            diagnostics = build_diagnostics(
                verdict, evidence, inp.attempt, inp.diff_stats, review_comment=inp.review_comment
            )
        preview: PreviewRun | None = self.extra.get("preview")
        return verdict.to_outcome(
            preview=preview.outcome(verdict.preview) if preview is not None else None,
            sandbox=sandbox_report,
            log_ref=self.extra.get("log_ref"),
            report_ref=self.extra.get("report_ref"),
            diagnostics=diagnostics,
            protected_reset=self.extra.get("protected_reset"),
        )


def setup_plan(
    env: EnvironmentSpec,
    settings: Settings,
    tenant: TenantRef | None,
    *,
    exposed: Iterable[Path] = (),
    redact: Callable[[str], str] | None = None,
) -> SetupPlan:
    """The plan the prepared-environment cache builds with: the allowlist only when asked for, the named secrets
    read from their files now (so a rotated secret is picked up by the next build)."""
    check_environment(env, settings, tenant)
    secrets: dict[str, str] = {}
    for name in env.secrets:
        ref = settings.setup_secrets[name]
        try:
            secrets[ref.env] = read_secret(name, ref.file, exposed)
        except (CredentialError, UnicodeDecodeError) as exc:
            raise EnvironmentRejected(f"environment.secrets: {exc}") from None
    return SetupPlan(
        python=env.python,
        allowlist=tuple(settings.setup_allowlist()) if env.network else (),
        secrets=secrets,
        image=env.image,
        redact=redact,
    )
