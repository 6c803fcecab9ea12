"""DAGs with declarative node compensation, against the pure engine (no services).

Build-time guards fire at ``@dag`` decoration; the level structure is a pure function of the
declaration; and one test per history-shape / pure-semantics name of the "## DAG compensation"
list in spec-test-names.md (``test_`` + the name). Diamond a → {b, c} → d is the running example.
Compensator dispatches are ``ActivityScheduled`` events with ``compensation=True`` whose input is
the envelope ``{"dag_compensate", "input", "output"}``.
"""

from __future__ import annotations

import re

import pytest

from harvest_celery import (
    CollectAll,
    CompensatorNameCollidesWithNode,
    DagBuildError,
    RetryPolicy,
    UnregisteredActivity,
    activity,
    dag,
)
from harvest_celery._core import events as ev
from harvest_celery._core.commands import RecordMarker, ScheduleActivity
from harvest_celery._core.engine import EngineConfig, Replay
from harvest_celery._core.registry import Registry, register_into
from harvest_celery._dag.builder import preflight
from harvest_celery._dag.model import DAG_FAILED, ENVELOPE_KEYS, NOT_AN_ARRAY
from harvest_celery.testing import Simulator

COMPENSATED, FAILED_METRIC = "saga_compensated", "saga_compensation_failed"


# ── activities ────────────────────────────────────────────────────────────────────────────────
def _act(name, output, queue="default"):
    return activity(name=name, queue=queue)(lambda _x: output)


a, b, c, d = _act("a", "A"), _act("b", "B"), _act("c", "C"), _act("d", "D")
e_all, e_ali = _act("e_all", "ALL"), _act("e_ali", "ALI")
big = _act("big", "x" * 500)
split = _act("split", [1, 2, 3])
empty = _act("empty", [])
notlist = _act("notlist", "not a list")
cell = activity(name="cell")(lambda x: x * 10)
undo = _act("undo", None)
undo_q = _act("undo_q", None, queue="undo_home")
ACTIVITIES = (a, b, c, d, e_all, e_ali, big, split, empty, notlist, cell, undo, undo_q)


# ── DAGs ──────────────────────────────────────────────────────────────────────────────────────
@dag
def diamond(g):
    na = g.activity(a).compensate(undo)
    nb = g.activity(b).upstream(na).compensate(undo)
    nc = g.activity(c).upstream(na).compensate(undo)
    g.activity(d).upstream(nb, nc).compensate(undo)


@dag
def chain(g):
    na = g.activity(a).compensate(undo)
    nb = g.activity(b).upstream(na).compensate(undo)
    g.activity(c).upstream(nb).compensate(undo)


@dag
def bare(g):
    g.activity(b).upstream(g.activity(a))


@dag
def bound(g):
    src = g.activity(a).compensate(undo)
    sb = g.activity(b).upstream(src).compensate(undo)
    f = g.activity(c).input_from(src).compensate(undo)
    al = g.activity(e_all).input_from_all(src, sb).compensate(undo)
    ali = g.activity(e_ali).input_from_aliased(first=src, second=sb).compensate(undo)
    m = g.map_activity(cell).over(g.activity(split).compensate(undo)).compensate(undo)
    g.activity(d).upstream(f, al, ali, m)


@dag
def reaches(g):
    na = g.activity(a).compensate(undo)
    g.activity(b).upstream(na)  # succeeds, declares no compensator
    nc = g.activity(c).upstream(na).compensate(undo)  # fails
    nx = g.activity(e_all).upstream(nc).compensate(undo)  # skipped
    g.activity(e_ali).upstream(nx).compensate(undo)  # never reached


@dag
def fan_empty(g):
    m = g.map_activity(cell).over(g.activity(empty).compensate(undo)).compensate(undo)
    g.activity(d).upstream(m)


@dag
def fan_notlist(g):
    g.map_activity(cell).over(g.activity(notlist).compensate(undo)).compensate(undo)


@dag
def fan_collect(g):
    m = g.map_activity(cell, CollectAll).over(g.activity(split).compensate(undo)).compensate(undo)
    g.activity(d).upstream(m)


@dag
def fan_failfast(g):
    g.map_activity(cell).over(g.activity(split).compensate(undo)).compensate(undo)


