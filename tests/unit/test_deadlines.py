"""Deadlines against the pure engine (no services): a ``WorkflowTimeoutRequested`` is an input
event delivered exactly like ``WorkflowCancelRequested`` — ``ctx.is_cancelled()`` turns true at
its position and ``ctx.cancellation_reason()`` holds "timeout", identically cold and warm — a
``ctx.sleep(..., cancellable=True)`` raises ``Cancelled`` when a cancellation comes before its
``TimerFired`` (whichever is first in history decides, on every replay), and the TIMED_OUT
outcome table (``lifecycle``). Plus the start-time checks of the timeouts."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from harvest_celery import Cancelled, Saga, WorkflowContext, WorkflowTimedOut, activity, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.deadlines import Timeouts, check_timeout
from harvest_celery._core.lifecycle import (
    CANCELLED,
    COMPLETED,
    FAILED,
    TERMINAL_STATUSES,
    TIMED_OUT,
    cancel_branch_failure,
    display_status,
    status_after_cancel,
)
from harvest_celery._store.records import timeout_kind
from harvest_celery.testing import Simulator

REASON = "execution_timeout of 3s expired"


@activity
def step(x):
    return x


@activity
def refund(x):
    return f"refunded {x}"


@workflow
async def napper(ctx: WorkflowContext, _data) -> str:
    """Charge, then a long cancellable sleep; a cancellation during it refunds durably."""
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(step, "charge"), lambda cid: ctx.execute_activity(refund, cid)
    )
    try:
        await ctx.sleep(3600, cancellable=True)
    except Cancelled:
        await saga.compensate_all()
        raise Cancelled(ctx.cancellation_reason() or "cancelled") from None
    return "slept"


@workflow
async def parked(ctx: WorkflowContext, _data) -> str:
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(step, "charge"), lambda cid: ctx.execute_activity(refund, cid)
    )
    try:
        return await ctx.wait_signal("approve", cancellable=True)  # type: ignore[no-any-return]
    except Cancelled:
        await saga.compensate_all()
        raise


@workflow
async def stubborn(ctx: WorkflowContext, _data) -> str:
    """Ignores the timeout: a plain sleep, then completes anyway."""
    await ctx.sleep(10)
    return "done anyway"


@workflow
async def breaks(ctx: WorkflowContext, _data) -> str:
    try:
        await ctx.wait_signal("go", cancellable=True)
    except Cancelled:
        raise RuntimeError("undo failed") from None
    return "went"


@workflow
async def sleeps_twice(ctx: WorkflowContext, _data) -> list:
    """What a cancellable sleep sees, and a second one begun after the cancellation."""
    seen = []
    for _ in range(2):
        try:
            await ctx.sleep(5, cancellable=True)
            seen.append("slept")
        except Cancelled as exc:
            seen.append(f"cancelled: {exc}")
    seen.append(ctx.cancellation_reason())
    return seen


def names(run):
    return [e.activity_name for e in run.scheduled()]


def same(cold, warm):
    assert [e.to_data() for e in warm.events] == [e.to_data() for e in cold.events]
    assert (warm.status, warm.metrics, warm.nd) == (cold.status, cold.metrics, cold.nd)


# ── the timeout request, delivered like a cancellation request ───────────────────────────────
@pytest.mark.parametrize("sticky", [False, True])
def test_a_timeout_wakes_a_cancellable_signal_wait_and_the_undo_is_durable(sticky):
    run = Simulator(parked, step, refund, sticky=sticky).start("parked", None)
    run.decide()
    run.complete("1", "ch_1")
    run.decide()  # parked on "approve"
    run.time_out("execution", REASON)
    run.decide()
    assert names(run) == ["step", "refund"] and run.status == "RUNNING" and run.cancelling
    run.run_to_end()
    assert run.status == TIMED_OUT
    assert run.events[-1] == ev.WorkflowFailed("Cancelled", REASON)
    assert "timeout" in run.events[-1].message and run.replay().nd is None


def test_a_warm_session_takes_the_timeout_request_as_a_new_event():
    run = Simulator(parked, step, refund, sticky=True).start("parked", None)
    run.decide()
    session = run.session
    assert session is not None
    run.complete("1", "ch_1")
    run.decide()
    run.time_out("run", "run_timeout of 1s expired")
    run.decide()
    assert run.session is session  # advanced in place: an input event, never a matcher candidate
    assert names(run) == ["step", "refund"]


def test_an_earlier_cancellation_request_keeps_its_reason():
    run = Simulator(parked, step, refund).start("parked", None)
    run.decide()
    run.complete("1", "ch_1")
    run.request_cancellation("customer asked")
    run.time_out("execution", REASON)
    run.run_to_end()
    assert run.events[-1] == ev.WorkflowFailed("Cancelled", "customer asked")
    assert run.status == TIMED_OUT  # the deadline was recorded: the run timed out


def test_a_workflow_that_completes_anyway_is_completed():
    run = Simulator(stubborn).start("stubborn", None)
    run.decide()
    run.time_out("execution", REASON)
    run.run_to_end()
    assert run.status == COMPLETED and run.events[-1].result == "done anyway"


def test_a_failing_cancel_branch_is_timed_out_with_the_failure_shown():
    run = Simulator(breaks).start("breaks", None)
    run.decide()
    run.time_out("execution", REASON)
    run.decide()
    assert run.status == TIMED_OUT
    error = {"type": "RuntimeError", "message": "undo failed"}
    assert cancel_branch_failure(TIMED_OUT, True, error) == "RuntimeError: undo failed"
    assert display_status(TIMED_OUT, False, True, error) == (
        "TIMED_OUT (cancel branch failed: RuntimeError: undo failed)"
    )
    assert display_status(TIMED_OUT, False, True, {"type": "Cancelled", "message": REASON}) == TIMED_OUT


def test_the_timeout_request_is_transparent_to_the_command_matcher():
    run = Simulator(parked, step, refund).start("parked", None)
    run.decide()
    run.time_out("execution", REASON)  # between the dispatch and its completion
    run.complete("1", "ch_1")
    run.run_to_end()
    probe = run.replay()
    assert probe.nd is None and probe.commands == [] and probe.outcome is not None


def _drive_random(seed: int, sticky: bool):
    rng = random.Random(seed)
    run = Simulator(napper, parked, step, refund, sticky=sticky).start(
        rng.choice(["napper", "parked"]), None, execution_id=f"t{seed}"
    )
    timed_out = False
    for _ in range(40):
        run.decide()
        for activity_event in run.open_activities()[: rng.randint(0, 2)]:
            run.execute(activity_event)
        if rng.random() < 0.25 and run.status == "RUNNING" and not timed_out:
            run.time_out(rng.choice(["execution", "run"]), REASON)
            timed_out = True
        if rng.random() < 0.2:
            run.fire_timers()
        if rng.random() < 0.1 and run.status == "RUNNING":
            run.signal("approve", "yes")
        if run.status != "RUNNING" and not run.open_activities():
            break
    return run


@pytest.mark.parametrize("seed", range(12))
def test_random_timeouts_decide_identically_cold_and_warm(seed):
    cold, warm = _drive_random(seed, False), _drive_random(seed, True)
    same(cold, warm)
    assert cold.replay().nd is None


# ── the cancellable sleep: whichever comes first in history decides ─────────────────────────
def _napping(sticky: bool):
    run = Simulator(napper, step, refund, sticky=sticky).start("napper", None)
    run.decide()
    run.complete("1", "ch_1")
    run.decide()  # asleep: TimerStarted recorded
    assert run.types()[-1] == "TimerStarted"
    return run


@pytest.mark.parametrize("sticky", [False, True])
def test_a_timeout_just_before_timer_fired_cancels_the_sleep(sticky):
    run = _napping(sticky)
    run.time_out("execution", REASON)
    run.fire_timers()  # the timer still fires: delivered to nobody
    run.decide()
    assert names(run) == ["step", "refund"]
    run.run_to_end()
    assert run.status == TIMED_OUT and run.events[-1].message == REASON
    assert run.replay().nd is None
    same(run, _replayed_both_ways(run))


@pytest.mark.parametrize("sticky", [False, True])
def test_a_timeout_just_after_timer_fired_leaves_the_sleep_done(sticky):
    run = _napping(sticky)
    run.fire_timers()
    run.time_out("execution", REASON)
    run.run_to_end()
    assert run.status == COMPLETED and run.events[-1].result == "slept"
    assert names(run) == ["step"]  # no refund: the sleep ended before the timeout
    assert run.replay().nd is None


@pytest.mark.parametrize("order", ["timeout first", "timer first"])
def test_cold_and_warm_agree_on_either_side_of_timer_fired(order):
    def drive(sticky):
        run = _napping(sticky)
        if order == "timeout first":
            run.time_out("execution", REASON)
            run.fire_timers()
        else:
            run.fire_timers()
            run.time_out("execution", REASON)
        run.run_to_end()
        return run

    cold, warm = drive(False), drive(True)
    same(cold, warm)
    assert cold.status == (TIMED_OUT if order == "timeout first" else COMPLETED)


def _replayed_both_ways(run):
    """A fresh cold probe of the recorded history: the same decision (nothing new)."""
    probe = run.replay()
    assert probe.commands == [] and probe.nd is None
    return run


def test_a_cancellable_sleep_begun_after_the_cancellation_raises_at_once_and_starts_no_timer():
    run = Simulator(sleeps_twice).start("sleeps_twice", None)
    run.decide()
    run.time_out("run", "run_timeout of 2s expired")
    run.run_to_end()
    assert run.events[-1].result == [
        "cancelled: run_timeout of 2s expired",
        "cancelled: run_timeout of 2s expired",
        "run_timeout of 2s expired",
    ]
    assert run.types().count("TimerStarted") == 1  # the second sleep started no timer
    assert run.replay().nd is None


def test_a_plain_sleep_is_not_cancelled():
    run = Simulator(stubborn).start("stubborn", None)
    run.decide()
    run.request_cancellation("stop")
    run.decide()
    assert run.status == "RUNNING" and run.types()[-1] == "WorkflowCancelRequested"
    run.fire_timers()
    run.decide()
    assert run.status == COMPLETED


def test_a_cancellable_sleep_is_cancelled_by_an_operator_request_too():
    run = _napping(False)
    run.request_cancellation("customer asked")
    run.run_to_end()
    assert run.status == CANCELLED and names(run) == ["step", "refund"]


def test_the_grace_seal_gives_timed_out():
    run = Simulator(stubborn).start("stubborn", None)
    run.decide()
    run.time_out("execution", REASON)
    run.decide()
    run.cancel(f"{REASON} (the grace period ended)", timed_out=True)
    assert run.status == TIMED_OUT and run.types()[-1] == "WorkflowCancelled"
    assert status_after_cancel([], True) == TIMED_OUT
    assert status_after_cancel([]) == CANCELLED


# ── the status set, the error and the start checks ───────────────────────────────────────────
def test_timed_out_is_terminal():
    assert TIMED_OUT in TERMINAL_STATUSES and FAILED in TERMINAL_STATUSES


def test_workflow_timed_out_carries_what_the_branch_did():
    exc = WorkflowTimedOut("r-1", "execution", REASON, "failed", "RuntimeError: undo failed")
    assert (exc.execution_id, exc.timeout, exc.reason, exc.outcome) == ("r-1", "execution", REASON, "failed")
    assert "timed out" in str(exc) and "cancel branch failed: RuntimeError: undo failed" in str(exc)
    returned = WorkflowTimedOut("r-1", "run", "run_timeout of 1s expired", "returned", value={"ok": 1})
    assert returned.value == {"ok": 1} and "returned" in str(returned)
    from harvest_celery import HarvestError

    assert isinstance(exc, HarvestError)


@pytest.mark.parametrize(
    "value", [0, -1, 0.0, timedelta(0), timedelta(seconds=-5), float("nan"), float("inf"), 1e300, True, "3"]
)
def test_a_timeout_that_is_not_positive_and_finite_is_a_value_error(value):
    with pytest.raises(ValueError, match="execution_timeout"):
        check_timeout("execution_timeout", value)


def test_timeouts_become_deadlines_from_the_start():
    now = datetime(2026, 12, 2, tzinfo=timezone.utc)
    assert Timeouts.checked(3, timedelta(minutes=1)).deadlines(now) == {
        "execution_deadline_at": now + timedelta(seconds=3),
        "run_deadline_at": now + timedelta(minutes=1),
    }
    assert Timeouts.checked().deadlines(now) == {"execution_deadline_at": None, "run_deadline_at": None}
    assert not Timeouts.checked() and Timeouts.checked(None, 1.5)


def test_which_timeout_expired_is_read_from_the_row():
    now = datetime(2026, 12, 2, tzinfo=timezone.utc)
    assert timeout_kind(None, now) is None
    assert timeout_kind(now, now - timedelta(seconds=1)) == "execution"
    assert timeout_kind(now, now + timedelta(seconds=1)) == "run"
    assert timeout_kind(now, None) == "run"
