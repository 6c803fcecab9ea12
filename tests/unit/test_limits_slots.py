"""Concurrency slots (``_store.limits``) on the embedded SQLite store, messages delivered by
hand: a limited dispatch takes a free slot or waits with no message; the transaction that frees
a slot releases the next row (compensations first, priority descending, FIFO); every close
abandons waiting rows and frees its slots; a retry waits in line again; overrides and keys.
After each test, ``in_use`` equals the scheduled and running rows of its limit."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, RetryPolicy, UnknownActivity, WorkflowContext, activity, workflow
from harvest_celery._cli import main
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store import limits as store_limits
from harvest_celery._store import tasks
from harvest_celery._store.schema import activity_tasks, limits
from harvest_celery._store.store import utcnow

ORDER: list[str] = []


@activity(name="charge", concurrency=2, retry=RetryPolicy(max_attempts=3, initial_interval=0.01))
def charge(label):
    ORDER.append(label)
    return label


@activity(name="ship", concurrency=1, limit_key=lambda i: i["merchant"])
def ship(payload):
    return payload["merchant"]


@workflow(name="pay")
async def pay(ctx: WorkflowContext, data):
    return await ctx.execute_activity(charge, data["label"], priority=data.get("priority", 0))


@workflow(name="send")
async def send(ctx: WorkflowContext, data):
    return await ctx.execute_activity(ship, data)


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}").register(pay, send, charge, ship)
    harvest.migrate()
    harvest._inline = None  # deliver messages by hand
    harvest.runtime.dispatcher = InlineDispatcher()
    yield harvest
    assert_in_use_matches(harvest)


def assert_in_use_matches(h):
    """The invariant: each limit row's in_use is its scheduled and running rows."""
    with h.store.begin() as tx:
        for row in tx.conn.execute(sa.select(limits).where(limits.c.key_digest != "")).all():
            holding = tx.conn.execute(
                sa.select(sa.func.count())
                .select_from(activity_tasks)
                .where(
                    (activity_tasks.c.activity_name == row.name)
                    & (activity_tasks.c.limit_digest == row.key_digest)
                    & activity_tasks.c.status.in_(("scheduled", "running"))
                )
            ).scalar_one()
            assert row.in_use == holding, (row.name, row.in_use, holding)
        for row in tx.conn.execute(sa.select(limits).where(limits.c.key_digest == "")).all():
            if row.name == "charge":  # no key: the name's row is the slot row too
                assert row.in_use == h_count(tx, "charge")


def h_count(tx, name):
    return tx.conn.execute(
        sa.select(sa.func.count())
        .select_from(activity_tasks)
        .where(
            (activity_tasks.c.activity_name == name) & activity_tasks.c.status.in_(("scheduled", "running"))
        )
    ).scalar_one()


def messages(h):
    """The activity messages queued for the broker (taken out of it)."""
    queue = h.runtime.dispatcher.queue
    sent = [m for m in queue if m.task_name != "harvest.decide"]
    queue.clear()
    return sent


def status(h, run_id):
    return h.store.activity_rows(run_id)[0]["status"]


def run_body(h, message):
    claim = h.runtime.claim(*message.args)
    assert claim is not None
    h.runtime.execute(claim, h.registry.activity(message.task_name).fn)


def start(h, workflow_type, data):
    run_id = h.start_workflow(workflow_type, data)
    h.runtime.run_decision(run_id)
    return run_id


def test_a_third_dispatch_waits_with_no_message_until_a_slot_frees(h):
    runs = [start(h, "pay", {"label": f"r{i}"}) for i in range(3)]
    sent = messages(h)
    assert [status(h, r) for r in runs] == ["scheduled", "scheduled", "waiting"]
    assert len(sent) == 2
    run_body(h, sent[0])  # its completion frees the slot and releases the waiter in its transaction
    assert status(h, runs[2]) == "scheduled"
    (released,) = messages(h)
    assert released.args[0] == runs[2]


def test_priority_then_fifo_orders_what_waits(h):
    ORDER.clear()
    holders = [start(h, "pay", {"label": f"hold{i}"}) for i in range(2)]
    held = messages(h)
    for label, priority in [("a0", 0), ("b0", 0), ("c9", 9), ("d5", 5), ("e9", 9)]:
        start(h, "pay", {"label": label, "priority": priority})
    assert messages(h) == []
    for message in held:
        run_body(h, message)
    while True:
        sent = messages(h)
        if not sent:
            break
        for message in sent:
            run_body(h, message)
    assert ORDER[2:] == ["c9", "e9", "d5", "a0", "b0"]
    assert all(h.describe(r).status == "COMPLETED" for r in holders)


def test_each_key_has_its_own_slots(h):
    a1, a2, b1 = (start(h, "send", {"merchant": m}) for m in ("m-a", "m-a", "m-b"))
    assert [status(h, r) for r in (a1, a2, b1)] == ["scheduled", "waiting", "scheduled"]
    digests = {r["limit_digest"] for r in h.store.activity_rows(a1) + h.store.activity_rows(b1)}
    assert len(digests) == 2 and not any("m-" in d for d in digests)


