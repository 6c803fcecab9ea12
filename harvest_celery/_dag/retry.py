"""Retry a failed DAG run from a node: the guard, the plan, the fork.

The guard reads only the run's own recorded history, never the registered definition, so it
survives every way the definition can drift. A run that executed its compensation unwind is
refused (its succeeded nodes' side effects were rolled back), detected by two signals:

1. a ``saga_compensat*`` marker followed by a *started* activity dispatch (positional, so it
   survives erasure; a bare marker whose compensator was rejected pre-dispatch stays retryable);
2. a *started* compensation dispatch — by ``folds.fold_dispatches``' rule, an input that is a
   compensation envelope naming a node dispatched earlier in the same run or carried into it
   (catches a marker-less unwind at a drained signal frontier).

"Started" means an ``ActivityStarted`` exists: its absence proves the body never ran.

The plan carries over what succeeded in the source run as the same fold reads it: an activity
node's latest forward dispatch completed; every cell of a mapped node finished (and, unless it is
``CollectAll``, completed); a gate's signal was delivered. Refusals are ``RetryRefused`` and
``UnknownNode`` from ``harvest_celery._errors``; nothing here touches the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.names import is_saga_marker
from harvest_celery._dag.folds import Dispatch, fold_dispatches
from harvest_celery._dag.model import CollectAll, DagDefinition, Node
from harvest_celery._errors import RetryRefused, UnknownNode

COMPENSATED = (
    "this run already executed its compensation unwind, so its succeeded nodes' side effects were "
    "rolled back; retrying would resume on rolled-back state — start a fresh DAG run instead"
)


def erased_refusal(execution_id: str) -> RetryRefused:
    return RetryRefused(
        execution_id,
        "erased",
        f"the payloads of run {execution_id} were erased: a fork would carry "
        "tombstones instead of its upstream outputs — start a fresh run instead",
    )


def compensation_executed(history: Sequence[ev.HistoryEvent]) -> bool:
    """Either signal holds (see the module docstring)."""
    dispatches = fold_dispatches(history)
    marker = next(
        (h.seq for h in history if isinstance(h.event, ev.MarkerRecorded) and is_saga_marker(h.event.name)),
        None,
    )
    if marker is not None and any(d.seq > marker and d.started for d in dispatches.dispatches):
        return True
    return any(d.started for d in dispatches.compensations())


@dataclass(frozen=True)
class RetryPlan:
    retry_from: str
    carried: dict[str, dict[str, Any]] = field(default_factory=dict)
    rerun: list[str] = field(default_factory=list)


def _succeeded(
    definition: DagDefinition, history: Sequence[ev.HistoryEvent], started: ev.WorkflowStarted
) -> dict[str, dict[str, Any]]:
    """Nodes that succeeded in the source run, with their recorded input and output."""
    carried_before = dict(started.carried or {})
    recorded = fold_dispatches(history).forward_by_name()
    signals = [h.event for h in history if isinstance(h.event, ev.SignalReceived)]
    out: dict[str, dict[str, Any]] = {}
    for node in definition.nodes:
        if node.name in carried_before:
            out[node.name] = carried_before[node.name]
        elif node.kind == "gate":
            payloads = [s.payload for s in signals if s.name == node.name]
            if payloads:
                out[node.name] = {"input": None, "output": payloads[0]}
        else:
            found = _node_succeeded(node, recorded.get(node.name, []))
            if found is not None:
                out[node.name] = found
    return out


def _node_succeeded(node: Node, dispatches: list[Dispatch]) -> dict[str, Any] | None:
    """``{input, output}`` of an activity or mapped node that succeeded, else ``None``."""
    if not dispatches:
        return None
    if node.kind == "activity":
        last = dispatches[-1]
        if isinstance(last.result, ev.ActivityCompleted):
            return {"input": last.input, "output": last.result.output}
        return None
    cells = [d.result for d in dispatches]
    if any(r is None for r in cells):
        return None  # a mapped node with cells still open
    output: list[Any]
    if node.policy is CollectAll:
        output = [
            {"status": "succeeded", "value": r.output}
            if isinstance(r, ev.ActivityCompleted)
            else {"status": "failed", "error": getattr(r, "message", "")}
            for r in cells
        ]
    elif all(isinstance(r, ev.ActivityCompleted) for r in cells):
        output = [getattr(r, "output", None) for r in cells]
    else:
        return None
    return {"input": [d.input for d in dispatches], "output": output}


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


def plan_retry(
    definition: DagDefinition, history: Sequence[ev.HistoryEvent], from_node: str | None = None
) -> RetryPlan:
    """Which node to re-run from, which succeeded nodes to carry over (everything succeeded
    that is neither that node nor downstream of it), and what re-runs."""
    started = history[0].event
    assert isinstance(started, ev.WorkflowStarted)
    succeeded = _succeeded(definition, history, started)
    if from_node is None:
        ordered = [n for level in definition.levels for n in level]
        runnable = [
            n for n in ordered if n.name not in succeeded and all(u in succeeded for u in n.upstreams)
        ]
        if not runnable:
            raise UnknownNode(definition.name, "(no failed node to retry from)")
        from_node = runnable[0].name
    elif from_node not in {n.name for n in definition.nodes}:
        raise UnknownNode(definition.name, from_node)
    redo = {from_node} | descendants(definition, from_node)
    carried = {name: value for name, value in succeeded.items() if name not in redo}
    rerun = [n.name for level in definition.levels for n in level if n.name not in carried]
    return RetryPlan(from_node, carried, rerun)
