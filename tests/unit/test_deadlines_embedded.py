"""Deadlines end to end on the embedded SQLite app (one process: ``result()`` drives the in-process
worker and the sweeper; the real-service tests are tests/integration/test_deadlines.py): the
deadline columns, the sweeper's timeout request and grace seal, a continue-as-new chain carrying
its deadlines, and bad timeouts refused with nothing written (also over the HTTP API)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import (
    Cancelled,
    Harvest,
    Saga,
    Timings,
    WorkflowContext,
    WorkflowTimedOut,
    activity,
    workflow,
)
from harvest_celery._store.schema import events as events_table
from harvest_celery._store.schema import executions
from harvest_celery._web.api import create_app

APP = "tests.unit.test_deadlines_embedded:harvest_app"  # the CLI's --app (module:attribute)
SHORT = 0.2  # seconds: a deadline that expires at the first sweeps
WAIT = 20.0  # seconds a test waits for an outcome (never a timed assertion)


@activity
def charge(x):
    return f"ch-{x}"


@activity
def refund(charge_id):
    return f"refunded {charge_id}"


@workflow
async def parked(ctx: WorkflowContext, order):
    saga = Saga(ctx)
    await saga.step(lambda: ctx.execute_activity(charge, order), lambda c: ctx.execute_activity(refund, c))
    try:
        return await ctx.wait_signal("approve", cancellable=True)
    except Cancelled:
        await saga.compensate_all()
        raise Cancelled(ctx.cancellation_reason() or "") from None


@workflow
async def napper(ctx: WorkflowContext, order):
    saga = Saga(ctx)
    await saga.step(lambda: ctx.execute_activity(charge, order), lambda c: ctx.execute_activity(refund, c))
    try:
        await ctx.sleep(3600, cancellable=True)
    except Cancelled:
        await saga.compensate_all()
        raise
    return "slept"


@workflow
async def stubborn(ctx: WorkflowContext, _):
    await ctx.wait_signal("go")  # not cancellable: it completes anyway
    return "done anyway"


@workflow
async def sleepy(ctx: WorkflowContext, _):
    await ctx.sleep(3600)  # not cancellable: only the grace period's seal ends it
    return "woke"


@workflow
async def breaks(ctx: WorkflowContext, _):
    try:
        await ctx.wait_signal("go", cancellable=True)
    except Cancelled:
        raise RuntimeError("undo failed") from None


@workflow
async def unwinding(ctx: WorkflowContext, order):
    """Mid-unwind when the grace ends: its refund dispatched, then it waits for a confirmation."""
    saga = Saga(ctx)
    await saga.step(lambda: ctx.execute_activity(charge, order))
    try:
        await ctx.wait_signal("approve", cancellable=True)
    except Cancelled:
        saga.push_compensation(lambda: ctx.execute_activity(refund, order))
        await saga.compensate_all()
        await ctx.wait_signal("confirmed")
        raise
    return "approved"


@workflow
async def chained(ctx: WorkflowContext, n):
    if n < 2:
        ctx.continue_as_new(n + 1)
    return await ctx.wait_signal("last")


ALL = (charge, refund, parked, napper, stubborn, sleepy, breaks, unwinding, chained)


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'd.db'}", timings=Timings(timeout_grace=0.3)).register(*ALL)
    harvest.migrate()
    return harvest


def activity_names(h, run_id):
    return [e.event.activity_name for e in h.history(run_id) if e.event.type == "ActivityScheduled"]


def until(h, check):
    """Drive the in-process worker and the sweeper until ``check()`` holds."""
    limit = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < limit, "gave up waiting"
        h.drain()
        h.runtime.sweep_once()
        time.sleep(0.02)


# ── the outcome table ────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("workflow_name", ["parked", "napper"])
def test_a_timeout_undoes_a_parked_run_and_ends_timed_out(h, workflow_name):
    run_id = h.start_workflow(workflow_name, "o-1", execution_timeout=SHORT)
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(run_id, timeout=WAIT)
    exc = caught.value
    assert (exc.outcome, exc.timeout) == ("cancelled", "execution")
    assert "timeout" in exc.reason
    x = h.describe(run_id)
    assert x.status == x.display_status == "TIMED_OUT" and x.timeout == "execution"
    assert x.timed_out_at is not None and x.cancelled_at is None and not x.timeout_overrun
    assert activity_names(h, run_id) == ["charge", "refund"]
    types = [e.event.type for e in h.history(run_id)]
    assert types.count("WorkflowTimeoutRequested") == 1
    assert ("TimerStarted" in types) == (workflow_name == "napper")
    last = h.history(run_id)[-1].event
    assert last.type == "WorkflowFailed" and "timeout" in last.message


def test_a_run_timeout_is_named_run(h):
    run_id = h.start_workflow("parked", "o-2", run_timeout=timedelta(seconds=SHORT))
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(run_id, timeout=WAIT)
    assert caught.value.timeout == "run" and caught.value.reason.startswith("run_timeout of ")


def test_a_run_that_completes_anyway_is_completed(tmp_path):
    h = Harvest(f"sqlite:///{tmp_path / 'g.db'}").register(*ALL)  # the default grace: 60 s
    h.migrate()
    run_id = h.start_workflow("stubborn", None, execution_timeout=SHORT)
    until(h, lambda: h.describe(run_id).timed_out_at is not None)
    assert h.describe(run_id).display_status == "CANCELLING"
    h.signal(run_id, "go")
    assert h.result(run_id, timeout=WAIT) == "done anyway"
    x = h.describe(run_id)
    assert x.status == "COMPLETED" and x.timed_out_at is not None


def test_a_non_cancellable_sleep_is_sealed_timed_out_at_the_end_of_the_grace(h):
    run_id = h.start_workflow("sleepy", None, execution_timeout=SHORT)
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(run_id, timeout=WAIT)
    assert caught.value.outcome == "stopped"  # it waits on a timer a sealed run never gets
    x = h.describe(run_id)
    assert x.status == "TIMED_OUT" and x.cancelled_at is not None
    assert "grace period ended" in (x.cancel_reason or "")
    assert [e.event.type for e in h.history(run_id)][-1] == "WorkflowCancelled"


def test_a_failing_cancel_branch_shows_cancel_branch_failed(h):
    run_id = h.start_workflow("breaks", None, execution_timeout=SHORT)
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(run_id, timeout=WAIT)
    assert caught.value.outcome == "failed" and caught.value.error == "RuntimeError: undo failed"
    x = h.describe(run_id)
    assert x.display_status == "TIMED_OUT (cancel branch failed: RuntimeError: undo failed)"
    assert x.cancel_branch_error == "RuntimeError: undo failed"


def test_mid_unwind_at_the_end_of_the_grace_the_run_is_not_sealed(h, caplog):
    run_id = h.start_workflow("unwinding", "o-3", execution_timeout=SHORT)
    with caplog.at_level("WARNING", logger="harvest_celery"):
        until(h, lambda: h.describe(run_id).timeout_overrun)
        for _ in range(3):  # later sweeps find nothing more to do: warned once
            h.runtime.sweep_once()
    warned = [r for r in caplog.records if "ended mid-unwind" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING" and run_id in warned[0].getMessage()
    x = h.describe(run_id)
    assert x.status == "RUNNING" and x.display_status == "CANCELLING" and x.cancelled_at is None
    assert activity_names(h, run_id) == ["charge", "refund"]  # the refund is in the history
    h.signal(run_id, "confirmed")
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(run_id, timeout=WAIT)
    assert caught.value.outcome == "cancelled"
    assert h.describe(run_id).status == "TIMED_OUT"


def test_an_operator_may_still_cancel_a_timed_out_run(h):
    run_id = h.start_workflow("unwinding", "o-4", execution_timeout=SHORT)
    until(h, lambda: h.describe(run_id).timed_out_at is not None)
    assert h.cancel_workflow_execution(run_id, "operator") in ("CANCELLED", "FAILED")


def test_the_list_filters_on_timed_out(h):
    run_id = h.start_workflow("breaks", None, execution_timeout=SHORT)
    with pytest.raises(WorkflowTimedOut):
        h.result(run_id, timeout=WAIT)
    assert [x.id for x in h.list(status="TIMED_OUT")] == [run_id]


# ── deadlines at start, and along a chain ────────────────────────────────────────────────────
def test_the_first_starts_deadlines_stand(h):
    run_id = h.start_workflow("parked", "o-5", "order-5", execution_timeout=3600)
    first = h.describe(run_id)
    assert first.execution_deadline_at is not None and first.run_deadline_at is None
    assert h.start_workflow("parked", "o-5", "order-5", execution_timeout=1, run_timeout=1) == run_id
    again = h.describe(run_id)
    assert (again.execution_deadline_at, again.run_deadline_at) == (first.execution_deadline_at, None)


def test_signal_with_start_takes_deadlines(h):
    h.signal_with_start("parked", "o-6", "order-6", "approve", "ok", run_timeout=3600)
    assert h.describe("order-6").run_deadline_at is not None


def test_a_chain_carries_the_execution_deadline_and_renews_the_run_deadline(h):
    h.start_workflow("chained", 0, "chain-1", execution_timeout=3600, run_timeout=1800)
    until(h, lambda: h.describe("chain-1").continued_to is not None)
    first = h.describe("chain-1")
    assert first.continued_to is not None
    second = h.describe(first.continued_to)
    assert second.execution_deadline_at == first.execution_deadline_at
    assert second.run_deadline_at is not None
    assert second.run_deadline_at - second.created_at == first.run_deadline_at - first.created_at


def _written(h):
    with h.store.engine.connect() as conn:
        return (
            conn.execute(sa.select(sa.func.count()).select_from(executions)).scalar(),
            conn.execute(sa.select(sa.func.count()).select_from(events_table)).scalar(),
        )


@pytest.mark.parametrize(
    "bad", [{"execution_timeout": 0}, {"run_timeout": -1}, {"run_timeout": timedelta(0)}]
)
def test_a_timeout_that_is_not_positive_is_refused_and_writes_nothing(h, bad):
    with pytest.raises(ValueError, match="timeout"):
        h.start_workflow("parked", "o-7", **bad)
    with pytest.raises(ValueError, match="timeout"):
        h.signal_with_start("parked", "o-7", "order-7", "approve", **bad)
    with pytest.raises(ValueError, match="timeout"):
        h.start_workflow_on_commit("parked", "o-7", session=object(), **bad)
    assert _written(h) == (0, 0)


def test_a_start_on_a_connection_takes_no_deadline_yet(h):
    with h.store.engine.connect() as conn, pytest.raises(ValueError, match="not taken with connection="):
        h.start_workflow("parked", "o-8", connection=conn, execution_timeout=5)
    assert _written(h) == (0, 0)


def test_the_api_takes_seconds_and_answers_400_for_a_bad_timeout(h, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    client = TestClient(create_app(h))
    bad = client.post("/workflows", json={"workflow": "parked", "input": "o-9", "execution_timeout": 0})
    assert bad.status_code == 400 and "execution_timeout" in bad.json()["detail"]
    bad = client.post("/workflows", json={"workflow": "parked", "input": "o-9", "run_timeout": -2.5})
    assert bad.status_code == 400
    assert _written(h) == (0, 0)
    ok = client.post("/workflows", json={"workflow": "parked", "input": "o-9", "execution_timeout": 60})
    assert ok.status_code == 201
    shown = client.get(f"/workflows/{ok.json()['execution_id']}").json()
    assert shown["execution_deadline_at"] is not None and shown["timeout"] is None
    assert shown["timeout_overrun"] is False


def test_async_harvest_takes_the_timeouts(h):
    from harvest_celery import AsyncHarvest

    async def scenario():
        async with AsyncHarvest(h) as ah:
            run_id = await ah.start_workflow("breaks", None, execution_timeout=SHORT)
            with pytest.raises(ValueError, match="run_timeout"):
                await ah.signal_with_start("parked", "o-10", "order-10", "approve", run_timeout=0)
            return run_id

    run_id = asyncio.run(scenario())
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(run_id, timeout=WAIT)
    assert caught.value.outcome == "failed"
    assert h.list(workflow="parked") == []  # the refused signal_with_start wrote nothing


harvest_app: Harvest | None = None  # what the CLI's --app names, set by the test below


def test_harvest_start_takes_the_timeouts_in_seconds(h, capsys, monkeypatch):
    import sys

    from harvest_celery._cli import main

    monkeypatch.setattr(sys.modules[__name__], "harvest_app", h)
    url = h.database_url
    assert (
        main(["--database-url", url, "--app", APP, "start", "parked", '"o-11"', "--execution-timeout", "0"])
        != 0
    )
    assert "execution_timeout must be positive" in capsys.readouterr().err
    assert _written(h) == (0, 0)
    assert (
        main(["--database-url", url, "--app", APP, "start", "parked", '"o-11"', "--run-timeout", "90"]) == 0
    )
    run_id = capsys.readouterr().out.strip()
    x = h.describe(run_id)
    assert x.run_deadline_at is not None and x.execution_deadline_at is None
    assert x.run_deadline_at - x.created_at == timedelta(seconds=90)


# ── migration 0015 ───────────────────────────────────────────────────────────────────────────
def test_migration_0015_adds_the_columns_and_the_status_and_downgrades(tmp_path):
    from harvest_celery._store.migrate import downgrade, upgrade

    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    now = "2026-12-02 00:00:00"
    row = (
        "INSERT INTO harvest_executions (id, workflow_type, status, next_seq, created_at, updated_at, "
        "nd_block_count, timed_out_at) VALUES ('t-1', 'w', 'TIMED_OUT', 0, :now, :now, 0, :now)"
    )
    with engine.begin() as conn:
        conn.execute(sa.text(row), {"now": now})
    downgrade(url, "0014")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status FROM harvest_executions")).scalar() == "FAILED"
        columns = {c["name"] for c in sa.inspect(conn).get_columns("harvest_executions")}
    assert not columns & {"execution_deadline_at", "run_deadline_at", "timed_out_at", "timeout_grace_at"}
    with engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):
        conn.execute(sa.text(row.replace(", timed_out_at", "").replace(", :now)", ")")), {"now": now})
    upgrade(url)
    engine.dispose()


def test_a_reset_past_the_timeout_request_keeps_it_open_on_the_fork(h):
    run_id = h.start_workflow("breaks", None, execution_timeout=SHORT)
    with pytest.raises(WorkflowTimedOut):
        h.result(run_id, timeout=WAIT)
    seen = [e.event.type for e in h.history(run_id)]
    fork = h.reset(run_id, seen.index("WorkflowTimeoutRequested") + 1)
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(fork, timeout=WAIT)
    assert caught.value.outcome == "failed"  # the fork replayed the request: its branch failed again
    x = h.describe(fork)
    assert x.status == "TIMED_OUT" and x.timed_out_at is not None
    assert x.execution_deadline_at is None  # a fork is a run of its own: no deadline carried
