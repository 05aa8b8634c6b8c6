"""The work item as submitted: `WorkItemSpec` and its parts (repository, environment, validation, protection,
agent, budget, review, sandbox), its kinds and states, and the bounds a submission is checked against.

Strict: unknown fields are errors, so a submission is validated field by field before any workflow starts."""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from crewwork.boundary.paths import PathPattern, RelPath, ReportPath
from crewwork.boundary.urls import RepoURLError, parse_repo_url
from crewwork.models.ids import is_tenant_id
from crewwork.models.matrix import MAX_CHECK_PARALLEL, MAX_CHECKS, CheckSpec
from crewwork.models.preview import PreviewSpec
from crewwork.models.scan import ScannersSpec

# Hard ceilings on what a submission may carry. Large content belongs in the repository or the artifact store.
MAX_INSTRUCTION_CHARS = 20_000
MAX_INPUT_JSON_BYTES = 256 * 1024
MAX_LABELS = 32
MAX_VALIDATION_ARGS = 64


class Strict(BaseModel):
    """Base for submitted documents: unknown fields are errors, not silently dropped, and a number field holds a
    finite number (NaN and infinity cannot be stored as JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TenantRef(BaseModel):
    """A tenant as an operator's scopes name it: by id (`tn_…`) or by name (`crewwork keys create --tenant NAME`)."""

    model_config = ConfigDict(frozen=True)
    id: str
    name: str | None = None

    @property
    def scope_name(self) -> str | None:
        """The name scopes may match: None when the tenant has none, or when it has the shape of a tenant id (a
        tenant an older release let `crewwork keys create --tenant tn_…` create): an entry shaped like an id means
        that id and nothing else."""
        return self.name if self.name is not None and not is_tenant_id(self.name) else None

    def in_scope(self, tenants: list[str] | None) -> bool:
        """Whether an operator scope (`"tenants": [...]` of a credential or a setup secret; None: every tenant)
        admits this tenant."""
        return tenants is None or self.id in tenants or (self.scope_name is not None and self.scope_name in tenants)


class WorkItemKind(enum.StrEnum):
    task = "task"
    code_change = "code_change"
    hotfix = "hotfix"
    pr_review = "pr_review"
    """An agent's review of a pull request (docs/forge.md): it reads the pull request's head in its sandbox and writes
    its review as data; the platform posts it once, as a comment review. Nothing is validated, reviewed or landed."""


class WorkItemState(enum.StrEnum):
    submitted = "submitted"
    queued = "queued"
    """Waiting for a place under the tenant's in-flight limit (first come, first served)."""
    admitted = "admitted"
    running = "running"
    validating = "validating"
    awaiting_review = "awaiting_review"
    landing = "landing"
    succeeded = "succeeded"
    failed = "failed"
    rejected = "rejected"
    cancelled = "cancelled"
    dead = "dead"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {
        WorkItemState.succeeded,
        WorkItemState.failed,
        WorkItemState.rejected,
        WorkItemState.cancelled,
        WorkItemState.dead,
    }
)


class PullRequestSpec(Strict):
    """Open a pull request for the landed branch on the repository's forge (configured by the operator)."""

    draft: bool | None = Field(default=None, description="Open it as a draft (default: the forge's setting).")
    base: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Branch the pull request targets (default: `repo.ref` when it is a branch, else the forge's "
        "default branch).",
    )
    title: str | None = Field(default=None, max_length=256, description="Title (default: the instruction).")
    body: str | None = Field(
        default=None,
        max_length=2000,
        description="A paragraph the body starts with, e.g. `Fixes #12` to link the issue (forge intake sets it).",
    )

    @field_validator("base")
    @classmethod
    def _base_is_plain(cls, v: str | None) -> str | None:
        if v is not None:
            _check_ref_name(v)
        return v