@dag
def shuffled(g):
    nc = g.activity(c).compensate(undo)  # index 0, level 2
    nb = g.activity(b).compensate(undo)  # index 1, level 1
    na = g.activity(a).compensate(undo)  # index 2, level 0
    nc.upstream(nb)
    nb.upstream(na)
    g.activity(d).upstream(nc)


@dag
def overridden(g):
    na = g.activity(a).compensate(undo)
    nb = g.activity(b).upstream(na).retry(RetryPolicy(max_attempts=5)).start_to_close(12)
    nb.compensate(undo)
    g.activity(c).upstream(nb)


@dag
def oversized(g):
    na = g.activity(a).compensate(undo)
    g.activity(c).input_from(g.activity(big).upstream(na))


@dag
def queued(g):
    na = g.activity(a).queue("q1").compensate(undo)
    nb = g.activity(b).upstream(na).compensate(undo_q)
    nc = g.activity(c).upstream(nb).compensate(undo)
    g.activity(d).upstream(nc)


@dag
def gated(g):
    gate = g.signal_gate("approve").upstream(g.activity(a))
    g.activity(b).upstream(gate)


DAGS = (
    diamond,
    chain,
    bare,
    bound,
    reaches,
    fan_empty,
    fan_notlist,
    fan_collect,
    fan_failfast,
    shuffled,
    overridden,
    oversized,
    queued,
    gated,
)


# ── helpers ───────────────────────────────────────────────────────────────────────────────────
def boom(name):
    def fail(_):
        raise RuntimeError(f"{name} down")

    return fail


def new_sim(failing=(), config=None):
    sim = Simulator(*DAGS, *ACTIVITIES, config=config)
    for name in failing:
        sim.behaviour[name] = boom(name)
    return sim


def forward(run):
    return [e.activity_name for e in run.scheduled() if not e.compensation]


def comps(run):
    """The compensated nodes, in dispatch order."""
    return [e.input["dag_compensate"] for e in run.scheduled() if e.compensation]


def envelopes(run):
    return {e.input["dag_compensate"]: e.input for e in run.scheduled() if e.compensation}


def markers(run):
    return [e.name for e in run.events if isinstance(e, ev.MarkerRecorded)]


def outcome(run):
    last = run.events[-1]
    assert isinstance(last, (ev.WorkflowCompleted, ev.WorkflowFailed)), last
    return last


def id_of(run, name, compensating=None):
    return next(
        e.activity_id
        for e in run.scheduled()
        if e.activity_name == name and (compensating is None or e.input.get("dag_compensate") == compensating)
    )


def levels(fn):
    return [[n.name for n in level] for level in fn.__harvest_workflow__.extra.levels]


def diamond_to_unwind(run):
    """Drive ``diamond`` by hand until d has failed and the unwind's first decision is made."""
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()
    run.complete(id_of(run, "b"), "B")
    run.complete(id_of(run, "c"), "C")
    run.decide()
    run.fail(id_of(run, "d"))
    return run.decide()


def unwind_failed(run):
    return outcome(run).error_type == "SagaCompensationFailed"


# ── build-time guards ─────────────────────────────────────────────────────────────────────────
def test_an_empty_compensator_name_is_rejected_at_decoration():
    with pytest.raises(DagBuildError, match="empty compensator name"):

        @dag
        def g(dg):
            dg.activity(a).compensate_named("  ")


def test_a_compensator_named_like_a_forward_node_is_rejected():
    with pytest.raises(CompensatorNameCollidesWithNode, match="'b'") as info:

        @dag
        def g(dg):
            dg.activity(b).upstream(dg.activity(a).compensate(b))

    assert (info.value.task, info.value.compensator) == ("a", "b")


def test_a_signal_gate_cannot_have_a_compensator():
    with pytest.raises(DagBuildError, match="signal gate and cannot have a compensator"):

        @dag
        def g(dg):
            dg.signal_gate("go").compensate(undo)


def test_a_signal_gate_cannot_have_an_input_binding():
    with pytest.raises(DagBuildError, match="signal gate and cannot have an input binding"):

        @dag
        def g(dg):
            dg.signal_gate("go").input_from(dg.activity(a))


def test_a_mapped_node_needs_over():
    with pytest.raises(DagBuildError, match=r"needs \.over"):

        @dag
        def g(dg):
            dg.map_activity(cell)


