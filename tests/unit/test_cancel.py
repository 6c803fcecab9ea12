"""Cooperative cancellation against the pure engine (no services): a ``WorkflowCancelRequested``
is an input event delivered in history order — ``ctx.is_cancelled()`` turns true at its position,
identically on cold and warm replays — transparent to the command and saga-marker matchers; the
run stays live (durable compensations run) and ends CANCELLED when the workflow raises
``Cancelled``. Plus the DAG cancel edges (a sealed DAG dispatches no new node; a cancel in the
middle of a DAG unwind counts as a hand-written saga's) and the derived statuses."""

from __future__ import annotations

import random

import pytest

from harvest_celery import Cancelled, Saga, WorkflowContext, activity, dag, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import cancel_branch_failure, display_status
from harvest_celery._dag.model import DAG_FAILED
from harvest_celery.testing import Simulator

COMPENSATED, FAILED_METRIC = "saga_compensated", "saga_compensation_failed"


@activity
def step(x):
    return x


@activity
def refund(x):
    return f"refunded {x}"


@workflow
async def checks(ctx: WorkflowContext, _data) -> list:
    """is_cancelled() read around every await: the trace is the workflow's view of the request."""
    seen = [ctx.is_cancelled()]
    for name in ("a", "b", "c"):
        await ctx.execute_activity(step, name)
        seen.append(ctx.is_cancelled())
    await ctx.sleep(1)
    seen.append(ctx.cancellation_reason())
    return seen


@workflow
async def coop(ctx: WorkflowContext, data: dict) -> str:
    saga = Saga(ctx)
    charge = await saga.step(
        lambda: ctx.execute_activity(step, "charge"), lambda cid: ctx.execute_activity(refund, cid)
    )
    await ctx.execute_activity(step, "pack")
    if ctx.is_cancelled():
        await saga.compensate_all()
        raise Cancelled(ctx.cancellation_reason() or "cancelled")
    return charge


@workflow
async def parked(ctx: WorkflowContext, _data) -> str:
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(step, "charge"), lambda cid: ctx.execute_activity(refund, cid)
    )
    try:
        return await ctx.wait_signal("approve", cancellable=True)  # type: ignore[no-any-return]
    except Cancelled:
        if not ctx.is_sealed():
            await saga.compensate_all()
        raise


def names(run):
    return [e.activity_name for e in run.scheduled()]


def markers(run):
    return [e.name for e in run.events if isinstance(e, ev.MarkerRecorded)]


# ── position in history, cold and warm ───────────────────────────────────────────────────────
def _drive_checks(sim: Simulator, where: int):
    """Complete a, b, c one by one; the request lands at script position ``where``."""
    run = sim.start("checks", None, execution_id=f"checks-{where}")
    script = []
    for activity_id in ("1", "2", "3"):
        script += [("decide",), ("start", activity_id), ("finish", activity_id)]
    script += [("decide",), ("timer",), ("decide",)]
    script.insert(where, ("request",))
    for action in script:
        if action[0] == "decide":
            run.decide()
        elif action[0] == "start":
            run.start_activity(action[1])
        elif action[0] == "finish":
            run.append(ev.ActivityCompleted(action[1], action[1]))
        elif action[0] == "timer":
            run.fire_timers()
        else:
            run.request_cancellation("customer asked")
    return run


@pytest.mark.parametrize("where", range(12))
def test_a_request_between_two_checks_reads_the_same_cold_and_warm(where):
    cold = _drive_checks(Simulator(checks, step), where)
    warm = _drive_checks(Simulator(checks, step, sticky=True), where)
    assert [e.to_data() for e in warm.events] == [e.to_data() for e in cold.events]
    assert cold.status == warm.status == "COMPLETED"  # it never raised Cancelled
    seen = cold.events[-1].result
    flips = [i for i, s in enumerate(seen[:4]) if s]
    assert flips == list(range(flips[0], 4)) if flips else True  # once true, it stays true
    assert cold.replay().nd is None and cold.replay().outcome is not None
    # the recorded position decides: a request recorded after activity b's completion is seen
    # only after c, never at the check that follows b
    types = cold.types()
    position = types.index("WorkflowCancelRequested")
    completions = [i for i, t in enumerate(types) if t == "ActivityCompleted"]
    assert seen[1:4] == [position < c for c in completions]
    assert seen[4] == ("customer asked" if position < types.index("TimerFired") else None)


@pytest.mark.parametrize("seed", range(12))
def test_random_requests_decide_identically_cold_and_warm(seed):
    def drive(sticky):
        rng = random.Random(seed)
        run = Simulator(coop, parked, step, refund, sticky=sticky).start(
            rng.choice(["coop", "parked"]), None, execution_id=f"r{seed}"
        )
        for _ in range(40):
            run.decide()
            for activity_event in run.open_activities()[: rng.randint(0, 2)]:
                run.execute(activity_event)
            if rng.random() < 0.25 and run.status == "RUNNING":
                run.request_cancellation("stop")
            if rng.random() < 0.1 and run.status == "RUNNING":
                run.signal("approve", "yes")
            if run.status != "RUNNING" and not run.open_activities():
                break
        return run

    cold, warm = drive(False), drive(True)
    assert [e.to_data() for e in warm.events] == [e.to_data() for e in cold.events]
    assert (warm.status, warm.metrics, warm.nd) == (cold.status, cold.metrics, cold.nd)
    assert cold.replay().nd is None


