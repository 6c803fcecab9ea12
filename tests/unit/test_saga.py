"""Saga semantics against the pure engine (no services).

One test per name in the "## Saga" list of spec-test-names.md (``test_`` + the name), plus the
contract details of DESIGN.md: LIFO, continue-not-abort, the ``SagaCompensationFailed`` format,
cancellation as a seal, the observability markers and their exactly-once counters.
Metrics are read from ``run.metrics`` (emitted after each applied decision); markers are
``MarkerRecorded`` events named ``saga_compensated:{seq}`` / ``saga_compensation_failed:{seq}``.
"""

from __future__ import annotations

from harvest_celery import (
    ActivityError,
    Cancelled,
    Saga,
    SagaCompensationFailed,
    activity,
    workflow,
)
from harvest_celery._core import events as ev
from harvest_celery._core.commands import RecordMarker
from harvest_celery.testing import Simulator

COMPENSATED, FAILED_METRIC = "saga_compensated", "saga_compensation_failed"


# ── activities ────────────────────────────────────────────────────────────────────────────────
charge_payment = activity(name="charge_payment", queue="payments")(lambda order: "ch_1")
refund_payment = activity(name="refund_payment", queue="payments")(lambda charge_id: None)
reserve_inventory = activity(name="reserve_inventory", queue="inventory")(lambda order: "rsv_1")
release_reservation = activity(name="release_reservation", queue="inventory")(lambda rsv_id: None)
print_label = activity(name="print_label")(lambda order: "lbl_1")
void_label = activity(name="void_label")(lambda label_id: None)
confirm_order = activity(name="confirm_order")(lambda ids: "confirmed")
shred_label = activity(name="shred_label")(lambda label_id: None)

ACTIVITIES = (
    charge_payment,
    refund_payment,
    reserve_inventory,
    release_reservation,
    print_label,
    void_label,
    confirm_order,
    shred_label,
)

# in-memory compensations append here (they re-run on every replay, by contract)
UNDONE: list = []


# ── workflows ─────────────────────────────────────────────────────────────────────────────────
async def _three_steps(ctx, saga, order, label_undo=void_label):
    c = await saga.step(
        lambda: ctx.execute_activity(charge_payment, order),
        lambda cid: ctx.execute_activity(refund_payment, cid),
    )
    r = await saga.step(
        lambda: ctx.execute_activity(reserve_inventory, order),
        lambda rid: ctx.execute_activity(release_reservation, rid),
    )
    lbl = await saga.step(
        lambda: ctx.execute_activity(print_label, order), lambda lid: ctx.execute_activity(label_undo, lid)
    )
    return [c, r, lbl]


@workflow
async def checkout(ctx, order):
    """Three compensable steps, then confirm_order (which may fail → automatic rollback)."""
    saga = Saga(ctx)
    ids = await _three_steps(ctx, saga, order)
    try:
        await saga.step(lambda: ctx.execute_activity(confirm_order, ids))
    except SagaCompensationFailed as err:
        if order.get("catch"):
            return {
                "caught": str(err),
                "original": str(err.original_error),
                "errors": [str(e) for e in err.compensation_errors],
            }
        raise
    except ActivityError as err:
        if order.get("catch"):
            return {"rolled_back": err.activity_name}
        raise
    return "confirmed"


@workflow
async def manual_unwind(ctx, order):
    saga = Saga(ctx)
    await _three_steps(ctx, saga, order)
    try:
        await saga.compensate_all()
    except SagaCompensationFailed as err:
        return {
            "original": err.original_error,
            "errors": [str(e) for e in err.compensation_errors],
            "message": str(err),
        }
    return "unwound"


@workflow
async def cancel_pattern(ctx, order):
    """The spec's recommended pattern: observe cancellation, compensate explicitly."""
    saga = Saga(ctx)
    durable = order.get("durable", False)

    def undo(activity_fn):
        if durable:
            return lambda value: ctx.execute_activity(activity_fn, value)
        return lambda value: UNDONE.append(value)

    c = await saga.step(lambda: ctx.execute_activity(charge_payment, order), undo(refund_payment))
    r = await saga.step(lambda: ctx.execute_activity(reserve_inventory, order), undo(release_reservation))
    if ctx.is_cancelled():
        await saga.compensate_all()
        raise Cancelled(ctx.cancellation_reason() or "cancelled")
    await ctx.wait_signal("approve")
    await ctx.execute_activity(confirm_order, [c, r])
    return "confirmed"


