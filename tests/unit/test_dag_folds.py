"""The one dispatch fold over a DAG run's history (``_dag.folds``), and the shared level depths."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from harvest_celery._core import events as ev
from harvest_celery._dag.builder import depths
from harvest_celery._dag.folds import fold_dispatches, forward_dispatches
from harvest_celery._errors import DagBuildError
from harvest_celery._web.pages import COMPENSATED, compensation_states, node_levels

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def history(*events: ev.Event) -> list[ev.HistoryEvent]:
    return [ev.HistoryEvent(i, e, T0 + timedelta(seconds=i)) for i, e in enumerate(events)]


def envelope(node: str) -> dict[str, Any]:
    return {"dag_compensate": node, "input": {"conf": {}, "dag_task": node}, "output": "o"}


def test_a_completion_wins_over_an_earlier_failure():
    h = history(
        ev.WorkflowStarted("d"),
        ev.ActivityScheduled("1", "a", {}),
        ev.ActivityStarted("1", 1, "w"),
        ev.ActivityFailed("1", "RuntimeError", "boom", 1),
        ev.ActivityStarted("1", 2, "w"),
        ev.ActivityCompleted("1", "out", 2),
        ev.ActivityFailed("1", "RuntimeError", "late", 3),
    )
    (d,) = fold_dispatches(h).dispatches
    assert (d.outcome, d.error_type, d.error) == ("succeeded", None, None)
    assert isinstance(d.result, ev.ActivityCompleted) and d.result.output == "out"
    assert (d.started_at, d.finished_at, d.attempts) == (h[4].recorded_at, h[5].recorded_at, 3)


def test_without_a_completion_the_last_failure_decides():
    h = history(
        ev.WorkflowStarted("d"),
        ev.ActivityScheduled("1", "a", {}),
        ev.ActivityFailed("1", "RuntimeError", "first", 1),
        ev.ActivityFailed("1", "StartToCloseTimeout", "second", 2),
    )
    (d,) = fold_dispatches(h).dispatches
    assert (d.outcome, d.error_type, d.error, d.finished_at) == (
        "timed_out",
        "StartToCloseTimeout",
        "second",
        h[3].recorded_at,
    )
    assert not d.started  # no ActivityStarted: the body provably never ran


def test_a_dispatch_with_no_result_is_open():
    h = history(ev.WorkflowStarted("d"), ev.ActivityScheduled("1", "a", {}), ev.ActivityStarted("1", 1, "w"))
    (d,) = fold_dispatches(h).dispatches
    assert (d.outcome, d.result, d.finished_at, d.attempts, d.started) == ("open", None, None, 1, True)


def test_a_compensator_dispatch_is_never_read_as_a_forward_node():
    # v1 compensated "reserve" with "release"; a later version declares a forward node "release"
    h = history(
        ev.WorkflowStarted("d"),
        ev.ActivityScheduled("1", "reserve", {}),
        ev.ActivityCompleted("1", "r"),
        ev.ActivityScheduled("2", "release", envelope("reserve")),
        ev.ActivityCompleted("2", None),
    )
    fold = fold_dispatches(h)
    assert [d.activity_name for d in fold.forward()] == ["reserve"]
    assert "release" not in fold.forward_by_name()
    (comp,) = fold.compensations()
    assert (comp.activity_id, comp.compensates, comp.forward, comp.outcome) == (
        "2",
        "reserve",
        False,
        "succeeded",
    )
    assert [x.seq for x in forward_dispatches(h)] == [1]


def test_an_envelope_naming_nothing_dispatched_before_it_is_forward():
    h = history(
        ev.WorkflowStarted("d"),
        ev.ActivityScheduled("1", "release", envelope("reserve")),
        ev.ActivityScheduled("2", "reserve", {}),
    )
    fold = fold_dispatches(h)
    assert [d.activity_name for d in fold.forward()] == ["release", "reserve"]
    assert fold.compensations() == []


def test_a_compensation_of_a_carried_node_is_a_compensation_dispatch_everywhere():
    carried = {"a": {"input": {}, "output": "A"}}
    h = history(
        ev.WorkflowStarted("d", {}, carried, "src"),
        ev.ActivityScheduled("1", "b", {}),
        ev.ActivityFailed("1", "RuntimeError", "boom"),
        ev.MarkerRecorded("saga_compensated:1"),
        ev.ActivityScheduled("2", "undo", envelope("a")),
        ev.ActivityCompleted("2", None),
    )
    fold = fold_dispatches(h)
    assert fold.carried == ("a",)
    assert [d.compensates for d in fold.compensations()] == ["a"]
    assert compensation_states(h) == {"a": COMPENSATED}  # the page badges the carried node too


def test_levels_are_one_computation_for_the_builder_and_the_page():
    ups = {"a": [], "b": ["a"], "c": ["b", "a"], "z": ["ghost"]}
    assert depths(ups, lambda name: 0) == {"a": 0, "b": 1, "c": 2, "z": 0}
    nodes = [{"node_name": n, "depends_on": u} for n, u in ups.items()]
    assert node_levels(nodes) == {"a": 0, "b": 1, "c": 2, "z": 0}
    cyclic = {"a": ["b"], "b": ["a"]}
    assert node_levels([{"node_name": n, "depends_on": u} for n, u in cyclic.items()]) == {"b": 1, "a": 2}

    def refuse(name: str) -> int:
        raise DagBuildError(f"cycle through {name}")

    with pytest.raises(DagBuildError, match="cycle through a"):
        depths(cyclic, refuse)
