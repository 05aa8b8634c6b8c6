"""The baseline and the flakes: what the same validation command showed on the base commit (the tree without the
change), and on reruns of the change's own tree, reduced to the facts grading compares (issue 45, items 2 and 3).

The validate step (crewwork/steps/validate/activity.py) runs these only when the work item asks
(`validation.baseline`, docs/lifecycle.md) and the change's run has failing tests; each run is graded by the same
pure `grade` first, and only a run graded `passed` or `test_failure` (complete, believed, nothing decisive cut) is
*usable*. An unusable run is kept as evidence and never used: a baseline cut by a bound cannot excuse a failure, and
a rerun cut by a bound cannot make a test flaky.

`compare` is pure: which of the change's failing tests were failing at the base too (`pre_existing`), which the
change broke (`regressions`), which failing base tests now pass (`fixed`), and which changed outcome between runs of
the same tree (`flaky`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from crewwork.models.spec import MAX_FLAKY_RERUNS

__all__ = ["MAX_FLAKY_RERUNS", "BaselineEvidence", "Comparison", "RunFacts", "compare", "definition_key"]

MAX_BASELINE_FAILING = 5_000
"""Failing tests a baseline may record; a base commit with more is not used (its list would be cut)."""
MAX_FLAKE_CANDIDATES = 200
"""Failing tests the change's tree is re-run for; with more, nothing is re-run and they all count as regressions."""
MAX_BASELINE_SHOWN = 100
"""Pre-existing, flaky and fixed tests a verdict names, each (it travels through Temporal beside the failing tests;
its reason counts them all). The repository's flaky list records the flaky ones named."""

Usable = Literal["passed", "test_failure"]


class RunFacts(BaseModel):
    """One extra run of the validation command, as grading uses it: whether it can be used, and its failing tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str = Field(description="`baseline` or `rerun N` (of the change's tree).")
    usable: bool = Field(description="Graded `passed` or `test_failure`: complete and believed.")
    cause: str = Field(description="The run's own grading cause.")
    reason: str = Field(default="", description="The run's own grading reason (why it is not usable, if not).")
    executed: int = Field(default=0, description="Tests that ran.")
    failing: list[str] = Field(
        default_factory=list, description="Sorted ids of failed or errored tests, at most MAX_BASELINE_FAILING."
    )
    passed: list[str] = Field(
        default_factory=list,
        description="Reruns only: the candidate tests (failing in the change's run) that passed in this run.",
    )


class BaselineEvidence(BaseModel):
    """The baseline run on the base commit and the reruns of the change's tree, as the validate step gathered them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["compare", "block"] = Field(description="validation.baseline.")
    base_commit: str
    cached: bool = Field(
        default=False,
        description="The baseline came from the cache (same tenant, repository, "
        "base commit, environment and command definition).",
    )
    base: RunFacts
    reruns: list[RunFacts] = Field(default_factory=list, description="Reruns of the change's tree, in order.")


@dataclass(frozen=True)
class Comparison:
    """The change's failing tests, sorted into what the baseline and the reruns say about them."""

    pre_existing: list[str]
    regressions: list[str]
    flaky: list[str]
    fixed: list[str]
    flaky_runs: dict[str, str]
    """test id -> one line saying in which runs it failed and passed."""


def usable_baseline(ev: BaselineEvidence | None) -> BaselineEvidence | None:
    return ev if ev is not None and ev.base.usable else None


def compare(failing: set[str], passing: set[str], ev: BaselineEvidence) -> Comparison:
    """Sort the change's `failing` tests (and its `passing` ones, for `fixed`) by the baseline and the reruns. Only
    usable runs count: a flaky test is one that failed in the change's run and passed in a usable rerun."""
    base_failing = set(ev.base.failing) if ev.base.usable else set()
    flaky_runs: dict[str, str] = {}
    for test_id in sorted(failing):
        passed_in = [r.label for r in ev.reruns if r.usable and test_id in r.passed]
        if passed_in:
            failed_in = ["the change's run"] + [r.label for r in ev.reruns if r.usable and test_id in r.failing]
            flaky_runs[test_id] = f"{test_id}: failed in {', '.join(failed_in)}; passed in {', '.join(passed_in)}"
    flaky = sorted(flaky_runs)
    rest = failing - set(flaky)
    return Comparison(
        pre_existing=sorted(rest & base_failing),
        regressions=sorted(rest - base_failing),
        flaky=flaky,
        fixed=sorted(base_failing & passing),
        flaky_runs=flaky_runs,
    )


def definition_key(definition: dict[str, Any]) -> str:
    """A stable key of what a baseline depends on besides tenant, repository and base commit: the command, its
    setup, report path, timeout and witness, the environment and the sandbox it ran in."""
    blob = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
