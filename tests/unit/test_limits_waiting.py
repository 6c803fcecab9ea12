"""``TaskStatus.WAITING`` and the task row's flow-control columns, on the embedded SQLite store
with messages delivered by hand (no worker). Every reader of task statuses knows a row a limit
holds back: the claim refuses it, every close abandons it, a late completion is accepted while
the next attempt waits, the sweeper never re-sends it, erasure tombstones its key, a reset
copies its key and priority, and ``stuck()``, ``harvest show`` and the console name it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from harvest_celery import FernetCodec, Harvest, RetryPolicy, WorkflowContext, activity, workflow
from harvest_celery._cli import waiting_line
from harvest_celery._core.limits import slot_text
from harvest_celery._payloads.digest import limit_digest
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store import sweeps, tasks
from harvest_celery._store.migrate import downgrade
from harvest_celery._store.records import Timings
from harvest_celery._store.schema import activity_tasks
from harvest_celery._store.store import utcnow
from harvest_celery._web.console.run_page import _activities
from harvest_celery._web.console.run_view import build_run_view


@activity(name="charge", concurrency=3, limit_key=lambda i: i["merchant"], retry=RetryPolicy(max_attempts=3))
def charge(payload):
    return "ch-1"


@activity(name="notify")
def notify(payload):
    return "sent"


@workflow(name="pay")
async def pay(ctx: WorkflowContext, data):
    return await ctx.execute_activity(charge, data, priority=7)


@workflow(name="fire_and_forget")
async def fire_and_forget(ctx: WorkflowContext, data):
    ctx.execute_activity(charge, data)  # never awaited: the run finishes without it
    return await ctx.execute_activity(notify, data)


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(
        f"sqlite:///{tmp_path / 'h.db'}", codec=FernetCodec({"k1": Fernet.generate_key()}, primary="k1")
    )
    harvest.register(pay, fire_and_forget, charge, notify)
    harvest.migrate()
    harvest._inline = None  # deliver messages by hand
    harvest.runtime.dispatcher = InlineDispatcher()
    return harvest


def decide(h, run_id):
    h.runtime.run_decision(run_id)
    h.runtime.dispatcher.queue.clear()


def row(h, run_id, activity_id="1"):
    (found,) = [r for r in h.store.activity_rows(run_id) if r["activity_id"] == activity_id]
    return found


def hold(h, run_id, activity_id="1"):
    """What a limit does to a dispatch it cannot start: the row is written ``waiting``."""
    with h.store.begin() as tx:
        tx.conn.execute(
            activity_tasks.update()
            .where((activity_tasks.c.execution_id == run_id) & (activity_tasks.c.activity_id == activity_id))
            .values(status="waiting")
        )


def types(h, run_id):
    return [e.event.type for e in h.store.history(run_id)]


def test_a_limited_row_carries_priority_an_encoded_key_and_the_keys_salted_digest(h):
    run_id = h.start_workflow("pay", {"merchant": "m-42", "amount": 5})
    decide(h, run_id)
    r = row(h, run_id)
    assert r["priority"] == 7
    assert "m-42" not in str(r["limit_key"])  # through the codec: a payload
    assert h.store.payloads.decode_value(r["limit_key"]) == "m-42"
    assert r["limit_digest"] == limit_digest("charge", "m-42") != limit_digest("other", "m-42")
    assert "m-42" not in r["limit_digest"] and limit_digest("charge", None) == ""


def test_an_unlimited_row_has_no_limit(h):
    run_id = h.start_workflow("fire_and_forget", {"merchant": "m-1"})
    decide(h, run_id)
    assert (row(h, run_id, "2")["limit_digest"], row(h, run_id, "2")["priority"]) == (None, 0)


def test_a_waiting_row_is_never_claimed(h):
    run_id = h.start_workflow("pay", {"merchant": "m-1"})
    decide(h, run_id)
    hold(h, run_id)
    assert h.runtime.claim(run_id, "1", 1) is None
    assert row(h, run_id)["status"] == "waiting" and "ActivityStarted" not in types(h, run_id)


@pytest.mark.parametrize("close", ["cancel", "terminate"])
def test_a_cancel_or_terminate_abandons_waiting_rows(h, close):
    run_id = h.start_workflow("pay", {"merchant": "m-1"})
    decide(h, run_id)
    hold(h, run_id)
    if close == "cancel":
        h.cancel_workflow_execution(run_id, "stop")
    else:
        h.terminate(run_id, "stop")
    assert row(h, run_id)["status"] == "cancelled"
    assert h.runtime.claim(run_id, "1", 1) is None


def test_a_finishing_decision_abandons_waiting_rows(h):
    run_id = h.start_workflow("fire_and_forget", {"merchant": "m-1"})
    decide(h, run_id)
    hold(h, run_id, "1")
    claim = h.runtime.claim(run_id, "2", 1)
    h.runtime.execute(claim, notify)
    h.runtime.run_decision(run_id)
    assert h.describe(run_id).status == "COMPLETED"
    assert row(h, run_id, "1")["status"] == "cancelled"


def test_the_sweeper_never_resends_a_waiting_row(h):
    run_id = h.start_workflow("pay", {"merchant": "m-1"})
    decide(h, run_id)
    hold(h, run_id)
    later = utcnow().replace(year=utcnow().year + 1)
    with h.store.begin() as tx:
        sweeps.stale_scheduled(tx, later, Timings())
        assert not tx.dispatches
    assert row(h, run_id)["status"] == "waiting"


def test_a_late_completion_is_accepted_while_the_next_attempt_waits(h):
    run_id = h.start_workflow("pay", {"merchant": "m-1"})
    decide(h, run_id)
    first = h.runtime.claim(run_id, "1", 1)
    assert h.runtime.fail(first, "ConnectionError", "flaky") == "retry"
    with h.store.begin() as tx:
        tasks.redispatch_next_attempt(tx, run_id, "1", utcnow())
    hold(h, run_id)
    assert row(h, run_id)["attempt"] == 2
    h.runtime.complete(first, "ch-1")  # attempt 1's body did finish after all
    assert row(h, run_id)["status"] == "completed" and "ActivityCompleted" in types(h, run_id)


def test_erasure_tombstones_the_stored_key(h):
    run_id = h.start_workflow("pay", {"merchant": "m-1"})
    decide(h, run_id)
    h.terminate(run_id, "stop")
    h.erase_payloads(run_id)
    assert row(h, run_id)["limit_key"] != h.store.payloads.encode_value("m-1", "x")
    assert h.store.payloads.decode_value(row(h, run_id)["limit_key"]) != "m-1"


def test_erasure_refuses_a_cancelled_run_that_still_holds_a_waiting_row(h):
    run_id = h.start_workflow("pay", {"merchant": "m-1"})
    decide(h, run_id)
    h.terminate(run_id, "stop")
    hold(h, run_id)  # an impossible state (a close abandons them): erasure does not let it pass
    with pytest.raises(Exception, match="closed with work still waiting"):
        h.erase_payloads(run_id)


def test_a_reset_copies_the_key_and_priority_from_the_source_row(h):
    run_id = h.start_workflow("pay", {"merchant": "m-9"})
    decide(h, run_id)
    new_id = h.reset(run_id, 2, "pay-reset")
    copied = row(h, new_id)
    assert copied["priority"] == 7 and copied["limit_digest"] == limit_digest("charge", "m-9")
    assert h.store.payloads.decode_value(copied["limit_key"]) == "m-9"


def test_stuck_names_the_slot_from_postgres_even_when_no_worker_can_be_asked(h):
    held = [h.start_workflow("pay", {"merchant": "m-1"}) for _ in range(4)]
    for run_id in held:
        decide(h, run_id)
    assert h._consumers is None  # embedded: the workers cannot be asked
    assert h.stuck(held[0]) is None  # a scheduled row: cannot tell
    (hint,) = h.stuck(held[3])
    assert (hint["kind"], hint["activity"], hint["in_use"], hint["concurrency"]) == ("slot", "charge", 3, 3)
    assert slot_text(hint) == "waiting for a slot of charge (3/3 in use)"
    assert waiting_line(hint, "app").startswith("waiting: waiting for a slot of charge (3/3 in use) for ")
    assert "m-1" not in str(hint)
    view = build_run_view(h.history(held[3]), [], held=h.store.held_activities(held[3]))
    assert "waiting for a slot of charge (3/3 in use)" in _activities(view)


def test_a_downgrade_refuses_while_a_row_waits(h, tmp_path):
    run_id = h.start_workflow("pay", {"merchant": "m-1"})
    decide(h, run_id)
    hold(h, run_id)
    with pytest.raises(Exception, match="'waiting' for a limit"):
        downgrade(h.database_url, "0007")
    engine = sa.create_engine(h.database_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM harvest_alembic_version")).scalar() == "0011"
    engine.dispose()
