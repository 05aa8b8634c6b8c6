"""The agent plugin interface.

An agent receives an `AgentContext` (the instruction or input, the attempt's private workspace, the diagnostics of
the previous attempt, a sandbox to run commands in) and returns an `AgentRunResult`. The platform, not the agent,
captures the diff and judges the change: whatever an agent says about its own success is stored as `claims` only.

Adding an agent is one new module with a subclass of `Agent` and a line in `crewwork.agents.classes` and in
`crewwork.agents.catalogue` (a built-in; its config check in a module of its own, which the API loads), or a package
of its own that declares it in the `crewwork.agents` entry-point group (a plugin; docs/agents.md).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from crewwork.config import Settings
from crewwork.models import WorkItemKind

# Re-exported: agent authors import the failure classes from here.
from crewwork.models.errors import AgentConfigError as AgentConfigError
from crewwork.models.errors import AgentError as AgentError
from crewwork.models.errors import AgentInfraError as AgentInfraError

if TYPE_CHECKING:
    from crewwork.sandbox.base import Sandbox, SandboxLimits


@dataclass
class AgentContext:
    work_item_id: str
    attempt: int
    """Repair-loop attempt number, from 1."""
    activity_attempt: int
    """Temporal's attempt number of the activity running this agent, from 1 (retries of the same step)."""
    kind: WorkItemKind
    config: dict[str, Any]
    instruction: str | None = None
    input: dict[str, Any] | None = None
    workspace: Path | None = None
    """The attempt's own fresh git worktree (code changes only). Nothing else on the host is the agent's."""
    diagnostics: str | None = None
    """The previous attempt's diagnostics packet (failing tests, output tail, cause), if any."""
    review_comment: str | None = None
    sandbox: Sandbox | None = None
    limits: SandboxLimits | None = None
    heartbeat: Callable[..., None] = lambda *details: None
    """Report liveness (and resumable progress) to Temporal. Call it at least every few seconds."""
    ensure_current: Callable[[], Awaitable[None]] = field(default=lambda: _current())
    """Raise if a later-scheduled attempt of this step has written (this attempt is a zombie). Call it before any
    external call that costs money or cannot be undone (a model call): a zombie must not make it."""
    resume_details: Any | None = None
    """Details of the last heartbeat of a previous Temporal attempt of this activity, to resume from."""
    save_artifact: Callable[[str, bytes, str], Awaitable[Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    host_workspace: Any | None = None
    """The platform's `crewwork.workspace.tree.Workspace` for `workspace` (owner, private git directory), for agents
    that change files on the host rather than in a sandbox (they must go through it or `crewwork.boundary.safefs`)."""


async def _current() -> None:
    return None


@dataclass(frozen=True)
class OperatorAgentSettings:
    """The operator's configuration of the built-in agents, as `crewwork.config.Settings` read it from the
    environment; the agents parse the JSON themselves (their models live with them)."""

    model_endpoints: str = ""
    """CREWWORK_MODEL_ENDPOINTS: the model agent's endpoints and routes (JSON, `crewwork.transport.TransportConfig`)."""
    command_agents: str = ""
    """CREWWORK_COMMAND_AGENTS: the CLIs the command agent may run (JSON, `crewwork.agents.command.CommandAgentsSettings`)."""
    command_agent_enabled: bool = True
    """CREWWORK_COMMAND_AGENT_ENABLED: the command agent's kill switch."""
    agent_plugins: str = "*"
    """CREWWORK_AGENT_PLUGINS: the plugins that may be used (`*`, empty, or comma-separated names)."""

    @classmethod
    def of(cls, settings: Settings) -> OperatorAgentSettings:
        return cls(
            model_endpoints=settings.model_endpoints,
            command_agents=settings.command_agents,
            command_agent_enabled=settings.command_agent_enabled,
            agent_plugins=settings.agent_plugins,
        )

    @classmethod
    def of_process(cls) -> OperatorAgentSettings:
        """This process's settings, read afresh from its environment at each call (as the agents read it before
        they were handed settings), for the callers that do not pass them yet: the agent activity constructs agents
        with no arguments and calls `choose_agent` and `get_agent_class` without settings, and the plugin
        interface's `validate_config` has no place for them (issue 27 item 1 moves the activity into
        `crewwork/steps/`, which can pass them). The only settings read in `crewwork.agents` not handed in."""
        return cls.of(Settings())


@dataclass
class AgentRunResult:
    output: dict[str, Any] | None = None
    claims: str | None = None
    transcript: str | None = None
    tokens_used: int = 0
    cost_usd: float = 0.0


class Agent(abc.ABC):
    name: ClassVar[str]
    mock: ClassVar[bool] = False
    """True for agents whose results are scripted, not produced by a model or a real agent program."""
    needs_sandbox: ClassVar[bool] = True
    """False for agents that never run commands (the platform then skips choosing and probing a sandbox)."""
    runs_inline: ClassVar[bool] = False
    """True only for agents whose every wait is cancellable asyncio I/O: they run in the agent pool's own process.
    Every other agent runs in a child process that the platform kills when the attempt is cancelled or times out
    (crewwork.agents.isolation), so blocking code cannot hold a slot."""

    @classmethod
    def validate_config(cls, kind: WorkItemKind, config: dict[str, Any]) -> None:
        """Raise AgentConfigError when `config` cannot work; called at submission time."""
        return None

    @abc.abstractmethod
    async def run(self, ctx: AgentContext) -> AgentRunResult: ...