@workflow
async def cancel_inside_step(ctx, order):
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(charge_payment, order),
        lambda cid: ctx.execute_activity(refund_payment, cid),
    )
    if not ctx.is_cancelled():
        await ctx.wait_signal("approve")

    async def forward():
        ctx.check_cancellation()
        return await ctx.execute_activity(reserve_inventory, order)

    await saga.step(forward, lambda rid: ctx.execute_activity(release_reservation, rid))
    return "done"


@workflow
async def push_then_maybe_unwind(ctx, order):
    saga = Saga(ctx)
    calls: list = []
    saga.push_compensation(lambda: calls.append("in-memory"))
    saga.push_compensation(lambda: ctx.execute_activity(refund_payment, "ch_pushed"))
    registered = [len(saga), list(calls)]
    await ctx.execute_activity(confirm_order, registered)  # the pushes dispatched nothing
    if order.get("unwind"):
        await saga.compensate_all()
    return {"registered": registered, "calls": calls}


@workflow
async def after_error(ctx, order):
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(charge_payment, order),
        lambda cid: ctx.execute_activity(refund_payment, cid),
    )
    try:
        await saga.compensate_all_after(ValueError("business rule violated"))
    except SagaCompensationFailed as err:
        return {
            "type": "SagaCompensationFailed",
            "original": type(err.original_error).__name__,
            "message": str(err),
        }
    except ValueError as err:
        return {"type": "ValueError", "message": str(err)}
    return "not raised"


@workflow
async def empty_then_real(ctx, order):
    empty = Saga(ctx)
    await empty.compensate_all()  # no registered compensations: not an unwind
    if order.get("only_empty"):
        return "nothing"
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(charge_payment, order),
        lambda cid: ctx.execute_activity(refund_payment, cid),
    )
    await saga.compensate_all()
    return "one unwind"


@workflow
async def two_unwinds(ctx, order):
    first = Saga(ctx)
    await first.step(
        lambda: ctx.execute_activity(charge_payment, order),
        lambda cid: ctx.execute_activity(refund_payment, cid),
    )
    await first.compensate_all()
    second = Saga(ctx)
    await second.step(
        lambda: ctx.execute_activity(reserve_inventory, order),
        lambda rid: ctx.execute_activity(release_reservation, rid),
    )
    try:
        await second.compensate_all()
    except SagaCompensationFailed:
        return "second failed"
    return "both clean"


# ── helpers ───────────────────────────────────────────────────────────────────────────────────
def new_sim(*workflows, failing=()):
    sim = Simulator(*workflows, *ACTIVITIES)

    def boom(name):
        def fail(_):
            raise RuntimeError(f"{name} down")

        return fail

    for name in failing:
        sim.behaviour[name] = boom(name)
    return sim


def names(run):
    return [e.activity_name for e in run.scheduled()]


def compensation_names(run):
    return [e.activity_name for e in run.scheduled() if e.compensation]


def markers(run):
    return [e.name for e in run.events if isinstance(e, ev.MarkerRecorded)]


def outcome(run):
    last = run.events[-1]
    assert isinstance(last, (ev.WorkflowCompleted, ev.WorkflowFailed)), last
    return last


def id_of(run, name):
    return next(e.activity_id for e in run.scheduled() if e.activity_name == name)


def to_confirm_failure(run, outputs=("ch_1", "rsv_1", "lbl_1")):
    """Drive ``checkout`` by hand: three forward steps complete, confirm_order fails."""
    for output in outputs:
        run.decide()
        run.complete(run.open_activities()[0].activity_id, output)
    run.decide()
    run.fail(id_of(run, "confirm_order"))
    return run


# ── the "## Saga" list ────────────────────────────────────────────────────────────────────────
def test_saga_success_does_not_run_compensations():
    run = new_sim(checkout).start("checkout", {"o": 1}).run_to_end()
    assert run.status == "COMPLETED" and outcome(run) == ev.WorkflowCompleted("confirmed")
    assert names(run) == ["charge_payment", "reserve_inventory", "print_label", "confirm_order"]
    assert compensation_names(run) == []