# ── the cooperative cancel ───────────────────────────────────────────────────────────────────
def _requested_while_packing(sim: Simulator):
    run = sim.start("coop", None)
    run.decide()
    run.complete("1", "ch_1")
    run.decide()
    run.start_activity("2")
    assert run.request_cancellation("customer asked") is True
    run.decide()
    assert run.status == "RUNNING" and run.cancelling
    return run


@pytest.mark.parametrize("sticky", [False, True])
def test_a_cooperative_cancel_runs_a_durable_refund_and_ends_cancelled(sticky):
    run = _requested_while_packing(Simulator(coop, step, refund, sticky=sticky))
    run.append(ev.ActivityCompleted("2", "pack"))
    run.decide()
    assert names(run) == ["step", "step", "refund"]  # the refund is a real dispatch: live run
    refund_event = run.scheduled()[-1]
    assert refund_event.compensation and refund_event.input == "ch_1"
    assert run.status == "RUNNING" and run.cancelling  # CANCELLING while the refund runs
    run.complete(refund_event.activity_id, "refunded ch_1")
    run.decide()
    assert run.status == "CANCELLED" and not run.cancelling and run.nd is None
    assert run.events[-1] == ev.WorkflowFailed("Cancelled", "customer asked")
    assert markers(run) == ["saga_compensated:1"] and run.metrics == [COMPENSATED]
    run.decide()  # the unwind after a request is counted exactly once
    assert run.metrics == [COMPENSATED] and run.replay().nd is None


def test_a_second_request_is_idempotent_and_a_workflow_that_completes_anyway_is_completed():
    run = Simulator(checks, step).start("checks", None)
    run.decide()
    assert run.request_cancellation("first") is True
    assert run.request_cancellation("second") is False
    assert run.types().count("WorkflowCancelRequested") == 1
    run.run_to_end()
    assert run.status == "COMPLETED" and run.events[-1].result[-1] == "first"


def test_a_seal_cancel_during_cancelling_still_seals():
    run = _requested_while_packing(Simulator(coop, step, refund))
    run.append(ev.ActivityCompleted("2", "pack"))
    run.decide()  # the refund is dispatched (an unwind has begun)
    run.cancel("operator")
    assert run.status == "FAILED"  # the seal landed mid-unwind, as the spec says
    refund_id = run.scheduled()[-1].activity_id
    assert refund_id in run.cancelled_rows  # unstarted: it never runs
    assert run.nd is None and run.types()[-1] == "WorkflowCancelled"


def test_the_request_is_transparent_to_the_command_matcher():
    """A request recorded between a dispatch and its completion, or right before an unwind's
    marker, never shifts a match: a probe replay of the whole history matches it."""
    run = _requested_while_packing(Simulator(coop, step, refund))
    run.append(ev.ActivityCompleted("2", "pack"))
    run.run_to_end()
    types = run.types()
    assert types.index("WorkflowCancelRequested") < types.index("MarkerRecorded")
    probe = run.replay()
    assert probe.nd is None and probe.commands == [] and probe.outcome is not None


# ── a cancellable wait ───────────────────────────────────────────────────────────────────────
def test_a_cancellable_wait_raises_cancelled_at_the_request():
    run = Simulator(parked, step, refund).start("parked", None)
    run.decide()
    run.complete("1", "ch_1")
    run.decide()  # parked on "approve"
    run.request_cancellation("changed my mind")
    run.decide()
    assert names(run) == ["step", "refund"] and run.status == "RUNNING"
    run.run_to_end()
    assert run.status == "CANCELLED" and run.events[-1].message == "changed my mind"
    # the request was the last event when the unwind began: transparent to the marker matcher,
    # so this is the live frontier, not a drained-signal (uncounted) one
    assert markers(run) == ["saga_compensated:1"] and run.metrics == [COMPENSATED]


def test_a_signal_delivered_before_the_request_wins():
    run = Simulator(parked, step, refund).start("parked", None)
    run.decide()
    run.complete("1", "ch_1")
    run.signal("approve", "ok")
    run.request_cancellation("too late")
    run.decide()
    assert run.status == "COMPLETED" and run.events[-1].result == "ok"


def test_a_cancellable_wait_under_a_seal_raises_cancelled_without_a_durable_undo():
    run = Simulator(parked, step, refund).start("parked", None)
    run.decide()
    run.complete("1", "ch_1")
    run.decide()
    run.cancel("operator")
    assert run.status == "CANCELLED" and run.events[-1] == ev.WorkflowFailed("Cancelled", "operator")
    assert names(run) == ["step"] and run.nd is None


