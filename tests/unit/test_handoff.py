"""A limited completion in one trip (``_store.handoff``), its pure parts: which writes ride the
completion's hand-off, the slot an attempt holds, the wait order taken in the write itself, and
the hand-off statements' keying. On real Postgres: tests/integration/test_limits_trip.py and
tests/integration/test_limits.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from harvest_celery._core.limits import Limits, parse_rate_limit
from harvest_celery._payloads.digest import limit_digest
from harvest_celery._store import handoff, sql
from harvest_celery._store.records import RunRow
from harvest_celery._store.staging import RunWrite, one_statement_refusal

FREE = SimpleNamespace(admission=SimpleNamespace(limited=False))
REGISTRY: Any = SimpleNamespace(workflows={"wf": FREE})
ROW = RunRow.assumed("r1", "wf", 5, None)
SLOT = ("charge", "")


def step(*tasks: tuple[str, str | None]) -> RunWrite:
    """A write that schedules these (activity, limit digest) rows."""
    return RunWrite(
        "r1", values={"next_seq": 9}, tasks=[{"activity_name": a, "limit_digest": d} for a, d in tasks]
    )


def test_only_the_next_step_under_the_same_limit_and_key_rides_the_hand_off():
    assert one_statement_refusal(step(("charge", "")), ROW, REGISTRY, True, SLOT) == ""
    assert one_statement_refusal(step(("charge", ""), ("other", None)), ROW, REGISTRY, True, SLOT) == ""
    # no slot to hand on, another key, another limit, two limited rows: the lock order's
    assert one_statement_refusal(step(("charge", "")), ROW, REGISTRY, True, None) == "limited"
    assert one_statement_refusal(step(("charge", "sha256:b")), ROW, REGISTRY, True, SLOT) == "limited"
    assert one_statement_refusal(step(("refund", "")), ROW, REGISTRY, True, SLOT) == "limited"
    assert one_statement_refusal(step(("charge", ""), ("charge", "")), ROW, REGISTRY, True, SLOT) == "limited"
    # a step with no limited row, or a last step, rides it whatever the completed attempt held
    assert one_statement_refusal(step(("other", None)), ROW, REGISTRY, True, SLOT) == ""


def test_a_limited_close_of_a_limited_workflow_does_not_take_both_trips():
    limited = SimpleNamespace(workflows={"wf": SimpleNamespace(admission=SimpleNamespace(limited=True))})
    close = RunWrite("r1", values={"status": "COMPLETED"})
    assert one_statement_refusal(close, ROW, limited, True, None) == ""  # its admission's trip
    assert one_statement_refusal(close, ROW, limited, True, SLOT) == "admission"  # both: ordinary


def registry(limits: Limits) -> Any:
    return SimpleNamespace(activity=lambda name: SimpleNamespace(limits=limits))


def test_the_slot_an_attempt_holds_is_its_limit_and_the_key_its_input_gives():
    assert handoff.slot(registry(Limits()), "charge", {"m": "a"}) is None  # unlimited
    rated = Limits(concurrency=2, rate_limit=parse_rate_limit("5/s"))
    assert handoff.slot(registry(rated), "charge", {}) is None  # a token: the lock order's
    assert handoff.slot(registry(Limits(concurrency=2)), "charge", {}) == ("charge", "")
    keyed = Limits(concurrency=2, limit_key=lambda i: i["m"])
    assert handoff.slot(registry(keyed), "charge", {"m": "a"}) == ("charge", limit_digest("charge", "a"))
    # a key that cannot be computed again matches no next step's digest (the hand-off still
    # reads the completed row's own limit from the database)
    assert handoff.slot(registry(keyed), "charge", {}) == ("charge", handoff.UNKNOWN_KEY)


def test_a_wait_order_from_the_sequence_is_taken_in_the_statement_itself():
    text = "VALUES (CAST(%(t0r0_wait_seq)s AS BIGINT), CAST(%(t0r1_wait_seq)s AS BIGINT))"
    params = {"t0r0_wait_seq": handoff.FROM_SEQUENCE, "t0r1_wait_seq": None, "run_id": "r1"}
    out = handoff.in_line(text, params)
    assert out == "VALUES (nextval('harvest_wait_seq'), CAST(%(t0r1_wait_seq)s AS BIGINT))"
    assert params == {"t0r1_wait_seq": None, "run_id": "r1"}


def test_the_hand_off_after_a_write_reads_its_limit_from_the_row_that_write_completed():
    text = sql.HAND_OFF_AFTER_WRITE
    assert "xmin = xid(pg_current_xact_id_if_assigned())" in text  # nothing when refused
    assert "%(name)s" not in text and "%(digest)s" not in text  # never a caller's key
    assert "FOR UPDATE SKIP LOCKED" in text and "LIMIT 1" in text
    assert "harvest_limits" in text and "FOR UPDATE\n" not in text.split("nxt AS")[0]  # no row lock
    for hand_off in (sql.HAND_OFF, sql.HAND_OFF_AFTER_WRITE):
        # only under a concurrency limit with no rate, within the stored in_use
        assert "cfg.rate IS NULL AND cfg.lim IS NOT NULL AND l.in_use <= cfg.lim" in hand_off
        assert "ORDER BY compensation DESC, priority DESC, wait_seq" in hand_off