def test_saga_runs_compensations_in_reverse_order_when_later_step_fails():
    run = new_sim(checkout, failing=["confirm_order"]).start("checkout", {"o": 1}).run_to_end()
    assert compensation_names(run) == ["void_label", "release_reservation", "refund_payment"]
    comps = [e for e in run.scheduled() if e.compensation]
    assert [(e.input, e.queue) for e in comps] == [
        ("lbl_1", "default"),
        ("rsv_1", "inventory"),
        ("ch_1", "payments"),
    ]
    # a successful rollback re-raises the failed step's own error
    assert run.status == "FAILED"
    assert outcome(run).error_type == "ActivityError"
    assert (
        outcome(run).message
        == "activity confirm_order failed after 1 attempt(s): RuntimeError: confirm_order down"
    )


def test_successful_rollback_reraises_the_steps_own_error_to_the_author():
    run = new_sim(checkout, failing=["confirm_order"]).start("checkout", {"catch": 1}).run_to_end()
    assert outcome(run) == ev.WorkflowCompleted({"rolled_back": "confirm_order"})
    assert run.metrics == [COMPENSATED]


def test_saga_compensate_all_runs_pending_compensations_in_reverse_order():
    run = new_sim(manual_unwind).start("manual_unwind", {"o": 1}).run_to_end()
    assert compensation_names(run) == ["void_label", "release_reservation", "refund_payment"]
    assert outcome(run) == ev.WorkflowCompleted("unwound")
    assert markers(run) == ["saga_compensated:1"] and run.metrics == [COMPENSATED]
    marker_at = run.types().index("MarkerRecorded")
    assert run.events[marker_at + 1].activity_name == "void_label"  # marker precedes first dispatch


def test_saga_reports_compensation_failures_with_original_error_and_keeps_unwinding():
    sim = new_sim(checkout, failing=["confirm_order", "release_reservation"])
    run = sim.start("checkout", {"o": 1}).run_to_end()
    # the middle compensation failed and the unwind still ran the last one (continue-not-abort)
    assert compensation_names(run) == ["void_label", "release_reservation", "refund_payment"]
    assert run.status == "FAILED"
    assert outcome(run).error_type == "SagaCompensationFailed"
    original = "activity confirm_order failed after 1 attempt(s): RuntimeError: confirm_order down"
    comp_err = (
        "activity release_reservation failed after 1 attempt(s): RuntimeError: release_reservation down"
    )
    assert outcome(run).message == (
        f"saga compensation failed after original error: {original}; compensation errors: [{comp_err}]"
    )
    caught = sim.start("checkout", {"catch": 1}, execution_id="run-2").run_to_end()
    assert outcome(caught).result == {
        "caught": outcome(run).message,
        "original": original,
        "errors": [comp_err],
    }


def test_saga_compensate_all_reports_failures_when_compensations_fail():
    sim = new_sim(manual_unwind, failing=["void_label", "refund_payment"])
    run = sim.start("manual_unwind", {"o": 1}).run_to_end()
    assert compensation_names(run) == ["void_label", "release_reservation", "refund_payment"]
    result = outcome(run).result
    assert result["original"] == "manual compensation requested"
    errs = [
        "activity void_label failed after 1 attempt(s): RuntimeError: void_label down",
        "activity refund_payment failed after 1 attempt(s): RuntimeError: refund_payment down",
    ]
    assert result["errors"] == errs  # unwind (LIFO) order
    assert result["message"] == (
        "saga compensation failed after original error: manual compensation requested; "
        f"compensation errors: [{errs[0]}, {errs[1]}]"
    )
    assert markers(run) == ["saga_compensated:1", "saga_compensation_failed:1"]


def _cancel_while_reserving(sim, order, reason="customer asked"):
    """charge done; reserve dispatched and *started* (a running body keeps its claim); cancel."""
    run = sim.start("cancel_pattern", order)
    run.decide()
    run.complete("1", "ch_1")
    run.decide()
    run.start_activity("2")
    run.cancel(reason)
    return run


def test_saga_cancellation_does_not_auto_compensate():
    run = new_sim(cancel_inside_step).start("cancel_inside_step", {"o": 1})
    run.decide()
    run.complete("1", "ch_1")
    run.decide()  # waiting for "approve"
    run.cancel("customer asked")
    assert run.status == "CANCELLED"
    assert compensation_names(run) == [] and markers(run) == [] and run.metrics == []
    # post-cancel replay: is_cancelled() is true, Cancelled passes through saga.step untouched
    assert outcome(run) == ev.WorkflowFailed("Cancelled", "customer asked")
    assert run.types()[-2:] == ["WorkflowCancelled", "WorkflowFailed"]
    assert run.nd is None and run.status == "CANCELLED"