class RepoSpec(Strict):
    """One of the tenant's registered repositories (docs/repositories.md), by `id` or by `url`. As stored and run,
    both are set: the registered repository's id and URL, and the ref (the repository's default ref if unset)."""

    id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
        description="The id of a repository the tenant registered (POST /v1/repositories).",
    )
    url: str | None = Field(
        default=None,
        description="The git repository: https://, http://, ssh:// or scp-style (git@host:path), git://, file:// "
        "or a local path, equal (once normalised) to one the tenant registered. Never credentials: the operator "
        "holds them (docs/repositories.md).",
        min_length=1,
        max_length=4096,
    )
    ref: str | None = Field(
        default=None,
        description="Branch, tag or commit to start from (default: the repository's default ref).",
        min_length=1,
        max_length=256,
    )
    pull_request: PullRequestSpec | None = Field(
        default=None, description="Also open a pull request for the landed branch (needs a configured forge)."
    )

    @field_validator("url")
    @classmethod
    def _url_grammar(cls, v: str | None) -> str | None:
        if v is None or _is_local_path(v):
            # Local paths are resolved and checked by the service at submission; this validator also runs when a
            # workflow decodes its input, so it must not touch the filesystem.
            return v
        try:
            return parse_repo_url(v).url
        except RepoURLError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("ref")
    @classmethod
    def _ref_is_plain(cls, v: str | None) -> str | None:
        return None if v is None else _check_ref_name(v)

    @model_validator(mode="after")
    def _names_one(self) -> RepoSpec:
        if self.id is None and self.url is None:
            raise ValueError("`repo` needs `id` (a registered repository) or `url`")
        return self


def _is_local_path(v: str) -> bool:
    """A local repository (a path or a file:// URL; not scp-style `host:path`), checked at submission."""
    if v.startswith("-") or any(c in v for c in "\x00\n\r"):
        return False
    if v.startswith("/") or v.lower().startswith("file:"):
        return True
    return "://" not in v and ":" not in v.split("/", 1)[0]


def _check_ref_name(v: str) -> str:
    if v.startswith("-") or (any(c in v for c in " \t\n\r\x00~^:?*[\\") and v != "HEAD") or ".." in v:
        raise ValueError(f"ref {v!r} is not a valid git ref name")
    return v


class EnvironmentSpec(Strict):
    """A repository's own environment: prepared once per base commit, then used by every validation run.

    With `python` set, crewwork first creates a virtual environment `$CREWWORK_ENV/venv` from that interpreter
    (inside the sandbox) and puts its `bin` first on PATH for the setup commands and for validation, so the tests
    run with the repository's interpreter and packages, never crewwork's."""

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Sandbox image for setup and validation (docker/gvisor backends; the operator lists allowed ones).",
    )
    python: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Interpreter the environment's venv is created from, as seen inside the sandbox "
        "(e.g. `python3`, `/usr/bin/python3.11`). None: no venv.",
    )
    setup: list[list[str]] = Field(
        default_factory=list,
        max_length=32,
        description="Setup commands (argv lists), run once per base commit in the environment, cwd the checkout.",
    )
    network: bool = Field(
        default=False,
        description="Setup may reach the operator's setup allowlist (CREWWORK_SETUP_NETWORK_ALLOWLIST) through "
        "crewwork's allowlisting proxy. Agents and validation never have network.",
    )
    secrets: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Names of operator setup secrets (CREWWORK_SETUP_SECRETS) the setup commands see as "
        "environment variables. Never given to agents or validation.",
    )
    setup_timeout_s: float = Field(default=600.0, gt=0, le=3600, description="Wall-clock limit of one setup command.")

    @field_validator("setup")
    @classmethod
    def _commands(cls, v: list[list[str]]) -> list[list[str]]:
        for i, argv in enumerate(v):
            if not argv or not argv[0].strip():
                raise ValueError(f"environment.setup[{i}] must name a program")
            if len(argv) > MAX_VALIDATION_ARGS:
                raise ValueError(f"environment.setup[{i}] has more than {MAX_VALIDATION_ARGS} arguments")
        return v


MAX_TEST_FILES = 256
MAX_FLAKY_RERUNS = 5  # crewwork.validation.baseline.MAX_FLAKY_RERUNS
MAX_PROTECT_PATTERNS = 64


