"""One attempt's model spend against its budget, and each tenant's call rate.

`Ledger` holds what the attempt has spent (including the calls earlier Temporal attempts of the same step made and
recorded: they were paid for) and what it may still spend: the work item's token and cost budgets less what its
earlier attempts spent, each capped by the operator's ceilings. A call is admitted only while nothing is exhausted, and
calls are admitted one at a time by default (`max_concurrent_calls`), so the budget is overshot by at most the one call
that crossed it.

`TenantRate` is a token bucket per tenant, per agent-pool process: each gateway of the tenant's attempts on this host
takes a token per call; an empty bucket refuses the call with the protocol's 429 and a Retry-After.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class Budget:
    """What the attempt may spend in all (None: no limit of that kind)."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    spent_before_tokens: int = 0
    """Tokens the work item's earlier attempts spent (they count against the item's budget)."""
    spent_before_cost_usd: float = 0.0
    max_calls: int | None = None
    """The operator's bound on model calls of one attempt."""


@dataclass
class Ledger:
    budget: Budget
    tokens: int = 0
    """This attempt's tokens so far (every Temporal attempt of its step)."""
    cost_usd: float = 0.0
    calls: int = 0

    def exhausted(self) -> str | None:
        """Why no further call may be made, or None."""
        b = self.budget
        if b.max_tokens is not None and b.spent_before_tokens + self.tokens >= b.max_tokens:
            return (
                f"token budget exhausted: {b.spent_before_tokens + self.tokens} tokens used "
                f"({self.tokens} by this attempt, {self.calls} call(s)), the budget is {b.max_tokens}"
            )
        if b.max_cost_usd is not None and b.spent_before_cost_usd + self.cost_usd >= b.max_cost_usd:
            return (
                f"cost budget exhausted: ${b.spent_before_cost_usd + self.cost_usd:.6f} spent "
                f"(${self.cost_usd:.6f} by this attempt, {self.calls} call(s)), the budget is ${b.max_cost_usd:g}"
            )
        if b.max_calls is not None and self.calls >= b.max_calls:
            return f"call limit reached: {self.calls} model calls, at most {b.max_calls} per attempt"
        return None

    def charge(self, tokens: int, cost_usd: float) -> None:
        self.tokens += tokens
        self.cost_usd += cost_usd
        self.calls += 1


class TenantRate:
    """Calls per minute per tenant, shared by every gateway of this process (a token bucket refilled continuously)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, tenant: str, per_minute: float, *, now: float | None = None) -> float:
        """0 when the call may go ahead (a token is taken), else the seconds until one is free."""
        if per_minute <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        burst = max(1.0, per_minute / 6)  # ten seconds' worth
        rate = per_minute / 60.0
        with self._lock:
            tokens, at = self._buckets.get(tenant, (burst, now))
            tokens = min(burst, tokens + (now - at) * rate)
            if tokens >= 1.0:
                self._buckets[tenant] = (tokens - 1.0, now)
                return 0.0
            self._buckets[tenant] = (tokens, now)
            return (1.0 - tokens) / rate


TENANT_RATE = TenantRate()
"""The process's buckets (one agent pool process serves many attempts of many tenants)."""