def test_saga_compensate_all_on_cancel_pattern():
    UNDONE.clear()
    run = _cancel_while_reserving(new_sim(cancel_pattern), {"o": 1})
    assert run.status == "CANCELLED" and run.types()[-1] == "WorkflowCancelled"  # still awaiting reserve
    assert UNDONE == []
    run.complete("2", "rsv_1", started=False)  # the running body finishes after the cancel
    run.decide()
    assert UNDONE == ["rsv_1", "ch_1"]  # in-memory compensations ran, LIFO
    assert markers(run) == ["saga_compensated:1"]
    assert run.metrics == [COMPENSATED]  # a trailing WorkflowCancelled is transparent to the marker
    assert outcome(run) == ev.WorkflowFailed("Cancelled", "customer asked")
    assert run.status == "CANCELLED" and run.nd is None
    assert compensation_names(run) == []
    run.decide()  # a re-run of the post-cancel decision counts nothing twice
    assert run.metrics == [COMPENSATED] and markers(run) == ["saga_compensated:1"]


def test_known_limitation_durable_compensation_after_recorded_cancel_fails_and_is_counted():
    run = _cancel_while_reserving(new_sim(cancel_pattern), {"durable": True})
    run.complete("2", "rsv_1", started=False)
    decision = run.decide()
    assert decision.nd is None and run.nd is None  # a sealed run never nd-blocks
    assert compensation_names(run) == []  # nothing durable is scheduled after the cancel
    assert markers(run) == ["saga_compensated:1", "saga_compensation_failed:1"]
    assert run.metrics == [COMPENSATED, FAILED_METRIC]
    failed = outcome(run)
    assert failed.error_type == "SagaCompensationFailed"
    assert failed.message.startswith(
        "saga compensation failed after original error: manual compensation requested;"
    )
    assert "expected ActivityScheduled(release_reservation), got WorkflowCancelled" in failed.message
    assert "expected ActivityScheduled(refund_payment), got WorkflowCancelled" in failed.message
    assert run.status == "CANCELLED"
    run.decide()  # replays observe both markers and stay silent
    assert run.metrics == [COMPENSATED, FAILED_METRIC] and run.nd is None
    assert run.replay().nd is None


def test_cancel_landing_mid_unwind_terminates_failed_and_never_nd_blocks():
    run = new_sim(checkout, failing=["confirm_order"]).start("checkout", {"o": 1})
    to_confirm_failure(run)
    run.decide()  # unwind starts: marker + void_label
    assert markers(run) == ["saga_compensated:1"] and compensation_names(run) == ["void_label"]
    run.start_activity(id_of(run, "void_label"))
    run.cancel("ops")
    assert run.status == "FAILED"  # an unwind had begun
    run.complete(id_of(run, "void_label"), None, started=False)
    run.decide()  # release_reservation's dispatch diverges against WorkflowCancelled
    assert run.nd is None and run.status == "FAILED"
    assert compensation_names(run) == ["void_label"]
    assert outcome(run).error_type == "SagaCompensationFailed"
    assert "got WorkflowCancelled" in outcome(run).message


def test_saga_compensation_idempotency_under_replay():
    # A crash after the unwind began: marker + first compensation recorded, then the next decision
    # re-runs every compensation from the top of the stack, reading recorded values.
    UNDONE.clear()
    events = [
        ev.WorkflowStarted("cancel_pattern", {"o": 1}),
        ev.ActivityScheduled("1", "charge_payment", {"o": 1}, "payments"),
        ev.ActivityStarted("1", 1, "w"),
        ev.ActivityCompleted("1", "ch_RECORDED"),
        ev.ActivityScheduled("2", "reserve_inventory", {"o": 1}, "inventory"),
        ev.ActivityStarted("2", 1, "w"),
        ev.WorkflowCancelled("ops"),
        ev.ActivityCompleted("2", "rsv_RECORDED"),
    ]
    run = new_sim(cancel_pattern).run_from_history("cancel_pattern", events)
    run.decide()
    run.decide()
    assert UNDONE == ["rsv_RECORDED", "ch_RECORDED"] * 2  # re-invoked wholesale, with recorded ids
    assert run.metrics == [COMPENSATED]

    # durable: recorded forward outputs (not the activity functions) feed the compensations
    durable = new_sim(checkout).start("checkout", {"o": 1})
    to_confirm_failure(durable, ("ch_REC", "rsv_REC", "lbl_REC"))
    durable.decide()
    durable.complete(id_of(durable, "void_label"))
    crashed = list(durable.history)
    first = durable.decide()
    durable.history[:] = crashed  # the decision's commit was lost: decide the same history again
    second = durable.decide()
    assert first.commands == second.commands
    assert [(c.activity_name, c.input) for c in second.commands] == [("release_reservation", "rsv_REC")]
    assert markers(durable) == ["saga_compensated:1"] and durable.replay().nd is None


