"""Bounded storage: one pass of the retention workflow (crewwork/workflows/reaper.py) over the store -- artifacts of
ended items stored by content, the details of items past their retention period removed, chunks no artifact names
deleted (the activity: crewwork/steps/retain/activity.py; the rules: crewwork/store/retention.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.retain.contract import RETENTION_PASS, RetentionPassInput, RetentionPassResult

__all__ = ["RETENTION_PASS", "RetentionPassInput", "RetentionPassResult"]
