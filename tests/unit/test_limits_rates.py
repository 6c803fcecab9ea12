"""Rate limits (``_store.rates``, GCRA with a burst of one) on the embedded SQLite store,
messages delivered by hand: one token per interval, the next row in line waits with the token's
due time, the waker releases at that time and one token gives one release; keys have their own
tokens; an abandoned row keeps its token spent; overrides and refusals write nothing bad. Time
is moved by moving the limit row's ``tat`` (and the due times) back, never by sleeping; the
rate is one a minute, so a slow machine (a start taking longer than a short interval) never
hands out a token the test did not move time for."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, UnknownActivity, WorkflowContext, activity, workflow
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._runtime.waker import IDLE
from harvest_celery._store import limits as store_limits
from harvest_celery._store import rates
from harvest_celery._store.schema import activity_tasks, limits
from harvest_celery._store.store import utcnow
from tests.unit.test_limits_slots import assert_in_use_matches, messages, run_body, status

RATE, INTERVAL = "1/m", 60  # one token a minute


@activity(name="tick", rate_limit=RATE)
def tick(label):
    return label


@activity(name="poll", rate_limit="1/m", concurrency=1, limit_key=lambda i: i["site"])
def poll(data):
    return data["site"]


@workflow(name="ticks")
async def ticks(ctx: WorkflowContext, label):
    return await ctx.execute_activity(tick, label)


@workflow(name="polls")
async def polls(ctx: WorkflowContext, data):
    return await ctx.execute_activity(poll, data)


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}").register(ticks, polls, tick, poll)
    harvest.migrate()
    harvest._inline = None  # deliver messages by hand
    harvest.runtime.dispatcher = InlineDispatcher()
    yield harvest
    assert_in_use_matches(harvest)


def start(h, workflow_type, data):
    run_id = h.start_workflow(workflow_type, data)
    h.runtime.run_decision(run_id)
    return run_id


def row(h, run_id):
    return h.store.activity_rows(run_id)[0]


def tat(h, name, digest=""):
    """The limit row's GCRA time (an unkeyed limit's slot row is the name's own, digest "")."""
    with h.store.begin() as tx:
        return tx.conn.execute(
            sa.select(limits.c.tat).where((limits.c.name == name) & (limits.c.key_digest == digest))
        ).scalar()


def time_passes(h, seconds):
    """The database's clock moves on by ``seconds``: every tat and due time moves back."""
    shift = timedelta(seconds=seconds)
    with h.store.begin() as tx:
        for r in tx.conn.execute(sa.select(limits).where(limits.c.tat.is_not(None))).all():
            tx.conn.execute(
                limits.update()
                .where((limits.c.name == r.name) & (limits.c.key_digest == r.key_digest))
                .values(tat=r.tat - shift)
            )
        for r in tx.conn.execute(sa.select(activity_tasks).where(activity_tasks.c.due_at.is_not(None))).all():
            tx.conn.execute(
                activity_tasks.update()
                .where(
                    (activity_tasks.c.execution_id == r.execution_id)
                    & (activity_tasks.c.activity_id == r.activity_id)
                )
                .values(due_at=r.due_at - shift)
            )


def test_one_token_per_interval_and_the_next_row_waits_with_its_due_time(h):
    before = utcnow()
    first, second, third = (start(h, "ticks", f"t{i}") for i in range(3))
    (sent,) = messages(h)  # burst one: only the first starts now
    assert sent.args[0] == first
    assert [status(h, r) for r in (first, second, third)] == ["scheduled", "waiting", "waiting"]
    due = row(h, second)["due_at"]  # its turn has come; its token is due one interval later
    assert due is not None and row(h, third)["due_at"] is None
    assert (
        timedelta(seconds=INTERVAL)
        <= due.replace(tzinfo=before.tzinfo) - before
        < timedelta(seconds=INTERVAL + 5)
    )
    assert due == tat(h, "tick")
    h.runtime.sweeper.sweep_once()  # not due yet: the sweep releases nothing
    assert messages(h) == [] and status(h, second) == "waiting"
    time_passes(h, INTERVAL)
    assert h.runtime.sweeper.waker.release_due()[0] > 0  # released; sleeps until the next due
    (sent,) = messages(h)
    assert sent.args[0] == second and status(h, third) == "waiting"
    assert row(h, second)["due_at"] is None and row(h, third)["due_at"] is not None


