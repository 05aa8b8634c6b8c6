"""Replaying a recorded attempt with the model answered from its transcript (ReplayWorkflow, `crewwork replay`; the
activity runs where an agent pool runs: crewwork/steps/replay/activity.py).

    contract.py  the step's input and result models and its `Step` policy
    activity.py  the replay, a plain function of explicit ports (loaded by the pools and the CLI only)
"""

from __future__ import annotations

from crewwork.steps.replay.contract import REPLAY_ATTEMPT, ReplayInput, ReplayOutcome

__all__ = ["REPLAY_ATTEMPT", "ReplayInput", "ReplayOutcome"]
