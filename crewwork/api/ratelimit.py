"""Per-API-key rate limiting: an in-process token bucket.

The buckets live in the memory of ONE API process: with N API processes behind a load balancer a key may make up to
N times the configured rate. That is the documented trade-off (no shared state, no extra round trip per request).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    def __init__(self, rate_per_s: float, burst: int, *, max_keys: int = 100_000) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """Take one token for `key`. Returns 0 when allowed, else the seconds until a token is available."""
        now = time.monotonic() if now is None else now
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                if len(self._buckets) >= self.max_keys:
                    self._buckets.clear()
                b = self._buckets[key] = _Bucket(self.burst, now)
            b.tokens = min(self.burst, b.tokens + (now - b.updated) * self.rate)
            b.updated = now
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                return 0.0
            return (1.0 - b.tokens) / self.rate


def retry_after_header(wait_s: float) -> str:
    return str(max(1, math.ceil(wait_s)))
