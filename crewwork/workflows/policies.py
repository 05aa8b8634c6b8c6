"""The lifecycle's own timers and limits, and the search attributes of WorkItemWorkflow (each step's timeouts and
retries are in its module, crewwork/steps/; docs/reliability.md has the table and why).

Workflow code: constants only, deterministic."""

from __future__ import annotations

from datetime import timedelta

# Defined below the workflow package (crewwork/models/search.py), for the code that starts workflows.
from crewwork.models.search import SA_KIND as SA_KIND
from crewwork.models.search import SA_REPO as SA_REPO
from crewwork.models.search import SA_STATE as SA_STATE
from crewwork.models.search import SA_TENANT as SA_TENANT

QUEUE_POLL = timedelta(seconds=20)
QUEUE_POLL_MAX = timedelta(seconds=120)
"""A queued item is admitted by the write of the item whose place it takes (`hand_off` in
crewwork/store/fencing/reference.py) and told so by the `admitted` signal; it re-runs admission on this backoff timer
only as a fallback: for a signal that was lost (the control process died between the write and the signal), or places
freed without a hand-off (the operator raised the limit). So it is long: at 5 s doubling to 30 s, on a loaded machine
where a queue wait is half a minute, the timers still gave a queued item 1.2 extra workflow tasks and admission
transactions (bench/trace.py)."""
REVIEW_LEASE_TTL_S = 3600.0
REVIEW_RENEW_EVERY = timedelta(minutes=20)
"""While awaiting review, the workspace lease is renewed this often (well inside its TTL), for as long as a review
may take (30 days by default) in a few thousand history events."""
REVIEWS_IN_STATUS = 10
"""The most recent review decisions the status query answers with (the store keeps every one)."""
ATTEMPTS_PER_RUN = 20
"""Attempts per workflow run before continue-as-new (Temporal may suggest it sooner)."""
