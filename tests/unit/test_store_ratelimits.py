"""The store's shared rate-limit buckets: one atomic upsert per charge, on both databases."""

from __future__ import annotations

import asyncio
import uuid

from crewwork.store.store import Store


async def test_concurrent_charges_from_two_engines_take_exactly_the_burst(any_store: Store) -> None:
    # Two engines (as two API processes would have) charge one bucket at once: the burst is shared, never doubled.
    other = Store(any_store.url)
    key = f"key:{uuid.uuid4().hex}"
    try:
        charges = await asyncio.gather(
            *(s.charge_rate_limit(key, rate_per_s=0.01, burst=5) for s in [any_store, other] * 10)
        )
    finally:
        await other.close()
    allowed = [c for c in charges if c.allowed]
    refused = [c for c in charges if not c.allowed]
    assert len(allowed) == 5 and len(refused) == 15
    assert all(c.retry_after_s == 0 for c in allowed)
    # The next token is a whole interval (100 s) away, less what has elapsed (20 contended SQLite writers on a loaded
    # machine can take many seconds); refused charges never push it further than the interval.
    assert all(60 < c.retry_after_s <= 100 for c in refused), [c.retry_after_s for c in refused]


async def test_a_bucket_refills_at_its_rate(any_store: Store) -> None:
    key = f"key:{uuid.uuid4().hex}"
    assert (await any_store.charge_rate_limit(key, rate_per_s=5, burst=1)).allowed
    refused = await any_store.charge_rate_limit(key, rate_per_s=5, burst=1)
    assert not refused.allowed and 0 < refused.retry_after_s <= 0.2
    await asyncio.sleep(refused.retry_after_s + 0.05)
    assert (await any_store.charge_rate_limit(key, rate_per_s=5, burst=1)).allowed
