"""The validate step's named checks (validation.checks, docs/checks.md): each in a fresh workspace holding the
change's tree (protected paths put back, report paths cleared, as for the tests), in a fresh sandbox with the
validation's limits, in the work item's prepared environment or its own (`environment`: another interpreter or
dependency set, prepared once per tenant, repository, base commit and definition like any other), at most
`validation.check_parallel` at once, beside the tests. Each is graded by `crewwork.validation.check_grading.grade_check`;
its log and report are artifacts.

Why inside the validate activity and not one activity each: every write an activity makes to the item is fenced by
the rank of its step, in the order Temporal scheduled them (docs/reliability.md); parallel activities of one item
would each hold a rank and refuse each other's writes. One step, one rank, the checks in parallel inside it, and a
heartbeat that covers them all."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from crewwork.models import CheckResult, CheckSpec
from crewwork.models.matrix import MAX_CHECK_FINDINGS
from crewwork.sandbox.envplan import PreparedEnv, SetupFailed
from crewwork.steps.execution import read_report_bounded
from crewwork.steps.validate import extra_runs
from crewwork.steps.validate.contract import check_environment
from crewwork.validation.baseline import definition_key
from crewwork.validation.check_grading import (
    CheckBase,
    CheckEvidence,
    against_base,
    base_facts,
    check_result,
    grade_check,
)
from crewwork.validation.grading import ValidationEvidence
from crewwork.validation.scanners.sarif import MAX_SARIF_BYTES
from crewwork.validation.verdicts import Cause
from crewwork.workspace.tree import WorkspaceError

if TYPE_CHECKING:
    from pathlib import Path

    from crewwork.models import ArtifactRef, EnvironmentSpec, SandboxReport
    from crewwork.sandbox.base import Mount
    from crewwork.sandbox.prepare import PreparedEnvCache
    from crewwork.workspace.tree import Workspace


class Validation(extra_runs.Validation, Protocol):
    """What the checks use of a validation in progress (crewwork.steps.validate.activity.Validation), named here
    so that the activity imports this module without a cycle."""

    def prepared_cache(self) -> PreparedEnvCache: ...

    async def prepared_env(
        self, environment: EnvironmentSpec | None, setup: list[list[str]], source: Path, cache: PreparedEnvCache
    ) -> PreparedEnv: ...

    async def save(self, name: str, data: bytes, ctype: str = "text/plain") -> ArtifactRef: ...

    async def run_in(
        self,
        ws: Workspace,
        tag: str,
        facts: dict[str, Any],
        *,
        preview_spec: Any = None,
        check: CheckSpec | None = None,
        prepared: tuple[dict[str, str], list[Mount]] | None = None,
    ) -> tuple[ValidationEvidence, SandboxReport, dict[str, ArtifactRef]]: ...


async def together(*coros: Coroutine[Any, Any, Any]) -> list[Any]:
    """Run `coros` at once and return their results; the first error cancels the others and is raised as itself.

    A task group raises an ExceptionGroup; the activity's errors must reach Temporal as they are (a non-retryable
    `bad input`, a stale attempt stopping itself), or they would be retried as unknown errors."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]
    except BaseExceptionGroup as eg:
        first: BaseException = eg
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [t.result() for t in tasks]


async def run_checks(v: Validation) -> list[CheckResult]:
    """Every declared check of this attempt, `check_parallel` at a time; their results in declaration order."""
    spec = v.inp.validation
    gate = asyncio.Semaphore(spec.check_parallel)

    async def one(check: CheckSpec) -> CheckResult:
        async with gate:
            return await run_check(v, check)

    # Not gather: one check's error cancels the others (and their sandboxes) instead of leaving them running.
    return await together(*(one(c) for c in spec.checks))


async def run_check(v: Validation, check: CheckSpec) -> CheckResult:
    inp = v.inp
    tag = f"check-{check.name}-"
    facts: dict[str, Any] = {
        **v.facts,
        # The lists name the tests; a check is judged by its own report and exit code.
        "fail_to_pass": [],
        "pass_to_pass": [],
        "runner_reach": [],
        "runner_reach_total": 0,
    }
    ws = await extra_runs.fresh_workspace(v, tag)
    prepared: PreparedEnv | None = None
    try:
        own = check.environment is not None
        try:
            # A check of its own environment is set up on the base content, then the change goes in.
            await ws.write_entries(v.base if own else v.final, source=v.ws.git)
            if own:
                environment = check_environment(check, inp.environment)
                setup = [*(environment.setup if environment else []), *inp.validation.setup]
                cache = v.prepared_cache()
                try:
                    prepared = await v.prepared_env(environment, setup, ws.path, cache)
                except SetupFailed as exc:
                    return await failed_setup(v, check, tag, exc)
                await ws.update(v.base, v.final, source=v.ws.git)
        except WorkspaceError as exc:
            evidence = ValidationEvidence(**{**facts, "disk_limited": True, "stderr_tail": str(exc)[-4000:]})
            ce = CheckEvidence(spec=check, run=evidence)
            return check_result(ce, await asyncio.to_thread(grade_check, ce))
        on = (prepared.env(), prepared.mounts()) if prepared is not None else None
        ce, rep, refs = await run_on(v, check, ws, tag, facts, on)
        verdict = await asyncio.to_thread(grade_check, ce)
        pre: list[str] = []
        note = None
        mode = inp.validation.baseline
        if mode != "off" and not verdict.passed and verdict.cause in (Cause.check_failed, Cause.test_failure):
            base = await check_baseline(v, check, tag, on)
            verdict, pre, note = against_base(check, verdict, base, mode)
        return check_result(
            ce,
            verdict,
            log_ref=refs.get("log_ref"),
            report_ref=refs.get("report_ref"),
            duration_s=rep.duration_s,
            pre_existing=pre[:MAX_CHECK_FINDINGS],
            baseline=note,
        )
    finally:
        if prepared is not None:
            prepared.release()
        await ws.remove()


