"""The pure replay engine, driven by the in-memory ``Simulator`` (no services).

Covers the replay model of DESIGN.md: the exact shape of a history, matching recorded commands,
divergence (``NonDeterministic``) and nd-blocking, ``ctx.gather`` joins, buffered signals,
durable timers, ``patched``, deterministic helpers, pre-dispatch rejections and the error tree.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
from datetime import timedelta

import pytest

from harvest_celery import (
    ActivityError,
    HarvestError,
    NonDeterministic,
    NotInWorkflow,
    PayloadTooLarge,
    SagaCompensationFailed,
    _errors,
    activity,
    workflow,
)
from harvest_celery._core import events as ev
from harvest_celery._core.commands import RecordMarker, ScheduleActivity, StartTimer
from harvest_celery._core.engine import EngineConfig
from harvest_celery.testing import Simulator


# ── activities ────────────────────────────────────────────────────────────────────────────────
@activity(name="a")
def act_a(x):
    return f"a:{x}"


@activity(name="b")
def act_b(x):
    return f"b:{x}"


@activity(name="c", queue="payments")
def act_c(x):
    return f"c:{x}"


@activity(name="a2")
def act_a2(x):
    return f"a2:{x}"


@activity(name="b2")
def act_b2(x):
    return f"b2:{x}"


ACTIVITIES = (act_a, act_b, act_c, act_a2, act_b2)


# ── workflows ─────────────────────────────────────────────────────────────────────────────────
@workflow(name="three")
async def three_steps(ctx, n):
    x = await ctx.execute_activity(act_a, n)
    y = await ctx.execute_activity("b", x)
    z = await ctx.execute_activity(act_c, y)
    return [x, y, z]


@workflow(name="order")
async def order_v1(ctx, n):
    x = await ctx.execute_activity(act_a, n)
    y = await ctx.execute_activity(act_b, n)
    return [x, y]


@workflow(name="order")
async def order_v2_reordered(ctx, n):
    y = await ctx.execute_activity(act_b, n)
    x = await ctx.execute_activity(act_a, n)
    return [x, y]


@workflow(name="order")
async def order_v3_removed_step(ctx, n):
    x = await ctx.execute_activity(act_a, n)
    return [x]


@workflow(name="order")
async def order_v4_catches(ctx, n):
    try:
        y = await ctx.execute_activity(act_b, n)
    except NonDeterministic:
        return "divergence hidden"
    return [y]


@workflow(name="order")
async def order_v5_patched(ctx, n):
    if ctx.patched("b-first"):
        y = await ctx.execute_activity(act_b, n)
        x = await ctx.execute_activity(act_a, n)
    else:
        x = await ctx.execute_activity(act_a, n)
        y = await ctx.execute_activity(act_b, n)
    return [x, y]


@workflow
async def fan_flat(ctx, _):
    return await ctx.gather(
        ctx.execute_activity(act_a, 1), ctx.execute_activity(act_b, 2), ctx.execute_activity(act_c, 3)
    )


async def _branch(ctx, first, second):
    r1 = await ctx.execute_activity(first, 0)
    r2 = await ctx.execute_activity(second, r1)
    return [r1, r2]


@workflow
async def fan_branches(ctx, _):
    res = await ctx.gather(_branch(ctx, "a", "a2"), _branch(ctx, "b", "b2"))
    await ctx.execute_activity(act_c, res)
    return res


@workflow
async def signal_after_activity(ctx, _):
    await ctx.execute_activity(act_a, 0)
    first = await ctx.wait_signal("go")
    second = await ctx.wait_signal("go")
    return [first, second]


@workflow
async def ignores_signals(ctx, _):
    x = await ctx.execute_activity(act_a, 0)
    y = await ctx.execute_activity(act_b, x)
    return y


@workflow
async def sleeper(ctx, _):
    await ctx.sleep(30)
    return ctx.now().isoformat()


@workflow
async def randoms(ctx, _):
    r1, u1 = ctx.random(), str(ctx.uuid4())
    await ctx.execute_activity(act_a, 0)
    return [r1, u1, ctx.random(), str(ctx.uuid4())]


@workflow
async def uses_asyncio_sleep(ctx, delay):
    await asyncio.sleep(delay)
    return "never"


CAPTURED: dict[str, object] = {}


@workflow
async def leaks_ctx(ctx, _):
    CAPTURED["ctx"] = ctx
    return "ok"


@workflow
async def rejected_then_ok(ctx, bad):
    caught = []
    for value in bad:
        try:
            if value == "unknown":
                await ctx.execute_activity("no_such_activity", 1)
            else:
                await ctx.execute_activity(act_a, value)
        except HarvestError as err:
            caught.append(type(err).__name__)
    await ctx.execute_activity(act_b, "fine")
    return caught


@workflow
async def rejection_uncaught(ctx, what):
    if what == "unknown":
        await ctx.execute_activity("no_such_activity", 1)
    else:
        await ctx.execute_activity(act_a, {"x": {1, 2}})


@workflow
async def too_large(ctx, size):
    try:
        await ctx.execute_activity(act_a, "x" * size)
    except PayloadTooLarge as err:
        return {"what": err.what, "size": err.size, "cap": err.cap, "message": str(err)}
    return "dispatched"


def sim_with(*workflows, config=None):
    return Simulator(*workflows, *ACTIVITIES, config=config)


def scheduled_names(run):
    return [e.activity_name for e in run.scheduled()]


# ── history shape and clean replay ────────────────────────────────────────────────────────────
def test_three_step_history_is_exactly_the_expected_event_sequence():
    run = sim_with(three_steps).start("three", 7).run_to_end()
    assert run.status == "COMPLETED"
    assert run.events == [
        ev.WorkflowStarted("three", 7),
        ev.ActivityScheduled("1", "a", 7, "default", False),
        ev.ActivityStarted("1", 1, "sim"),
        ev.ActivityCompleted("1", "a:7"),
        ev.ActivityScheduled("2", "b", "a:7", "default", False),
        ev.ActivityStarted("2", 1, "sim"),
        ev.ActivityCompleted("2", "b:a:7"),
        ev.ActivityScheduled("3", "c", "b:a:7", "payments", False),
        ev.ActivityStarted("3", 1, "sim"),
        ev.ActivityCompleted("3", "c:b:a:7"),
        ev.WorkflowCompleted(["a:7", "b:a:7", "c:b:a:7"]),
    ]
    assert [h.seq for h in run.history] == list(range(11))
    assert run.metrics == []


def test_each_decision_issues_one_command_then_waits():
    run = sim_with(three_steps).start("three", 1)
    first = run.decide()
    assert first.commands == [ScheduleActivity("1", "a", 1, "default", False)]
    assert first.outcome is None
    again = run.decide()  # nothing arrived: the same history yields nothing new
    assert again.commands == [] and again.outcome is None and again.nd is None
    assert len(run.history) == 2


def test_replay_of_a_finished_history_has_no_nd_and_no_commands():
    run = sim_with(three_steps).start("three", 1).run_to_end()
    decision = run.replay()
    assert decision.nd is None
    assert decision.commands == []
    assert decision.outcome is not None and decision.outcome.result == ["a:1", "b:a:1", "c:b:a:1"]
    before = len(run.history)
    run.decide()  # a decision on a finished run appends no second outcome
    assert len(run.history) == before


# ── divergence ────────────────────────────────────────────────────────────────────────────────
def _v1_history(finish=True):
    run = sim_with(order_v1).start("order", 5)
    return run.run_to_end() if finish else run


def test_reordered_activities_diverge_with_expected_and_actual():
    recorded = _v1_history()
    replayer = sim_with(order_v2_reordered).run_from_history("order", recorded.events)
    decision = replayer.replay()
    assert decision.nd is not None
    assert decision.nd["expected"] == "ActivityScheduled(b)"
    assert decision.nd["actual"] == "ActivityScheduled(a)"
    assert decision.nd["event_index"] == 1
    assert decision.nd["workflow_type"] == "order"
    assert decision.commands == [] and decision.outcome is None
    err = NonDeterministic(decision.nd["expected"], decision.nd["actual"], 1)
    assert str(err) == "expected ActivityScheduled(b), got ActivityScheduled(a)"


def test_replay_under_the_same_code_does_not_diverge():
    recorded = _v1_history()
    assert sim_with(order_v1).run_from_history("order", recorded.events).replay().nd is None


def test_a_removed_step_is_a_divergence():
    recorded = _v1_history()
    decision = sim_with(order_v3_removed_step).run_from_history("order", recorded.events).replay()
    assert decision.nd is not None
    assert decision.nd["actual"] == "ActivityScheduled(b)"
    assert decision.nd["event_index"] == 4


def test_nd_block_appends_nothing_and_status_stays_running():
    live = sim_with(order_v1).start("order", 5)
    live.decide()
    live.complete("1", "a:5")
    live.decide()  # b scheduled, still running
    assert live.status == "RUNNING" and scheduled_names(live) == ["a", "b"]
    run = sim_with(order_v2_reordered).run_from_history("order", live.events)
    before = list(run.history)
    decision = run.decide()
    assert decision.nd is not None and decision.commands == []
    assert run.nd == decision.nd
    assert run.nd["expected"] == "ActivityScheduled(b)" and run.nd["actual"] == "ActivityScheduled(a)"
    assert run.history == before
    assert run.status == "RUNNING"
    assert run.metrics == []


def test_catching_nondeterministic_still_records_nd():
    recorded = _v1_history()
    run = sim_with(order_v4_catches).run_from_history("order", recorded.events[:4])
    decision = run.decide()
    assert decision.nd is not None, "a user catching NonDeterministic must not hide the divergence"
    assert decision.nd["expected"] == "ActivityScheduled(b)"
    assert decision.outcome is None
    assert run.status == "RUNNING" and len(run.history) == 4


# ── gather ────────────────────────────────────────────────────────────────────────────────────
def test_gather_dispatches_every_member_in_argument_order_in_one_decision():
    run = sim_with(fan_flat).start("fan_flat")
    decision = run.decide()
    assert [(c.activity_id, c.activity_name) for c in decision.commands] == [
        ("1", "a"),
        ("2", "b"),
        ("3", "c"),
    ]
    assert all(isinstance(c, ScheduleActivity) for c in decision.commands)
    run.complete("3", "C")
    run.complete("1", "A")
    assert run.decide().outcome is None  # not every member has a result yet
    run.complete("2", "B")
    assert run.decide().outcome.result == ["A", "B", "C"]
    assert run.status == "COMPLETED"


def test_gather_settles_only_after_all_results_and_raises_first_failure_in_argument_order():
    run = sim_with(fan_flat).start("fan_flat")
    run.decide()
    run.fail("3", "ValueError", "c broke")  # fails first in time, last in argument order
    first = run.decide()
    assert first.outcome is None and first.commands == []  # never settles at the first failure
    run.complete("1", "A")
    assert run.decide().outcome is None
    run.fail("2", "KeyError", "b broke")
    run.decide()
    assert run.status == "FAILED"
    failed = run.events[-1]
    assert isinstance(failed, ev.WorkflowFailed)
    assert failed.error_type == "ActivityError"
    assert "activity b failed" in failed.message and "b broke" in failed.message


def _run_branches(order):
    run = sim_with(fan_branches).start("fan_branches")
    run.decide()
    ids = {e.activity_name: e.activity_id for e in run.scheduled()}
    assert [ids["a"], ids["b"]] == ["1", "2"]
    for name in order:  # complete the first activity of each branch, then the second
        ids = {e.activity_name: e.activity_id for e in run.scheduled()}
        run.complete(ids[name], f"{name}!")
        run.decide()
    ids = {e.activity_name: e.activity_id for e in run.scheduled()}
    run.complete(ids["c"], "done")
    run.decide()
    return run


def test_gather_branches_completing_in_different_orders_replay_deterministically():
    ab = _run_branches(["a", "b", "a2", "b2"])
    ba = _run_branches(["b", "a", "b2", "a2"])
    assert scheduled_names(ab) == ["a", "b", "a2", "b2", "c"]
    assert scheduled_names(ba) == ["a", "b", "b2", "a2", "c"]  # live order really differed
    for run in (ab, ba):
        assert run.status == "COMPLETED"
        decision = run.replay()
        assert decision.nd is None and decision.commands == []
        assert decision.outcome.result == [["a!", "a2!"], ["b!", "b2!"]]


# ── signals ───────────────────────────────────────────────────────────────────────────────────
def test_signal_before_wait_is_buffered():
    run = sim_with(signal_after_activity).start("signal_after_activity")
    run.decide()
    run.signal("go", 1)
    run.signal("go", 2)
    run.complete("1", "x")
    run.decide()
    assert run.status == "COMPLETED"
    assert run.events[-1] == ev.WorkflowCompleted([1, 2])  # FIFO per name
    assert run.replay().nd is None


def test_signal_after_wait_resolves_the_waiter():
    run = sim_with(signal_after_activity).start("signal_after_activity")
    run.decide()
    run.complete("1", "x")
    blocked = run.decide()
    assert blocked.outcome is None and blocked.commands == []
    run.signal("go", "first")
    assert run.decide().outcome is None
    run.signal("go", "second")
    run.decide()
    assert run.events[-1] == ev.WorkflowCompleted(["first", "second"])
    assert run.replay().nd is None


def test_a_stray_unawaited_signal_never_diverges():
    run = sim_with(ignores_signals).start("ignores_signals")
    run.signal("noise", 0)
    run.decide()
    run.signal("noise", 1)
    run.complete("1", "x")
    run.signal("other", 2)
    run.decide()
    run.complete("2", "y")
    run.signal("noise", 3)
    run.decide()
    assert run.nd is None and run.status == "COMPLETED"
    assert scheduled_names(run) == ["a", "b"]
    assert run.replay().nd is None


# ── timers ────────────────────────────────────────────────────────────────────────────────────
def test_sleep_records_timer_started_then_timer_fired_resolves():
    run = sim_with(sleeper).start("sleeper")
    first = run.decide()
    assert len(first.commands) == 1 and isinstance(first.commands[0], StartTimer)
    started = run.events[1]
    assert isinstance(started, ev.TimerStarted) and started.seconds == 30.0
    assert started.fire_at == (run.history[0].recorded_at + timedelta(seconds=30)).isoformat()
    assert run.decide().outcome is None  # not fired yet
    run.fire_timers()
    run.decide()
    assert run.types() == ["WorkflowStarted", "TimerStarted", "TimerFired", "WorkflowCompleted"]
    assert run.events[-1].result == run.history[2].recorded_at.isoformat()  # now() = fired time
    assert run.replay().nd is None


# ── patched ───────────────────────────────────────────────────────────────────────────────────
def test_patched_is_true_on_a_new_run_and_records_the_marker():
    run = sim_with(order_v5_patched).start("order", 1).run_to_end()
    assert run.events[1] == ev.MarkerRecorded("patch:b-first")
    assert scheduled_names(run) == ["b", "a"]
    assert run.metrics == []  # a patch marker is not a counted marker
    assert run.replay().nd is None


def test_patched_is_false_on_a_history_without_the_marker():
    recorded = _v1_history()
    run = sim_with(order_v5_patched).run_from_history("order", recorded.events)
    decision = run.replay()
    assert decision.nd is None
    assert decision.outcome.result == ["a:5", "b:5"]
    mid = sim_with(order_v5_patched).run_from_history("order", recorded.events[:4])
    assert mid.decide().commands == [ScheduleActivity("2", "b", 5, "default", False)]
    assert not any(isinstance(e, ev.MarkerRecorded) for e in mid.events)


# ── deterministic helpers ─────────────────────────────────────────────────────────────────────
def test_random_and_uuid4_are_identical_across_replays():
    sim = sim_with(randoms)
    run = sim.start("randoms", execution_id="rnd-1").run_to_end()
    recorded = run.events[-1].result
    assert len(set(recorded)) == 4
    assert run.replay().outcome.result == recorded
    assert sim.start("randoms", execution_id="rnd-1").run_to_end().events[-1].result == recorded
    other = sim.start("randoms", execution_id="rnd-2").run_to_end().events[-1].result
    assert other != recorded


# ── determinism guards ────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("delay", [0, 1])
def test_awaiting_asyncio_sleep_fails_the_run_with_a_type_error(delay):
    run = sim_with(uses_asyncio_sleep).start("uses_asyncio_sleep", delay)
    run.decide()
    assert run.status == "FAILED"
    failed = run.events[-1]
    assert isinstance(failed, ev.WorkflowFailed)
    assert failed.error_type == "TypeError"
    assert "asyncio.sleep" in failed.message and "ctx." in failed.message


def test_engine_apis_outside_a_workflow_raise_not_in_workflow():
    CAPTURED.clear()
    sim_with(leaks_ctx).start("leaks_ctx").run_to_end()
    ctx = CAPTURED["ctx"]
    for call, api in [
        (lambda: ctx.execute_activity(act_a, 1), "ctx.execute_activity"),
        (lambda: ctx.sleep(1), "ctx.sleep"),
        (lambda: ctx.wait_signal("go"), "ctx.wait_signal"),
        (lambda: ctx.patched("p"), "ctx.patched"),
        (lambda: ctx.gather().send(None), "ctx.gather"),
    ]:
        with pytest.raises(NotInWorkflow) as info:
            call()
        assert info.value.api == api
        assert str(info.value) == f"{api} can only be called from inside a running workflow"


def test_unknown_activity_and_unserializable_payload_are_rejected_before_anything_is_recorded():
    # a set is not JSON: PayloadNotSerializable
    run = sim_with(rejected_then_ok).start("rejected_then_ok", ["unknown", {"x": {1}}])
    decision = run.decide()
    assert decision.commands == [ScheduleActivity("1", "b", "fine", "default", False)]
    assert run.scheduled() == [ev.ActivityScheduled("1", "b", "fine", "default", False)]
    run.complete("1")
    run.decide()
    assert run.events[-1] == ev.WorkflowCompleted(["UnknownActivity", "PayloadNotSerializable"])


@pytest.mark.parametrize(
    "what,error_type", [("unknown", "UnknownActivity"), ("set", "PayloadNotSerializable")]
)
def test_uncaught_pre_dispatch_rejection_fails_the_run_with_nothing_scheduled(what, error_type):
    run = sim_with(rejection_uncaught).start("rejection_uncaught", what)
    run.decide()
    assert run.types() == ["WorkflowStarted", "WorkflowFailed"]
    assert run.events[-1].error_type == error_type
    assert run.status == "FAILED"


def test_payload_too_large_with_a_small_cap():
    sim = sim_with(too_large, config=EngineConfig(max_activity_input_bytes=16))
    run = sim.start("too_large", 100).run_to_end()
    assert run.scheduled() == []
    result = run.events[-1].result
    assert result["what"] == "input of activity 'a'"
    assert result["size"] == 102 and result["cap"] == 16
    assert (
        result["message"] == "payload too large: input of activity 'a' is 102 bytes, over the cap of 16 bytes"
    )
    under = sim.start("too_large", 10, execution_id="run-2").run_to_end()
    assert under.events[-1].result == "dispatched" and scheduled_names(under) == ["a"]


# ── the error tree pickles ────────────────────────────────────────────────────────────────────
SAMPLE_ARGS = {
    "HarvestError": ("plain message",),
    "Cancelled": ("customer asked",),
    "NonDeterministic": ("ActivityScheduled(b)", "ActivityScheduled(a)", 4, "order"),
    "SagaCompensationFailed": (RuntimeError("boom"), [ValueError("e1"), "e2"]),
    "PayloadTooLarge": ("input of activity 'a'", 2048, 1024),
    "PayloadNotSerializable": ("input of activity 'a'", "set is not JSON"),
    "ActivityError": ("charge", "RuntimeError", "card declined", 3),
    "WorkflowFailed": ("run-1", "ActivityError", "boom"),
    "ChildWorkflowFailed": ("order-7-c1", "FAILED", "RuntimeError: no rooms"),
    "UnknownQuery": ("run-1", "stagee", ["stage", "total"]),
    "QueryFailed": ("run-1", "stage", "QueryCommand", "may not call ctx.sleep", "ctx.sleep"),
    "UnknownUpdate": ("run-1", "qtyy", ["qty"]),
    "UpdateRejected": ("run-1", "qty", "ValueError", "negative"),
    "UpdateFailed": ("run-1", "qty", "RunClosed", "the run ended COMPLETED before update 'u1' completed"),
    "WorkflowCancelledError": (
        "run-1",
        "customer asked",
        "SagaCompensationFailed: saga compensation failed after original error: x",
        "failed",
        {"refunded": ["ch_1"]},
    ),
    "WorkflowTimedOut": (
        "run-1",
        "execution",
        "execution_timeout of 3s expired",
        "failed",
        "RuntimeError: undo failed",
        None,
    ),
    "NotInActivity": ("harvest_celery.activity_context()",),
    "RegistrationError": ("bad registration",),
    "UnknownWorkflow": ("nope",),
    "UnknownActivity": ("nope",),
    "DuplicateRegistration": ("activity", "charge"),
    "NotInWorkflow": ("ctx.sleep",),
    "ExecutionNotFound": ("run-9",),
    "ExecutionAlreadyExists": ("run-1", "checkout"),
    "InvalidExecutionId": ("a:b", "an id may not hold a ':'"),
    "InvalidTaskCall": ("priority", "call option 'priority' is refused"),
    "CanvasNotSupported": ("propagate", "a chord with propagate=False is not supported"),
    "InvalidSchedule": ("give exactly one of cron= and every=",),
    "ScheduleNotFound": ("nightly",),
    "ScheduleAlreadyExists": ("nightly",),
    "BeatImportRefused": ({"sunrise": "solar schedules are refused", "a:b": "a name with a colon"},),
    "InvalidLimitKey": ("charge", "limit_key returned int, not str"),
    "InvalidState": ("run-1", "COMPLETED", "cancel"),
    "ForksHoldCopies": ("run-1", ["run-1-reset", "run-1-retry"]),
    "PayloadCodecError": ("unknown key id 'k9'",),
    "PayloadStoreError": ("no payload store is configured",),
    "UnknownEventType": ("FutureEvent",),
    "RetryRefused": ("run-1", "erased", "the payloads of run run-1 were erased"),
    "UnknownNode": ("fulfillment", "nope"),
    "DagBuildError": ("dag 'd': a cycle",),
    "CompensatorNameCollidesWithNode": ("d", "charge", "reserve"),
    "UnregisteredActivity": ("d", "charge", "refund", "compensator"),
    "DagTaskFailed": ("one or more DAG tasks failed",),
    "StartToCloseTimeout": ("start_to_close exceeded",),
    "RedactedActivityError": ("RuntimeError", "order-7:2:1"),
    "BodyInterrupted": ("SystemExit", "3"),
    "CorruptHistory": ("ActivityScheduled event: field 'activity_id' holds list, not str",),
}


def _error_classes():
    return sorted(
        (
            cls
            for _, cls in inspect.getmembers(_errors, inspect.isclass)
            if issubclass(cls, HarvestError) and cls.__module__ == _errors.__name__
        ),
        key=lambda c: c.__name__,
    )


def test_every_error_class_has_a_pickle_sample():
    assert {c.__name__ for c in _error_classes()} <= set(SAMPLE_ARGS)
    assert len(_error_classes()) >= 27


def _comparable(value):
    if isinstance(value, BaseException):
        return (type(value), str(value))
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_errors_pickle_round_trip_keeping_fields_and_str(cls):
    err = cls(*SAMPLE_ARGS[cls.__name__])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert isinstance(back, HarvestError)
    assert str(back) == str(err) and str(err)
    assert {k: _comparable(v) for k, v in vars(back).items()} == {
        k: _comparable(v) for k, v in vars(err).items()
    }
    assert back.args == err.args


def test_saga_compensation_failed_pickles_its_nested_errors():
    err = SagaCompensationFailed(
        ActivityError("reserve", "RuntimeError", "out of stock"),
        [ActivityError("refund", "RuntimeError", "gateway down")],
    )
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back.original_error, ActivityError)
    assert back.original_error.activity_name == "reserve"
    assert back.compensation_errors[0].error_message == "gateway down"
    assert str(back) == (
        "saga compensation failed after original error: activity reserve failed after 1 attempt(s): "
        "RuntimeError: out of stock; compensation errors: [activity refund failed after 1 attempt(s): "
        "RuntimeError: gateway down]"
    )


def test_markers_are_plain_commands_without_metrics_for_patches():
    run = sim_with(order_v5_patched).start("order", 1)
    decision = run.decide()
    assert decision.commands[0] == RecordMarker("patch:b-first")
    assert decision.metrics == []


@workflow
async def returns_a_set(ctx, _input):
    return {1, 2}


def test_a_non_json_workflow_result_fails_the_run_with_a_clear_error():
    sim = Simulator(returns_a_set)
    run = sim.start("returns_a_set")
    run.decide()
    assert run.status == "FAILED"
    failed = run.events[-1]
    assert failed.error_type == "PayloadNotSerializable"
    assert "result of workflow 'returns_a_set' is not JSON-serialisable" in failed.message


# ── review regressions ────────────────────────────────────────────────────────────────────────
@activity
def upload(x):
    return "ok"


@activity
def notify_done(x):
    return "ok"


@workflow
async def big_then_small(ctx, blob):
    await ctx.execute_activity(upload, blob)
    await ctx.wait_signal("approved")
    return await ctx.execute_activity(notify_done, "done")


def test_lowering_the_cap_never_strands_a_dispatch_already_recorded():
    from harvest_celery._core.engine import EngineConfig

    sim = Simulator(
        big_then_small, upload, notify_done, config=EngineConfig(max_activity_input_bytes=1_000_000)
    )
    run = sim.start("big_then_small", "x" * 50_000)
    run.decide()
    run.execute(run.open_activities()[0])
    run.decide()
    sim.config = EngineConfig(max_activity_input_bytes=10_000)  # applies to new dispatches only
    run.signal("approved")
    run.run_to_end()
    assert run.nd is None and run.status == "COMPLETED"


@activity
def pa(x):
    return x


@activity
def pb(x):
    return x


@workflow
async def patched_after_cancel(ctx, _):
    fa = ctx.execute_activity(pa, 1)
    fb = ctx.execute_activity(pb, 2)
    await fa
    v2 = ctx.patched("p")  # first reached by the post-cancel decision
    await fb
    return "v2" if v2 else "v1"


def test_patched_after_a_cancel_reads_back_what_the_post_cancel_decision_recorded():
    from harvest_celery._core.events import ActivityCompleted

    sim = Simulator(patched_after_cancel, pa, pb)
    run = sim.start("patched_after_cancel")
    run.decide()
    run.start_activity("1")
    run.start_activity("2")  # both bodies running when the cancel lands
    run.cancel("op")
    run.append(ActivityCompleted("1", 1))
    run.decide()
    assert run.types()[-1] == "MarkerRecorded"
    run.append(ActivityCompleted("2", 2))
    run.decide()
    assert run.events[-1].result == "v2"
