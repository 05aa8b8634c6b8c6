"""What step activities work with, passed in explicitly: the store, the settings, the host's repositories, the
evidence publisher, the agent pool's child processes, the Temporal client and the pool's slot supplier. Built once per worker
(`Ports.build`); each activity is a plain function `(ports, input) -> result`, bound to them as the step's
Temporal activity (`bind`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import activity

from crewwork.agents.isolation import AgentProcesses
from crewwork.attestation.publish import Publisher
from crewwork.config import Settings
from crewwork.repos.worker import Repositories
from crewwork.steps.step import Step
from crewwork.store.store import Store

I = TypeVar("I", bound=BaseModel)  # noqa: E741
R = TypeVar("R")


def _no_slot() -> None:
    """Outside an agent pool that polls ahead there is no slot to declare free early."""


@dataclass(frozen=True)
class Ports:
    store: Store
    settings: Settings
    repos: Repositories
    evidence: Publisher
    """The operator's evidence signer (crewwork/attestation): landing and on-request bundles."""
    agent_processes: AgentProcesses
    """The agent slots' child processes (crewwork.agents.isolation); started only by the agent pool."""
    client: Any = None
    """A Temporal client: a write that hands a freed place on tells the queued items it admitted at once."""
    agent_done: Callable[[], None] = _no_slot
    """Declares that the running attempt's agent has returned, so its slot may poll for the next task while the
    attempt writes its last transaction (the worker passes crewwork.workers.slots.agent_done; no-op by default)."""

    @classmethod
    def build(
        cls, store: Store, settings: Settings, *, client: Any = None, agent_done: Callable[[], None] = _no_slot
    ) -> Ports:
        return cls(
            store=store,
            settings=settings,
            repos=Repositories(settings),
            evidence=Publisher(settings.evidence),
            agent_processes=AgentProcesses(settings.agent_concurrency),
            client=client,
            agent_done=agent_done,
        )


def bind(step: Step[I, R], fn: Callable[[Ports, I], Awaitable[R]], ports: Ports) -> Callable[[I], Awaitable[R]]:
    """`fn` bound to `ports`, as the Temporal activity of `step` (its name, input and result types)."""

    async def run(inp: I) -> R:
        return await fn(ports, inp)

    run.__annotations__ = {"inp": step.input, "return": step.result}
    run.__name__ = run.__qualname__ = fn.__name__
    run.__module__ = fn.__module__
    run.__doc__ = fn.__doc__
    return activity.defn(name=step.name)(run)