class ProtectSpec(Strict):
    """Widen or narrow the protected test infrastructure (see docs/lifecycle.md and crewwork.validation.protect)."""

    paths: list[PathPattern] = Field(
        default_factory=list,
        max_length=MAX_PROTECT_PATTERNS,
        description="More paths to restore to the base commit before validation: exact paths, `dir/` for a whole "
        "directory, or fnmatch patterns over the repository-relative path (`*` also matches `/`).",
    )
    exclude: list[PathPattern] = Field(
        default_factory=list,
        max_length=MAX_PROTECT_PATTERNS,
        description="Default protections to lift for these paths (e.g. `setup.cfg` for a change that must edit "
        "it). Never lifts `test_files` or `paths`.",
    )
    defaults: bool = Field(
        default=True,
        description="Protect the default test infrastructure (conftest.py, pytest/tox configuration, pytest "
        "plugins the repository ships, runner shadows, bytecode). False keeps only `test_files` and `paths`.",
    )
    witness: Literal["auto", "off"] = Field(
        default="auto",
        description="`auto`: when the command runs pytest, load crewwork's outcome witness into it and doubt any "
        "report it disagrees with (a missing witness record is a doubt too). `off`: no witness (for a runner that "
        "starts pytest in a cleaned environment, such as tox), so a report rewritten from inside the test process "
        "goes undetected.",
    )
    runner_code: Literal["suspect", "allow"] = Field(
        default="suspect",
        description="`suspect`: a change that adds code reaching into the test runner (pytest hooks, `_pytest`, "
        "report objects, ...) is `suspected_tampering`. `allow`: such lines are only shown in the evidence (for a "
        "repository that is itself a pytest plugin).",
    )


