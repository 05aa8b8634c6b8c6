"""The store's shared rate-limit buckets: one atomic upsert per charge, on both databases."""

from __future__ import annotations

import asyncio
import time
import uuid

from crewwork.store.store import Store
from tests.conftest import statements_sent


async def test_concurrent_charges_from_two_engines_take_exactly_the_burst(any_store: Store) -> None:
    # Two engines (as two API processes would have) charge one bucket at once: the burst is shared, never doubled.
    other = Store(any_store.url)
    key = f"key:{uuid.uuid4().hex}"
    started = time.monotonic()
    try:
        charges = await asyncio.gather(
            *(s.charge_rate_limit(key, rate_per_s=0.01, burst=5) for s in [any_store, other] * 10)
        )
    finally:
        spread = time.monotonic() - started
        await other.close()
    allowed = [c for c in charges if c.allowed]
    refused = [c for c in charges if not c.allowed]
    assert len(allowed) == 5 and len(refused) == 15
    assert all(c.retry_after_s == 0 for c in allowed)
    # The next token is a whole interval (100 s) after the first charge's time: a refused charge waits that, less the
    # time between the first charge and its own (20 contended SQLite writers on a loaded machine can take many
    # seconds). Refused charges never push it further. A charge's time is the later of its statement's start
    # (PostgreSQL's statement_timestamp, taken when the statement arrives, before it waits for the bucket's row) and
    # the bucket's last charge: a charge whose statement arrived before the charge ahead of it on the row acts at
    # that charge's time. Without that, one was once refused and told to retry after 0.001 s (its stamp a fraction
    # of a millisecond before the first charge's, with one token left by the later stamp).
    assert all(100 - spread - 1 < c.retry_after_s <= 100.001 for c in refused), (
        [c.retry_after_s for c in refused],
        spread,
    )


async def test_a_bucket_refills_at_its_rate(any_store: Store) -> None:
    key = f"key:{uuid.uuid4().hex}"
    assert (await any_store.charge_rate_limit(key, rate_per_s=5, burst=1)).allowed
    # The bucket holds one token and refills one every 0.2 s: a charge right after the first is refused. On a loaded
    # machine the next charge can come more than 0.2 s later (the bucket has refilled, and that charge takes the
    # token again), so what is checked is that a charge following another within the interval is refused.
    for _ in range(10):
        refused = await any_store.charge_rate_limit(key, rate_per_s=5, burst=1)
        if not refused.allowed:
            break
    else:
        raise AssertionError("no charge was refused: every one came a whole interval after the one before")
    assert 0 < refused.retry_after_s <= 0.2
    await asyncio.sleep(refused.retry_after_s + 0.05)
    assert (await any_store.charge_rate_limit(key, rate_per_s=5, burst=1)).allowed


async def test_a_charge_skips_the_wal_flush_for_itself_only(pg_url: str) -> None:
    # On PostgreSQL a charge is one statement that turns off synchronous_commit for its own implicit transaction.
    # The connection goes back to the pool: the fenced writes and submissions that run on it next must still wait
    # for their WAL flush (a 202 or an accepted write must survive a database crash).
    from sqlalchemy import text

    store = Store(pg_url, pool_size=1)
    try:
        key = f"key:{uuid.uuid4().hex}"
        for _ in range(3):
            assert (await store.charge_rate_limit(key, rate_per_s=1000, burst=100)).allowed
            row = await store.autocommit_first(text("SELECT current_setting('synchronous_commit'), pg_backend_pid()"))
            assert row[0] == "on"
        async with store.session() as s:
            assert (await s.scalar(text("SELECT current_setting('synchronous_commit')"))) == "on"
        # The charge's own commit did not wait: the setting is off inside the statement that charges.
        probe = await store.autocommit_first(
            text(
                "SELECT current_setting('synchronous_commit') FROM "
                "(SELECT set_config('synchronous_commit', 'off', true)) AS cfg"
            )
        )
        assert probe[0] == "off"
        assert (await store.autocommit_first(text("SELECT current_setting('synchronous_commit')")))[0] == "on"
    finally:
        await store.close()


async def test_a_key_is_looked_up_and_charged_together_and_only_while_live(any_store: Store) -> None:
    # The REST API's authentication: the key's principal and its request charged to its own bucket (`key:<id>`, the
    # bucket charge_rate_limit and the MCP endpoint use too); nothing charged for an unknown or a revoked key.
    tid = await any_store.ensure_tenant(f"t-{uuid.uuid4().hex[:8]}")
    key_id, plain = await any_store.create_api_key(tid, scopes=["submit"])
    principal, charge = await any_store.authenticate_and_charge(plain, rate_per_s=0.01, burst=2)
    assert principal is not None and principal.key_id == key_id and principal.tenant_id == tid
    assert principal.scopes == frozenset({"submit"}) and charge is not None and charge.allowed
    # The second token of the burst went to a charge of the same bucket by name; the next request is refused.
    assert (await any_store.charge_rate_limit(f"key:{key_id}", rate_per_s=0.01, burst=2)).allowed
    principal, charge = await any_store.authenticate_and_charge(plain, rate_per_s=0.01, burst=2)
    assert principal is not None and charge is not None and not charge.allowed and charge.retry_after_s > 90
    assert await any_store.authenticate_and_charge(plain + "x", rate_per_s=0.01, burst=2) == (None, None)
    await any_store.revoke_api_key(key_id)
    assert await any_store.authenticate_and_charge(plain, rate_per_s=0.01, burst=2) == (None, None)


async def test_on_postgresql_an_authenticated_request_costs_one_statement(pg_url: str) -> None:
    store = Store(pg_url, pool_size=1)
    try:
        tid = await store.ensure_tenant(f"t-{uuid.uuid4().hex[:8]}")
        _key_id, plain = await store.create_api_key(tid, scopes=["submit"])
        await store.authenticate_and_charge(plain, rate_per_s=100, burst=10)  # the pool's connection exists
        with statements_sent(store) as statements:
            principal, charge = await store.authenticate_and_charge(plain, rate_per_s=100, burst=10)
        assert principal is not None and charge is not None and charge.allowed
        assert len(statements) == 1, statements
        with statements_sent(store) as statements:
            assert await store.authenticate_and_charge("cw_nothing", rate_per_s=100, burst=10) == (None, None)
        assert len(statements) == 1, statements
    finally:
        await store.close()