def test_saga_compensated_metric_emitted_once_across_crash_replay():
    run = new_sim(checkout, failing=["confirm_order"]).start("checkout", {"o": 1})
    to_confirm_failure(run)
    first = run.decide()
    assert [c.name for c in first.commands if isinstance(c, RecordMarker)] == ["saga_compensated:1"]
    assert run.metrics == [COMPENSATED]
    length = len(run.history)
    again = run.decide()  # the same history decided again (a crashed worker's successor)
    assert again.commands == [] and again.metrics == []
    assert len(run.history) == length and markers(run) == ["saga_compensated:1"]
    run.run_to_end()
    assert run.status == "FAILED" and run.metrics == [COMPENSATED]
    assert markers(run) == ["saga_compensated:1"]


def test_saga_compensation_failed_metric_distinct_and_once():
    run = (
        new_sim(checkout, failing=["confirm_order", "void_label", "refund_payment"])
        .start("checkout", {"o": 1})
        .run_to_end()
    )
    assert markers(run) == ["saga_compensated:1", "saga_compensation_failed:1"]
    assert run.metrics == [COMPENSATED, FAILED_METRIC]  # one failure sample for two failed comps
    i_failed = run.types().index("WorkflowFailed")
    assert run.events[i_failed - 1] == ev.MarkerRecorded("saga_compensation_failed:1")
    for _ in range(2):
        run.decide()
    assert run.metrics == [COMPENSATED, FAILED_METRIC]
    assert run.replay().nd is None


def test_saga_compensation_failed_emitted_even_when_author_catches_error():
    run = (
        new_sim(checkout, failing=["confirm_order", "refund_payment"])
        .start("checkout", {"catch": 1})
        .run_to_end()
    )
    assert run.status == "COMPLETED"
    assert "caught" in outcome(run).result
    assert run.metrics == [COMPENSATED, FAILED_METRIC]
    assert markers(run) == ["saga_compensated:1", "saga_compensation_failed:1"]


def test_saga_success_path_emits_no_saga_metrics_and_no_marker_commands():
    run = new_sim(checkout).start("checkout", {"o": 1})
    decisions = []
    for _ in range(20):
        decisions.append(run.decide())
        if run.status != "RUNNING":
            break
        for act in run.open_activities():
            run.execute(act)
    assert run.status == "COMPLETED"
    assert all(not isinstance(c, RecordMarker) for d in decisions for c in d.commands)
    assert run.metrics == [] and markers(run) == []


def test_saga_empty_compensate_all_emits_nothing():
    only = new_sim(empty_then_real).start("empty_then_real", {"only_empty": 1}).run_to_end()
    assert outcome(only) == ev.WorkflowCompleted("nothing")
    assert markers(only) == [] and only.metrics == [] and only.scheduled() == []
    # an empty unwind takes no number: the first real unwind is 1
    real = new_sim(empty_then_real).start("empty_then_real", {"o": 1}).run_to_end()
    assert markers(real) == ["saga_compensated:1"] and real.metrics == [COMPENSATED]