def test_a_binding_and_a_mapped_upstream_are_mutually_exclusive():
    with pytest.raises(DagBuildError, match="mutually exclusive"):

        @dag
        def g(dg):
            up = dg.activity(split)
            dg.map_activity(cell).over(up).input_from(up)


@pytest.mark.parametrize("self_loop", [False, True])
def test_a_cycle_is_rejected(self_loop):
    with pytest.raises(DagBuildError, match="cycle"):

        @dag
        def g(dg):
            na = dg.activity(a)
            if self_loop:
                na.upstream(na)
            else:
                na.upstream(dg.activity(b).upstream(na))


def test_duplicate_node_names_are_rejected():
    with pytest.raises(DagBuildError, match="two nodes are named 'a'"):

        @dag
        def g(dg):
            dg.activity(a)
            dg.activity("a")


def test_a_dag_without_nodes_is_rejected():
    with pytest.raises(DagBuildError, match="no nodes"):

        @dag
        def g(dg):
            pass


def test_compensate_named_trims_and_the_last_compensate_call_wins():
    @dag
    def g(dg):
        dg.activity(a).compensate_named("  undo  ")
        dg.activity(b).compensate(undo).compensate_named("undo_q")
        dg.activity(c).compensate_named("undo_q").compensate(undo)

    definition = g.__harvest_workflow__.extra
    assert [definition.node(n).compensator for n in "abc"] == ["undo", "undo_q", "undo"]


def test_one_compensator_may_be_shared_by_several_nodes():
    nodes = diamond.__harvest_workflow__.extra.nodes
    assert {n.compensator for n in nodes} == {"undo"} and len(nodes) == 4
    run = new_sim(failing=["d"]).start("diamond", {}).run_to_end()
    assert comps(run) == ["c", "b", "a"]  # the envelope's dag_compensate tells them apart


def test_preflight_rejects_an_unregistered_compensator_with_the_exact_message():
    @dag
    def shipping(dg):
        dg.activity(a).compensate_named("release_stock")

    registry = Registry()
    register_into(registry, [a, shipping])
    with pytest.raises(UnregisteredActivity) as info:
        preflight(shipping.__harvest_workflow__.extra, registry)
    assert (
        str(info.value) == "dag 'shipping' references unregistered compensator 'release_stock' for task 'a'"
    )
    register_into(registry, [activity(name="release_stock")(lambda env: None)])
    preflight(shipping.__harvest_workflow__.extra, registry)  # now it boots


# ── level structure ───────────────────────────────────────────────────────────────────────────
def test_diamond_levels():
    assert levels(diamond) == [["a"], ["b", "c"], ["d"]]


def test_a_signal_gate_is_a_level_of_its_own():
    @dag
    def g(dg):
        na = dg.activity(a)
        gate = dg.signal_gate("go").upstream(na)
        dg.activity(b).upstream(na)
        dg.activity(c).upstream(gate)

    assert levels(g) == [["a"], ["b"], ["go"], ["c"]]
    assert levels(gated) == [["a"], ["approve"], ["b"]]


# ── success and signal gates ──────────────────────────────────────────────────────────────────
def test_a_successful_dag_returns_the_succeeded_nodes_outputs():
    run = new_sim().start("diamond", {"x": 1}).run_to_end()
    assert run.status == "COMPLETED"
    assert outcome(run) == ev.WorkflowCompleted({"a": "A", "b": "B", "c": "C", "d": "D"})
    assert forward(run) == ["a", "b", "c", "d"] and comps(run) == []


def test_a_signal_gate_waits_for_its_signal_and_outputs_its_payload():
    run = new_sim().start("gated", {})
    run.run_to_end()
    assert run.status == "RUNNING" and forward(run) == ["a"]  # blocked on the gate
    run.signal("approve", {"ok": True})
    run.run_to_end()
    assert forward(run) == ["a", "b"]
    assert outcome(run) == ev.WorkflowCompleted({"a": "A", "approve": {"ok": True}, "b": "B"})


# ── the "## DAG compensation" list ────────────────────────────────────────────────────────────
def test_terminal_failure_compensates_succeeded_nodes_in_reverse_topological_order():
    run = new_sim(failing=["d"]).start("diamond", {}).run_to_end()
    assert comps(run) == ["c", "b", "a"]
    assert all(e.activity_name == "undo" for e in run.scheduled() if e.compensation)
    assert run.status == "FAILED" and outcome(run).message == DAG_FAILED


