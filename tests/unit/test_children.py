"""Child workflows and continue-as-new in the pure engine (docs/concepts.md, "Child workflows"):
recorded ids, answers delivered in history order, a child as a saga step, bad input refused
before anything is recorded, the seal, unwind detection, and a cold replay and a warm one
(``Session.advance``) giving the same decision for every new event type."""

from __future__ import annotations

import pytest

from harvest_celery import (
    Cancelled,
    ChildWorkflowFailed,
    ExecutionAlreadyExists,
    InvalidExecutionId,
    PayloadNotSerializable,
    Saga,
    UnknownWorkflow,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._core import events as ev
from harvest_celery._core.commands import ContinuedAsNew, StartChildWorkflow
from harvest_celery._core.engine import Activation, Session
from harvest_celery._core.ids import MAX_ID_LENGTH, check_execution_id
from harvest_celery._core.lifecycle import CONTINUED_AS_NEW, decision_events, unwind_begun
from harvest_celery.testing import Simulator


@activity
def charge(order):
    return f"charge-{order}"


@activity
def refund(charge_id):
    return f"refunded-{charge_id}"


@activity
def ship(order):
    raise RuntimeError("no truck")


@workflow
async def book_trip(ctx: WorkflowContext, trip):
    return {"ref": f"trip-{trip}"}


@workflow
async def cancel_trip(ctx: WorkflowContext, booking):
    return "cancelled"


@workflow
async def calls_one(ctx: WorkflowContext, data):
    return await ctx.execute_child_workflow(book_trip, data)


@workflow
async def with_handle(ctx: WorkflowContext, data):
    handle = ctx.start_child_workflow("book_trip", data, id="my-trip", parent_close_policy="abandon")
    return [handle.id, await handle]


@workflow
async def trip_saga(ctx: WorkflowContext, data):
    saga = Saga(ctx)
    await saga.step(lambda: ctx.execute_activity(charge, data), lambda c: ctx.execute_activity(refund, c))
    await saga.step(
        lambda: ctx.execute_child_workflow(book_trip, data),
        lambda booking: ctx.execute_child_workflow(cancel_trip, booking),
    )
    await saga.step(lambda: ctx.execute_activity(ship, data))
    return "never"


@workflow
async def bad_child(ctx: WorkflowContext, case):
    try:
        if case == "unknown":
            ctx.start_child_workflow("no_such_workflow", 1)
        elif case == "colon":
            ctx.start_child_workflow(book_trip, 1, id="a:b")
        elif case == "policy":
            ctx.start_child_workflow(book_trip, 1, parent_close_policy="kill")
        elif case == "json":
            ctx.start_child_workflow(book_trip, {1, 2})
        elif case == "can_json":
            ctx.continue_as_new(object())
    except Exception as exc:  # noqa: BLE001 - what the workflow saw is its result
        return type(exc).__name__
    return "accepted"


@workflow
async def looper(ctx: WorkflowContext, n):
    got = await ctx.wait_signal("tick")
    if n < 3:
        ctx.continue_as_new(n + 1)
    return [n, got]


OBJECTS = (charge, refund, ship, book_trip, cancel_trip, calls_one, with_handle, trip_saga, bad_child, looper)


def sim(sticky=False):
    return Simulator(*OBJECTS, sticky=sticky)


def scheduled(run):
    return [e for e in run.events if isinstance(e, ev.ChildWorkflowScheduled)]


def close(run, child_id, status="COMPLETED", result=None, error_type="", message=""):
    run.append(ev.ChildWorkflowClosed(child_id, status, result, error_type, message))


@pytest.mark.parametrize("sticky", [False, True])
def test_a_child_is_recorded_with_its_default_id_and_its_result_is_delivered(sticky):
    run = sim(sticky).start("calls_one", "rome", execution_id="order-7")
    run.decide()
    assert [(e.child_id, e.workflow_type, e.input, e.policy, e.compensation) for e in scheduled(run)] == [
        ("order-7-c1", "book_trip", "rome", "terminate", False)
    ]
    run.append(ev.ChildWorkflowStarted("order-7-c1"))
    run.decide()  # started, not closed: still waiting, nothing new
    assert run.status == "RUNNING" and run.types()[-1] == "ChildWorkflowStarted"
    close(run, "order-7-c1", result={"ref": "trip-rome"})
    run.decide()
    assert run.status == "COMPLETED" and run.events[-1] == ev.WorkflowCompleted({"ref": "trip-rome"})


def test_a_handle_knows_its_id_at_once_and_replay_reads_the_id_back():
    run = sim().start("with_handle", "oslo")
    decision = run.decide()
    assert decision.commands == [
        StartChildWorkflow("my-trip", "book_trip", "oslo", "", "abandon", False, True)
    ]
    run.append(ev.ChildWorkflowStarted("my-trip"))
    close(run, "my-trip", result=1)
    run.decide()
    assert run.events[-1] == ev.WorkflowCompleted(["my-trip", 1])


def test_a_default_id_of_a_200_character_parent_is_legal():
    parent = "p" * MAX_ID_LENGTH
    run = sim().start("calls_one", 1, execution_id=parent)
    run.decide()
    (child,) = scheduled(run)
    assert check_execution_id(child.child_id) == child.child_id and len(child.child_id) <= MAX_ID_LENGTH


def test_a_refused_id_raises_already_exists_and_is_read_back_without_asking_again():
    run = sim().start("with_handle", 1)
    run.decide()
    run.append(ev.ChildWorkflowStartRefused("my-trip", "other_wf"))
    run.decide()
    assert run.status == "FAILED"
    assert run.events[-1].error_type == ExecutionAlreadyExists.__name__
    assert len(scheduled(run)) == 1  # recorded once
    assert run.replay().nd is None and run.replay().commands == []  # the same answer on replay


@pytest.mark.parametrize("sticky", [False, True])
def test_a_child_as_a_saga_step_is_undone_by_a_compensating_child_that_gets_its_result(sticky):
    run = sim(sticky).start("trip_saga", "o1")
    run.run_to_end()
    (forward,) = scheduled(run)
    run.append(ev.ChildWorkflowStarted(forward.child_id))
    close(run, forward.child_id, result={"ref": "trip-o1"})
    run.run_to_end()  # ship fails: the unwind starts with the compensating child
    kids = scheduled(run)
    assert [(k.workflow_type, k.input, k.compensation) for k in kids] == [
        ("book_trip", "o1", False),
        ("cancel_trip", {"ref": "trip-o1"}, True),
    ]
    types = run.types()
    assert types[types.index("ChildWorkflowScheduled", types.index("ActivityFailed")) - 1] == "MarkerRecorded"
    assert unwind_begun(run.events)
    run.append(ev.ChildWorkflowStarted(kids[1].child_id))
    close(run, kids[1].child_id, "FAILED", None, "RuntimeError", "undo failed")
    run.run_to_end()  # continue-not-abort: the refund still runs
    assert [e.activity_name for e in run.scheduled()] == ["charge", "ship", "refund"]
    assert run.status == "FAILED" and run.events[-1].error_type == "SagaCompensationFailed"
    assert "compensation errors: [child workflow run-1-c2 ended FAILED: RuntimeError: undo failed]" in (
        run.events[-1].message
    )
    assert run.metrics == ["saga_compensated", "saga_compensation_failed"]  # once each


@pytest.mark.parametrize(
    ("status", "rolled_back"), [("FAILED", True), ("TERMINATED", True), ("CANCELLED", False)]
)
def test_a_child_that_does_not_complete_registers_nothing(status, rolled_back):
    run = sim().start("trip_saga", "o2")
    run.run_to_end()
    (forward,) = scheduled(run)
    run.append(ev.ChildWorkflowStarted(forward.child_id))
    close(run, forward.child_id, status, None, "Boom" if status == "FAILED" else "", "x")
    run.run_to_end()
    assert len(scheduled(run)) == 1  # no compensating child: the step registered nothing
    refunds = [e for e in run.scheduled() if e.activity_name == "refund"]
    assert bool(refunds) is rolled_back  # a CANCELLED child passes through without a rollback
    assert run.status == "FAILED" and run.events[-1].error_type == ChildWorkflowFailed.__name__
    assert f"ended {status}" in run.events[-1].message


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("unknown", UnknownWorkflow),
        ("colon", InvalidExecutionId),
        ("policy", ValueError),
        ("json", PayloadNotSerializable),
        ("can_json", PayloadNotSerializable),
    ],
)
def test_bad_input_raises_before_anything_is_recorded(case, error):
    run = sim().start("bad_child", case)
    run.decide()
    assert run.events[-1] == ev.WorkflowCompleted(error.__name__) and not scheduled(run)
    assert run.replay().nd is None  # the same on replay


