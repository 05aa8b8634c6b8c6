"""The body of `validate_change`: apply the attempt's diff in the host's private git directory, put protected
paths back, prepare the environment, run the command in a fresh sandbox, read the report without following
anything, and grade the evidence (crewwork/validation)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

from crewwork import gitops
from crewwork.activities.common import AttemptWriter, artifact_bytes
from crewwork.activities.execute_base import MAX_REPORT_BYTES, StepBase, pick_sandbox, read_report, sandbox_limits
from crewwork.evidence.sandbox_spec import sandbox_spec
from crewwork.models import (
    EnvironmentSpec,
    ValidationOutcome,
)
from crewwork.preview.run import PreviewRun, run_preview
from crewwork.repos.environment import EnvironmentRejected, setup_plan
from crewwork.sandbox.base import Mount
from crewwork.sandbox.prepare import CacheOwner, PreparedEnv, PreparedEnvCache, SetupFailed
from crewwork.steps.errors import bad_input
from crewwork.steps.validate import ValidateInput
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.grading import ValidationEvidence, grade
from crewwork.validation.protect import Protection, apply_protection, strip_platform
from crewwork.workspace import WorkspaceError


class ValidateStep(StepBase):
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
        prepared: PreparedEnv | None = None
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
            mounts: list[Mount] = []
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
                            await self.store.tenant_ref(inp.tenant_id),
                            exposed=self.repos.credentials.exposed,
                            redact=self.repos.redact,
                        )
                    except EnvironmentRejected as exc:
                        raise bad_input(str(exc)) from exc
                    setup_limits = dataclasses.replace(limits, timeout_s=environment.setup_timeout_s)
                cache = PreparedEnvCache(
                    self.settings.data_dir.resolve() / "prepared", disk_mb=self.settings.sandbox.prepare_disk_cap_mb()
                )
                registration = await self.store.find_repository(inp.tenant_id, inp.repo_path)
                owner = CacheOwner(
                    tenant_id=inp.tenant_id,
                    repository=registration.id if registration is not None else f"unregistered:{inp.repo_path}",
                )
                try:
                    prepared = await cache.get_or_prepare(
                        owner=owner,
                        sandbox=sandbox,
                        repo=inp.repo_path,
                        base_commit=inp.base_commit,
                        setup=setup_commands,
                        source=ws.path,
                        limits=setup_limits,
                        plan=plan,
                        # Kept from eviction while the tests below run on it (released in `finally`).
                        hold=True,
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
                    setup_report = setup.report(4000).model_copy(update={"workspace_disk": cache.disk_enforcement})
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
            run = await sandbox.run(spec.command, workspace=ws.path, limits=limits, env=run_env, mounts=mounts)
            heartbeat()
            rep = run.report(8000).model_copy(
                # evidence hook: what the run was given, signed in the item's evidence bundle (crewwork/evidence)
                update={"workspace_disk": ws.disk_enforcement, "spec": sandbox_spec(sandbox, limits, mounts)}
            )
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
                preview_spec=spec.preview,
            )
            if spec.preview is not None and grade(evidence.model_copy(update={"preview_spec": None})).passed:
                # Preview hook: the one call into crewwork/preview, once the tests passed, in this workspace, with
                # this sandbox, its limits and prepared environment (docs/preview.md).
                preview = await run_preview(
                    spec.preview,
                    sandbox=sandbox,
                    workspace=ws.path,
                    limits=limits,
                    env=run_env,
                    mounts=mounts,
                    settings=self.settings.sandbox,
                    scratch=self.settings.data_dir.resolve() / "preview",
                    save=lambda name, data, ctype: self._save(inp.work_item_id, inp.tenant_id, name, data, ctype),
                    prefix=f"attempt-{inp.attempt}",
                    heartbeat=heartbeat,
                )
                outcome_extra["preview"] = preview
                evidence = evidence.model_copy(update={"preview": preview.evidence})
            return self._judge(inp, evidence, outcome_extra, sandbox_report=rep)
        finally:
            if prepared is not None:
                prepared.release()
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
        preview: PreviewRun | None = extra.get("preview")
        return verdict.to_outcome(
            preview=preview.outcome(verdict.preview) if preview is not None else None,
            sandbox=sandbox_report,
            log_ref=extra.get("log_ref"),
            report_ref=extra.get("report_ref"),
            diagnostics=diagnostics,
            protected_reset=extra.get("protected_reset"),
        )
