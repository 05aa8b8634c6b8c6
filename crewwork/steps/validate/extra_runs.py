"""The validate step's extra runs (validation.baseline, docs/lifecycle.md): the same command on the base tree, cached
per tenant, repository, base commit and definition in the store, and reruns of the change's tree for flaky tests,
each in a fresh workspace with the validation's sandbox, limits and prepared environment. What they showed goes into
the evidence (crewwork.validation.baseline); grading compares (crewwork.validation.comparison)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from crewwork.models import ArtifactRef, ExtraRun, SandboxReport
from crewwork.steps.execution import make_workspace
from crewwork.validation.baseline import (
    MAX_BASELINE_SHOWN,
    MAX_FLAKE_CANDIDATES,
    BaselineEvidence,
    RunFacts,
    compare,
    definition_key,
)
from crewwork.validation.grading import Cause, ValidationEvidence, run_facts
from crewwork.workspace.gitops import Tree
from crewwork.workspace.tree import WorkspaceError

if TYPE_CHECKING:
    from crewwork.sandbox.base import Sandbox, SandboxLimits
    from crewwork.steps.attempt import AttemptWriter
    from crewwork.steps.ports import Ports
    from crewwork.steps.validate import ValidateInput
    from crewwork.workspace.tree import Workspace

Verdict = tuple[ValidationEvidence, SandboxReport | None]
"""The evidence a validation ended with, and the sandbox report of the run that produced it (if one ran)."""


class Validation(Protocol):
    """What the extra runs use of a validation in progress (crewwork.steps.validate.activity.Validation): named
    here, not imported, so that the activity can import this module without a cycle."""

    ports: Ports
    inp: ValidateInput
    w: AttemptWriter
    facts: dict[str, Any]
    extra: dict[str, Any]
    sandbox: Sandbox
    limits: SandboxLimits
    ws: Workspace
    base: Tree
    final: Tree
    mirror: Any

    def heartbeat(self) -> None: ...

    @property
    def setup_commands(self) -> list[list[str]]: ...

    async def repository_key(self) -> str: ...

    async def run_in(
        self, ws: Workspace, tag: str, facts: dict[str, Any], *, preview_spec: Any = None
    ) -> tuple[ValidationEvidence, SandboxReport, dict[str, ArtifactRef]]: ...


async def against_base(v: Validation, evidence: ValidationEvidence, rep: SandboxReport | None) -> Verdict:
    """Where the item asks (validation.baseline) and the change's run has failing tests, without test lists:
    the same command on the base tree (or its cached result) and up to `flaky_reruns` reruns of the change's
    tree, as evidence for grading (crewwork.validation.baseline)."""
    spec, inp = v.inp.validation, v.inp
    if spec.baseline == "off" or spec.fail_to_pass or spec.pass_to_pass:
        return evidence, rep
    after = await asyncio.to_thread(run_facts, evidence, "the change's run")
    if after.cause != Cause.test_failure.value or not after.usable:
        # Passed, or not judged by its tests at all (a cap, a cut, a doubt): nothing to compare.
        return evidence, rep
    base, runs = await baseline_run(v)
    reruns: list[RunFacts] = []
    candidates = set(after.failing) - set(base.failing if base.usable else ())
    if base.usable and candidates and len(candidates) <= MAX_FLAKE_CANDIDATES:
        seen_passing: set[str] = set()
        for i in range(1, spec.flaky_reruns + 1):
            ev, _, refs = await extra_run(v, v.final, f"rerun-{i}", v.facts)
            facts = await asyncio.to_thread(run_facts, ev, f"rerun {i}", candidates)
            reruns.append(facts)
            runs.append(extra_run_record(facts, refs))
            if facts.usable:
                seen_passing |= set(facts.passed)
            if candidates <= seen_passing:
                break  # every candidate passed once: more runs cannot change what they are
    v.extra["extra_runs"] = runs
    baseline = BaselineEvidence(
        mode=spec.baseline,  # type: ignore[arg-type]
        base_commit=inp.base_commit,
        cached=runs[0].cached,
        base=base,
        reruns=reruns,
    )
    cmp = compare(set(after.failing), set(), baseline)
    if cmp.flaky_runs:
        await v.ports.store.record_flaky(
            inp.tenant_id,
            await v.repository_key(),
            {t: cmp.flaky_runs[t] for t in cmp.flaky[:MAX_BASELINE_SHOWN]},
            work_item_id=inp.work_item_id,
            attempt=inp.attempt,
        )
    return evidence.model_copy(update={"baseline": baseline}), rep


async def baseline_run(v: Validation) -> tuple[RunFacts, list[ExtraRun]]:
    """The command's result on the base tree: from the store when this tenant already ran it on this repository,
    base commit and definition; else run now, and kept when usable."""
    inp, store = v.inp, v.ports.store
    repository, key = await v.repository_key(), definition_key(definition(v))
    cached = await store.get_baseline(inp.tenant_id, repository, inp.base_commit, key)
    if cached is not None:
        facts = RunFacts.model_validate(cached["facts"])
        return facts, [
            ExtraRun(
                label="baseline",
                cause=facts.cause,
                usable=facts.usable,
                cached=True,
                cached_from=cached.get("ran_by"),
            )
        ]
    # The base tree as the change's run would see it with no change: platform paths stripped, nothing reset.
    base_facts = {
        **v.facts,
        "runner_reach": [],
        "runner_reach_total": 0,
        "weakened": [],
        "changed_paths": [],
        "protected_reset": [],
    }
    ev, _, refs = await extra_run(v, v.base, "baseline", base_facts)
    facts = await asyncio.to_thread(run_facts, ev, "baseline")
    if facts.usable:
        await store.put_baseline(
            inp.tenant_id,
            repository,
            inp.base_commit,
            key,
            {"facts": facts.model_dump(), "ran_by": f"{inp.work_item_id} attempt {inp.attempt}"},
        )
    return facts, [extra_run_record(facts, refs)]


def definition(v: Validation) -> dict[str, Any]:
    """What a baseline depends on besides tenant, repository and base commit."""
    spec, inp = v.inp.validation, v.inp
    return {
        "command": spec.command,
        "setup": v.setup_commands,
        "junit_path": str(spec.junit_path) if spec.junit_path is not None else None,
        "timeout_s": spec.timeout_s,
        "witness": spec.protect.witness,
        "environment": inp.environment.model_dump(mode="json") if inp.environment is not None else None,
        "sandbox": {**inp.sandbox.model_dump(mode="json"), **v.sandbox.runner()},
    }


def extra_run_record(facts: RunFacts, refs: dict[str, ArtifactRef]) -> ExtraRun:
    return ExtraRun(
        label=facts.label,
        cause=facts.cause,
        usable=facts.usable,
        log_ref=refs.get("log_ref"),
        report_ref=refs.get("report_ref"),
    )


async def extra_run(
    v: Validation, tree: Tree, tag: str, facts: dict[str, Any]
) -> tuple[ValidationEvidence, SandboxReport | None, dict[str, ArtifactRef]]:
    """One more run of the command on `tree` in a fresh workspace (same sandbox, limits, prepared environment),
    removed afterwards."""
    ws = await fresh_workspace(v, tag)
    try:
        try:
            # The change's blobs are in the validation's own workspace's git directory.
            await ws.write_entries(tree, source=v.ws.git)
        except WorkspaceError as exc:
            return ValidationEvidence(**{**facts, "disk_limited": True, "stderr_tail": str(exc)[-4000:]}), None, {}
        return await v.run_in(ws, f"{tag}-", facts)
    finally:
        await ws.remove()


async def fresh_workspace(v: Validation, tag: str) -> Workspace:
    """A new, empty workspace on the base commit beside the validation's own, named with `tag` (the caller writes a
    tree into it and removes it)."""
    inp = v.inp
    v.heartbeat()
    return await make_workspace(
        v.ports,
        v.mirror.gitdir,
        inp.work_item_id,
        f"validate-{inp.attempt}-s{inp.step}a{v.w.rank.attempt}-{tag}",
        inp.base_commit,
        v.limits,
        materialise=False,
    )
