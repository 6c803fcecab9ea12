"""Races and edge paths of the store, on the embedded SQLite store with messages delivered by
hand (no worker): each test replays an interleaving that once broke an invariant."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from harvest_celery import Harvest, InvalidState, RetryPolicy, Saga, WorkflowContext, activity, workflow
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store import sweeps, tasks
from harvest_celery._store.store import utcnow

SEEN: list = []


@activity(retry=RetryPolicy(max_attempts=3), start_to_close=1)
def charge(x):
    return "ch-1"


@activity
def refund(x):
    return None


@activity
def notify(x):
    SEEN.append(x)
    return "sent"


@activity(retry=RetryPolicy(max_attempts=1))
def decline(x):
    raise RuntimeError("declined")


@workflow
async def checkout(ctx: WorkflowContext, data):
    saga = Saga(ctx)
    await saga.step(lambda: ctx.execute_activity(charge, data), lambda cid: ctx.execute_activity(refund, cid))


@workflow
async def order(ctx: WorkflowContext, data):
    pending = ctx.execute_activity(notify, {"email": data["email"]})
    await ctx.execute_activity(decline, data)  # fails: the run fails, notify never awaited
    await pending


@workflow
async def waits(ctx: WorkflowContext, data):
    await ctx.wait_signal("go")
    return {"cancelled": ctx.is_cancelled()}


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}").register(
        checkout, charge, refund, order, notify, decline, waits
    )
    harvest.migrate()
    harvest._inline = None  # deliver messages by hand
    harvest.runtime.dispatcher = InlineDispatcher()
    return harvest


def pump(h, hold=()):
    """Deliver queued messages; those named in ``hold`` stay 'in the broker' and are returned."""
    queue, held = h.runtime.dispatcher.queue, []
    while queue:
        m = queue.popleft()
        if m.task_name == "harvest.decide":
            h.runtime.run_decision(m.args[0])
        elif m.task_name in hold:
            held.append(m)
        else:
            claim = h.runtime.claim(*m.args)
            if claim:
                h.runtime.execute(claim, h.registry.activity(m.task_name).fn)
    return held


def types(h, run_id):
    return [e.event.type for e in h.store.history(run_id)]


def test_a_delayed_message_of_a_finished_run_never_runs_its_body(h):
    SEEN.clear()
    run_id = h.start_workflow("order", {"email": "pii@example.com"})
    held = pump(h, hold={"notify"})
    assert h.describe(run_id).status == "FAILED"
    assert [r["status"] for r in h.store.activity_rows(run_id)] == ["cancelled", "failed"]
    h.erase_payloads(run_id)
    for m in held:  # the broker finally delivers it
        assert h.runtime.claim(*m.args) is None
    assert SEEN == [] and types(h, run_id)[-1] == "WorkflowFailed"


def test_a_stale_sweeper_pass_never_fails_a_row_the_cancel_already_failed(h):
    run_id = h.start_workflow("checkout", {"o": 1})
    h.runtime.run_decision(run_id)
    claim = h.runtime.claim(run_id, "1", 1)
    later = utcnow() + timedelta(seconds=60)
    with h.store.begin() as tx:
        expired = sweeps.expired_leases(tx, later)  # the sweeper reads the expired lease...
    assert h.runtime.fail(claim, "ConnectionError", "flaky") == "retry"
    h.cancel_workflow_execution(run_id, "customer asked")
    for execution_id, activity_id, attempt in expired:  # ...and processes its stale list
        with h.store.begin() as tx:
            tasks.expire_lease(tx, execution_id, activity_id, attempt, later, "harvest")
    assert h.store.activity_rows(run_id)[0]["status"] == "cancelled"
    assert "ActivityFailed" not in types(h, run_id)
    pump(h)
    assert h.describe(run_id).status == "CANCELLED" and not any(
        t == "MarkerRecorded" for t in types(h, run_id)
    )  # no rollback was set off


def test_a_retry_policy_that_overflows_is_capped_and_the_sweep_goes_on(h):
    huge = RetryPolicy(max_attempts=100_000, maximum_interval=60)
    assert huge.delay_after(5000) == 60
    assert RetryPolicy(backoff_coefficient=10.0, maximum_interval=7).delay_after(400) == 7


def test_cancel_clears_a_pause_and_an_erased_run_takes_no_decision(h):
    run_id = h.start_workflow("waits", {})
    pump(h)
    h.pause(run_id)
    h.cancel_workflow_execution(run_id, "stop")
    assert h.describe(run_id).paused_at is None
    with pytest.raises(InvalidState, match="not paused"):
        h.resume(run_id)
    pump(h)
    h.erase_payloads(run_id)
    before = types(h, run_id)
    with h.store.begin() as tx:
        tx.request_decision(run_id, utcnow(), "harvest", force=True)
    pump(h)
    assert types(h, run_id) == before  # nothing is appended to an erased run


def test_a_forked_child_starts_with_a_free_lease_lock_and_no_warm_sessions(h):
    import os

    h.runtime.leases._lock.acquire()  # another thread holds it at the moment of the fork
    pid = os.fork()
    if pid == 0:  # the child: the lock must be free and the cache empty
        ok = h.runtime.leases._lock.acquire(timeout=2) and len(h.runtime.sessions) == 0
        os._exit(0 if ok else 1)
    h.runtime.leases._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


@activity
def slow_no_deadline(x):
    import time

    time.sleep(0.6)
    return "done"


@workflow
async def long_body(ctx: WorkflowContext, data):
    return await ctx.execute_activity(slow_no_deadline, data)


def test_a_body_without_start_to_close_keeps_its_lease_alive_while_it_runs(tmp_path):
    import threading
    import time

    from harvest_celery._store.store import Timings

    h = Harvest(f"sqlite:///{tmp_path / 'l.db'}", timings=Timings(default_lease=0.15))
    h.register(long_body, slow_no_deadline)
    h.migrate()
    h._inline = None
    h.runtime.dispatcher = InlineDispatcher()
    run_id = h.start_workflow("long_body", {})
    h.runtime.run_decision(run_id)
    claim = h.runtime.claim(run_id, "1", 1)
    first = h.store.activity_rows(run_id)[0]["lease_expires_at"]
    body = threading.Thread(target=h.runtime.execute, args=(claim, slow_no_deadline))
    body.start()
    time.sleep(0.4)  # a few heartbeats (every 0.05 s)
    renewed = h.store.activity_rows(run_id)[0]["lease_expires_at"]
    body.join()
    assert renewed > first  # the running body pushed its lease forward
    assert h.store.activity_rows(run_id)[0]["status"] == "completed"


def test_erasure_scrubs_error_messages_that_may_quote_the_input(h):
    @activity(name="leaky", retry=RetryPolicy(max_attempts=1))
    def leaky(x):
        raise ValueError(f"card {x['card']} declined")

    @workflow(name="leaky_flow")
    async def leaky_flow(ctx, data):
        return await ctx.execute_activity("leaky", data)

    h.register(leaky, leaky_flow)
    run_id = h.start_workflow("leaky_flow", {"card": "4111-1111"})
    pump(h)
    assert "4111-1111" in str(h.describe(run_id).error)
    h.erase_payloads(run_id)
    dump = (
        str([e.event for e in h.store.history(run_id)])
        + str(h.describe(run_id).error)
        + str(h.store.activity_rows(run_id))
    )
    assert "4111-1111" not in dump
    assert h.describe(run_id).error["type"] == "ActivityError"  # the type survives


def test_a_cancel_fails_a_dispatched_but_unclaimed_row_without_an_event_and_its_body_never_runs(h):
    SEEN.clear()

    @workflow(name="notify_then_wait")
    async def notify_then_wait(ctx, data):
        await ctx.execute_activity(notify, data)

    h.register(notify_then_wait)
    run_id = h.start_workflow("notify_then_wait", {"email": "x@example.com"})
    held = pump(h, hold={"notify"})  # dispatched, still in the broker
    h.cancel_workflow_execution(run_id, "stop")
    row = h.store.activity_rows(run_id)[0]
    assert row["status"] == "cancelled" and row["last_error"] == "workflow cancelled: stop"
    for m in held:  # delivered after the cancel: the claim is refused
        assert h.runtime.claim(*m.args) is None
    pump(h)
    assert SEEN == []
    assert types(h, run_id) == ["WorkflowStarted", "ActivityScheduled", "WorkflowCancelled"]
    assert h.describe(run_id).status == "CANCELLED"


def test_a_late_heartbeat_never_revives_an_expired_lease(h):
    from harvest_celery._store.schema import activity_tasks

    run_id = h.start_workflow("checkout", {"o": 1})
    h.runtime.run_decision(run_id)
    assert h.runtime.claim(run_id, "1", 1) is not None
    expired_at = utcnow() - timedelta(seconds=5)
    with h.store.begin() as tx:  # the lease ran out while the heartbeat thread was stalled
        tx.conn.execute(
            activity_tasks.update()
            .where(activity_tasks.c.execution_id == run_id)
            .values(lease_expires_at=expired_at)
        )
    h.runtime.leases.renew([(run_id, "1", 1)])  # the stalled beat finally runs
    with h.store.begin() as tx:
        assert sweeps.expired_leases(tx, utcnow()) == [(run_id, "1", 1)]  # still the sweeper's
    lease = h.store.activity_rows(run_id)[0]["lease_expires_at"]
    assert lease.replace(tzinfo=None) <= utcnow().replace(tzinfo=None)


def test_a_cancel_after_an_expired_lease_still_records_the_late_completion_of_the_body_that_ran(h):
    # charge's attempt 1 runs; its lease expires while its completion is held up (a database
    # outage): the sweeper records a StartToCloseTimeout and schedules a retry (no event); then
    # the run is cancelled, which abandons the row (its retry never runs)
    run_id = h.start_workflow("checkout", {"o": 1})
    h.runtime.run_decision(run_id)
    claim = h.runtime.claim(run_id, "1", 1)
    later = utcnow() + timedelta(seconds=60)
    with h.store.begin() as tx:
        tasks.expire_lease(tx, run_id, "1", 1, later, "harvest")
    assert h.store.activity_rows(run_id)[0]["status"] == "retry_wait"
    h.cancel_workflow_execution(run_id, "customer asked")
    assert h.store.activity_rows(run_id)[0]["status"] == "cancelled"
    h.runtime.complete(claim, "ch-1")  # the body ran: the charge happened
    assert types(h, run_id)[-1] == "ActivityCompleted"  # the history says so
    assert h.store.activity_rows(run_id)[0]["status"] == "completed"
    assert h.runtime.claim(run_id, "1", 2) is None  # the retry still never runs
    pump(h)
    assert h.describe(run_id).status == "CANCELLED"
    assert types(h, run_id).count("ActivityScheduled") == 1  # no new durable work after the seal


def test_a_cancel_never_lets_a_body_that_never_started_record_a_completion(h):
    run_id = h.start_workflow("checkout", {"o": 1})
    h.runtime.run_decision(run_id)
    claim = h.runtime.claim(run_id, "1", 1)
    assert h.runtime.fail(claim, "ConnectionError", "flaky") == "retry"
    with h.store.begin() as tx:
        tasks.redispatch_next_attempt(tx, run_id, "1", utcnow())  # attempt 2 sent, not claimed
    h.cancel_workflow_execution(run_id, "stop")
    forged = dataclasses.replace(claim, attempt=2)  # attempt 2 never claimed: never started
    h.runtime.complete(forged, "ch-2")
    assert "ActivityCompleted" not in types(h, run_id)
    assert h.store.activity_rows(run_id)[0]["status"] == "cancelled"