def test_a_child_start_after_the_seal_is_raised_into_the_workflow_never_nd_blocked():
    run = sim().start("calls_one", 1)
    run.append(ev.WorkflowCancelled("stop"))  # sealed before the first decision
    run.status = "CANCELLED"
    run.decide()
    assert run.nd is None and not scheduled(run)
    assert run.events[-1].error_type == "NonDeterministic"
    assert "expected ChildWorkflowScheduled(book_trip), got WorkflowCancelled" in run.events[-1].message


def test_a_compensating_child_counts_as_an_unwind_for_a_cancel():
    events = [
        ev.WorkflowStarted("trip_saga", "o"),
        ev.ChildWorkflowScheduled("x-c2", "cancel_trip", {}, "", "terminate", compensation=True),
    ]
    assert unwind_begun(events) and not unwind_begun(events[:1] + [ev.ChildWorkflowScheduled("x-c1", "b")])


def test_continue_as_new_names_the_next_link_and_carries_unconsumed_signals_in_order():
    run = sim().start("looper", 0, execution_id="poll")
    run.signal("tick", "a")
    run.signal("other", 1)
    run.signal("tick", "b")
    decision = run.decide()
    assert decision.outcome == ContinuedAsNew("poll-n1", 1, (("other", 1), ("tick", "b")))
    assert run.status == CONTINUED_AS_NEW
    assert run.events[-1] == ev.WorkflowContinuedAsNew("poll-n1", 1)
    # the next link derives its successor from the chain's first id
    link = Simulator(*OBJECTS).run_from_history(
        "looper",
        [
            ev.WorkflowStarted("looper", 1, continued_from="poll", chain_id="poll", link=1),
            ev.SignalReceived("tick", "c"),
        ],
        execution_id="poll-n1",
    )
    assert link.decide().outcome == ContinuedAsNew("poll-n2", 2, ())
    long_root = "r" * MAX_ID_LENGTH
    far = Simulator(*OBJECTS).run_from_history(
        "looper",
        [ev.WorkflowStarted("looper", 2, chain_id=long_root, link=4999), ev.SignalReceived("tick", 0)],
    )
    next_id = far.decide().outcome.next_id
    assert check_execution_id(next_id) == next_id and next_id.endswith("-n5000")