def test_compensator_receives_recorded_input_and_output():
    run = new_sim().start("diamond", {"order": 7})
    run.decide()
    run.complete(id_of(run, "a"), {"rsv": "rsv-9001"})  # recorded output, not the function's
    run.decide()
    run.complete(id_of(run, "b"), {"charge_id": "ch_abc123"})
    run.complete(id_of(run, "c"), "C")
    run.decide()
    run.fail(id_of(run, "d"))
    run.run_to_end()
    env = envelopes(run)
    assert env["a"] == {
        "dag_compensate": "a",
        "input": {"conf": {"order": 7}, "dag_task": "a"},
        "output": {"rsv": "rsv-9001"},
    }
    assert env["b"] == {
        "dag_compensate": "b",
        "input": {"conf": {"order": 7}, "dag_task": "b"},
        "output": {"charge_id": "ch_abc123"},
    }


def test_compensator_of_a_bound_node_receives_the_bound_input():
    run = new_sim(failing=["d"]).start("bound", {"k": 1}).run_to_end()
    env = envelopes(run)
    assert env["a"]["input"] == {"conf": {"k": 1}, "dag_task": "a"}  # unbound
    assert env["c"]["input"] == "A"  # input_from: the raw upstream output
    assert env["e_all"]["input"] == {"a": "A", "b": "B"}  # input_from_all
    assert env["e_ali"]["input"] == {"first": "A", "second": "B"}  # input_from_aliased
    assert env["cell"]["input"] == [1, 2, 3] and env["cell"]["output"] == [10, 20, 30]  # mapped
    # forward levels a, split | b, c, cell | e_all, e_ali — popped LIFO
    assert comps(run) == ["e_ali", "e_all", "cell", "c", "b", "split", "a"]


def test_skipped_and_never_reached_and_uncompensated_nodes_invoke_nothing():
    run = new_sim(failing=["c"]).start("reaches", {}).run_to_end()
    assert forward(run) == ["a", "b", "c"]  # e_all skipped, e_ali never reached
    assert comps(run) == ["a"]  # b declares nothing; c failed


def test_the_failed_node_itself_is_never_compensated():
    run = new_sim(failing=["c"]).start("chain", {}).run_to_end()
    assert forward(run) == ["a", "b", "c"] and comps(run) == ["b", "a"]
    assert run.status == "FAILED"


def test_an_empty_mapped_fan_out_is_never_compensated():
    run = new_sim(failing=["d"]).start("fan_empty", {}).run_to_end()
    assert forward(run) == ["empty", "d"]  # the fan-out dispatched nothing
    assert comps(run) == ["empty"]


def test_a_non_array_mapped_input_still_unwinds_the_succeeded_upstream():
    run = new_sim().start("fan_notlist", {}).run_to_end()
    assert forward(run) == ["notlist"] and comps(run) == ["notlist"]
    assert run.status == "FAILED" and run.nd is None
    assert NOT_AN_ARRAY == "mapped upstream output is not a JSON array"
    assert NOT_AN_ARRAY in outcome(run).message


def test_mapped_node_compensation_is_node_granular_not_cell_granular():
    sim = new_sim(failing=["d"])
    sim.behaviour["cell"] = lambda x: (_ for _ in ()).throw(RuntimeError("cell 2 down")) if x == 2 else x * 10
    run = sim.start("fan_collect", {}).run_to_end()
    assert comps(run) == ["cell", "split"]  # one compensation for three cells
    env = envelopes(run)["cell"]
    assert env["input"] == [1, 2, 3]
    assert env["output"][0] == {"status": "succeeded", "value": 10}
    assert env["output"][2] == {"status": "succeeded", "value": 30}
    assert env["output"][1]["status"] == "failed" and "cell 2 down" in env["output"][1]["error"]
    assert set(env["output"][1]) == {"status", "error"}


def _failing_cell(sim, index):
    value = [1, 2, 3][index]

    def body(x):
        if x == value:
            raise RuntimeError(f"cell {x} down")
        return x * 10

    sim.behaviour["cell"] = body