def test_pre_801_history_mid_unwind_replays_clean_and_uncounted():
    events = [
        ev.WorkflowStarted("checkout", {"o": 1}),
        ev.ActivityScheduled("1", "charge_payment", {"o": 1}, "payments"),
        ev.ActivityStarted("1", 1, "w"),
        ev.ActivityCompleted("1", "ch_1"),
        ev.ActivityScheduled("2", "reserve_inventory", {"o": 1}, "inventory"),
        ev.ActivityStarted("2", 1, "w"),
        ev.ActivityCompleted("2", "rsv_1"),
        ev.ActivityScheduled("3", "print_label", {"o": 1}, "default"),
        ev.ActivityStarted("3", 1, "w"),
        ev.ActivityCompleted("3", "lbl_1"),
        ev.ActivityScheduled("4", "confirm_order", ["ch_1", "rsv_1", "lbl_1"], "default"),
        ev.ActivityStarted("4", 1, "w"),
        ev.ActivityFailed("4", "RuntimeError", "down"),
        # recorded before the markers existed: no saga_compensated:1 here
        ev.ActivityScheduled("5", "void_label", "lbl_1", "default"),
        ev.ActivityStarted("5", 1, "w"),
        ev.ActivityCompleted("5", None),
        ev.ActivityScheduled("6", "release_reservation", "rsv_1", "inventory"),
    ]
    run = new_sim(checkout).run_from_history("checkout", events)
    assert run.replay().nd is None
    decision = run.decide()
    assert decision.nd is None and decision.commands == [] and decision.outcome is None
    run.complete("6")
    decision = run.decide()
    assert decision.nd is None
    assert [c.activity_name for c in decision.commands] == ["refund_payment"]  # no marker command
    run.complete(id_of(run, "refund_payment"))
    run.decide()
    assert run.status == "FAILED" and outcome(run).error_type == "ActivityError"
    assert markers(run) == [] and run.metrics == []
    assert run.replay().nd is None


def test_trailing_unawaited_signal_does_not_suppress_the_failure_counter():
    run = new_sim(checkout).start("checkout", {"o": 1})
    to_confirm_failure(run)
    run.decide()  # counted unwind starts
    assert markers(run) == ["saga_compensated:1"]
    run.complete(id_of(run, "void_label"))
    run.decide()
    run.complete(id_of(run, "release_reservation"))
    run.decide()
    run.fail(id_of(run, "refund_payment"), "RuntimeError", "gateway down")
    run.signal("cancel-webhook", {"retry": 2})  # ingested at the final unwind cycle's wake
    run.decide()
    assert run.types()[-3:] == ["SignalReceived", "MarkerRecorded", "WorkflowFailed"]
    assert markers(run) == ["saga_compensated:1", "saga_compensation_failed:1"]
    assert run.metrics == [COMPENSATED, FAILED_METRIC]
    assert run.replay().nd is None
    run.decide()
    assert run.metrics == [COMPENSATED, FAILED_METRIC]


def test_drained_signal_frontier_at_unwind_start_is_uncounted_but_still_compensates():
    run = new_sim(checkout).start("checkout", {"o": 1})
    to_confirm_failure(run)
    run.signal("promo", 1)  # appended just before the decision that starts the unwind
    decision = run.decide()
    assert [c.activity_name for c in decision.commands] == ["void_label"]
    run.run_to_end()
    assert compensation_names(run) == ["void_label", "release_reservation", "refund_payment"]
    assert markers(run) == [] and run.metrics == []
    assert run.status == "FAILED" and run.replay().nd is None


def test_signal_with_start_shape_keeps_the_failed_counter_coupled_to_compensated():
    sim = new_sim(checkout, failing=["confirm_order", "refund_payment"])
    run = sim.start("checkout", {"o": 1})
    run.signal("approve", {"staged": True})  # signal-with-start: staged, never awaited
    run.run_to_end()
    assert compensation_names(run) == ["void_label", "release_reservation", "refund_payment"]
    assert outcome(run).error_type == "SagaCompensationFailed"
    assert markers(run) == []
    assert run.metrics == []  # never failed=1 with compensated=0
    assert run.replay().nd is None


def test_two_saga_unwinds_in_one_workflow_count_independently():
    run = new_sim(two_unwinds, failing=["release_reservation"]).start("two_unwinds", {"o": 1}).run_to_end()
    assert outcome(run) == ev.WorkflowCompleted("second failed")
    assert markers(run) == ["saga_compensated:1", "saga_compensated:2", "saga_compensation_failed:2"]
    assert run.metrics == [COMPENSATED, COMPENSATED, FAILED_METRIC]
    assert compensation_names(run) == ["refund_payment", "release_reservation"]
    assert run.replay().nd is None


