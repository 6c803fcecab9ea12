"""Updates against the pure engine (no services): ``ctx.set_update_handler``, ``_core.updates``
and ``_core.validators``.

An update is validated on a probe replay built for the call (a rejection writes nothing), then
recorded as ``UpdateAccepted``, an input event delivered in history order; its handler runs as
a task of the replay loop, may await activities, and its end is recorded as ``UpdateCompleted``,
a command event matched by update id. Warm and cold replays agree; a handler that no longer
completes where it did diverges; an ``UpdateAccepted`` with no handler nd-blocks the run."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from harvest_celery import (
    PayloadNotSerializable,
    Saga,
    UnknownUpdate,
    UpdateFailed,
    UpdateRejected,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._core import events as ev
from harvest_celery._core.commands import CompleteUpdate
from harvest_celery._errors import error_body, http_status
from harvest_celery.testing import Simulator


@activity
def double(x):
    return 2 * x


@activity
def refund(x):
    return f"refunded {x}"


@workflow
async def counter(ctx: WorkflowContext, _data: Any) -> dict:
    state: dict[str, Any] = {"total": 0, "log": []}

    def positive(arg: Any) -> None:
        if not isinstance(arg, int) or arg <= 0:
            raise ValueError(f"not a positive int: {arg!r}")
        if state["total"] + arg > 100:  # the validator sees the current state
            raise ValueError("over the limit of 100")

    async def add(arg: int) -> int:
        doubled = await ctx.execute_activity(double, arg)
        state["total"] += doubled
        state["log"].append(f"add {arg}")
        return int(state["total"])

    def note(arg: Any) -> str:
        state["log"].append(f"note {arg}")
        return f"noted {arg}"

    def snooping(_arg: Any) -> None:
        state["log"].append("validator changed a local")  # dies with the probe

    def scheduling(_arg: Any) -> None:
        try:
            ctx.execute_activity(double, 1)
        except UpdateRejected:
            pass  # caught: the update is rejected all the same

    def fails(_arg: Any) -> None:
        raise RuntimeError("handler broke")

    def sagas(_arg: Any) -> None:
        Saga(ctx)

    ctx.set_update_handler("add", add, validator=positive)
    ctx.set_update_handler("note", note)
    ctx.set_update_handler("snoop", note, validator=snooping)
    ctx.set_update_handler("schedules", note, validator=scheduling)
    ctx.set_update_handler("fails", fails)
    ctx.set_update_handler("saga", sagas)
    ctx.set_update_handler("set_set", lambda _arg: {1, 2})
    ctx.set_update_handler("gone", note)
    ctx.set_update_handler("gone", None)  # None removes it
    ctx.set_query_handler("state", lambda _arg: dict(state))
    stop = await ctx.wait_signal("stop")
    return {"total": state["total"], "log": state["log"], "stop": stop}


@workflow(name="counter")
async def counter_without_handlers(ctx: WorkflowContext, _data: Any) -> dict:
    """A deploy that dropped every update handler."""
    stop = await ctx.wait_signal("stop")
    return {"stop": stop}


@workflow(name="counter")
async def counter_whose_note_waits(ctx: WorkflowContext, _data: Any) -> dict:
    """A deploy whose ``note`` handler no longer completes at once."""

    async def note(arg: Any) -> str:
        await ctx.wait_signal("never")
        return f"noted {arg}"

    ctx.set_update_handler("note", note)
    stop = await ctx.wait_signal("stop")
    return {"stop": stop}


def sim(sticky: bool = False) -> Simulator:
    return Simulator(counter, double, refund, sticky=sticky)


def started(s: Simulator, execution_id: str = "run-1"):
    run = s.start("counter", None, execution_id=execution_id)
    run.decide()
    return run


def completed(run, update_id: str) -> ev.UpdateCompleted:
    done = run.update_outcome(update_id)
    assert done is not None, run.types()
    return done


# ── acceptance and the handler ────────────────────────────────────────────────────────────────
def test_a_handler_awaiting_an_activity_records_its_value_as_update_completed():
    run = started(sim())
    uid = run.update("add", 5, update_id="u1")
    assert uid == "u1" and run.types()[-1] == "UpdateAccepted"
    decision = run.decide()
    assert [(c.activity_name, c.input) for c in decision.commands] == [("double", 5)]
    assert run.update_outcome("u1") is None  # still awaiting its activity
    run.complete("1", 10)
    assert run.decide().commands == [CompleteUpdate("u1", 10)]
    assert completed(run, "u1") == ev.UpdateCompleted("u1", 10)
    assert run.status == "RUNNING"  # the workflow itself still waits on its signal
    run.signal("stop", "ok")
    run.decide()
    assert run.events[-1].result == {"total": 10, "log": ["add 5"], "stop": "ok"}


def test_updates_are_delivered_in_history_order():
    run = started(sim())
    run.update("note", "a", update_id="u1")
    run.update("note", "b", update_id="u2")
    run.signal("stop", "s")
    run.decide()
    assert [e.update_id for e in run.events if isinstance(e, ev.UpdateCompleted)] == ["u1", "u2"]
    assert run.events[-1].result["log"] == ["note a", "note b"]


def test_a_plain_handler_completes_in_the_decision_that_delivers_it():
    run = started(sim())
    run.update("note", "x", update_id="u1")
    assert run.decide().commands == [CompleteUpdate("u1", "noted x")]


def test_a_raising_handler_records_its_error_and_the_run_goes_on():
    run = started(sim())
    run.update("fails", None, update_id="u1")
    run.decide()
    done = completed(run, "u1")
    assert (done.error_type, done.message, done.result) == ("RuntimeError", "handler broke", None)
    assert run.status == "RUNNING"


def test_a_result_that_is_not_json_fails_the_update():
    run = started(sim())
    run.update("set_set", None, update_id="u1")
    run.decide()
    assert completed(run, "u1").error_type == "PayloadNotSerializable"


def test_a_saga_used_from_an_update_handler_fails_it_with_a_clear_error():
    run = started(sim())
    run.update("saga", None, update_id="u1")
    run.decide()
    done = completed(run, "u1")
    assert done.error_type == "TypeError"
    assert "update handler" in done.message and "saga + update is out of scope" in done.message


def test_an_update_id_already_accepted_appends_nothing():
    run = started(sim())
    run.update("note", "a", update_id="u1")
    before = list(run.history)
    assert run.update("note", "other", update_id="u1") == "u1"
    assert run.history == before


# ── the validator ─────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("arg", [0, -3, "five"])
def test_a_validator_that_raises_rejects_and_writes_nothing(arg):
    run = started(sim())
    before = list(run.history)
    with pytest.raises(UpdateRejected) as err:
        run.update("add", arg)
    assert err.value.error_type == "ValueError" and "not a positive int" in err.value.error_message
    assert run.history == before
    assert run.decide().commands == []


def test_a_validator_sees_the_state_earlier_updates_left():
    run = started(sim())
    run.update("add", 40, update_id="u1")
    run.decide()
    run.complete("1", 80)
    run.decide()
    with pytest.raises(UpdateRejected, match="over the limit of 100"):
        run.update("add", 30)  # 80 + 30 > 100
    run.update("add", 20, update_id="u2")  # 80 + 20 is fine


def test_a_validator_issuing_a_ctx_command_is_rejected_even_if_it_caught_the_refusal():
    run = started(sim())
    before = list(run.history)
    with pytest.raises(UpdateRejected) as err:
        run.update("schedules", None)
    assert err.value.error_type == "UpdateCommand" and "ctx.execute_activity" in err.value.error_message
    assert run.history == before


def test_a_validator_changing_a_local_changes_nothing_any_decision_sees():
    run = started(sim(sticky=True))
    warm = run.session
    run.update("snoop", "x", update_id="u1")
    assert run.session is warm
    run.signal("stop", "s")
    run.decide()
    assert run.events[-1].result["log"] == ["note x"]  # not "validator changed a local"


def test_an_unknown_update_lists_the_registered_names_and_writes_nothing():
    run = started(sim())
    before = list(run.history)
    with pytest.raises(UnknownUpdate) as err:
        run.update("gone", None)
    assert err.value.known == ["add", "fails", "note", "saga", "schedules", "set_set", "snoop"]
    assert http_status(err.value) == 404
    assert run.history == before


def test_an_argument_that_is_not_json_is_refused_before_anything_is_read():
    run = started(sim())
    with pytest.raises(PayloadNotSerializable):
        run.update("note", {1, 2})


# ── replay: warm and cold, divergences ────────────────────────────────────────────────────────
def drive(sticky: bool):
    run = started(sim(sticky), execution_id="both")
    run.update("add", 5, update_id="u1")
    run.decide()
    run.update("note", "between", update_id="u2")
    run.decide()
    run.complete("1", 10)
    run.decide()
    run.update("fails", None, update_id="u3")
    run.signal("stop", "s")
    run.decide()
    return run


def test_warm_and_cold_replays_record_the_same_history():
    warm, cold = drive(True), drive(False)
    assert warm.status == cold.status == "COMPLETED"
    assert [e.to_data() for e in warm.events] == [e.to_data() for e in cold.events]
    assert warm.events[-1].result == {"total": 10, "log": ["note between", "add 5"], "stop": "s"}
    assert warm.replay().nd is None and warm.replay().outcome == cold.replay().outcome


def test_an_update_accepted_with_no_handler_in_the_code_nd_blocks_the_run():
    run = started(sim())
    run.update("note", "a", update_id="u1")
    newer = Simulator(counter_without_handlers, double)
    replayed = newer.start("counter", None, execution_id="run-1")
    replayed.history = list(run.history)
    decision = replayed.decide()
    assert decision.nd is not None and replayed.nd is not None
    assert decision.nd["expected"] == "an update handler 'note'"
    assert decision.nd["actual"] == "UpdateAccepted(u1)"


def test_a_handler_that_no_longer_completes_where_it_did_diverges():
    run = started(sim())
    run.update("note", "a", update_id="u1")
    run.decide()
    assert completed(run, "u1").result == "noted a"
    newer = Simulator(counter_whose_note_waits, double)
    replayed = newer.start("counter", None, execution_id="run-1")
    replayed.history = list(run.history)
    decision = replayed.decide()
    assert decision.nd is not None and decision.nd["actual"] == "UpdateCompleted(u1)"


def test_a_sealed_replay_records_no_update_completed():
    run = started(sim())
    run.update("add", 5, update_id="u1")
    run.decide()  # its activity is scheduled, never completed
    run.cancel("stop it")
    assert run.status == "CANCELLED"
    assert run.update_outcome("u1") is None
    assert not any(isinstance(e, ev.UpdateCompleted) for e in run.events)


def test_update_events_declare_their_families_and_payload_fields():
    assert ev.UpdateAccepted.family is ev.Family.INPUT and ev.UpdateAccepted.advance
    assert ev.UpdateCompleted.family is ev.Family.COMMAND and ev.UpdateCompleted.cursor is ev.Cursor.MATCHED
    assert ev.payload_fields(ev.UpdateAccepted) == ("arg",)
    assert ev.payload_fields(ev.UpdateCompleted) == ("result",)
    assert ev.scrubbed_fields(ev.UpdateCompleted) == ("message",)
    data = ev.UpdateCompleted("u1", None, "RuntimeError", "boom").to_data()
    assert ev.event_from_data(data) == ev.UpdateCompleted("u1", None, "RuntimeError", "boom")


def test_the_update_errors_pickle_and_answer_http():
    rejected = UpdateRejected("run-1", "add", "ValueError", "negative")
    failed = UpdateFailed("run-1", "add", "RunClosed", "the run ended COMPLETED")
    for err in (rejected, failed, UnknownUpdate("run-1", "x", ["add"])):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and vars(back) == vars(err) and str(back) == str(err)
    assert http_status(rejected) == http_status(failed) == 400
    assert error_body(rejected) == {"error": "UpdateRejected", "detail": str(rejected)}
    assert str(rejected) == "update 'add' of execution 'run-1' was rejected: ValueError: negative"


@workflow
async def gathering(ctx: WorkflowContext, _data: Any) -> str:
    async def saga_in_a_branch() -> None:
        Saga(ctx)

    async def fan(_arg: Any) -> list[Any]:
        return await ctx.gather(ctx.execute_activity(double, 1), saga_in_a_branch())

    ctx.set_update_handler("fan", fan)
    saga = Saga(ctx)  # the workflow's own code may use one
    await saga.step(lambda: ctx.execute_activity(double, 2), lambda _r: ctx.execute_activity(refund, 2))
    return str(await ctx.wait_signal("stop"))


def test_a_saga_in_a_branch_an_update_handler_gathers_is_refused_too():
    run = Simulator(gathering, double, refund).start("gathering", None)
    run.decide()
    run.update("fan", None, update_id="u1")
    run.decide()
    run.complete("1", 4)
    run.complete("2", 2)
    run.decide()
    assert completed(run, "u1").error_type == "TypeError"
    run.signal("stop", "s")
    run.decide()
    assert run.status == "COMPLETED"


@workflow
async def busy(ctx: WorkflowContext, _data: Any) -> int:
    seen: list[Any] = []
    ctx.set_update_handler("note", lambda arg: seen.append(arg) or len(seen))
    await ctx.execute_activity(double, 1)
    return len(seen)


def test_an_update_runs_beside_an_activity_the_workflow_still_awaits():
    run = Simulator(busy, double).start("busy", None)
    run.decide()
    run.update("note", "x", update_id="u1")
    assert run.decide().commands == [CompleteUpdate("u1", 1)]  # the activity is still open
    run.complete("1", 2)
    run.decide()
    assert run.status == "COMPLETED" and run.events[-1].result == 1