def test_failfast_mapped_node_failing_mid_array_compensates_and_never_nd_blocks():
    sim = new_sim()
    _failing_cell(sim, 1)
    run = sim.start("fan_failfast", {}).run_to_end()
    assert forward(run) == ["split", "cell", "cell", "cell"]  # every cell is awaited
    assert comps(run) == ["split"]  # the FailFast node itself is not compensated
    assert run.status == "FAILED" and run.nd is None
    assert run.replay().nd is None


@pytest.mark.parametrize("index", [0, 1, 2])
def test_failfast_mapped_node_compensates_for_every_failing_cell_position(index):
    sim = new_sim()
    _failing_cell(sim, index)
    run = sim.start("fan_failfast", {}).run_to_end()
    assert comps(run) == ["split"] and run.nd is None
    assert run.status == "FAILED" and outcome(run).message == DAG_FAILED


def test_cancellation_does_not_auto_compensate():
    run = new_sim().start("chain", {})
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()
    run.start_activity(id_of(run, "b"))  # b is running when the cancel lands
    run.cancel("customer asked")
    assert run.status == "CANCELLED"
    run.fail(id_of(run, "b"), started=False)
    run.decide()
    assert comps(run) == [] and markers(run) == [] and run.metrics == []
    assert run.status == "CANCELLED" and run.nd is None
    assert outcome(run).message == DAG_FAILED


def test_cancel_landing_mid_unwind_terminates_and_never_nd_blocks():
    run = new_sim().start("diamond", {})
    diamond_to_unwind(run)
    assert comps(run) == ["c"]
    run.start_activity(id_of(run, "undo", "c"))  # comp_c is running when the cancel lands
    run.cancel("operator")
    assert run.status == "FAILED"
    assert run.types()[-1] == "WorkflowCancelled"  # the unwind waits on the running comp_c
    run.complete(id_of(run, "undo", "c"), None, started=False)
    run.decide()
    assert run.status == "FAILED" and run.nd is None
    assert comps(run) == ["c"]  # comp_b and comp_a are never dispatched
    types = run.types()
    assert types.count("WorkflowFailed") == 1 and types.index("WorkflowCancelled") < types.index(
        "WorkflowFailed"
    )
    # the running comp_c's completion is still recorded, then the unwind fails past the seal
    assert types[types.index("WorkflowCancelled") + 1] == "ActivityCompleted"
    assert run.replay().nd is None


def test_a_cancel_mid_dag_unwind_counts_as_a_hand_written_saga_does():
    """The unwind that began before the seal replays: comp_c (recorded, completed) matches, comp_b
    and comp_a diverge against the seal and are collected, so the failure marker is recorded
    past the seal and both counters fire once — the dangling state pages, as in the saga case."""
    run = new_sim().start("diamond", {})
    diamond_to_unwind(run)
    run.start_activity(id_of(run, "undo", "c"))
    run.cancel("operator")
    run.complete(id_of(run, "undo", "c"), None, started=False)
    run.decide()
    assert markers(run) == ["saga_compensated:1", "saga_compensation_failed:1"]
    assert run.metrics == [COMPENSATED, FAILED_METRIC]
    failed = outcome(run)
    assert failed.error_type == "SagaCompensationFailed"
    assert failed.message.startswith(f"saga compensation failed after original error: {DAG_FAILED};")
    assert failed.message.count("expected ActivityScheduled(undo), got WorkflowCancelled") == 2
    run.decide()  # replays observe both markers and count nothing twice
    assert run.metrics == [COMPENSATED, FAILED_METRIC]


def test_compensator_failure_surfaces_saga_compensation_failed():
    sim = new_sim(failing=["d"])
    sim.behaviour["undo"] = lambda env: boom("undo b")(env) if env["dag_compensate"] == "b" else None
    run = sim.start("diamond", {}).run_to_end()
    assert comps(run) == ["c", "b", "a"]  # continue-not-abort
    assert run.status == "FAILED" and unwind_failed(run)
    message = outcome(run).message
    assert message.startswith(
        f"saga compensation failed after original error: {DAG_FAILED}; compensation errors: ["
    )
    assert "undo b down" in message
    assert markers(run) == ["saga_compensated:1", "saga_compensation_failed:1"]