def test_continue_as_new_on_a_sealed_run_raises_cancelled():
    run = sim().start("looper", 0)
    run.signal("tick", "a")
    run.append(ev.WorkflowCancelled("stop"))
    run.status = "CANCELLED"
    run.decide()
    assert run.events[-1].error_type == Cancelled.__name__ and not any(
        isinstance(e, ev.WorkflowContinuedAsNew) for e in run.events
    )


def _cold_and_warm(workflow_type, data, appended):
    """Decide once, append ``appended`` after the decision's events, then decide again both ways."""
    simulator = sim()
    run = simulator.start(workflow_type, data, execution_id="w")
    definition = simulator.registry.workflow(workflow_type)
    session = Session(definition, Activation("w", workflow_type, list(run.history)), simulator.registry)
    for event in decision_events(session.decision, run.events):
        run.append(event)
    for event in appended:
        run.append(event)
    warm = session.advance(run.history[len(session.events) :], simulator.config)
    cold = Session(definition, Activation("w", workflow_type, list(run.history)), simulator.registry).decision
    return cold, warm


@pytest.mark.parametrize(
    ("workflow_type", "data", "appended"),
    [
        ("calls_one", 1, [ev.ChildWorkflowStarted("w-c1")]),
        ("calls_one", 1, [ev.ChildWorkflowStarted("w-c1"), ev.ChildWorkflowClosed("w-c1", "COMPLETED", 5)]),
        (
            "calls_one",
            1,
            [ev.ChildWorkflowStarted("w-c1"), ev.ChildWorkflowClosed("w-c1", "FAILED", None, "E", "m")],
        ),
        ("with_handle", 1, [ev.ChildWorkflowStartRefused("my-trip", "other")]),
        ("looper", 0, [ev.SignalReceived("tick", "a")]),  # the decision ends WorkflowContinuedAsNew
    ],
)
def test_a_cold_replay_and_a_warm_one_give_the_same_decision(workflow_type, data, appended):
    cold, warm = _cold_and_warm(workflow_type, data, appended)
    assert warm is not None and warm == cold