# ── further saga contract details ─────────────────────────────────────────────────────────────
def test_push_compensation_registers_without_running():
    plain = new_sim(push_then_maybe_unwind).start("push_then_maybe_unwind", {}).run_to_end()
    assert outcome(plain).result == {"registered": [2, []], "calls": []}
    assert names(plain) == ["confirm_order"] and plain.metrics == []
    unwound = new_sim(push_then_maybe_unwind).start("push_then_maybe_unwind", {"unwind": 1}).run_to_end()
    assert compensation_names(unwound) == ["refund_payment"]
    assert outcome(unwound).result == {"registered": [2, []], "calls": ["in-memory"]}
    assert unwound.metrics == [COMPENSATED]


def test_compensate_all_after_reraises_the_callers_error():
    run = new_sim(after_error).start("after_error", {"o": 1}).run_to_end()
    assert outcome(run) == ev.WorkflowCompleted({"type": "ValueError", "message": "business rule violated"})
    assert compensation_names(run) == ["refund_payment"] and run.metrics == [COMPENSATED]


def test_compensate_all_after_carries_the_callers_error_when_a_compensation_fails():
    run = new_sim(after_error, failing=["refund_payment"]).start("after_error", {"o": 1}).run_to_end()
    result = outcome(run).result
    assert result["type"] == "SagaCompensationFailed" and result["original"] == "ValueError"
    assert result["message"] == (
        "saga compensation failed after original error: business rule violated; compensation errors: "
        "[activity refund_payment failed after 1 attempt(s): RuntimeError: refund_payment down]"
    )
    assert run.metrics == [COMPENSATED, FAILED_METRIC]


@workflow(name="checkout")
async def checkout_v2_new_label_undo(ctx, order):
    """A later deploy: the label's compensation changed (code drift inside the unwind)."""
    saga = Saga(ctx)
    ids = await _three_steps(ctx, saga, order, label_undo=shred_label)
    try:
        await saga.step(lambda: ctx.execute_activity(confirm_order, ids))
    except SagaCompensationFailed:
        return "author swallowed it"
    return "confirmed"


def test_divergence_inside_an_unwind_still_nd_blocks():
    recorded = new_sim(checkout).start("checkout", {"o": 1})
    to_confirm_failure(recorded)
    recorded.decide()  # saga_compensated:1 + void_label recorded by the old code
    sim = Simulator(checkout_v2_new_label_undo, *ACTIVITIES)
    run = sim.run_from_history("checkout", recorded.events)
    before = list(run.history)
    decision = run.decide()
    assert decision.nd is not None, "a divergence during an unwind nd-blocks even if the author catches it"
    assert decision.nd["expected"] == "ActivityScheduled(shred_label)"
    assert decision.nd["actual"] == "ActivityScheduled(void_label)"
    assert run.history == before and run.status == "RUNNING" and run.metrics == []


def test_cancel_before_a_dispatched_compensation_is_claimed_leaves_it_unrun():
    run = new_sim(checkout, failing=["confirm_order"]).start("checkout", {"o": 1})
    to_confirm_failure(run)
    run.decide()  # unwind starts: void_label dispatched, not yet claimed
    run.cancel("ops")
    assert run.status == "FAILED" and run.nd is None
    assert id_of(run, "void_label") in run.cancelled_rows and run.open_activities() == []
    assert run.types()[-1] == "WorkflowCancelled"  # blocked on a result that never arrives
    assert compensation_names(run) == ["void_label"] and run.metrics == [COMPENSATED]


def test_probe_replay_of_a_marker_less_cancelled_history_counts_nothing():
    UNDONE.clear()
    events = [
        ev.WorkflowStarted("cancel_pattern", {"o": 1}),
        ev.ActivityScheduled("1", "charge_payment", {"o": 1}, "payments"),
        ev.ActivityStarted("1", 1, "w"),
        ev.ActivityCompleted("1", "ch_1"),
        ev.ActivityScheduled("2", "reserve_inventory", {"o": 1}, "inventory"),
        ev.ActivityStarted("2", 1, "w"),
        ev.WorkflowCancelled("ops"),
        ev.ActivityCompleted("2", "rsv_1"),
        ev.WorkflowFailed("Cancelled", "ops"),  # pre-marker build: no saga_compensated:1
    ]
    run = new_sim(cancel_pattern).run_from_history("cancel_pattern", events)
    assert run.status == "CANCELLED"
    decision = run.replay()
    assert decision.nd is None
    assert decision.commands == [] and decision.metrics == []
    assert UNDONE == ["rsv_1", "ch_1"]  # the replay did run the in-memory unwind
