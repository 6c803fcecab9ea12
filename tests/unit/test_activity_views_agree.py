"""The DAG view (``_dag.folds`` and the run graph) and the console's view (``run_view``) of the
one activity fold agree on every activity's outcome, over generated histories: several
activities, each scheduled and then started, completed, failed or timed out over several
attempts (retries), interleaved, with unrelated events between, attempt errors for retried
attempts, and the run sealed (cancel, terminate, outcome) or still live."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harvest_celery._core import events as ev
from harvest_celery._dag.builder import DagBuilder, build
from harvest_celery._dag.folds import fold_dispatches
from harvest_celery._dag.graph import build_run_graph
from harvest_celery._store.records import AttemptError
from harvest_celery._store.store import Execution
from harvest_celery._web.console.run_view import build_run_view

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
NAMES = ("a", "b", "c", "d")
ERROR_TYPES = ("RuntimeError", "StartToCloseTimeout", "ValueError")
SEALS: dict[str, ev.Event] = {
    "CANCELLED": ev.WorkflowCancelled("stop"),
    "TERMINATED": ev.WorkflowFailed("Terminated", "op"),
    "COMPLETED": ev.WorkflowCompleted("done"),
    "FAILED": ev.WorkflowFailed("DagTaskFailed", "x"),
}

# one step of an activity's life after its scheduling: ("start"|"complete"|"fail", a retry?, error)
step = st.tuples(
    st.sampled_from(["start", "start", "complete", "fail"]), st.booleans(), st.sampled_from(ERROR_TYPES)
)
life = st.lists(step, max_size=6)
noise = st.sampled_from(
    [
        ev.SignalReceived("s", 1),
        ev.MarkerRecorded("saga_compensated:1"),
        ev.TimerStarted("t1", 1.0, "2024-01-01T00:00:01+00:00"),
        ev.TimerFired("t1"),
        ev.WorkflowCancelRequested("please"),
    ]
)


def _events(name: str, aid: str, steps: list[tuple[str, bool, str]]) -> list[ev.Event]:
    out: list[ev.Event] = [ev.ActivityScheduled(aid, name, {"conf": {}, "dag_task": name})]
    attempt, started = 1, False
    for kind, retry, error_type in steps:
        if kind == "start":
            attempt += 1 if retry and started else 0  # a retry: the next attempt starts
            started = True
            out.append(ev.ActivityStarted(aid, attempt, "w1"))
        elif kind == "complete":
            out.append(ev.ActivityCompleted(aid, "out", attempt))
        else:
            out.append(ev.ActivityFailed(aid, error_type, f"{error_type} on {attempt}", attempt))
    return out


@st.composite
def runs(draw: Any) -> tuple[list[ev.HistoryEvent], str, list[AttemptError], list[str]]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    lanes = [_events(n, str(i + 1), draw(life)) for i, n in enumerate(names)]
    lanes.append(draw(st.lists(noise, max_size=3)))
    merged: list[ev.Event] = []
    while any(lanes):  # interleave, each lane keeping its own order
        lane = draw(st.sampled_from([lane for lane in lanes if lane]))
        merged.append(lane.pop(0))
    status = draw(st.sampled_from(["RUNNING", *SEALS]))
    if status != "RUNNING":
        merged.insert(draw(st.integers(0, len(merged))), SEALS[status])
    history = [
        ev.HistoryEvent(i, e, T0 + timedelta(seconds=i))
        for i, e in enumerate([ev.WorkflowStarted("agree"), *merged])
    ]
    errors = [
        AttemptError(
            e.activity_id,
            e.attempt,
            draw(st.sampled_from(ERROR_TYPES)),
            "retried",
            "tb",
            T0 + timedelta(seconds=100),
        )
        for e in merged
        if isinstance(e, ev.ActivityStarted) and draw(st.booleans())
    ]
    return history, status, errors, names


def _definition(names: list[str]) -> Any:
    def fn(g: DagBuilder) -> None:
        for name in names:
            g.activity(name)

    return build("agree", fn)


def _execution(status: str) -> Execution:
    return Execution(
        "run",
        "agree",
        status,
        None,
        None,
        None,
        T0,
        T0,
        None if status == "RUNNING" else T0,
        None,
        None,
        None,
        None,
        0,
        None,
        0,
    )


@settings(max_examples=300, deadline=None)
@given(runs())
def test_the_dag_view_and_the_console_agree_on_every_activity(run):
    history, status, errors, names = run
    live = status == "RUNNING"
    dispatches = {d.activity_id: d for d in fold_dispatches(history).dispatches}
    console = {a.activity_id: a for a in build_run_view(history, errors).activities}
    assert list(dispatches) == list(console)  # scheduling order, both
    assert sorted(dispatches) == [str(i + 1) for i in range(len(names))]
    for aid, d in dispatches.items():
        shown = console[aid]
        assert d.status == shown.status, (aid, history)
        assert (d.outcome == "open") == (shown.status in ("running", "pending", "cancelled"))
        assert d.attempts == max(shown.attempts, default=0)
        assert (shown.status in ("running", "pending")) == (live and d.outcome == "open")
    # the run-graph API (one node per activity) against the console: the graph draws a dispatched
    # node without a result as running from its dispatch on, so the console's pending is running
    graph = build_run_graph(_definition(names), _execution(status), history)
    ids = {name: str(i + 1) for i, name in enumerate(names)}
    for node in graph["nodes"]:
        aid = ids[node["node_name"]]
        expected = console[aid].status
        assert node["status"] == ("running" if expected == "pending" else expected), (node, history)
        assert node["attempts"] == dispatches[aid].attempts