class ValidationSpec(Strict):
    command: list[str] = Field(
        description="argv of the test command, run in a fresh sandbox at the workspace root.",
        min_length=1,
        max_length=MAX_VALIDATION_ARGS,
    )
    timeout_s: float = Field(default=300.0, gt=0, le=3600, description="Wall-clock limit of one validation run.")
    junit_path: ReportPath | None = Field(
        default=None,
        description="Workspace-relative path of a JUnit XML report the command writes (parsed as evidence); "
        "usually under `.crewwork/`. Must stay inside the workspace and outside `.git`.",
    )
    fail_to_pass: list[str] = Field(default_factory=list, description="Test ids that must pass after the change.")
    pass_to_pass: list[str] = Field(default_factory=list, description="Test ids that must keep passing.")
    test_files: list[RelPath] = Field(
        default_factory=list,
        max_length=MAX_TEST_FILES,
        description="Workspace-relative test files (or directories) restored to the base commit before validation; "
        "ones the change created are removed.",
    )
    protect: ProtectSpec = Field(default_factory=ProtectSpec, description="Widen or narrow the protected set.")
    setup: list[list[str]] = Field(default_factory=list, description="Setup commands (argv lists) run first.")
    preview: PreviewSpec | None = Field(
        default=None,
        description="After the tests pass, start the changed app in the sandbox and run these HTTP probes and "
        "browser flows against it; the change passes only if every probe does (docs/preview.md).",
    )
    scanners: ScannersSpec | None = Field(
        default=None,
        description="Security scanners run in the sandbox with no network before the tests: secrets, Python static "
        "analysis and dependency changes the change introduces, and SARIF scanners of your own (docs/scanners.md). "
        "Absent: none run.",
    )
    baseline: Literal["off", "compare", "block"] = Field(
        default="off",
        description="When the change's run has failing tests (and no fail_to_pass/pass_to_pass lists are given), "
        "run the same command on the base commit (cached per tenant, repository, base commit, environment and "
        "command) and re-run the change's tree for flaky tests. `compare`: a test failing at the base too is "
        "pre-existing and does not block, a flaky one neither passes nor fails; `block`: pre-existing failures "
        "still block (but are named); `off`: neither runs (docs/lifecycle.md).",
    )
    flaky_reruns: int = Field(
        default=2,
        ge=0,
        le=MAX_FLAKY_RERUNS,
        description="With a baseline: times the change's tree is re-run at most when tests fail that pass at the "
        "base; a test that passes in one of them is flaky.",
    )
    checks: list[CheckSpec] = Field(
        default_factory=list,
        max_length=MAX_CHECKS,
        description="Named checks besides the tests (lint, type-check, another environment's tests, any command): "
        "each runs in its own fresh sandbox on the change's tree and is graded on its own; a required one failing "
        "fails the attempt (cause `check_failed`). Empty: the tests alone judge, as before (docs/checks.md).",
    )
    check_parallel: int = Field(
        default=2,
        ge=1,
        le=MAX_CHECK_PARALLEL,
        description="Checks of one attempt that run at once (each in its own sandbox, with the item's limits), "
        "besides the tests.",
    )

    @field_validator("checks")
    @classmethod
    def _distinct_checks(cls, v: list[CheckSpec], info: ValidationInfo) -> list[CheckSpec]:
        names = [c.name for c in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"check names must be distinct: {', '.join(dup)} repeated")
        junit = info.data.get("junit_path")
        paths = [str(c.report_path) for c in v if c.report_path is not None] + ([str(junit)] if junit else [])
        if len(set(paths)) != len(paths):
            raise ValueError("each check needs its own report_path, not another check's or validation.junit_path")
        return v

    @field_validator("command")
    @classmethod
    def _non_empty_args(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("validation.command[0] must name a program")
        if any("\x00" in a for a in v):
            raise ValueError("validation.command arguments must not contain NUL bytes")
        if any(ord(c) < 0x20 for c in v[0]):
            raise ValueError("validation.command[0] must not contain control characters")
        return v


class AgentSpec(Strict):
    name: str = Field(default="scripted", min_length=1, max_length=64, description="Registered agent plugin name.")
    config: dict[str, Any] = Field(default_factory=dict, description="Agent-specific configuration.")


class BudgetSpec(Strict):
    max_attempts: int = Field(default=3, ge=1, le=1000, description="Attempts (agent run + validation) at most.")
    max_wall_clock_s: float | None = Field(default=None, gt=0, description="Total wall-clock seconds for attempts.")
    max_tokens: int | None = Field(default=None, gt=0, description="Model tokens across all attempts.")
    max_cost_usd: float | None = Field(default=None, gt=0, description="Model cost across all attempts.")


class ReviewSpec(Strict):
    required: bool | None = Field(
        default=None,
        description="Wait for a person to approve before landing. Unset: the operator's default, "
        "CREWWORK_REVIEW_REQUIRED_DEFAULT (true unless changed: code changes wait for review), filled in at "
        "submission; a `task` never waits.",
    )
    timeout_s: float | None = Field(default=None, gt=0, description="End the item if nobody reviews in time.")


class SandboxSpec(Strict):
    backend: str | None = Field(default=None, description="Sandbox backend; the pool default when omitted.")
    memory_mb: int | None = Field(default=None, gt=0)
    pids: int | None = Field(default=None, gt=0)
    cpus: float | None = Field(default=None, gt=0)
    disk_mb: int | None = Field(
        default=None, gt=0, description="Size of each workspace's disk in MiB (operator maximum applies)."
    )


class WorkItemSpec(Strict):
    """A work item exactly as a client submits it (JSON)."""

    kind: WorkItemKind
    input: dict[str, Any] | None = Field(default=None, description="Input payload of a `task`.")
    repo: RepoSpec | None = None
    instruction: str | None = Field(default=None, max_length=MAX_INSTRUCTION_CHARS)
    validation: ValidationSpec | None = None
    agent: AgentSpec = Field(default_factory=AgentSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    review: ReviewSpec = Field(default_factory=ReviewSpec)
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    environment: EnvironmentSpec | None = Field(
        default=None, description="The repository's environment for validation (overrides the repository's own)."
    )
    target_branch: str | None = Field(
        default=None, max_length=256, description="Branch the change is meant for (workspace lease key)."
    )
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _bounded_labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels")
        for k, val in v.items():
            if not k or len(k) > 63 or len(val) > 256:
                raise ValueError("label keys are 1-63 characters and values at most 256")
        return v

    @model_validator(mode="after")
    def _kind_rules(self) -> WorkItemSpec:
        if self.kind == WorkItemKind.task:
            if self.input is None:
                raise ValueError("a `task` work item needs `input` (an object, may be empty)")
            import json

            if len(json.dumps(self.input)) > MAX_INPUT_JSON_BYTES:
                raise ValueError(f"`input` is larger than {MAX_INPUT_JSON_BYTES} bytes as JSON")
        else:
            if self.repo is None:
                raise ValueError(f"a `{self.kind.value}` work item needs `repo`")
            if not self.instruction:
                raise ValueError(f"a `{self.kind.value}` work item needs `instruction`")
            if self.validation is None and self.kind != WorkItemKind.pr_review:
                raise ValueError(f"a `{self.kind.value}` work item needs `validation`")
        return self
