"""Queries against the pure engine (no services): ``ctx.set_query_handler`` and ``_core.queries``.

A query replays the history as a probe on a replay built for the call, discards what that replay
issues at the frontier, and calls the handler: it answers from the state the next decision starts
from, it can change nothing any decision sees (cold or warm), every ``ctx`` command in a handler
fails the query, and a divergence, an unknown name, a raising handler or a value that is not JSON
each get their own error."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from harvest_celery import (
    NotInWorkflow,
    PayloadNotSerializable,
    QueryFailed,
    UnknownQuery,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._core import events as ev
from harvest_celery._core.engine import Activation
from harvest_celery._core.queries import answer
from harvest_celery._errors import error_body, http_status
from harvest_celery.testing import Simulator


@activity
def step(x):
    return f"did {x}"


@activity
def other(x):
    return x


@workflow
async def parked(ctx: WorkflowContext, data: Any) -> dict:
    state: dict[str, Any] = {"stage": "started", "peeked": 0, "log": []}

    def peek(_arg: Any) -> int:
        state["peeked"] += 1  # a local changed by a query: no decision may see it
        state["log"].append("peeked")
        state["stage"] = "changed by a query"
        return int(state["peeked"])

    ctx.set_query_handler("stage", lambda _arg: {"stage": state["stage"], "peeked": state["peeked"]})
    ctx.set_query_handler("peek", peek)
    ctx.set_query_handler("echo", lambda arg: arg)
    first = await ctx.execute_activity(step, "a")
    state["stage"] = f"waiting ({first})"
    approval = await ctx.wait_signal("approve")
    state["stage"] = f"approved by {approval}"
    second = await ctx.execute_activity(step, f"b{state['peeked']}")
    return {"stage": state["stage"], "peeked": state["peeked"], "second": second, "log": state["log"]}


COMMANDS = {
    "activity": lambda ctx: ctx.execute_activity(step, "x"),
    "sleep": lambda ctx: ctx.sleep(5),
    "signal": lambda ctx: ctx.wait_signal("approve"),
    "patched": lambda ctx: ctx.patched("p1"),
    "child": lambda ctx: ctx.execute_child_workflow(parked, None),
    "continue": lambda ctx: ctx.continue_as_new(None),
    "register": lambda ctx: ctx.set_query_handler("more", lambda _a: 1),
    "inputs": lambda ctx: ctx.check_activity_inputs(step, [1]),
}
API = {
    "activity": "ctx.execute_activity",
    "sleep": "ctx.sleep",
    "signal": "ctx.wait_signal",
    "patched": "ctx.patched",
    "child": "ctx.start_child_workflow",
    "continue": "ctx.continue_as_new",
    "register": "ctx.set_query_handler",
    "inputs": "ctx.check_activity_inputs",
}


@workflow
async def commanding(ctx: WorkflowContext, _data: Any) -> str:
    for key, command in COMMANDS.items():
        ctx.set_query_handler(key, lambda _arg, command=command: command(ctx))

    def swallowed(_arg: Any) -> str:
        try:
            ctx.execute_activity(step, "x")
        except QueryFailed:
            pass  # caught: the query fails all the same
        return "fine"

    ctx.set_query_handler("swallowed", swallowed)
    ctx.set_query_handler(
        "reads", lambda _arg: [ctx.now().isoformat(), ctx.is_cancelled(), ctx.info.workflow_type]
    )
    await ctx.execute_activity(step, "a")
    return str(await ctx.wait_signal("approve"))


@workflow
async def odd_handlers(ctx: WorkflowContext, _data: Any) -> str:
    async def not_plain(_arg: Any) -> int:
        return 1

    ctx.set_query_handler("raises", lambda arg: {"k": 1}[arg])
    ctx.set_query_handler("not_json", lambda _arg: {1, 2})
    ctx.set_query_handler("awaitable", lambda _arg: not_plain(None))
    ctx.set_query_handler("cancel", lambda _arg: ctx.check_cancellation())
    ctx.set_query_handler("gone", lambda _arg: 1)
    ctx.set_query_handler("gone", None)  # None removes it
    return str(await ctx.wait_signal("approve"))


@workflow
async def late(ctx: WorkflowContext, _data: Any) -> str:
    await ctx.execute_activity(step, "a")
    ctx.set_query_handler("late", lambda _arg: "registered")
    ctx.set_query_handler("late", lambda _arg: "replaced")
    return str(await ctx.wait_signal("approve"))


@workflow
async def async_handler(ctx: WorkflowContext, _data: Any) -> str:
    async def handler(_arg: Any) -> int:
        return 1

    ctx.set_query_handler("a", handler)
    return "unreachable"


def sim(sticky: bool = False) -> Simulator:
    return Simulator(parked, commanding, odd_handlers, late, async_handler, step, other, sticky=sticky)


def waiting(s: Simulator, workflow_type: str = "parked", execution_id: str = "run-1"):
    """A run that took its step and waits on its signal."""
    run = s.start(workflow_type, None, execution_id=execution_id)
    run.decide()
    run.complete("1", "did a")
    run.decide()
    return run


# ── answers ───────────────────────────────────────────────────────────────────────────────────
def test_a_run_waiting_on_a_signal_answers_from_its_current_state():
    run = waiting(sim())
    assert run.query("stage") == {"stage": "waiting (did a)", "peeked": 0}
    assert run.query("echo", {"a": [1, (2, 3)]}) == {"a": [1, [2, 3]]}  # the JSON the handler sees


def test_a_run_answers_at_every_step_the_state_its_next_decision_starts_from():
    run = sim().start("parked", None)
    assert run.query("stage")["stage"] == "started"  # before its first decision: replayed to the await
    run.decide()
    assert run.query("stage")["stage"] == "started"
    run.complete("1", "did a")
    assert run.query("stage")["stage"] == "waiting (did a)"  # delivered, though not yet decided on


def test_a_query_writes_nothing_and_issues_nothing():
    run = waiting(sim())
    before = [h for h in run.history]
    for name in ("stage", "peek", "echo"):
        run.query(name)
    assert run.history == before
    assert run.decide().commands == []  # still waiting: nothing was consumed or emitted


@pytest.mark.parametrize("sticky", [False, True])
def test_a_handler_changing_a_local_changes_nothing_the_next_decision_sees(sticky):
    asked = waiting(sim(sticky), execution_id="asked")
    if sticky:
        assert asked.session is not None  # the warm replay a query must never touch
    warm = asked.session
    assert [asked.query("peek") for _ in range(3)] == [1, 1, 1]  # each call a fresh replay
    assert asked.query("stage") == {"stage": "waiting (did a)", "peeked": 0}
    assert asked.session is warm
    asked.signal("approve", "ops")
    decision = asked.decide()
    assert [c.input for c in decision.commands] == ["b0"]  # not b1, b2 or b3
    asked.complete("2", "did b0")
    asked.decide()

    quiet = waiting(sim(sticky), execution_id="asked")
    quiet.signal("approve", "ops")
    quiet.run_to_end()
    assert asked.status == quiet.status == "COMPLETED"
    assert [e.to_data() for e in asked.events] == [e.to_data() for e in quiet.events]
    assert asked.events[-1].result == {"stage": "approved by ops", "peeked": 0, "second": "did b0", "log": []}
    assert asked.replay().nd is None


def test_warm_and_cold_runs_asked_at_every_step_record_the_same_history():
    def drive(sticky: bool):
        run = sim(sticky).start("parked", None, execution_id="both")
        for action in ("decide", "complete1", "decide", "signal", "decide", "complete2", "decide"):
            run.query("peek")
            if action == "decide":
                run.decide()
            elif action == "signal":
                run.signal("approve", "ops")
            else:
                run.complete(action[-1], f"did {'a' if action[-1] == '1' else 'b0'}")
            run.query("peek")
        return run

    cold, warm = drive(False), drive(True)
    assert [e.to_data() for e in warm.events] == [e.to_data() for e in cold.events]
    assert cold.status == warm.status == "COMPLETED"
    assert cold.events[-1].result["peeked"] == 0


def test_a_closed_run_answers_from_its_final_state():
    run = waiting(sim())
    run.signal("approve", "ops")
    run.run_to_end()
    assert run.status == "COMPLETED"
    assert run.query("stage") == {"stage": "approved by ops", "peeked": 0}


def test_a_sealed_run_answers():
    run = waiting(sim())
    run.cancel("stop")
    assert run.status == "CANCELLED"
    assert run.query("stage") == {"stage": "waiting (did a)", "peeked": 0}


def test_a_failed_run_answers():
    s = sim()
    run = s.start("parked", None)
    run.decide()
    run.fail("1", "RuntimeError", "card declined")
    run.decide()
    assert run.status == "FAILED"
    assert run.query("stage")["stage"] == "started"


def test_a_handler_registered_later_in_the_code_answers_from_where_the_code_reaches_it():
    s = sim()
    run = s.start("late", None)
    run.decide()
    with pytest.raises(UnknownQuery) as unknown:
        run.query("late")
    assert unknown.value.known == []
    run.complete("1", "did a")
    assert run.query("late") == "replaced"  # a later registration replaces the handler


# ── refusals ──────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("key", sorted(COMMANDS))
def test_a_ctx_command_in_a_handler_fails_the_query_naming_it(key):
    run = waiting(sim(), "commanding")
    before = list(run.history)
    with pytest.raises(QueryFailed) as failed:
        run.query(key)
    err = failed.value
    assert (err.error_type, err.command, err.name, err.execution_id) == (
        "QueryCommand",
        API[key],
        key,
        "run-1",
    )
    assert API[key] in str(err)
    assert run.history == before
    assert run.decide().commands == []  # nothing was issued: the run still waits


def test_a_refusal_the_handler_catches_fails_the_query_all_the_same():
    run = waiting(sim(), "commanding")
    with pytest.raises(QueryFailed) as failed:
        run.query("swallowed")
    assert failed.value.command == "ctx.execute_activity"


def test_a_handler_may_read_the_context():
    run = waiting(sim(), "commanding")
    now, cancelled, workflow_type = run.query("reads")
    assert (cancelled, workflow_type) == (False, "commanding")
    assert now == run.history[-1].recorded_at.isoformat()  # the time of the last delivered event


def test_an_unknown_name_lists_the_registered_ones():
    run = waiting(sim())
    with pytest.raises(UnknownQuery) as unknown:
        run.query("nope")
    assert unknown.value.known == ["echo", "peek", "stage"]
    assert "'echo', 'peek', 'stage'" in str(unknown.value)
    removed = waiting(sim(), "odd_handlers")
    with pytest.raises(UnknownQuery) as gone:
        removed.query("gone")
    assert "gone" not in gone.value.known


def test_an_argument_that_is_not_json_is_refused_before_the_replay():
    run = waiting(sim())
    for bad in (float("nan"), {1, 2}, object(), {"k": float("inf")}):
        with pytest.raises(PayloadNotSerializable):
            run.query("echo", bad)


def test_a_raising_handler_fails_the_query_with_its_error():
    run = waiting(sim(), "odd_handlers")
    with pytest.raises(QueryFailed) as failed:
        run.query("raises", "missing")
    assert (failed.value.error_type, failed.value.error_message) == ("KeyError", "'missing'")
    assert failed.value.command == ""
    assert run.query("raises", "k") == 1


def test_a_handler_answer_that_is_not_json_or_is_awaitable_fails_the_query():
    run = waiting(sim(), "odd_handlers")
    with pytest.raises(QueryFailed) as failed:
        run.query("not_json")
    assert failed.value.error_type == "PayloadNotSerializable"
    with pytest.raises(QueryFailed) as awaited:
        run.query("awaitable")
    assert awaited.value.error_type == "TypeError"


def test_a_handler_raising_cancelled_on_a_cancelling_run_is_a_failed_query():
    run = waiting(sim(), "odd_handlers")
    run.request_cancellation("stop")
    with pytest.raises(QueryFailed) as failed:
        run.query("cancel")
    assert (failed.value.error_type, failed.value.error_message) == ("Cancelled", "stop")


def test_an_async_handler_is_refused_where_it_is_registered():
    run = sim().start("async_handler", None)
    run.decide()
    assert run.status == "FAILED"
    error = run.events[-1]
    assert isinstance(error, ev.WorkflowFailed) and error.error_type == "TypeError"
    assert "plain function" in error.message


def test_set_query_handler_outside_a_workflow_is_refused():
    captured: list[WorkflowContext] = []

    @workflow(name="captures")
    async def captures(ctx: WorkflowContext, _data: Any) -> None:
        captured.append(ctx)
        await ctx.wait_signal("never")

    s = Simulator(captures)
    s.start("captures", None).decide()
    with pytest.raises(NotInWorkflow):
        captured[0].set_query_handler("late", lambda _a: 1)


def test_a_diverging_probe_fails_the_query():
    s = sim()
    recorded = [
        ev.WorkflowStarted("parked", None),
        ev.ActivityScheduled("1", "other", "a", "default"),
        ev.ActivityStarted("1", 1, "w"),
        ev.ActivityCompleted("1", "a"),
    ]
    run = s.run_from_history("parked", recorded)
    with pytest.raises(QueryFailed) as failed:
        run.query("stage")
    assert failed.value.error_type == "NonDeterministic"
    assert "expected ActivityScheduled(step), got ActivityScheduled(other)" in str(failed.value)


def test_the_answer_is_a_probe_even_for_an_activation_that_is_not():
    s = sim()
    run = waiting(s)
    definition = s.registry.workflow("parked")
    live = Activation("run-1", "parked", list(run.history), s.config)  # probe=False
    assert answer(definition, live, s.registry, "stage", None)["stage"] == "waiting (did a)"


# ── the errors ────────────────────────────────────────────────────────────────────────────────
def test_the_query_errors_pickle_and_have_one_http_status():
    unknown = UnknownQuery("r", "nope", ["a", "b"])
    failed = QueryFailed("r", "q", "QueryCommand", "no", "ctx.sleep")
    for err in (unknown, failed):
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and copy.__dict__ == err.__dict__ and str(copy) == str(err)
    assert (http_status(unknown), http_status(failed)) == (404, 400)
    assert error_body(unknown) == {"error": "UnknownQuery", "detail": str(unknown)}
    assert str(UnknownQuery("r", "x", [])).endswith("(registered: none)")
