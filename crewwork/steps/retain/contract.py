"""One batch of the retention workflow: which pass, how many; what it did (crewwork/steps/retain/activity.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel

from crewwork.steps.step import Step


class RetentionPassInput(BaseModel):
    kind: Literal["compact", "retain", "collect"]
    """`compact`: artifacts of ended items into shared chunks; `retain`: remove the details of items past their
    retention period; `collect`: delete chunks no artifact names."""
    batch: int
    """Artifacts, items or chunks handled by this call, at most."""


class RetentionPassResult(BaseModel):
    handled: int = 0
    """Artifacts compacted, items retained, chunks deleted."""
    examined: int = 0
    """Candidates looked at (a retain candidate may be skipped: it took a hold, or was retained meanwhile)."""
    bytes_in: int = 0
    """compact: bytes of the artifacts compacted; retain: bytes of the artifacts whose bytes were removed."""
    bytes_stored: int = 0
    """compact: bytes stored for chunks not stored before."""
    events_removed: int = 0


RETENTION_PASS = Step(
    "retention_pass",
    RetentionPassInput,
    RetentionPassResult,
    pool=None,
    start_to_close=timedelta(minutes=10),
    heartbeat=timedelta(seconds=60),
)
"""On the calling workflow's own queue (the control pool's). A batch of 100 artifacts of up to 16 MiB each is
minutes of work at worst, heartbeating after each."""