# ── DAGs ─────────────────────────────────────────────────────────────────────────────────────
def _act(name):
    return activity(name=name)(lambda _x: name.upper())


a, b, c, e, undo = _act("a"), _act("b"), _act("c"), _act("e"), _act("undo")


@dag
def edge(g):
    na = g.activity(a).compensate(undo)
    g.activity(b).upstream(na).compensate(undo)
    nc = g.activity(c).upstream(na).compensate(undo)
    g.activity(e).upstream(nc).compensate(undo)


@dag
def gated_cx(g):
    na = g.activity(a).compensate(undo)
    gate = g.signal_gate("go").upstream(na)
    g.activity(b).upstream(gate).compensate(undo)


def dag_sim():
    return Simulator(edge, gated_cx, a, b, c, e, undo)


def id_of(run, name):
    return next(x.activity_id for x in run.scheduled() if x.activity_name == name and not x.compensation)


def test_a_sealed_dag_dispatches_no_new_node_and_keeps_the_dag_error():
    run = dag_sim().start("edge", {})
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()  # b and c dispatched together
    run.fail(id_of(run, "b"))
    run.decide()
    run.start_activity(id_of(run, "c"))  # c runs when the cancel lands
    run.cancel("operator")
    run.complete(id_of(run, "c"), "C", started=False)  # ... and then succeeds
    run.decide()
    assert names(run) == ["a", "b", "c"]  # e is never dispatched
    assert run.nd is None and run.status == "CANCELLED"
    assert run.events[-1] == ev.WorkflowFailed("DagTaskFailed", DAG_FAILED)
    assert markers(run) == [] and run.metrics == []  # a sealed DAG never unwinds
    assert run.replay().nd is None


def test_a_sealed_dag_with_no_failed_node_ends_cancelled():
    run = dag_sim().start("edge", {})
    run.decide()
    run.start_activity(id_of(run, "a"))
    run.cancel("operator")
    run.complete(id_of(run, "a"), "A", started=False)
    run.decide()
    assert names(run) == ["a"] and run.nd is None
    assert run.events[-1] == ev.WorkflowFailed("Cancelled", "operator")


@pytest.mark.parametrize("sticky", [False, True])
def test_a_cooperative_dag_stops_dispatching_and_unwinds_durably(sticky):
    run = Simulator(edge, gated_cx, a, b, c, e, undo, sticky=sticky).start("edge", {})
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()
    run.start_activity(id_of(run, "c"))
    run.request_cancellation("stop")
    run.complete(id_of(run, "b"), "B")
    run.decide()
    run.complete(id_of(run, "c"), "C", started=False)
    run.decide()
    forward = [x.activity_name for x in run.scheduled() if not x.compensation]
    undone = [x.input["dag_compensate"] for x in run.scheduled() if x.compensation]
    assert forward == ["a", "b", "c"] and undone == ["c"]  # LIFO of level order; e never ran
    run.run_to_end()
    undone = [x.input["dag_compensate"] for x in run.scheduled() if x.compensation]
    assert undone == ["c", "b", "a"] and run.status == "CANCELLED"
    assert run.events[-1] == ev.WorkflowFailed("Cancelled", "stop")
    assert markers(run) == ["saga_compensated:1"] and run.metrics == [COMPENSATED]


def test_a_dag_gate_gives_up_on_a_cooperative_cancel():
    run = dag_sim().start("gated_cx", {})
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()  # waiting at the gate
    run.request_cancellation("stop")
    run.run_to_end()
    assert [x.input["dag_compensate"] for x in run.scheduled() if x.compensation] == ["a"]
    assert run.status == "CANCELLED" and "b" not in names(run)


# ── the derived statuses ─────────────────────────────────────────────────────────────────────
def test_the_derived_statuses():
    error = {"type": "SagaCompensationFailed", "message": "saga compensation failed ..."}
    assert display_status("RUNNING", False, True, None) == "CANCELLING"
    assert display_status("CANCELLED", True, False, {"type": "Cancelled", "message": "x"}) == "CANCELLED"
    assert display_status("CANCELLED", True, False, error) == (
        "CANCELLED (cancel branch failed: SagaCompensationFailed: saga compensation failed ...)"
    )
    assert display_status("FAILED", False, True, error).startswith("FAILED (cancel branch failed: ")
    assert display_status("FAILED", False, False, error) == "FAILED"  # never cancelled
    assert cancel_branch_failure("TERMINATED", True, {"type": "Terminated", "message": ""}) is None


def test_a_warm_session_takes_the_request_as_a_new_event():
    run = Simulator(coop, step, refund, sticky=True).start("coop", None)
    run.decide()
    session = run.session
    assert session is not None
    run.complete("1", "ch_1")
    run.request_cancellation("stop")
    run.decide()
    assert run.session is session  # advanced in place, not rebuilt: the request is an input event
