"""The validate step's activity: judge one attempt's change.

Validation never runs in the agent's workspace: the captured diff is applied to the base tree in the host's private
git directory, protected test infrastructure is put back to the base commit (a change must not weaken the tests that
judge it; `crewwork.validation.protect`), the result is written into a fresh workspace, the repository's environment
is prepared (once per host and base commit, `crewwork.sandbox.prepare`), the command runs in a fresh sandbox, the
report is read back without trusting it (`crewwork.boundary.safefs`), the preview probes run where declared, and the saved
evidence is graded with a pure function (`crewwork.validation.grading`).

Each of those is a phase of `Validation`; a phase that already decides the verdict (no change, a patch that does not
apply, a setup that fails) returns its evidence, and `judge` grades whatever evidence the attempt ended with.

Where the item asks (`validation.baseline`) and the change's run has failing tests, `against_base` runs the same
command on the base tree (cached per tenant, repository, base commit and definition in the store) and re-runs the
change's tree a bounded number of times for flaky tests, each in a fresh workspace with the same sandbox, limits and
prepared environment; what they showed goes into the evidence (crewwork.validation.baseline) and grading compares.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crewwork.attestation.sandbox_spec import sandbox_spec
from crewwork.models import (
    ArtifactRef,
    CheckResult,
    CheckSpec,
    EnvironmentSpec,
    SandboxReport,
    ValidationOutcome,
    WorkItemState,
)
from crewwork.preview.run import PreviewRun, run_preview
from crewwork.repos.environment import EnvironmentRejected
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits
from crewwork.sandbox.disk import prepare_disk_cap_mb
from crewwork.sandbox.envplan import CacheOwner, PreparedEnv, SetupFailed
from crewwork.sandbox.prepare import PreparedEnvCache
from crewwork.steps.attempt import AttemptWriter, artifact_bytes, watch
from crewwork.steps.errors import bad_input
from crewwork.steps.execution import (
    MAX_REPORT_BYTES,
    forget_item_dir,
    hold_mirror,
    make_workspace,
    pick_sandbox,
    read_report_bounded,
    sandbox_limits,
    save,
)
from crewwork.steps.ports import Ports
from crewwork.steps.validate import ValidateInput
from crewwork.steps.validate.check_runs import run_checks, together
from crewwork.steps.validate.extra_runs import Verdict, against_base
from crewwork.steps.validate.output import TAIL_BYTES, stdout_cut
from crewwork.steps.validate.scanning import ScanStage
from crewwork.steps.validate.setup import setup_plan
from crewwork.steps.validate.witnessing import STREAMS_REL, WitnessRun, read_streams
from crewwork.validation.check_grading import checks_diagnostics, with_checks
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.grading import ValidationEvidence, grade
from crewwork.validation.protect import Protection, apply_protection, report_paths, strip_platform
from crewwork.validation.reach import scan_diff, unprotected_conftests
from crewwork.validation.weakening import scan_weakening
from crewwork.validation.witness import expects_witness
from crewwork.workspace.gitops import Tree
from crewwork.workspace.tree import Workspace, WorkspaceError, gitops


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
            scan = v.scan_stage(diff)
            if scan is not None:
                await scan.before_tests()

            async def tests() -> Verdict:
                verdict = await v.with_preview(*await against_base(v, *await v.run_tests()))
                return await v.with_scan(scan, verdict) if scan is not None else verdict

            if inp.validation.checks:
                # Beside the tests, each in its own sandbox (crewwork/steps/validate/check_runs.py); a failure of either
                # cancels the other.
                verdict, v.extra["checks"] = await together(tests(), run_checks(v))
            else:
                verdict = await tests()
        # Parsing a report of up to 32 MiB is CPU work: in a thread, so heartbeats go on meanwhile.
        return await asyncio.to_thread(v.judge, *verdict)


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
    mirror: Any = None

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
        mirror = self.mirror = await hold_mirror(ports, self.w, inp.repo_path, inp.base_commit, inp.attempt)
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
        reports = report_paths(spec)
        self.base, _ = strip_platform(ws.base, reports)
        self.final, resets = await apply_protection(
            ws.git, ws.base, changed, Protection.from_spec(spec), report_paths=reports
        )
        self.extra["protected_reset"] = resets
        self.facts["protected_reset"] = [f"{r.path} ({r.why})" for r in resets]
        reach, total = await asyncio.to_thread(
            scan_diff,
            diff,
            skip=frozenset(r.path for r in resets),
            unprotected=unprotected_conftests(self.base, self.final),
        )
        self.facts["runner_reach"] = [f.describe() for f in reach]
        self.facts["runner_reach_total"] = total
        weakened, weakened_total = await asyncio.to_thread(scan_weakening, diff, skip=frozenset(r.path for r in resets))
        more = [f"… and {weakened_total - len(weakened)} more"] if weakened_total > len(weakened) else []
        self.facts["weakened"] = [f.describe() for f in weakened] + more
        self.facts["runner_code_allowed"] = spec.protect.runner_code == "allow"
        self.facts["changed_paths"] = sorted(
            p.decode("utf-8", "surrogateescape")
            for p in set(self.base) | set(self.final)
            if self.base.get(p) != self.final.get(p)
        )
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
        inp = self.inp
        cache = self.prepared_cache()
        try:
            self.prepared = await self.prepared_env(inp.environment, self.setup_commands, self.ws.path, cache)
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

    def prepared_cache(self) -> PreparedEnvCache:
        settings = self.ports.settings
        return PreparedEnvCache(settings.data_dir.resolve() / "prepared", disk_mb=prepare_disk_cap_mb(settings.sandbox))

    async def prepared_env(
        self, environment: EnvironmentSpec | None, setup: list[list[str]], source: Path, cache: PreparedEnvCache
    ) -> PreparedEnv:
        """`environment` prepared (or found) for this tenant, repository and base commit, from the base content in
        `source`, and held until released. Raises SetupFailed."""
        inp, ports = self.inp, self.ports
        plan, setup_limits = None, self.limits
        if environment is not None:
            try:
                plan = setup_plan(
                    environment,
                    ports.settings,
                    await ports.store.tenant_ref(inp.tenant_id),
                    exposed=ports.repos.credentials.exposed,
                    redact=ports.repos.redact,
                )
            except EnvironmentRejected as exc:
                raise bad_input(str(exc)) from exc
            setup_limits = dataclasses.replace(self.limits, timeout_s=environment.setup_timeout_s)
        owner = CacheOwner(tenant_id=inp.tenant_id, repository=await self.repository_key())
        return await cache.get_or_prepare(
            owner=owner,
            sandbox=self.sandbox,
            repo=inp.repo_path,
            base_commit=inp.base_commit,
            setup=setup,
            source=source,
            limits=setup_limits,
            plan=plan,
            # Kept from eviction while the runs use it (released when they are done).
            hold=True,
        )

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

    async def repository_key(self) -> str:
        """The tenant's registration of the repository, what caches are kept under (never across tenants)."""
        inp = self.inp
        registration = await self.ports.store.find_repository(inp.tenant_id, inp.repo_path)
        return registration.id if registration is not None else f"unregistered:{inp.repo_path}"

    async def run_tests(self) -> Verdict:
        """The validation command in a fresh sandbox; its log and report kept."""
        spec = self.inp.validation
        evidence, rep, refs = await self.run_in(self.ws, "", self.facts, preview_spec=spec.preview)
        self.extra.update(refs)
        return evidence, rep

    async def with_preview(self, evidence: ValidationEvidence, rep: SandboxReport | None) -> Verdict:
        """Once the tests pass (compared with the baseline, where asked for), the preview probes (docs/preview.md)."""
        if (
            self.inp.validation.preview is not None
            and (await asyncio.to_thread(grade, evidence.model_copy(update={"preview_spec": None}))).passed
        ):
            evidence = await self.preview(evidence)
        return evidence, rep

    async def run_in(
        self,
        ws: Workspace,
        tag: str,
        facts: dict[str, Any],
        *,
        preview_spec: Any = None,
        check: CheckSpec | None = None,
        prepared: tuple[dict[str, str], list[Mount]] | None = None,
    ) -> tuple[ValidationEvidence, SandboxReport, dict[str, ArtifactRef]]:
        """One run of the validation command (or of `check`'s, in its own prepared environment when it has one) in
        `ws` (written already), its log, report and witness streams saved as artifacts named with `tag`, and the
        evidence grading needs."""
        spec, settings = self.inp.validation, self.ports.settings
        command, junit_path, limits = spec.command, spec.junit_path, self.limits
        if check is not None:
            command = check.command
            junit_path = check.report_path if check.report == "junit" else None
            if check.timeout_s is not None:
                # Checked against the operator's maxima again here (admission did at submission).
                limits = sandbox_limits(self.inp.sandbox, check.timeout_s, settings.sandbox)
        refs: dict[str, ArtifactRef] = {}
        # The platform's directory, owned by the sandbox user; the report path's parent exists too. Whatever the
        # run leaves there is read back without following anything.
        ws.make_dir(gitops.PLATFORM_DIR)
        for path in (junit_path, check.report_path if check is not None else None):
            if path is not None and len(path.parts) > 1:
                ws.make_dir("/".join(path.parts[:-1]))
        base_env, base_mounts = prepared if prepared is not None else (self.env, self.mounts)
        env, mounts = base_env, base_mounts
        facts = dict(facts)
        if spec.protect.witness == "auto":
            ws.make_dir(STREAMS_REL)
            witness = WitnessRun.prepare(self.sandbox, settings.data_dir, ws.path, base_env)
            env, mounts = {**base_env, **witness.env}, [*base_mounts, witness.mount]
            facts["witness_expected"] = expects_witness(command)
            if not tag:
                self.facts["witness_expected"] = facts["witness_expected"]
        self.heartbeat()
        run = await self.sandbox.run(command, workspace=ws.path, limits=limits, env=env, mounts=mounts)
        self.heartbeat()
        rep = run.report(TAIL_BYTES).model_copy(
            # evidence hook: what the run was given, signed in the item's evidence bundle (crewwork/attestation)
            update={
                "workspace_disk": ws.disk_enforcement,
                "spec": sandbox_spec(self.sandbox, limits, base_mounts),
            }
        )
        refs["log_ref"] = await self.save(
            f"{tag}validation.log",
            b"$ " + " ".join(command).encode() + b"\n" + run.stdout + b"\n--- stderr ---\n" + run.stderr,
        )
        report, refused, cut = None, None, None
        if junit_path is not None:
            bound = (
                "MAX_REPORT_BYTES" if MAX_REPORT_BYTES <= settings.max_artifact_bytes else "CREWWORK_MAX_ARTIFACT_BYTES"
            )
            report, refused, cut = await asyncio.to_thread(
                read_report_bounded,
                ws.path,
                junit_path,
                min(MAX_REPORT_BYTES, settings.max_artifact_bytes),
                bound=bound,
            )
        if report is not None:
            refs["report_ref"] = await self.save(f"{tag}junit.xml", report, "application/xml")
        cuts = [cut] if cut is not None else []
        if spec.protect.witness == "auto":
            streams = await asyncio.to_thread(read_streams, ws.path)
            facts["witness_streams"] = streams.streams
            facts["witness_refused"] = streams.refused
            if not tag:
                self.facts["witness_streams"] = streams.streams
                self.facts["witness_refused"] = streams.refused
            if streams.cut is not None:
                cuts.append(streams.cut)
            if streams.streams:
                refs["witness_ref"] = await self.save(
                    f"{tag}witness.jsonl",
                    b"".join(streams.streams[k] for k in sorted(streams.streams)),
                    "application/x-ndjson",
                )
        evidence = ValidationEvidence.from_sandbox(
            rep,
            **facts,
            report=report,
            report_refused=refused,
            cuts=cuts,
            stdout_cut=stdout_cut(run.stdout, run.truncated, TAIL_BYTES, limits.max_log_bytes),
            # With a configured report path a missing report is not evidence of anything: it fails.
            report_format="junit" if junit_path else None,
            report_path=str(junit_path) if junit_path is not None else None,
            preview_spec=preview_spec,
        )
        return evidence, rep, refs

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

    def scan_stage(self, diff: bytes) -> ScanStage | None:
        """Scanners hook: the work item's security scanners (docs/scanners.md), None when it asks for none."""
        spec = self.inp.validation.scanners
        if spec is None:
            return None
        return ScanStage(
            spec=spec,
            sandbox=self.sandbox,
            limits=self.limits,
            ws=self.ws,
            base=self.base,
            final=self.final,
            diff=diff,
            data_dir=self.ports.settings.data_dir,
            env=self.env,
            mounts=self.mounts,
        )

    async def with_scan(self, scan: ScanStage, verdict: Verdict) -> Verdict:
        """The custom scanners (after the tests), the SARIF evidence log kept, and the findings in the evidence."""
        self.heartbeat()
        await scan.after_tests()
        self.heartbeat()
        self.extra["scan_ref"] = await scan.save_log(self.save)
        evidence, report = verdict
        evidence = evidence.model_copy(
            update={
                "scan": scan.outcome(),
                "scan_required": scan.spec.required,
                "cuts": [*evidence.cuts, *scan.cuts],
            }
        )
        return evidence, report

    def judge(self, evidence: ValidationEvidence, sandbox_report: SandboxReport | None = None) -> ValidationOutcome:
        """Grade the evidence (a pure function) and say what the next attempt needs to know when it failed."""
        inp = self.inp
        checks: list[CheckResult] = self.extra.get("checks") or []
        verdict = with_checks(grade(evidence), checks)
        diagnostics = None
        if not verdict.passed:
            diagnostics = build_diagnostics(
                verdict, evidence, inp.attempt, inp.diff_stats, review_comment=inp.review_comment
            )
            more = checks_diagnostics(checks)
            diagnostics = f"{diagnostics}\n\n{more}" if more else diagnostics
        preview: PreviewRun | None = self.extra.get("preview")
        return verdict.to_outcome(
            preview=preview.outcome(verdict.preview) if preview is not None else None,
            sandbox=sandbox_report,
            log_ref=self.extra.get("log_ref"),
            report_ref=self.extra.get("report_ref"),
            witness_ref=self.extra.get("witness_ref"),
            diagnostics=diagnostics,
            protected_reset=self.extra.get("protected_reset"),
            extra_runs=self.extra.get("extra_runs"),
        ).model_copy(update={"scan": evidence.scan, "scan_ref": self.extra.get("scan_ref"), "checks": checks})