def test_a_continued_history_replays_cold_to_the_same_outcome():
    run = sim().start("looper", 0, execution_id="poll")
    run.signal("tick", "a")
    first = run.decide()
    assert isinstance(first.outcome, ContinuedAsNew)
    again = run.replay()
    assert again.nd is None and again.outcome == first.outcome


NEW_TYPES = {
    "ChildWorkflowScheduled",
    "ChildWorkflowStarted",
    "ChildWorkflowStartRefused",
    "ChildWorkflowClosed",
    "WorkflowContinuedAsNew",
}


def _warm_checked_against_cold(monkeypatch) -> list[tuple[set[str], set[str]]]:
    """Every warm decision (a ``Session.advance`` that did not decline) is compared with a cold
    replay of the same history. Returns, per warm decision, the event types of the history it
    read and of the events it decided."""
    compared: list[tuple[set[str], set[str]]] = []
    real = Session.advance

    def advance(self, new, config):
        warm = real(self, new, config)
        if warm is not None:
            replay = self.replay
            history = [
                ev.HistoryEvent(i, e, t)
                for i, (e, t) in enumerate(zip(replay.events, replay.times, strict=True))
            ]
            activation = Activation(
                replay.activation.execution_id, replay.activation.workflow_type, history, config
            )
            cold = Session(replay.definition, activation, replay.registry)
            assert warm == cold.decision, (warm, cold.decision)
            cold.close()
            decided = {e.type for e in decision_events(warm, list(replay.events))}
            compared.append(({e.type for e in replay.events}, decided))
        return warm

    monkeypatch.setattr(Session, "advance", advance)
    return compared


def test_a_warm_replay_decides_as_a_cold_one_over_every_new_event_type(monkeypatch):
    compared = _warm_checked_against_cold(monkeypatch)
    run = sim(sticky=True).start("trip_saga", "o1")  # a child step, then its compensating child
    run.run_to_end()
    (forward,) = scheduled(run)
    run.append(ev.ChildWorkflowStarted(forward.child_id))
    close(run, forward.child_id, result={"ref": "trip-o1"})
    run.run_to_end()
    undo = scheduled(run)[1]
    assert undo.compensation
    run.append(ev.ChildWorkflowStarted(undo.child_id))
    close(run, undo.child_id, "FAILED", None, "RuntimeError", "undo failed")
    run.run_to_end()
    assert run.status == "FAILED"
    refused = sim(sticky=True).start("with_handle", 1)
    refused.decide()
    refused.append(ev.ChildWorkflowStartRefused("my-trip", "other_wf"))
    refused.decide()
    assert refused.status == "FAILED"
    looped = sim(sticky=True).start("looper", 0)
    looped.decide()
    looped.signal("tick", "a")
    looped.decide()
    assert looped.status == CONTINUED_AS_NEW
    read = set().union(*(r for r, _ in compared))
    decided = set().union(*(d for _, d in compared))
    # every new type was read by a warm decision, or (a terminal one) decided by one
    assert NEW_TYPES - {"WorkflowContinuedAsNew"} <= read
    assert {"ChildWorkflowScheduled", "WorkflowContinuedAsNew"} <= decided
