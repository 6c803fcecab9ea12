"""The run-graph readers over hand-built histories: no database, no workers."""

from __future__ import annotations

import json
import typing
from datetime import datetime, timedelta, timezone
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._dag.builder import DagBuilder, build
from harvest_celery._dag.folds import forward_dispatches, is_compensation_dispatch
from harvest_celery._dag.graph import (
    NODE_STATUSES,
    build_run_graph,
    first_line,
    latest_scheduled,
    node_outcome,
)
from harvest_celery._dag.model import CollectAll, FailFast
from harvest_celery._store.store import Execution

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
SECRET = "card-4242-secret"


class History:
    """Builds a history; each event one second after the previous one."""

    def __init__(self) -> None:
        self.events: list[ev.HistoryEvent] = []
        self.add(ev.WorkflowStarted("dag", {"secret": SECRET}))

    def add(self, event: ev.Event) -> History:
        self.events.append(ev.HistoryEvent(len(self.events), event, T0 + timedelta(seconds=len(self.events))))
        return self

    def at(self, seq: int) -> datetime:
        return self.events[seq].recorded_at

    def run(
        self,
        aid: str,
        name: str,
        input: Any = None,
        *,
        fail: str | None = None,
        error_type: str = "RuntimeError",
        attempts: int = 1,
        open: bool = False,
    ) -> History:
        self.add(ev.ActivityScheduled(aid, name, input if input is not None else {"secret": SECRET}))
        for attempt in range(1, attempts + 1):
            self.add(ev.ActivityStarted(aid, attempt, "w1"))
        if open:
            return self
        if fail is None:
            return self.add(ev.ActivityCompleted(aid, {"secret": SECRET}, attempts))
        return self.add(ev.ActivityFailed(aid, error_type, fail, attempts))

    def compensate(self, aid: str, compensator: str, node: str) -> History:
        envelope = {"dag_compensate": node, "input": {"secret": SECRET}, "output": {"secret": SECRET}}
        return self.run(aid, compensator, envelope)


def execution(status: str = "FAILED", **kw: Any) -> Execution:
    fields: dict[str, Any] = dict(
        id="run-1",
        workflow_type="diamond",
        status=status,
        input=None,
        result=None,
        error=None,
        created_at=T0,
        updated_at=T0,
        closed_at=None if status == "RUNNING" else T0 + timedelta(minutes=1),
        cancelled_at=None,
        cancel_reason=None,
        nd_blocked_at=None,
        nd_block_reason=None,
        nd_block_count=0,
        nd_details=None,
        history_length=0,
    )
    fields.update(kw)
    return Execution(**fields)


def diamond_def() -> Any:
    def fn(g: DagBuilder) -> None:
        a = g.activity("dia_a").compensate_named("undo_node")
        b = g.activity("dia_b").upstream(a).compensate_named("undo_node")
        c = g.activity("dia_c").upstream(a).compensate_named("undo_node")
        g.activity("dia_d").upstream(b, c).compensate_named("undo_node")

    return build("diamond", fn)


def compensated_diamond() -> History:
    h = History().run("1", "dia_a").run("2", "dia_b").run("3", "dia_c")
    h.run("4", "dia_d", fail="dia_d failed\nTraceback (most recent call last): ...")
    h.add(ev.MarkerRecorded("saga_compensated:1"))
    h.compensate("5", "undo_node", "dia_c").compensate("6", "undo_node", "dia_b")
    h.compensate("7", "undo_node", "dia_a")
    return h.add(ev.WorkflowFailed("DagTaskFailed", "one or more DAG tasks failed"))


