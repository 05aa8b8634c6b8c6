"""Rate limits of the API, shared by every API process through the store (crewwork/store/ratelimits.py).

Two limits, one 429 contract (problem code `rate_limited`, a `Retry-After` header in whole seconds):

- per API key, on every authenticated request: `CREWWORK_API_RATE_PER_S`, burst `CREWWORK_API_RATE_BURST`;
- per client address, on failed authentication (a wrong, revoked or malformed key):
  `CREWWORK_API_AUTH_FAILURE_RATE_PER_S`, burst `CREWWORK_API_AUTH_FAILURE_BURST`. Once an address is over the
  limit, this process answers its requests with 429 from memory until the Retry-After has passed, without looking
  up the key or touching the database; the other API processes learn it from the shared bucket on the address's
  next failure there.
"""

from __future__ import annotations

import math
import time

from crewwork.store.auth import Principal
from crewwork.store.ratelimits import RateLimitStore

MAX_BLOCKED_ADDRESSES = 100_000
"""Addresses one process remembers as blocked (the memory held is bounded even under a spray of addresses)."""


class ApiRateLimits:
    def __init__(
        self,
        store: RateLimitStore,
        *,
        key_rate_per_s: float,
        key_burst: int,
        auth_failure_rate_per_s: float,
        auth_failure_burst: int,
    ) -> None:
        self.store = store
        self.key_rate_per_s = key_rate_per_s
        self.key_burst = float(key_burst)
        self.auth_failure_rate_per_s = auth_failure_rate_per_s
        self.auth_failure_burst = float(auth_failure_burst)
        self._blocked: dict[str, float] = {}

    async def authenticate(self, plain: str) -> tuple[Principal | None, float]:
        """The principal of API key `plain` (None: unknown or revoked) and, for a live key, its request charged:
        the seconds to wait (0 when allowed). The lookup and the charge are one statement on PostgreSQL."""
        principal, charge = await self.store.authenticate_and_charge(
            plain, rate_per_s=self.key_rate_per_s, burst=self.key_burst
        )
        return principal, charge.retry_after_s if charge is not None else 0.0

    async def charge_key(self, key_id: str) -> float:
        """Charge one request to an API key. Returns 0 when allowed, else the seconds to wait."""
        c = await self.store.charge_rate_limit(f"key:{key_id}", rate_per_s=self.key_rate_per_s, burst=self.key_burst)
        return c.retry_after_s

    def address_blocked(self, address: str) -> float:
        """Seconds this address stays refused for its failed authentications (0: not refused), from memory."""
        until = self._blocked.get(address)
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            self._blocked.pop(address, None)
            return 0.0
        return left

    async def charge_auth_failure(self, address: str) -> float:
        """Charge one failed authentication to a client address. Returns 0 while under the limit, else the seconds
        to wait (and the address is refused from memory for that long)."""
        c = await self.store.charge_rate_limit(
            f"auth:{address}", rate_per_s=self.auth_failure_rate_per_s, burst=self.auth_failure_burst
        )
        if c.allowed:
            return 0.0
        if len(self._blocked) >= MAX_BLOCKED_ADDRESSES:
            self._blocked.clear()
        self._blocked[address] = time.monotonic() + c.retry_after_s
        return c.retry_after_s


def retry_after_header(wait_s: float) -> str:
    return str(max(1, math.ceil(wait_s)))
