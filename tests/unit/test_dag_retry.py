"""The retry guard and plan, on recorded histories (no services)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from harvest_celery import DagBuilder, activity, dag
from harvest_celery._core.events import (
    ActivityCompleted,
    ActivityFailed,
    ActivityScheduled,
    ActivityStarted,
    HistoryEvent,
    MarkerRecorded,
    SignalReceived,
    WorkflowFailed,
    WorkflowStarted,
)
from harvest_celery._dag.retry import compensation_executed, plan_retry
from harvest_celery._errors import UnknownNode

T = datetime(2026, 1, 1, tzinfo=timezone.utc)


def history(*events):
    return [HistoryEvent(i, e, T) for i, e in enumerate(events)]


def env(node, output="o"):
    return {"dag_compensate": node, "input": {"conf": {}, "dag_task": node}, "output": output}


FORWARD = [
    WorkflowStarted("d", {}),
    ActivityScheduled("1", "a", {"conf": {}, "dag_task": "a"}),
    ActivityStarted("1", 1, "w"),
    ActivityCompleted("1", "o"),
    ActivityScheduled("2", "b", {"conf": {}, "dag_task": "b"}),
    ActivityStarted("2", 1, "w"),
    ActivityFailed("2", "RuntimeError", "boom"),
]


def test_a_run_that_never_unwound_is_retryable():
    assert not compensation_executed(history(*FORWARD, WorkflowFailed("DagTaskFailed", "x")))


def test_signal_one_alone_marker_followed_by_a_started_dispatch():
    # the dispatch after the marker is not envelope-shaped (e.g. its envelope was erased)
    h = history(
        *FORWARD,
        MarkerRecorded("saga_compensated:1"),
        ActivityScheduled("3", "undo", {"_harvest_erased": True}, compensation=True),
        ActivityStarted("3", 1, "w"),
    )
    assert compensation_executed(h)


def test_signal_two_alone_a_started_envelope_naming_a_dispatched_node_without_marker():
    h = history(
        *FORWARD,
        SignalReceived("stray"),
        ActivityScheduled("3", "undo", env("a")),
        ActivityStarted("3", 1, "w"),
    )
    assert compensation_executed(h)


def test_a_bare_marker_with_no_dispatch_after_it_stays_retryable():
    assert not compensation_executed(
        history(*FORWARD, MarkerRecorded("saga_compensated:1"), MarkerRecorded("saga_compensation_failed:1"))
    )


def test_a_dispatched_but_never_started_compensator_is_not_a_rollback():
    h = history(*FORWARD, MarkerRecorded("saga_compensated:1"), ActivityScheduled("3", "undo", env("a")))
    assert not compensation_executed(h)


def test_an_envelope_shaped_forward_input_naming_nothing_dispatched_is_not_a_signal():
    h = history(*FORWARD, ActivityScheduled("3", "c", env("never_dispatched")), ActivityStarted("3", 1, "w"))
    assert not compensation_executed(h)


@activity
def a(_x):
    return "o"


@activity
def b(_x):
    return "o"


@activity
def c(_x):
    return "o"


@activity
def side(_x):
    return "s"


@dag
def chain(g: DagBuilder) -> None:
    na = g.activity(a)
    g.activity(side)
    nb = g.activity(b).input_from(na)
    g.activity(c).input_from(nb)


def chain_history(*extra):
    return history(
        WorkflowStarted("chain", {"k": 1}),
        ActivityScheduled("1", "a", {"conf": {"k": 1}, "dag_task": "a"}),
        ActivityScheduled("2", "side", {"conf": {"k": 1}, "dag_task": "side"}),
        ActivityStarted("1", 1, "w"),
        ActivityCompleted("1", "A"),
        ActivityStarted("2", 1, "w"),
        ActivityCompleted("2", "S"),
        ActivityScheduled("3", "b", "A"),
        ActivityStarted("3", 1, "w"),
        ActivityFailed("3", "RuntimeError", "b broke"),
        *extra,
    )


def test_plan_carries_every_succeeded_node_not_downstream_of_the_retry_node():
    plan = plan_retry(chain.__harvest_workflow__.extra, chain_history())
    assert plan.retry_from == "b"
    assert plan.carried == {
        "a": {"input": {"conf": {"k": 1}, "dag_task": "a"}, "output": "A"},
        "side": {"input": {"conf": {"k": 1}, "dag_task": "side"}, "output": "S"},
    }
    assert plan.rerun == ["b", "c"]


def test_plan_from_an_upstream_node_reruns_it_and_everything_downstream():
    plan = plan_retry(chain.__harvest_workflow__.extra, chain_history(), "a")
    assert sorted(plan.carried) == ["side"] and plan.rerun == ["a", "b", "c"]


def test_plan_rejects_an_unknown_node():
    with pytest.raises(UnknownNode, match="no node 'zzz'"):
        plan_retry(chain.__harvest_workflow__.extra, chain_history(), "zzz")


def test_a_forked_run_dispatches_only_what_was_not_carried_and_feeds_carried_outputs():
    from harvest_celery.testing import Simulator

    plan = plan_retry(chain.__harvest_workflow__.extra, chain_history())
    sim = Simulator(a, b, c, side, chain)
    run = sim.run_from_history("chain", [WorkflowStarted("chain", {"k": 1}, plan.carried, "src")])
    run.run_to_end()
    scheduled = run.scheduled()
    assert [(e.activity_name, e.input) for e in scheduled] == [("b", "A"), ("c", "o")]
    assert run.status == "COMPLETED"


def test_in_a_forked_run_a_compensation_of_a_carried_node_is_still_a_compensation():
    h = history(
        WorkflowStarted("chain", {"k": 1}, {"a": {"input": {}, "output": "A"}}, "src"),
        ActivityScheduled("1", "b", "A"),
        ActivityStarted("1", 1, "w"),
        ActivityFailed("1", "RuntimeError", "again"),
        SignalReceived("stray"),
        ActivityScheduled("2", "undo", env("a")),
        ActivityStarted("2", 1, "w"),
    )
    assert compensation_executed(h)


def test_the_run_graph_of_a_forked_run_shows_carried_nodes_succeeded():
    from harvest_celery._dag.graph import build_run_graph
    from harvest_celery._store.store import Execution

    h = history(
        WorkflowStarted(
            "chain",
            {"k": 1},
            {"a": {"input": {}, "output": "A"}, "side": {"input": {}, "output": "S"}},
            "src",
        ),
        ActivityScheduled("1", "b", "A"),
        ActivityStarted("1", 1, "w"),
        ActivityCompleted("1", "B"),
    )
    execution = Execution(
        "new", "chain", "RUNNING", None, None, None, T, T, None, None, None, None, None, 0, None, 4
    )
    graph = build_run_graph(chain.__harvest_workflow__.extra, execution, h)
    assert {n["node_name"]: n["status"] for n in graph["nodes"]} == {
        "a": "succeeded",
        "side": "succeeded",
        "b": "succeeded",
        "c": "pending",
    }