def by_name(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node_name"]: n for n in graph["nodes"]}


# ── compensation dispatches ──────────────────────────────────────────────────────────────────
def test_a_compensated_diamond_shows_the_four_forward_nodes_only():
    graph = build_run_graph(diamond_def(), execution(), compensated_diamond().events)
    assert [n["node_name"] for n in graph["nodes"]] == ["dia_a", "dia_b", "dia_c", "dia_d"]
    assert [n["status"] for n in graph["nodes"]] == ["succeeded", "succeeded", "succeeded", "failed"]
    assert [n["depends_on"] for n in graph["nodes"]] == [[], ["dia_a"], ["dia_a"], ["dia_b", "dia_c"]]
    assert graph["nodes"][3]["error_type"] == "RuntimeError"
    assert graph["nodes"][3]["error"] == "dia_d failed"
    assert {k: graph[k] for k in ("run_id", "dag_name", "state")} == {
        "run_id": "run-1",
        "dag_name": "diamond",
        "state": "FAILED",
    }


def test_the_graph_never_carries_a_payload():
    graph = build_run_graph(diamond_def(), execution(), compensated_diamond().events)
    assert SECRET not in json.dumps(graph, default=str)
    assert set(graph) == {"run_id", "dag_name", "state", "started_at", "finished_at", "nodes"}
    assert all(
        set(n)
        == {
            "node_name",
            "status",
            "depends_on",
            "started_at",
            "finished_at",
            "attempts",
            "error_type",
            "error",
        }
        for n in graph["nodes"]
    )


def test_compensation_dispatches_are_recognised_by_history_alone():
    h = compensated_diamond()
    forward = [x.event.activity_name for x in forward_dispatches(h.events)]  # type: ignore[attr-defined]
    assert forward == ["dia_a", "dia_b", "dia_c", "dia_d"]
    comp = next(
        x.event
        for x in h.events
        if isinstance(x.event, ev.ActivityScheduled) and x.event.activity_name == "undo_node"
    )
    assert is_compensation_dispatch(comp, {"dia_a", "dia_b", "dia_c"})
    assert not is_compensation_dispatch(comp, {"dia_a", "dia_b"})  # names dia_c: not dispatched


def test_cross_version_a_forward_node_named_like_an_old_compensator_reads_as_never_run():
    # v1: reserve (compensated by release) → charge. v2 declares a forward node "release".
    h = History().run("1", "reserve").run("2", "charge", fail="declined")
    h.compensate("3", "release", "reserve").add(ev.WorkflowFailed("DagTaskFailed", "x"))

    def v2(g: DagBuilder) -> None:
        reserve = g.activity("reserve")
        g.activity("release").upstream(reserve)

    assert node_outcome(h.events, "release") == "not_attempted"
    assert latest_scheduled(h.events, "release") is None
    graph = build_run_graph(build("v2", v2), execution(), h.events)
    release = by_name(graph)["release"]
    assert release["status"] == "skipped"
    assert (release["started_at"], release["finished_at"], release["attempts"]) == (None, None, 0)


def test_a_forward_input_with_the_envelope_keys_naming_nothing_dispatched_is_not_excluded():
    envelope_like = {"dag_compensate": "ghost", "input": 1, "output": 2}
    h = History().run("1", "release", envelope_like)
    assert node_outcome(h.events, "release") == "succeeded"
    latest = latest_scheduled(h.events, "release")
    assert latest is not None and latest.activity_id == "1"


def test_an_envelope_naming_a_node_dispatched_only_later_is_a_forward_dispatch():
    h = History().run("1", "release", {"dag_compensate": "reserve", "input": 1, "output": 2})
    h.run("2", "reserve")
    assert node_outcome(h.events, "release") == "succeeded"


def test_status_and_timings_describe_the_same_attempt():
    # v1 compensator "release" ran after the forward "release" of a later version failed: both
    # readers stay on the forward dispatch.
    h = History().run("1", "reserve").run("2", "release", {"x": 1}, fail="boom")
    h.compensate("3", "release", "reserve")
    assert node_outcome(h.events, "release") == "failed"
    latest = latest_scheduled(h.events, "release")
    assert latest is not None and latest.activity_id == "2" and latest.error == "boom"


# ── statuses, timings, attempts, errors ──────────────────────────────────────────────────────
def chain() -> Any:
    def fn(g: DagBuilder) -> None:
        a = g.activity("a")
        g.activity("b").upstream(a)

    return build("chain", fn)


def test_error_is_the_first_line_cut_at_200_characters():
    assert first_line("x" * 300) == "x" * 200
    assert first_line("short\nsecond line") == "short"
    assert first_line("") is None and first_line(None) is None
    h = History().run("1", "a", fail="y" * 250 + "\nmore")
    node = by_name(build_run_graph(chain(), execution(), h.events))["a"]
    assert node["error"] == "y" * 200


def test_a_start_to_close_timeout_is_timed_out():
    h = History().run("1", "a", fail="start_to_close exceeded", error_type="StartToCloseTimeout")
    node = by_name(build_run_graph(chain(), execution(), h.events))["a"]
    assert (node["status"], node["error_type"]) == ("timed_out", "StartToCloseTimeout")


def test_attempts_count_every_claim_and_timings_come_from_the_latest_attempt():
    h = History().run("1", "a", attempts=3)
    node = by_name(build_run_graph(chain(), execution("RUNNING"), h.events))["a"]
    assert node["attempts"] == 3
    assert node["started_at"] == h.at(4)  # the third ActivityStarted
    assert node["finished_at"] == h.at(5)
    assert node["error"] is None and node["error_type"] is None


def test_open_nodes_are_running_on_a_live_run_and_cancelled_on_a_sealed_one():
    h = History().run("1", "a", open=True)
    live = by_name(build_run_graph(chain(), execution("RUNNING"), h.events))
    assert (live["a"]["status"], live["b"]["status"]) == ("running", "pending")
    assert live["a"]["finished_at"] is None
    h.add(ev.WorkflowCancelled("operator"))
    sealed = by_name(build_run_graph(chain(), execution("CANCELLED"), h.events))
    assert (sealed["a"]["status"], sealed["b"]["status"]) == ("cancelled", "skipped")


def test_a_scheduled_but_unclaimed_node_starts_at_its_schedule_time():
    h = History().add(ev.ActivityScheduled("1", "a", None))
    node = by_name(build_run_graph(chain(), execution("RUNNING"), h.events))["a"]
    assert (node["status"], node["started_at"], node["attempts"]) == ("running", h.at(1), 0)


def mapped(policy: Any) -> Any:
    def fn(g: DagBuilder) -> None:
        items = g.activity("items")
        g.map_activity("cell", policy).over(items)

    return build("mapped", fn)


def cells_history() -> History:
    h = History().run("1", "items")
    for aid in ("2", "3", "4"):
        h.add(ev.ActivityScheduled(aid, "cell", {"n": aid}))
    h.add(ev.ActivityStarted("2", 1, "w")).add(ev.ActivityCompleted("2", 1))
    h.add(ev.ActivityStarted("3", 1, "w")).add(ev.ActivityStarted("3", 2, "w"))
    h.add(ev.ActivityFailed("3", "ValueError", "negative -2", 2))
    h.add(ev.ActivityStarted("4", 1, "w")).add(ev.ActivityCompleted("4", 3))
    return h


def test_a_failfast_mapped_node_with_a_failed_cell_is_failed():
    h = cells_history()
    node = by_name(build_run_graph(mapped(FailFast), execution(), h.events))["cell"]
    assert (node["status"], node["attempts"], node["error"]) == ("failed", 2, "negative -2")
    assert node["started_at"] == h.at(7) and node["finished_at"] == h.at(13)


def test_a_collect_all_mapped_node_with_a_failed_cell_is_succeeded():
    node = by_name(build_run_graph(mapped(CollectAll), execution(), cells_history().events))["cell"]
    assert (node["status"], node["attempts"], node["error"]) == ("succeeded", 2, None)


def test_a_mapped_node_with_an_open_cell_is_running():
    h = History().run("1", "items").add(ev.ActivityScheduled("2", "cell", 1))
    h.add(ev.ActivityScheduled("3", "cell", 2)).add(ev.ActivityCompleted("2", 10))
    node = by_name(build_run_graph(mapped(CollectAll), execution("RUNNING"), h.events))["cell"]
    assert (node["status"], node["finished_at"]) == ("running", None)


def gated() -> Any:
    def fn(g: DagBuilder) -> None:
        a = g.activity("a")
        gate = g.signal_gate("approve").upstream(a)
        g.activity("b").upstream(gate)

    return build("gated", fn)


def test_a_signal_gate_succeeds_once_its_signal_is_delivered():
    h = History().run("1", "a")
    waiting = by_name(build_run_graph(gated(), execution("RUNNING"), h.events))
    assert (waiting["approve"]["status"], waiting["approve"]["depends_on"]) == ("pending", ["a"])
    h.add(ev.SignalReceived("approve", {"secret": SECRET}))
    done = by_name(build_run_graph(gated(), execution("RUNNING"), h.events))
    assert done["approve"]["status"] == "succeeded"
    assert done["approve"]["finished_at"] == h.at(4)
    assert SECRET not in json.dumps(done, default=str)


def test_run_fields_come_from_the_execution():
    x = execution("COMPLETED")
    graph = build_run_graph(chain(), x, History().run("1", "a").run("2", "b").events)
    assert (graph["started_at"], graph["finished_at"]) == (x.created_at, x.closed_at)
    assert [n["status"] for n in graph["nodes"]] == ["succeeded", "succeeded"]


def test_the_api_models_name_the_same_statuses():
    from harvest_celery._core.lifecycle import TERMINAL_STATUSES
    from harvest_celery._web import models as _api

    assert typing.get_args(_api.NodeStatus) == NODE_STATUSES
    assert set(typing.get_args(_api.Status)) == {"RUNNING", *TERMINAL_STATUSES}