async def run_on(
    v: Validation,
    check: CheckSpec,
    ws: Workspace,
    tag: str,
    facts: dict[str, Any],
    on: tuple[dict[str, str], list[Mount]] | None,
) -> tuple[CheckEvidence, SandboxReport, dict[str, ArtifactRef]]:
    """The check's run in `ws` (written already), and its SARIF log read back without trusting it."""
    evidence, rep, refs = await v.run_in(ws, tag, facts, check=check, prepared=on)
    sarif, refused, cut = None, None, None
    if check.report == "sarif" and check.report_path is not None:
        limit = min(MAX_SARIF_BYTES, v.ports.settings.max_artifact_bytes)
        sarif, refused, cut = await asyncio.to_thread(
            read_report_bounded, ws.path, check.report_path, limit, bound="MAX_SARIF_BYTES"
        )
        if sarif is not None:
            refs["report_ref"] = await v.save(f"{tag}report.sarif", sarif, "application/sarif+json")
    return CheckEvidence(spec=check, run=evidence, sarif=sarif, sarif_refused=refused, sarif_cut=cut), rep, refs


async def check_baseline(
    v: Validation, check: CheckSpec, tag: str, on: tuple[dict[str, str], list[Mount]] | None
) -> CheckBase:
    """The check's result on the base commit: from the store when this tenant already ran this check (same
    definition, environment and sandbox) on this repository and base commit; else run now on the base tree, in a
    fresh workspace with the same environment, and kept when usable (validation.baseline)."""
    inp, store = v.inp, v.ports.store
    repository = await v.repository_key()
    key = definition_key(
        {
            "kind": "check",
            "check": check.model_dump(mode="json"),
            "setup": inp.validation.setup,
            "witness": inp.validation.protect.witness,
            "environment": inp.environment.model_dump(mode="json") if inp.environment is not None else None,
            "sandbox": {**inp.sandbox.model_dump(mode="json"), **v.sandbox.runner()},
        }
    )
    cached = await store.get_baseline(inp.tenant_id, repository, inp.base_commit, key)
    if cached is not None:
        return CheckBase.model_validate(cached["check"])
    facts = {
        **v.facts,
        "fail_to_pass": [],
        "pass_to_pass": [],
        "runner_reach": [],
        "runner_reach_total": 0,
        "weakened": [],
        "changed_paths": [],
        "protected_reset": [],
    }
    ws = await extra_runs.fresh_workspace(v, f"{tag}baseline")
    try:
        try:
            await ws.write_entries(v.base, source=v.ws.git)
        except WorkspaceError:
            return CheckBase(usable=False, passed=False, cause="disk")
        ce, _, _ = await run_on(v, check, ws, f"{tag}baseline-", facts, on)
    finally:
        await ws.remove()
    base = base_facts(check, await asyncio.to_thread(grade_check, ce))
    if base.usable:
        ran_by = f"{inp.work_item_id} attempt {inp.attempt}"
        await store.put_baseline(
            inp.tenant_id, repository, inp.base_commit, key, {"check": base.model_dump(), "ran_by": ran_by}
        )
    return base


async def failed_setup(v: Validation, check: CheckSpec, tag: str, exc: SetupFailed) -> CheckResult:
    """The check's own environment could not be set up: its setup's exit code says why; the check never ran."""
    setup = exc.results[-1]
    log = await v.save(f"{tag}setup.log", exc.log or (setup.stdout + b"\n--- stderr ---\n" + setup.stderr))
    evidence = ValidationEvidence(
        **{**v.facts, "fail_to_pass": [], "pass_to_pass": []},
        setup_exit_code=setup.exit_code if setup.exit_code not in (None, 0) else 1,
        stderr_tail=setup.stderr.decode("utf-8", "replace")[-4000:],
    )
    ce = CheckEvidence(spec=check, run=evidence)
    return check_result(ce, grade_check(ce), log_ref=log)