def test_two_failing_compensators_collect_both_errors_and_page_once():
    sim = new_sim(failing=["d"])
    sim.behaviour["undo"] = lambda env: (
        boom(f"undo {env['dag_compensate']}")(env) if env["dag_compensate"] in ("a", "c") else None
    )
    run = sim.start("diamond", {}).run_to_end()
    message = outcome(run).message
    assert unwind_failed(run) and comps(run) == ["c", "b", "a"]
    assert message.index("undo c down") < message.index("undo a down")  # unwind order
    assert run.metrics.count(FAILED_METRIC) == 1
    assert run.metrics == [COMPENSATED, FAILED_METRIC]


def test_a_successful_unwind_fires_the_compensated_counter_once_with_labels(monkeypatch):
    labels: list[str] = []
    original = Replay.saga_unwind_started

    def spy(self, workflow_label):
        labels.append(workflow_label)
        return original(self, workflow_label)

    monkeypatch.setattr(Replay, "saga_unwind_started", spy)
    run = new_sim(failing=["d"]).start("diamond", {}).run_to_end()
    assert run.metrics == [COMPENSATED]
    assert markers(run) == ["saga_compensated:1"]
    assert set(labels) == {"diamond"}  # the workflow label is the DAG's own name
    assert outcome(run).message == DAG_FAILED and outcome(run).error_type == "DagTaskFailed"


def test_failing_dag_without_compensators_emits_no_saga_commands_or_metrics():
    run = new_sim(failing=["b"]).start("bare", {})
    decisions = []
    for _ in range(10):
        decisions.append(run.decide())
        if run.status != "RUNNING":
            break
        for act in run.open_activities():
            run.execute(act)
    assert run.status == "FAILED" and outcome(run).message == DAG_FAILED
    assert not any(isinstance(cmd, RecordMarker) for dec in decisions for cmd in dec.commands)
    assert comps(run) == [] and markers(run) == [] and run.metrics == []


def test_compensation_is_recorded_as_ordinary_activity_events_only():
    run = new_sim(failing=["d"]).start("diamond", {}).run_to_end()
    ordinary = {
        "WorkflowStarted",
        "ActivityScheduled",
        "ActivityStarted",
        "ActivityCompleted",
        "ActivityFailed",
        "MarkerRecorded",
        "WorkflowFailed",
    }
    assert set(run.types()) <= ordinary
    comp_events = [e for e in run.scheduled() if e.compensation]
    assert len(comp_events) == 3
    assert all(type(e) is ev.ActivityScheduled and set(e.input) == ENVELOPE_KEYS for e in comp_events)
    assert ENVELOPE_KEYS == {"dag_compensate", "input", "output"}
    assert not any(name.startswith("Compensat") or name.startswith("Dag") for name in dir(ev))


def test_unwind_order_is_reverse_topological_not_reverse_declaration_index():
    assert levels(shuffled) == [["a"], ["b"], ["c"], ["d"]]
    run = new_sim(failing=["d"]).start("shuffled", {}).run_to_end()
    assert forward(run) == ["a", "b", "c", "d"]
    assert comps(run) == ["c", "b", "a"]  # reverse declaration index would be a, b, c


def test_a_node_recovered_by_retry_compensates_nothing():
    run = new_sim().start("overridden", {})
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()
    b_id = id_of(run, "b")
    run.start_activity(b_id, 1)
    run.start_activity(b_id, 2)  # attempt 1 raised; the retry succeeded
    run.append(ev.ActivityCompleted(b_id, "B", 2))
    run.run_to_end()
    assert run.status == "COMPLETED" and outcome(run).result == {"a": "A", "b": "B", "c": "C"}
    assert comps(run) == [] and markers(run) == [] and run.metrics == []


def test_a_node_that_exhausts_its_retries_unwinds_the_prefix_but_not_itself():
    run = new_sim().start("overridden", {})
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()
    b_id = id_of(run, "b")
    for attempt in range(1, 6):
        run.start_activity(b_id, attempt)
    run.append(ev.ActivityFailed(b_id, "RuntimeError", "b down", 5))
    run.run_to_end()
    assert comps(run) == ["a"]  # the prefix, never b itself
    assert forward(run) == ["a", "b"]  # c is skipped
    assert run.status == "FAILED" and outcome(run).message == DAG_FAILED