def test_cancel_and_terminate_abandon_waiting_rows_and_free_slots(h):
    first, second, waiting = (start(h, "pay", {"label": f"r{i}"}) for i in range(3))
    messages(h)
    h.cancel_workflow_execution(waiting, "stop")
    assert status(h, waiting) == "cancelled"
    h.terminate(first, "stop")  # its scheduled row is abandoned: the slot frees
    assert status(h, first) == "cancelled"
    late = start(h, "pay", {"label": "late"})
    assert status(h, late) == "scheduled" and status(h, waiting) == "cancelled"


def test_an_override_holds_slots_and_clearing_it_restores_the_declared_value(h):
    with h.store.begin() as tx:
        store_limits.declare(tx, "charge", h.registry.activity("charge").limits)
        tx.conn.execute(
            limits.update()
            .where((limits.c.name == "charge") & (limits.c.key_digest == ""))
            .values(override_concurrency=0)
        )
    run_id = start(h, "pay", {"label": "held"})
    assert status(h, run_id) == "waiting" and messages(h) == []
    with h.store.begin() as tx:
        tx.conn.execute(limits.update().where(limits.c.name == "charge").values(override_concurrency=None))
        tx.touch_limit("charge", "")
    assert status(h, run_id) == "scheduled"


def test_a_retry_waits_in_line_again_and_a_lost_lease_frees_its_slot(h):
    one, two, three = (start(h, "pay", {"label": f"r{i}"}) for i in range(3))
    first, second = messages(h)
    claim = h.runtime.claim(*first.args)
    assert h.runtime.fail(claim, "ConnectionError", "flaky") == "retry"  # retry_wait: frees the slot
    assert status(h, three) == "scheduled"
    with h.store.begin() as tx:
        tasks.redispatch_next_attempt(tx, one, "1", utcnow())
    assert status(h, one) == "waiting"  # 2 in use: its retry waits for a slot
    claim = h.runtime.claim(*second.args)
    with h.store.begin() as tx:
        tasks.expire_lease(tx, two, "1", 1, utcnow() + timedelta(hours=1), "harvest")
    assert status(h, one) == "scheduled"  # the expired lease's slot went to the waiting retry


def test_the_sweeper_backstop_releases_what_a_lost_process_did_not(h):
    start(h, "pay", {"label": "r0"})
    start(h, "pay", {"label": "r1"})
    waiting = start(h, "pay", {"label": "r2"})
    with h.store.begin() as tx:  # a slot freed without a settle (its process died)
        tx.conn.execute(
            activity_tasks.update().where(activity_tasks.c.status == "scheduled").values(status="completed")
        )
    assert status(h, waiting) == "waiting"
    h.runtime.sweeper.sweep_once()
    assert status(h, waiting) == "scheduled"


# ── run-time overrides: set_limit and harvest limits ─────────────────────────────────────────
def limit_rows(h):
    with h.store.begin() as tx:
        return [tuple(r) for r in tx.conn.execute(sa.select(limits).order_by(limits.c.name)).all()]


def test_set_limit_of_an_unknown_name_or_a_bad_value_writes_nothing(h):
    start(h, "pay", {"label": "r0"})
    before = limit_rows(h)
    with pytest.raises(UnknownActivity):
        h.set_limit("no_such_activity", 2)
    for bad in (-1, True, 2.5, "3"):
        with pytest.raises(ValueError, match="concurrency must be an int >= 0"):
            h.set_limit("charge", bad)
    with pytest.raises(ValueError, match="not both"):
        h.set_limit("charge", 2, clear=True)
    assert limit_rows(h) == before


def test_an_override_lowers_new_slots_and_clearing_it_restores_the_decorators(h):
    runs = [start(h, "pay", {"label": f"r{i}"}) for i in range(4)]
    first, second = messages(h)
    h.set_limit("charge", 1)  # lowering stops no running body: both holders keep their slots
    (entry,) = [e for e in h.limits() if e["name"] == "charge"]
    assert (entry["declared_concurrency"], entry["override_concurrency"], entry["in_use"]) == (2, 1, 2)
    assert entry["waiting"] == 2 and entry["override_set_at"] is not None
    run_body(h, first)
    assert messages(h) == [] and [status(h, r) for r in runs[2:]] == ["waiting", "waiting"]
    run_body(h, second)
    (third,) = messages(h)  # new slots follow 1
    assert third.args[0] == runs[2]
    h.runtime.sync_limits()  # a worker start with the decorator's 2 keeps the override
    (entry,) = [e for e in h.limits() if e["name"] == "charge"]
    assert (entry["declared_concurrency"], entry["override_concurrency"]) == (2, 1)
    start(h, "pay", {"label": "r4"})
    h.set_limit("charge", clear=True)  # 2 again: the waiting row is released at once
    assert [status(h, r) for r in runs[2:]] == ["scheduled", "scheduled"]


def test_the_limits_cli_lists_sets_and_clears(h, capsys):
    start(h, "pay", {"label": "r0"})
    url = h.database_url
    assert main(["--database-url", url, "limits", "set", "charge", "--concurrency", "0"]) == 0
    out = capsys.readouterr().out
    assert "charge: 1/0 in use, 0 waiting, declared 2, override 0 set " in out
    assert main(["--database-url", url, "limits", "clear", "charge"]) == 0
    assert "charge: 1/2 in use, 0 waiting, declared 2\n" in capsys.readouterr().out
    assert main(["--database-url", url, "limits", "set", "nope", "--concurrency", "1"]) != 0
    assert "no limited activity named 'nope'" in capsys.readouterr().err
