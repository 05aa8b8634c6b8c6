"""`Settings`: the runtime configuration, entirely from environment variables (prefix `CREWWORK_`): the one reader of them.

Every knob has its unit in its name and a description; `crewwork config` prints them all, the nested sections
included (`api`: the API process's own options, `mcp`: CREWWORK_MCP_*, `codeintel`: CREWWORK_CODEINTEL_*,
`evidence`: CREWWORK_EVIDENCE_*, `sandbox`: CREWWORK_SANDBOX_*, each in a module of this package; the repositories' credentials, forges and setup secrets in crewwork/config/repos.py). The package imports no code that acts on the
settings, so every process can read them cheaply. Code is handed the settings it needs; `get_settings()` is for a
process's entry point. Defaults are the embedded single-host setup: SQLite in the data directory and the Temporal dev
server on localhost. tests/unit/test_config_surface.py fails when the code names a CREWWORK_* variable that is not a
field here.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from crewwork.boundary.outbound import parse_networks
from crewwork.config.api import ApiOptions
from crewwork.config.attestation import EvidenceSettings
from crewwork.config.codeintel import CodeIntelSettings
from crewwork.config.gateway import GatewaySettings
from crewwork.config.mcp import McpSettings
from crewwork.config.operations import DeploymentSettings, RetentionSettings, SweepSettings
from crewwork.config.repos import ForgeConfig, RepoCredential, SetupSecret
from crewwork.config.sandbox import SandboxSettings
from crewwork.config.tenant_policy import TenantPolicy
from crewwork.models import EnvironmentSpec
from crewwork.models.ids import is_tenant_id
from crewwork.models.limits import OperatorCeilings

DEFAULT_DATA_DIR = Path(".crewwork")
T = TypeVar("T")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CREWWORK_", extra="forbid", populate_by_name=True)

    data_dir: Path = Field(
        default=DEFAULT_DATA_DIR,
        description="Directory for the embedded SQLite store, the Temporal dev-server file, worktrees and logs.",
    )
    database_url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy async URL of the store, e.g. postgresql+asyncpg://user@host/db. "
            "Default: sqlite+aiosqlite in the data directory."
        ),
    )
    db_pool_size: int = Field(
        default=20,
        ge=1,
        description=(
            "The most PostgreSQL connections one process holds: opened as needed, then kept (a transaction waits for "
            "a free one, up to 30 s, rather than opening and closing an extra connection)."
        ),
    )
    store_unavailable_wait_s: float = Field(
        default=60.0,
        ge=0,
        description="Worker pools: how long a store call waits for PostgreSQL to accept connections again (restart, "
        "failover) before failing into its activity's retry policy. 0: fail at once.",
    )
    store_server_writes: bool = Field(
        default=True,
        description="PostgreSQL: each fenced write is one call of the server-side function crewwork_fenced_write "
        "(migration 0008), one round trip instead of one per statement. false: the Python path (what SQLite always "
        "runs; the same statements in the same order), for comparison.",
    )
    store_driver_writes: bool = Field(
        default=True,
        description="PostgreSQL: the server-side fenced write is sent straight on the pooled connection's asyncpg "
        "driver instead of through SQLAlchemy's execution layers (~0.25 ms less CPU per write for the caller). "
        "false: through SQLAlchemy, for comparison.",
    )
    temporal_address: str = Field(default="127.0.0.1:7233", description="host:port of the Temporal frontend.")
    temporal_namespace: str = Field(default="default", description="Temporal namespace.")
    temporal_ui_url: str = Field(
        default="http://127.0.0.1:8233", description="Base URL of the Temporal Web UI, for links."
    )
    temporal_tls: bool = Field(default=False, description="Connect to Temporal with TLS.")
    temporal_tls_cert_path: Path | None = Field(default=None, description="Client certificate (mTLS), PEM.")
    temporal_tls_key_path: Path | None = Field(default=None, description="Client private key (mTLS), PEM.")
    temporal_tls_ca_path: Path | None = Field(default=None, description="CA bundle for the server, PEM.")
    temporal_api_key: str | None = Field(default=None, description="API key for Temporal Cloud.")
    task_queue_prefix: str = Field(default="crewwork", description="Task queues are PREFIX-control|agent|validate.")
    api_host: str = Field(default="127.0.0.1", description="Address the API binds to.")
    api_port: int = Field(default=8080, description="Port the API binds to.")
    api_forwarded_allow_ips: str = Field(
        default="",
        description="Comma-separated addresses (or networks, or `*`) of the reverse proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto the API believes: the client address (rate limits, failed-authentication blocks) is then "
        "the one they forward. Empty: none, the TCP peer is the client (a client on the API host cannot pick its own "
        "address by sending the header).",
    )
    api_url: str = Field(default="http://127.0.0.1:8080", description="Where the CLI finds the API.")
    api_key: str | None = Field(default=None, description="Bearer key the CLI sends to the API.")
    api_auth_failure_rate_per_s: float = Field(
        default=0.5,
        gt=0,
        description="Failed authentications (wrong, revoked or malformed API key) per second each client address "
        "may make, shared by all API processes; over it: 429 with Retry-After, without looking the key up.",
    )
    api_auth_failure_burst: int = Field(
        default=30, ge=1, description="Failed authentications a client address may make in a burst."
    )
    repo_roots: str = Field(
        default="",
        description=(
            "Colon-separated directories that submitted repository paths must lie under. "
            "Empty: any absolute path (single-user development)."
        ),
    )
    tenant_repo_roots: dict[str, list[Path]] = Field(
        default={},
        description="Repository roots per tenant (JSON: tenant name or id -> directories): the only places that "
        "tenant may register local repositories. A tenant not listed gets CREWWORK_REPO_ROOTS, and none at all "
        "when this is set and CREWWORK_REPO_ROOTS is empty. Paths are resolved (symlinks, /proc) before the check, "
        "and a repository whose git directory sends git elsewhere (alternates, a `gitdir:`/`commondir` redirect, a "
        "symlink out of it) is refused (docs/repositories.md).",
    )
    max_repositories_per_tenant: int = Field(
        default=200,
        ge=1,
        description="Repositories one tenant may register (each is a row and a remote check); more is a 409.",
    )
    auto_register_repos: bool = Field(
        default=False,
        description="Register a repository for the submitting tenant on first use when its work item names an "
        "unregistered URL (same checks as POST /v1/repositories). Development, demo and tests only: `crewwork "
        "dev` and the demo turn it on; off, a work item must name a repository its tenant registered.",
    )
    worktree_dir: Path | None = Field(default=None, description="Where attempt workspaces go (default DATA/worktrees).")
    sandbox: SandboxSettings = Field(
        default_factory=SandboxSettings,
        description="Sandbox backend, image, default and maximum caps (section; variables CREWWORK_SANDBOX_*).",
    )
    api: ApiOptions = Field(
        default_factory=ApiOptions,
        description="Options of an API process: rate limits, event streams, webhook delivery (section).",
    )
    evidence: EvidenceSettings = Field(
        default_factory=EvidenceSettings,
        description="Signed evidence bundles: the signing key, published keys, notes (section; variables "
        "CREWWORK_EVIDENCE_*; docs/evidence.md).",
    )
    mcp: McpSettings = Field(
        default_factory=McpSettings,
        description="The MCP endpoint at /mcp: hosts, origins, answer bounds (section; variables CREWWORK_MCP_*).",
    )
    codeintel: CodeIntelSettings = Field(
        default_factory=CodeIntelSettings,
        description="Repository maps: index cache, parse bounds, the model agent's map budget (section; variables "
        "CREWWORK_CODEINTEL_*).",
    )
    gateway: GatewaySettings = Field(
        default_factory=GatewaySettings,
        description="The model gateway agents reach their model through: its port in the sandbox, request and answer "
        "bounds, call limits, the tenant call rate, the transcript's size (section; variables CREWWORK_GATEWAY_*; "
        "docs/gateway.md).",
    )
    deployment: DeploymentSettings = Field(
        default_factory=DeploymentSettings,
        description="Worker Versioning: this process's build and deployment (section; variables "
        "CREWWORK_DEPLOYMENT_*; docs/operations.md).",
    )
    retention: RetentionSettings = Field(
        default_factory=RetentionSettings,
        description="Retention of ended items and storage by content (section; variables CREWWORK_RETENTION_*).",
    )
    sweep: SweepSettings = Field(
        default_factory=SweepSettings,
        description="The per-host sweep of dead attempts' workspaces and locks (section; CREWWORK_SWEEP_*).",
    )
    allow_unsafe_sandbox: bool = Field(
        default=False, description="Permit the `local` backend (no isolation). Development only."
    )
    max_attempts_ceiling: int = Field(default=100, ge=1, description="Operator ceiling on budget.max_attempts.")
    max_wall_clock_s_ceiling: float = Field(default=6 * 3600, gt=0, description="Ceiling on budget wall clock.")
    max_tokens_ceiling: int = Field(default=5_000_000, gt=0, description="Ceiling on budget.max_tokens.")
    max_cost_usd_ceiling: float = Field(default=100.0, gt=0, description="Ceiling on budget.max_cost_usd.")
    max_review_timeout_s_ceiling: float = Field(
        default=30 * 86400, gt=0, description="Ceiling on review.timeout_s; also the deadline where none is set."
    )
    review_required_default: bool = Field(
        default=True,
        description="review.required of code_change and hotfix work items that leave it out: true, a person "
        "approves every change before it lands; false, validated changes land unreviewed unless the submission "
        "asks for review. A submission may still set it either way; per tenant: CREWWORK_TENANT_POLICIES. Hotfix "
        "reports (POST /v1/hotfix) wait for review unless they say otherwise.",
    )
    review_names: bool = Field(
        default=True,
        description="Whether a review decision may carry a reviewer name (`reviewer`, the reviewer's own words, shown "
        "beside the API key the decision came through, in the landed commit's Reviewed-by trailer and the signed "
        "evidence). false: a decision with a name is refused (422) and decisions are known by their key alone.",
    )
    # ---------------------------------------------------------------- operator policy (crewwork/admission/policy.py)
    policy_agents: str = Field(
        default="*",
        description="Agents work items may name: `*` every plugin CREWWORK_AGENT_PLUGINS allows, else "
        "comma-separated names. The production compose leaves out `scripted` (a mock).",
    )
    policy_sandbox_backends: str = Field(
        default="gvisor,docker,bwrap",
        description="Sandbox backends `sandbox.backend` may name (comma-separated); `local` only with "
        "CREWWORK_ALLOW_UNSAFE_SANDBOX as well. Omitted, the pool's default backend is used.",
    )
    test_faults: bool = Field(
        default=False,
        description="Accept the scripted agent's fault-injection keys (`crash`, `stall_s`, `fail`, "
        "`on_activity_attempt`). Test suites and benchmarks only: without it they are refused at submission and "
        "ignored by the agent.",
    )
    tenant_policies: dict[str, TenantPolicy] = Field(
        default={},
        description="Per-tenant policy overrides (JSON: tenant name or id -> {agents, sandbox_backends, "
        "max_memory_mb, max_cpus, max_pids, max_disk_mb, max_timeout_s, max_attempts, max_wall_clock_s, "
        "max_tokens, max_cost_usd, max_review_timeout_s, review_required_default, model_calls_per_minute}); unset fields keep the deployment's "
        "value.",
    )
    tenant_max_in_flight: int = Field(
        default=20,
        ge=1,
        description="Work items one tenant may have admitted at once (running, validating, landing); more wait "
        "in `queued`, first come first served.",
    )
    tenant_max_queued: int = Field(
        default=1000,
        ge=1,
        description="Work items one tenant may have waiting for a place (`queued`, or stored and not yet admitted); a "
        "submission past it is refused with 429 `queue_full` and nothing is stored. Submissions racing each other "
        "may pass it by at most their number; items reviewers send back re-enter the queue whatever its length.",
    )
    admit_at_submission: bool = Field(
        default=True,
        description="The API decides admission in the submission's request: an admitted item's workflow starts "
        "admitted, and a queued item's workflow starts only when a freed place is handed to it (queued items are in "
        "the API and the console, not in the Temporal Web UI, until then). false: every workflow starts at once and "
        "runs its own admission (queued workflows wait in Temporal), as before 2026-12-04.",
    )
    fairness_keys: bool = Field(
        default=False,
        description="Start each work item's workflow with Temporal's task-queue fairness key set to its tenant "
        "(Priority(fairness_key=tenant)), inherited by its activities: a tenant's backlog on a shared task queue is "
        "dispatched round-robin with the others' instead of first come first served. Needs the server's "
        "`matching.enableFairness` dynamic config; the in-flight limit still applies. Measured in bench/flood.py "
        "--fairness (docs/performance.md).",
    )
    eager_start: bool = Field(
        default=True,
        description="Start work-item workflows with Temporal's eager workflow start: when the starting process also "
        "runs a worker on the control task queue with a free workflow-task slot (a control pool handing a freed place "
        "to a queued item), the server returns the new workflow's first task in the start's reply, to that worker, "
        "instead of through matching and a poll. Elsewhere (the API) it is a plain start. Needs the server's "
        "`system.enableEagerWorkflowStart` (on in the dev server); a server without it starts the workflow as usual.",
    )
    reconcile_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="Control pools: seconds between the reconciler's passes, which end the store's record of items "
        "whose workflow was terminated, timed out or failed without recording it (crewwork/admission/reconcile.py). 0: off.",
    )
    reconcile_batch: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Open items the reconciler checks per pass (one Temporal describe each); the next pass goes on "
        "where this one stopped.",
    )
    reconcile_min_age_s: float = Field(
        default=300.0,
        ge=0,
        description="The reconciler leaves items younger than this alone (their workflow may still be starting).",
    )
    max_artifact_bytes: int = Field(default=16 * 1024 * 1024, gt=0, description="Largest artifact stored.")
    lease_ttl_s: float = Field(default=60.0, gt=0, description="Lease lifetime; heartbeats renew it.")
    control_concurrency: int = Field(default=100, ge=1, description="Max concurrent activities, control pool.")
    agent_concurrency: int = Field(default=2, ge=1, description="Max concurrent activities, agent pool.")
    validate_concurrency: int = Field(default=2, ge=1, description="Max concurrent activities, validate pool.")
    agent_poll_ahead: bool = Field(
        default=True,
        description="An agent slot polls for its next task as soon as its agent returns, while the attempt still "
        "writes its result and reports completion (never more than agent_concurrency agents at once; up to as many "
        "more attempts finishing their writes).",
    )
    agent_isolation: Literal["process", "inline"] = Field(
        default="process",
        description="Where agent code runs: `process` (a persistent child process per agent slot, killed and "
        "replaced when its attempt is cancelled or times out, so blocking code cannot hold a slot) or `inline` (in "
        "the pool's process; only for trusted agents). Agents marked `runs_inline` (the model agent) run inline.",
    )
    pool_restart_healthy_s: float = Field(
        default=60.0,
        gt=0,
        description="`crewwork dev`/`demo` supervisor: a pool process that has run this many seconds is healthy, "
        "and its restart back-off starts again from the shortest delay at its next exit.",
    )
    workflow_sandbox: Literal["full", "passthrough", "off"] = Field(
        default="off",
        description="Temporal's workflow sandbox in the control pool: `full`, `passthrough` (crewwork's modules "
        "passed through) or `off` (see docs/architecture.md, 'The workflow sandbox').",
    )
    workflow_task_pollers: int = Field(
        default=10,
        ge=2,
        description="Concurrent workflow-task polls of a control-pool process (half for new work items, half sticky).",
    )
    agent_plugins: str = Field(
        default="*",
        description="Agent plugins (entry points `crewwork.agents`) that may be used: `*` every installed one, "
        "empty none, else comma-separated names. Install plugins on the API and the agent pool.",
    )
    log_level: str = Field(default="INFO", description="Python log level.")
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="The event loop of the API and the pools: `uvloop` (libuv, with the httptools HTTP parser in the "
        "API), `asyncio` (the standard library's loop and the pure-Python h11 parser), `auto` uvloop where it is "
        "installed (it is a dependency on Linux and macOS). See docs/performance.md for what it saves.",
    )
    search_attributes: bool = Field(
        default=True,
        description="Set crewwork's custom search attributes on work-item workflows (register them first: "
        "`crewwork dev` does; see docs/operations.md). False on a namespace without them.",
    )
    metrics_port: int | None = Field(
        default=None, description="Serve this process's Prometheus metrics at http://0.0.0.0:PORT/metrics."
    )
    metrics_store_refresh_s: float = Field(
        default=15.0,
        ge=0,
        description="API /metrics: the store's projections (work items by state, attempts, events, outbox) are "
        "queried at most this often, however often Prometheus scrapes.",
    )
    temporal_metrics_port: int | None = Field(
        default=None, description="Serve the Temporal SDK runtime's metrics on this port (differs from the above)."
    )
    model_endpoints: str = Field(
        default="",
        description="Operator model endpoints (JSON object by name, or a full transport config; docs/agents.md). "
        "Handed to the model agent (crewwork.agents.base.OperatorAgentSettings), which parses it "
        "(crewwork.transport.config.operator_config); set it on the API processes too, which check submissions "
        "against it.",
    )
    command_agents: str = Field(
        default="",
        description="CLIs the command agent may run (JSON; docs/agents.md). Handed to the command agent "
        "(crewwork.agents.base.OperatorAgentSettings), which parses it (CommandAgentsSettings.parse).",
    )
    command_agent_enabled: bool = Field(
        default=True,
        description="Whether the command agent may run at all; false: a work item asking for it runs the built-in "
        "model agent instead (docs/agents.md).",
    )
    delegated_runner: str = Field(
        default="",
        description="The command (a name in CREWWORK_COMMAND_AGENTS) that runs a code change whose work item names the "
        "`model` agent: the delegated runner is then the default, with the model agent as the fallback where the kill "
        "switch (CREWWORK_COMMAND_AGENT_ENABLED) or the command's eligibility says no. Empty: items run the agent they "
        "name (docs/agents.md).",
    )
    outbound_allow_networks: str = Field(
        default="",
        description="Comma-separated CIDRs a tenant-named URL (a webhook) may reach although they are not public "
        "(loopback, private, link-local, ...); empty: public addresses only. Checked at registration and at "
        'every delivery, connecting to the checked address (docs/operations.md, "Outbound requests").',
    )
    # ---------------------------------------------------------------- repositories (docs/repositories.md)
    repo_schemes: str = Field(
        default="https,http,ssh,git,file",
        description="Comma-separated URL schemes submissions may use for repo.url (`file` covers local paths).",
    )
    repo_allow_networks: str = Field(
        default="",
        description="Comma-separated CIDRs a repository remote (https, http, ssh, git) may be reached at although "
        "they are not public (loopback, private, link-local, ...); empty: public addresses only. Checked at "
        "registration, at submission and before every fetch, ls-remote and push, connecting to the checked address "
        '(docs/repositories.md, "Addresses"). Separate from CREWWORK_OUTBOUND_ALLOW_NETWORKS: allowing an internal '
        "git server should not let webhooks reach it. Local paths are governed by the repository roots instead.",
    )
    repo_check_timeout_s: float = Field(
        default=20.0, gt=0, description="Timeout of the submission-time check that the remote and its ref exist."
    )
    git_timeout_s: float = Field(default=600.0, gt=0, description="Timeout of one network git command (fetch, push).")
    git_memory_mb: int = Field(
        default=2048,
        ge=64,
        description="Memory (heap and private writable mappings, RLIMIT_DATA) of any host git process: fetches into a "
        "mirror, applying a diff, capturing a change, landing. Past it git fails (out of memory), the host does not "
        "(docs/bounds.md).",
    )
    git_query_memory_mb: int = Field(
        default=512,
        ge=64,
        description="Memory (RLIMIT_DATA) of a git process answering a tenant's question (MCP search_code, read_file, "
        "git_log/show/diff, a repository map's blob reads); one that needs more fails with a clear error.",
    )
    git_query_threads: int = Field(
        default=2,
        ge=1,
        le=32,
        description="Threads one git process answering a tenant may use (grep.threads, pack.threads): at most this "
        "many cores per search.",
    )
    mirror_dir: Path | None = Field(
        default=None, description="Where this host keeps its bare mirror per repository (default DATA/mirrors)."
    )
    mirror_max_bytes: int = Field(
        default=20 * 1024**3,
        gt=0,
        description="Bytes the mirror cache may hold; least-recently-used mirrors without worktrees go first.",
    )
    mirror_fsck: bool = Field(
        default=True, description="Check every fetched object (transfer.fsckObjects): malformed trees are refused."
    )
    repo_credentials: dict[str, RepoCredential] = Field(
        default={},
        description="Operator-held git credentials by name (JSON): each names its secret file and the URL prefixes "
        "it may be sent to.",
    )
    ssh_known_hosts: Path | None = Field(
        default=None, description="known_hosts file host-side ssh checks servers against (strict checking)."
    )
    forges: list[ForgeConfig] = Field(
        default=[], description="Forges whose REST API opens pull requests for landed branches (JSON)."
    )
    repo_environments: dict[str, EnvironmentSpec] = Field(
        default={},
        description="Default environment per repository (JSON, keyed by normalised URL); a work item's "
        "`environment` overrides it.",
    )
    environment_images: str = Field(
        default="",
        description="Comma-separated sandbox images `environment.image` may name (besides the default image).",
    )
    setup_network_allowlist: str = Field(
        default="",
        description="Comma-separated host:port (or *.domain:port) a setup with `network: true` may reach through "
        "the allowlisting proxy, e.g. pypi.org:443,files.pythonhosted.org:443. Empty: setup has no network.",
    )
    setup_secrets: dict[str, SetupSecret] = Field(
        default={}, description="Operator secrets setup commands may name (JSON: name -> file, env var)."
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log lines on stderr: `text` (one plain line per record) or `json` (one JSON object per line, "
        "with work item, workflow and trace ids). Secrets are masked in both.",
    )
    # OpenTelemetry: the standard variables (no CREWWORK_ prefix), read here only to decide whether tracing is on;
    # the SDK reads them (and every other OTEL_* variable) itself. See crewwork/observability/tracing.py.
    otel_sdk_disabled: bool = Field(
        default=False, validation_alias="OTEL_SDK_DISABLED", description="OpenTelemetry: `true` turns tracing off."
    )
    otel_traces_exporter: str | None = Field(
        default=None,
        validation_alias="OTEL_TRACES_EXPORTER",
        description="OpenTelemetry trace exporters (`otlp`, `console`, `none`); set (or an OTLP endpoint) turns "
        "tracing on.",
    )
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="OpenTelemetry OTLP endpoint; set alone, it turns tracing on with the `otlp` exporter.",
    )
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        description="OpenTelemetry OTLP endpoint for traces only; like OTEL_EXPORTER_OTLP_ENDPOINT.",
    )
    otel_service_name: str | None = Field(
        default=None,
        validation_alias="OTEL_SERVICE_NAME",
        description="OpenTelemetry service name (default: crewwork-api, crewwork-worker-POOL).",
    )

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'crewwork.db').resolve()}"

    def resolved_worktree_dir(self) -> Path:
        return (self.worktree_dir or self.data_dir / "worktrees").resolve()

    @field_validator("outbound_allow_networks", "repo_allow_networks")
    @classmethod
    def _networks(cls, v: str) -> str:
        parse_networks(v)  # a bad entry is a startup error naming it, not a silently closed allowlist
        return v

    def resolved_codeintel_dir(self) -> Path:
        return (self.codeintel.cache_dir or self.data_dir / "codeintel").resolve()

    def resolved_mirror_dir(self) -> Path:
        return (self.mirror_dir or self.data_dir / "mirrors").resolve()

    def repo_scheme_set(self) -> set[str]:
        return {s.strip().lower() for s in self.repo_schemes.split(",") if s.strip()}

    def environment_image_set(self) -> set[str]:
        return {s.strip() for s in self.environment_images.split(",") if s.strip()}

    def setup_allowlist(self) -> list[str]:
        return [s.strip().lower() for s in self.setup_network_allowlist.split(",") if s.strip()]

    def task_queue(self, pool: str) -> str:
        return f"{self.task_queue_prefix}-{pool}"

    def operator_ceilings(self) -> OperatorCeilings:
        return OperatorCeilings(
            max_attempts=self.max_attempts_ceiling,
            max_wall_clock_s=self.max_wall_clock_s_ceiling,
            max_tokens=self.max_tokens_ceiling,
            max_cost_usd=self.max_cost_usd_ceiling,
        )

    def repo_root_list(self) -> list[Path]:
        return [Path(p).resolve() for p in self.repo_roots.split(":") if p.strip()]

    def tenant_setting(self, mapping: dict[str, T], tenant_id: str | None, tenant_name: str | None) -> T | None:
        """A per-tenant setting's entry for the tenant, keyed by its id or by its name (the id wins). A name shaped
        like a tenant id matches nothing (crewwork.models.TenantRef.scope_name)."""
        if tenant_name is not None and is_tenant_id(tenant_name):
            tenant_name = None
        for key in (tenant_id, tenant_name):
            if key is not None and key in mapping:
                return mapping[key]
        return None

    def repo_roots_for(self, tenant_id: str | None, tenant_name: str | None) -> list[Path] | None:
        """The directories the tenant may register local repositories under; None: anywhere (no roots are
        configured at all); an empty list: nowhere."""
        own = self.tenant_setting(self.tenant_repo_roots, tenant_id, tenant_name)
        if own is not None:
            return [Path(p).resolve() for p in own]
        common = self.repo_root_list()
        if common:
            return common
        return [] if self.tenant_repo_roots else None


@functools.cache
def get_settings() -> Settings:
    return Settings()


def reset_settings_cache() -> None:
    get_settings.cache_clear()