def test_a_compensator_inherits_no_retry_or_timeout_override_from_its_node():
    run = new_sim().start("overridden", {})
    commands = []
    commands += run.decide().commands
    run.complete(id_of(run, "a"), "A")
    commands += run.decide().commands
    run.complete(id_of(run, "b"), "B")
    commands += run.decide().commands
    run.fail(id_of(run, "c"))
    commands += run.decide().commands
    sched = [cmd for cmd in commands if isinstance(cmd, ScheduleActivity)]
    node_b = next(cmd for cmd in sched if cmd.activity_name == "b")
    assert node_b.retry == RetryPolicy(max_attempts=5) and node_b.start_to_close == 12
    comp_b = next(cmd for cmd in sched if cmd.compensation)
    assert comp_b.input["dag_compensate"] == "b"
    assert comp_b.retry is None and comp_b.start_to_close is None


def test_an_unwind_resumed_mid_flight_dispatches_only_the_remaining_compensations():
    run = new_sim().start("diamond", {})
    first = diamond_to_unwind(run)
    assert [type(cmd) for cmd in first.commands] == [RecordMarker, ScheduleActivity]
    run.complete(id_of(run, "undo", "c"), None)
    second = run.decide()
    assert [(type(cmd), cmd.input["dag_compensate"]) for cmd in second.commands] == [(ScheduleActivity, "b")]
    run.complete(id_of(run, "undo", "b"), None)
    run.run_to_end()
    assert comps(run) == ["c", "b", "a"]
    assert markers(run) == ["saga_compensated:1"] and run.metrics == [COMPENSATED]


def test_success_path_emits_no_new_commands_and_no_saga_metrics():
    run = new_sim().start("diamond", {}).run_to_end()
    assert run.status == "COMPLETED" and run.metrics == [] and markers(run) == []
    again = run.replay()
    assert again.commands == [] and again.metrics == [] and again.nd is None


def test_an_oversized_activity_input_still_unwinds_the_succeeded_upstream():
    run = new_sim(config=EngineConfig(max_activity_input_bytes=200)).start("oversized", {})
    run.run_to_end()
    assert forward(run) == ["a", "big"]  # c was rejected before dispatch
    assert comps(run) == ["a"]
    assert run.status == "FAILED" and run.nd is None
    message = outcome(run).message
    assert "'c'" in message and "over the cap of 200 bytes" in message
    assert re.search(r"is \d+ bytes", message) and DAG_FAILED not in message


def test_known_limitation_raising_the_cap_mid_unwind_diverges():
    sim = new_sim(config=EngineConfig(max_activity_input_bytes=200))
    run = sim.start("oversized", {})
    run.decide()
    run.complete(id_of(run, "a"), "A")
    run.decide()
    run.complete(id_of(run, "big"), "x" * 500)
    run.decide()  # c rejected → the unwind dispatches a's compensator
    assert comps(run) == ["a"] and run.status == "RUNNING"
    length = len(run.history)
    sim.config = EngineConfig(max_activity_input_bytes=10_000_000)
    run.decide()
    assert run.nd is not None and run.status == "RUNNING" and len(run.history) == length
    sim.config = EngineConfig(max_activity_input_bytes=200)
    run.decide()
    assert run.nd is None
    run.run_to_end()
    assert run.status == "FAILED" and comps(run) == ["a"]


def test_compensator_dispatches_on_the_nodes_queue():
    run = new_sim(failing=["d"]).start("queued", {}).run_to_end()
    by_node = {e.input["dag_compensate"]: e for e in run.scheduled() if e.compensation}
    assert by_node["a"].queue == "q1"  # the node's .queue(...)
    assert by_node["b"].activity_name == "undo_q" and by_node["b"].queue == "undo_home"
    assert by_node["c"].queue == "default"  # unqueued node, compensator's own default
    assert comps(run) == ["c", "b", "a"]


def test_an_envelope_over_the_cap_surfaces_saga_compensation_failed():
    run = new_sim(failing=["b"], config=EngineConfig(max_activity_input_bytes=200))
    run = run.start("chain", {"pad": "y" * 140}).run_to_end()
    assert forward(run) == ["a", "b"]  # the forward inputs fit under the cap
    assert comps(run) == []  # the envelope around a's input did not
    assert run.status == "FAILED" and unwind_failed(run)
    message = outcome(run).message
    assert message.startswith(f"saga compensation failed after original error: {DAG_FAILED}")
    assert "payload too large" in message and "over the cap of 200 bytes" in message
    assert run.metrics == [COMPENSATED, FAILED_METRIC]
