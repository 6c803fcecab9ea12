"""Retry a failed DAG run from a node: the guard, the plan, the fork.

The guard reads only the run's own recorded history, never the registered definition, so it
survives every way the definition can drift. A run that executed its compensation unwind is
refused (its succeeded nodes' side effects were rolled back), detected by two signals:

1. a ``saga_compensat*`` marker followed by a *started* activity dispatch (positional, so it
   survives erasure; a bare marker whose compensator was rejected pre-dispatch stays retryable);
2. a *started* dispatch whose input is a compensation envelope naming a node dispatched in the
   same run (catches a marker-less unwind at a drained signal frontier).

"Started" means an ``ActivityStarted`` exists: its absence proves the body never ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.names import is_saga_marker
from harvest_celery._dag.builder import CollectAll, DagDefinition
from harvest_celery._dag.graph import forward_dispatches
from harvest_celery._errors import RetryRefused, UnknownNode

COMPENSATED = (
    "this run already executed its compensation unwind, so its succeeded nodes' side effects were "
    "rolled back; retrying would resume on rolled-back state — start a fresh DAG run instead"
)



def erased_refusal(execution_id: str) -> RetryRefused:
    return RetryRefused(execution_id, "erased",
                        f"the payloads of run {execution_id} were erased: a fork would carry "
                        "tombstones instead of its upstream outputs — start a fresh run instead")


def compensation_executed(history: Sequence[ev.HistoryEvent]) -> bool:
    """Either signal holds (see the module docstring)."""
    events = [h.event for h in history]
    started = {e.activity_id for e in events if isinstance(e, ev.ActivityStarted)}
    for i, event in enumerate(events):
        if isinstance(event, ev.MarkerRecorded) and is_saga_marker(event.name):
            if any(isinstance(later, ev.ActivityScheduled) and later.activity_id in started
                   for later in events[i + 1:]):
                return True
    forward = {id(h) for h in forward_dispatches(history)}
    return any(isinstance(h.event, ev.ActivityScheduled) and id(h) not in forward
               and h.event.activity_id in started for h in history)


@dataclass(frozen=True)
class RetryPlan:
    retry_from: str
    carried: dict[str, dict[str, Any]] = field(default_factory=dict)
    rerun: list[str] = field(default_factory=list)


def _recorded(history: Sequence[ev.HistoryEvent]) -> dict[str, list[tuple[Any, ev.Event | None]]]:
    """Forward dispatches by node name: (scheduled input, final result event or None)."""
    results: dict[str, ev.Event] = {}
    for h in history:
        if isinstance(h.event, ev.ActivityCompleted) or (
                isinstance(h.event, ev.ActivityFailed) and h.event.activity_id not in results):
            results[h.event.activity_id] = h.event
    out: dict[str, list[tuple[Any, ev.Event | None]]] = {}
    for h in forward_dispatches(history):
        scheduled = h.event
        assert isinstance(scheduled, ev.ActivityScheduled)
        out.setdefault(scheduled.activity_name, []).append(
            (scheduled.input, results.get(scheduled.activity_id)))
    return out


def _succeeded(definition: DagDefinition, history: Sequence[ev.HistoryEvent],
               started: ev.WorkflowStarted) -> dict[str, dict[str, Any]]:
    """Nodes that succeeded in the source run, with their recorded input and output."""
    carried_before = dict(started.carried or {})
    recorded = _recorded(history)
    signals = [h.event for h in history if isinstance(h.event, ev.SignalReceived)]
    out: dict[str, dict[str, Any]] = {}
    for node in definition.nodes:
        if node.name in carried_before:
            out[node.name] = carried_before[node.name]
            continue
        if node.kind == "gate":
            payloads = [s.payload for s in signals if s.name == node.name]
            if payloads:
                out[node.name] = {"input": None, "output": payloads[0]}
            continue
        dispatches = recorded.get(node.name, [])
        if not dispatches:
            continue
        if node.kind == "activity":
            value, result = dispatches[-1]
            if isinstance(result, ev.ActivityCompleted):
                out[node.name] = {"input": value, "output": result.output}
            continue
        if not all(result is not None for _v, result in dispatches):
            continue  # a mapped node with cells still open
        cells = [r for _v, r in dispatches]
        output: list[Any]
        if node.policy is CollectAll:
            output = [{"status": "succeeded", "value": r.output} if isinstance(r, ev.ActivityCompleted)
                      else {"status": "failed", "error": getattr(r, "message", "")} for r in cells]
        elif all(isinstance(r, ev.ActivityCompleted) for r in cells):
            output = [getattr(r, "output", None) for r in cells]
        else:
            continue
        out[node.name] = {"input": [v for v, _r in dispatches], "output": output}
    return out


def descendants(definition: DagDefinition, name: str) -> set[str]:
    found: set[str] = set()
    frontier = [name]
    while frontier:
        current = frontier.pop()
        for node in definition.nodes:
            if current in node.upstreams and node.name not in found:
                found.add(node.name)
                frontier.append(node.name)
    return found


def plan_retry(definition: DagDefinition, history: Sequence[ev.HistoryEvent],
               from_node: str | None = None) -> RetryPlan:
    """Which node to re-run from, which succeeded nodes to carry over (everything succeeded
    that is neither that node nor downstream of it), and what re-runs."""
    started = history[0].event
    assert isinstance(started, ev.WorkflowStarted)
    succeeded = _succeeded(definition, history, started)
    if from_node is None:
        ordered = [n for level in definition.levels for n in level]
        runnable = [n for n in ordered if n.name not in succeeded
                    and all(u in succeeded for u in n.upstreams)]
        if not runnable:
            raise UnknownNode(definition.name, "(no failed node to retry from)")
        from_node = runnable[0].name
    elif from_node not in {n.name for n in definition.nodes}:
        raise UnknownNode(definition.name, from_node)
    redo = {from_node} | descendants(definition, from_node)
    carried = {name: value for name, value in succeeded.items() if name not in redo}
    rerun = [n.name for level in definition.levels for n in level if n.name not in carried]
    return RetryPlan(from_node, carried, rerun)