def test_the_waker_sleeps_until_the_earliest_due_time_and_idles_when_none(h):
    waker = h.runtime.sweeper.waker
    assert waker.release_due() == (IDLE, None)
    start(h, "ticks", "a")
    start(h, "ticks", "b")
    messages(h)
    wait, due = waker.release_due()
    assert 0 < wait <= INTERVAL and due == tat(h, "tick").replace(tzinfo=utcnow().tzinfo).timestamp()


def test_a_waker_whose_sleep_ends_settles_the_limit_it_slept_for_before_reading(h, monkeypatch):
    waker = h.runtime.sweeper.waker
    first, second = start(h, "ticks", "a"), start(h, "ticks", "b")
    messages(h)
    assert waker.release_due()[0] > 0  # read: it sleeps for "tick"'s token
    time_passes(h, INTERVAL)

    def no_read(_tx):
        raise AssertionError("read before the release")

    monkeypatch.setattr(rates, "next_due", no_read)
    waker._wake_target()  # what its loop does when the timed sleep ends (no NOTIFY came)
    (sent,) = messages(h)
    assert sent.args[0] == second and status(h, second) == "scheduled" and first != second


def test_one_token_gives_one_release_however_many_settle(h):
    runs = [start(h, "ticks", f"t{i}") for i in range(4)]
    messages(h)
    time_passes(h, INTERVAL)
    with h.store.begin() as tx:  # two wakers and a sweep at the same due time
        assert store_limits.wake(tx, "tick", row(h, runs[1])["limit_digest"], utcnow()) == 1
        assert store_limits.wake(tx, "tick", row(h, runs[1])["limit_digest"], utcnow()) == 0
        assert [d.execution_id for d in tx.dispatches] == [runs[1]]
    h.runtime.sweeper.sweep_once()
    assert messages(h) == []
    assert [status(h, r) for r in runs] == ["scheduled", "scheduled", "waiting", "waiting"]


def test_each_key_has_its_own_token_and_concurrency_gates_the_due_time(h):
    a1, a2, b1 = (start(h, "polls", {"site": s}) for s in ("a", "a", "b"))
    assert [status(h, r) for r in (a1, a2, b1)] == ["scheduled", "waiting", "scheduled"]
    assert row(h, a2)["due_at"] is None  # its slot is taken: its turn has not come
    sent = messages(h)
    run_body(h, next(m for m in sent if m.args[0] == a1))  # the slot frees; no token for a minute
    assert status(h, a2) == "waiting" and row(h, a2)["due_at"] == tat(h, "poll", row(h, a2)["limit_digest"])
    time_passes(h, 60)
    h.runtime.sweeper.waker.release_due()
    assert status(h, a2) == "scheduled"


def test_a_released_row_then_abandoned_keeps_its_token_spent(h):
    first, second = (start(h, "ticks", f"t{i}") for i in range(2))
    spent = tat(h, "tick")
    h.cancel_workflow_execution(first, "stop")  # released with the token, then abandoned
    assert status(h, first) == "cancelled" and tat(h, "tick") == spent
    assert status(h, second) == "waiting"  # the token is not returned: fewer starts, never more


def test_a_throttled_release_counts_its_seconds_waiting(h):
    start(h, "ticks", "a")
    second = start(h, "ticks", "b")
    messages(h)
    time_passes(h, INTERVAL)
    with h.store.begin() as tx:
        store_limits.wake(tx, "tick", row(h, second)["limit_digest"], utcnow())
        (amount,) = tx.amounts
    assert amount[:2] == ("limit_throttled", {"limit": "tick"}) and amount[2] >= 0.0


# ── run-time overrides ───────────────────────────────────────────────────────────────────────
def limit_rows(h):
    with h.store.begin() as tx:
        return [tuple(r) for r in tx.conn.execute(sa.select(limits).order_by(limits.c.name)).all()]


