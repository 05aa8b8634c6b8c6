"""What a bundle states, as plain values: gathered from the store (gather.py) or made by tests, then turned into
statements by the pure functions of statements.py. Text in here that a tenant, an agent or code under test
controls (the submission, test ids, the reviewer's words) is data: it is signed as what was recorded, never
interpreted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FileFact:
    """A file a statement names by digest, and its bytes (embedded in the bundle up to the configured bound)."""

    name: str
    data: bytes
    media_type: str
    artifact_id: str | None = None


@dataclass(frozen=True)
class TestFact:
    __test__ = False  # not a pytest class
    id: str
    outcome: str  # passed | failed | error | skipped


@dataclass(frozen=True)
class AttemptFact:
    number: int
    verdict: str
    cause: str | None
    reason: str = ""


@dataclass(frozen=True)
class ReviewFact:
    required: bool
    decision: str | None = None
    """approve | reject | request_changes; None when no review was required."""
    reviewer: str | None = None
    """The name the reviewer gave (their own words)."""
    api_key_id: str | None = None
    """The API key the decision came through (set by the API, never by the client)."""
    comment: str | None = None
    decided_at: float | None = None
    diff_sha256: str | None = None
    """The SHA-256 of the diff the reviewer decided on (the landed attempt's diff artifact)."""
    line_comments: tuple[dict[str, Any], ...] = ()
    """The approval's line comments: {path, line, side, body}."""
    history: tuple[dict[str, Any], ...] = ()
    """The item's earlier decisions (requests for changes on earlier attempts), oldest first, as recorded
    (`review_decided` events): {decision, attempt, reviewer, apiKey, comment, decidedAt, lineComments}."""


@dataclass(frozen=True)
class LandedFact:
    commit: str
    tree: str
    tree_sha256: str
    parent: str
    branch: str
    committed_at: float


@dataclass(frozen=True)
class Facts:
    work_item_id: str
    tenant_id: str
    kind: str
    workflow_id: str
    submission: dict[str, Any]
    repo: str
    ref: str | None
    base_commit: str
    created_at: float
    attempt: int
    attempt_finished_at: float
    passed: bool
    cause: str
    reason: str
    exit_code: int | None
    tests: list[TestFact]
    tests_executed: int
    agent: dict[str, Any]
    """name, mock, selected_because, tokens_used, cost_usd: what ran (never its claims)."""
    diff: FileFact
    sandbox: FileFact
    environment: FileFact
    validation: FileFact
    report: FileFact | None = None
    transcripts: list[FileFact] = field(default_factory=list)
    """Probe transcripts (preview HTTP and browser probes), where the work item has probes."""
    attempts: list[AttemptFact] = field(default_factory=list)
    review: ReviewFact | None = None
    landed: LandedFact | None = None
    test_counts: dict[str, int] | None = None
    """Tests per outcome (passed, failed, error, skipped) over the whole report, when there is one: `tests` may
    list fewer (the statement lists ids within a bound; the report, a subject, names every test)."""
    """Set for a landed change's bundle; None for one attempt's."""

    @property
    def mock(self) -> bool:
        return bool(self.agent.get("mock"))

    def files(self) -> list[FileFact]:
        out = [self.diff, self.validation, self.sandbox, self.environment]
        if self.report is not None:
            out.append(self.report)
        return [*out, *self.transcripts]
