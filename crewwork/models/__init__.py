"""Domain models: the work item as submitted, its states, and the values workflows and activities exchange.

This file is the package's face: the names other layers import as `crewwork.models.X`, defined in

    spec.py     the submission (`WorkItemSpec` and its parts), kinds, states and submission bounds
    matrix.py   the named checks a validation declares besides its tests (`CheckSpec`)
    values.py   what workflows and activities exchange (terms, outcomes, evidence, status, result)
    review.py   a reviewer's decision, its line comments and the record the workflow keeps of it
    preview.py  the preview and acceptance probes a work item declares
    search.py   the Temporal search attributes a work item's workflow carries
    ids.py      identifiers (time-ordered, prefixed)
    errors.py   agent failure classes and the refusal to capture a change
    limits.py   budgets and the same-cause breaker (pure; workflow code imports it)

Everything is a pydantic model, so Temporal's pydantic data converter can carry it and a submission is validated
field by field (unknown fields are rejected) before any workflow starts.
"""

from __future__ import annotations

from crewwork.models.matrix import CheckEnvironment, CheckSpec
from crewwork.models.review import LineComment, ReviewRecord
from crewwork.models.spec import (
    MAX_INPUT_JSON_BYTES,
    MAX_INSTRUCTION_CHARS,
    MAX_LABELS,
    MAX_PROTECT_PATTERNS,
    MAX_TEST_FILES,
    MAX_VALIDATION_ARGS,
    TERMINAL_STATES,
    AgentSpec,
    BudgetSpec,
    EnvironmentSpec,
    ProtectSpec,
    PullRequestSpec,
    RepoSpec,
    ReviewSpec,
    SandboxSpec,
    Strict,
    TenantRef,
    ValidationSpec,
    WorkItemKind,
    WorkItemSpec,
    WorkItemState,
)
from crewwork.models.values import (
    AdmissionTerms,
    AgentOutcome,
    ArtifactRef,
    AttemptSummary,
    CheckResult,
    DiffStats,
    EvidenceCut,
    ExtraRun,
    LoopCarry,
    PreviewOutcome,
    ProbeResult,
    ResetPath,
    ReviewDecision,
    SandboxReport,
    TestCaseResult,
    ValidationOutcome,
    WorkItemInput,
    WorkItemResult,
    WorkItemStatus,
)

__all__ = [
    "MAX_INPUT_JSON_BYTES",
    "MAX_INSTRUCTION_CHARS",
    "MAX_LABELS",
    "MAX_PROTECT_PATTERNS",
    "MAX_TEST_FILES",
    "MAX_VALIDATION_ARGS",
    "TERMINAL_STATES",
    "AdmissionTerms",
    "AgentOutcome",
    "AgentSpec",
    "ArtifactRef",
    "AttemptSummary",
    "BudgetSpec",
    "CheckEnvironment",
    "CheckResult",
    "CheckSpec",
    "DiffStats",
    "EnvironmentSpec",
    "EvidenceCut",
    "ExtraRun",
    "LineComment",
    "LoopCarry",
    "PreviewOutcome",
    "ProbeResult",
    "ProtectSpec",
    "PullRequestSpec",
    "RepoSpec",
    "ResetPath",
    "ReviewDecision",
    "ReviewRecord",
    "ReviewSpec",
    "SandboxReport",
    "SandboxSpec",
    "Strict",
    "TenantRef",
    "TestCaseResult",
    "ValidationOutcome",
    "ValidationSpec",
    "WorkItemInput",
    "WorkItemKind",
    "WorkItemResult",
    "WorkItemSpec",
    "WorkItemState",
    "WorkItemStatus",
]
