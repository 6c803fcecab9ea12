"""Running out of connections degrades to slower, never to a stall (docs/operations.md
#connection-pools): the refusals a connection waits out, and the sweeper's re-sends spread."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

from harvest_celery._store.dialect import no_slot
from harvest_celery._store.sweeps import resend_at


def test_a_refusal_for_want_of_a_slot_is_waited_out_and_nothing_else() -> None:
    assert no_slot(Exception('FATAL:  too many connections for role "harvest_budget"'))
    assert no_slot(Exception("FATAL:  sorry, too many clients already"))
    assert no_slot(Exception("FATAL:  remaining connection slots are reserved for superuser"))
    assert not no_slot(Exception('FATAL:  password authentication failed for user "x"'))
    assert not no_slot(Exception("connection refused"))


def test_re_sends_that_went_stale_together_spread_and_back_off() -> None:
    random.seed(7)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    stale = now - timedelta(seconds=30)  # a burst, all requested at one instant
    first = [resend_at(now, stale) for _ in range(50)]
    assert all(now <= at <= now + timedelta(seconds=30) for at in first)
    assert len({at for at in first}) == 50  # no two at one instant
    assert max(first) - min(first) > timedelta(seconds=15)
    later = resend_at(now, now - timedelta(days=3))
    assert later <= now + timedelta(hours=1)  # the backoff is capped
    assert resend_at(now, now + timedelta(seconds=5)) == now  # a clock ahead: no negative wait


def test_the_postgres_payload_store_pool_follows_the_pool_settings() -> None:
    """Its own pool (blobs) is sized as the claim pool, no longer SQLAlchemy's 5 + 10."""
    from harvest_celery import Harvest, PostgresPayloadStore

    store = PostgresPayloadStore()
    h = Harvest(
        "postgresql+psycopg://nobody@127.0.0.1:1/nowhere",
        payload_store=store,
        claim_pool_size=1,
        claim_max_overflow=3,
        pooled=True,
    )
    pool: Any = store.engine.pool
    assert (pool.size(), pool._max_overflow) == (1, 3)
    assert h.store.pools.claim_overflow == 3
    alone: Any = PostgresPayloadStore("postgresql+psycopg2://nobody@127.0.0.1:1/nowhere").engine.pool
    assert (alone.size(), alone._max_overflow) == (1, 4)  # not bound to a Harvest: small too
