"""One attempt's agent run: in a fresh workspace of its own, in a sandbox, the change captured by the platform (the
activity: crewwork/steps/agent/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.agent.contract import (
    AGENT_START_TO_CLOSE,
    RUN_AGENT,
    AgentStepInput,
)

__all__ = [
    "AGENT_START_TO_CLOSE",
    "RUN_AGENT",
    "AgentStepInput",
]