@pytest.mark.parametrize("bad", ["ten per second", "0/s", "20/d", "", 20, "1.5/s"])
def test_a_bad_rate_override_is_refused_and_writes_nothing(h, bad):
    start(h, "ticks", "a")
    before = limit_rows(h)
    with pytest.raises(ValueError, match="rate_limit must be a positive integer"):
        h.set_limit("tick", rate_limit=bad)
    with pytest.raises(UnknownActivity):
        h.set_limit("no_such_activity", rate_limit="5/s")
    assert limit_rows(h) == before


def test_a_rate_override_is_shown_respaces_the_next_token_and_clears(h):
    start(h, "ticks", "a")
    second = start(h, "ticks", "b")
    messages(h)
    h.set_limit("tick", rate_limit="1/h")  # lowered: the next token is an hour after the last start
    (entry,) = [e for e in h.limits() if e["name"] == "tick"]
    assert (entry["declared_rate_limit"], entry["override_rate_limit"]) == (RATE, "1/h")
    assert entry["override_concurrency"] is None and entry["override_set_at"] is not None
    time_passes(h, 60)
    h.runtime.sweeper.waker.release_due()
    assert status(h, second) == "waiting"
    h.set_limit("tick", clear=True)  # 1/m again, from the last start: long due, released now
    assert status(h, second) == "scheduled"
    (entry,) = [e for e in h.limits() if e["name"] == "tick"]
    assert (entry["override_rate_limit"], entry["override_set_at"]) == (None, None)


def test_earliest_due_reads_the_database_clock(h):
    with h.store.begin() as tx:
        assert rates.earliest_due(tx) is None and rates.due_limits(tx) == []


def test_the_limits_cli_sets_a_rate_and_refuses_a_bad_one(h, capsys):
    from harvest_celery._cli import main

    start(h, "ticks", "a")
    url = h.database_url
    assert main(["--database-url", url, "limits", "set", "tick", "--rate-limit", "5/m"]) == 0
    out = capsys.readouterr().out
    assert "tick: 1 in use at 5/m, 0 waiting, declared 1/m, override 5/m set " in out
    assert main(["--database-url", url, "limits", "set", "tick", "--rate-limit", "20/d"]) != 0
    assert "rate_limit must be a positive integer" in capsys.readouterr().err
    assert [e["override_rate_limit"] for e in h.limits() if e["name"] == "tick"] == ["5/m"]


def test_the_throttled_seconds_counter_is_registered_with_the_limit_label_only():
    from harvest_celery._runtime.metrics import _SPECS, FROM_POSTGRES, HISTOGRAMS, METRICS

    name, _doc, labels = _SPECS["limit_throttled"]
    assert (name, labels) == ("harvest_limit_throttled_seconds", ("limit",))
    assert "limit_throttled" not in HISTOGRAMS and "limit_throttled" not in FROM_POSTGRES  # a counter
    assert "harvest_limit_throttled_seconds_total" in METRICS.exported_names()
    before = METRICS.value("limit_throttled", {"limit": "unit-rate"})
    METRICS.inc("limit_throttled", {"limit": "unit-rate"}, 1.5)
    assert METRICS.value("limit_throttled", {"limit": "unit-rate"}) == before + 1.5


@activity(name="burst", concurrency=1)
def burst(label):
    return label


@workflow(name="bursts")
async def bursts(ctx: WorkflowContext, label):
    return await ctx.execute_activity(burst, label)


def test_a_rate_gone_leaves_no_waiting_row_due_so_the_waker_idles(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'b.db'}").register(bursts, burst)
    harvest.migrate()
    harvest._inline = None
    harvest.runtime.dispatcher = InlineDispatcher()
    start(harvest, "bursts", "a")  # takes the one slot
    harvest.set_limit("burst", rate_limit="1/h")  # an override adds a rate to the slot limit
    second = start(harvest, "bursts", "b")
    messages(harvest)
    with harvest.store.begin() as tx:  # as its turn had come under the rate: a due time
        tx.conn.execute(
            activity_tasks.update().where(activity_tasks.c.execution_id == second).values(due_at=utcnow())
        )
    harvest.set_limit("burst", clear=True)  # no rate now; the one slot is still taken
    assert status(harvest, second) == "waiting" and row(harvest, second)["due_at"] is None
    assert harvest.runtime.sweeper.waker.release_due() == (IDLE, None)  # not a 5 ms retry loop
    assert_in_use_matches(harvest)
