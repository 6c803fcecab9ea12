"""A canvas run's stored graph (``Harvest.start_canvas``) as a DAG, keyed by node id.

The graph ``canvas_compile`` wrote into ``WorkflowStarted.input`` once, at start::

    {"canvas": 1,
     "nodes": [{"id": "1.header.0", "task": "shop.reserve", "kind": "task" | "per_item",
                "call": {"args": [...], "kwargs": {...}} | {"items": [[...], ...]},
                "prepend": ref | None, "upstreams": [ids], "queue": str | None,
                "countdown": seconds | None, "eta": ISO 8601 | None,
                "compensator": {"task": name, "receives": "output" | "envelope"} | None,
                "retry": RetryPolicy data}, ...],
     "result": ref, "link": [callback, ...], "link_error": [callback, ...]}

A *ref* is a node id or a list of refs: the value it names is that node's output (or the list of
theirs), which is how a chain prepends the previous result and a chord body receives its header's
list. Every decision builds the ``DagDefinition`` from this graph alone (``definition``), never from
a live signature or a newer compiler; a schema version this build cannot read is refused
(``readable``). Each node's retry policy is recorded too: the canvas's, else its task's ``adopt_task``
policy, with ``CanvasNotSupported`` and ``PayloadNotSerializable`` never retried. Levels are the
declared DAGs' longest-path levels (``model.depths``), path order
within a level.

How each dispatch is called is recorded on it as its ``call_convention`` (never inferred on the
worker): ``args_kwargs`` for a task node, ``per_item`` for a chunk or starmap node, and for a
compensation ``envelope_output`` (the undo gets the node's result as its first argument) or
``envelope`` (the opt-in ``receives: "envelope"``: the whole ``{dag_compensate, input, output}``,
``dag_compensate`` being the node id).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeGuard

from harvest_celery._core.names import CallConvention
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._dag.model import DagDefinition, Node, depths
from harvest_celery._errors import CorruptHistory

CANVAS = "harvest.canvas"  # the reserved built-in workflow a canvas run is
CANVAS_VERSION = 1  # the stored graph's schema version
RECEIVES = ("output", "envelope")  # what a compensator receives
Ref = Any  # a node id (str) or a list of refs

CANVAS_FAILED = "canvas task {task!r} (node {node}) failed: {error}"


def readable(graph: Any) -> TypeGuard[Mapping[str, Any]]:
    """A stored graph this build can run (its schema version is ``CANVAS_VERSION``)."""
    return isinstance(graph, Mapping) and graph.get("canvas") == CANVAS_VERSION


def definition(graph: Mapping[str, Any]) -> DagDefinition:
    """The DAG a stored graph runs as: one node per canvas node, named by its id."""
    nodes = []
    for index, spec in enumerate(graph["nodes"]):
        compensator = spec.get("compensator") or {}
        nodes.append(
            Node(
                index,
                spec["id"],
                "activity",
                list(spec["upstreams"]),
                queue=spec.get("queue") or "",
                retry=RetryPolicy.from_data(spec["retry"]) if spec.get("retry") else None,
                compensator=compensator.get("task"),
                task=spec["task"],
                canvas=dict(spec),
            )
        )

    def cycle(name: str) -> int:
        raise CorruptHistory(f"the stored canvas graph has a cycle through node {name!r}")

    depth = depths({n.name: n.upstreams for n in nodes}, cycle)
    for node in nodes:
        node.level = depth[node.name]
    levels = tuple(tuple(n for n in nodes if n.level == level) for level in sorted({n.level for n in nodes}))
    return DagDefinition(CANVAS, tuple(nodes), levels, canvas=dict(graph))


def resolve(ref: Ref, outputs: Mapping[str, Any]) -> Any:
    """The value ``ref`` names: a node's output, or the list of its members' values."""
    if isinstance(ref, str):
        return outputs[ref]
    return [resolve(r, outputs) for r in ref]


def node_call(spec: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The node's recorded input: its call with the previous result prepended (a partial node
    in a chain or a chord body), as Celery would call it."""
    call = spec["call"]
    if spec.get("kind") == "per_item" or spec.get("prepend") is None:
        return dict(call)
    return {"args": [resolve(spec["prepend"], outputs), *call["args"]], "kwargs": call["kwargs"]}


def convention(spec: Mapping[str, Any]) -> str:
    per_item = spec.get("kind") == "per_item"
    return (CallConvention.PER_ITEM if per_item else CallConvention.ARGS_KWARGS).value


def compensation_convention(spec: Mapping[str, Any]) -> str:
    receives = (spec.get("compensator") or {}).get("receives", "output")
    return (CallConvention.ENVELOPE if receives == "envelope" else CallConvention.ENVELOPE_OUTPUT).value


def wait_seconds(spec: Mapping[str, Any], now: datetime) -> float:
    """How long the node's durable timer waits before its dispatch: its ``countdown``, or until
    its ``eta`` (recorded as an absolute time); 0: dispatched at once."""
    if spec.get("countdown") is not None:
        return float(spec["countdown"])
    if spec.get("eta") is not None:
        return max(0.0, (datetime.fromisoformat(spec["eta"]) - now).total_seconds())
    return 0.0


def callback_call(callback: Mapping[str, Any], first: Any) -> dict[str, Any]:
    """A ``link``'s or ``link_error``'s call: ``first`` prepended unless it is immutable."""
    call = callback["call"]
    if callback.get("immutable"):
        return dict(call)
    return {"args": [first, *call["args"]], "kwargs": call["kwargs"]}


def error_argument(node: Node, error_type: str | None, message: str | None) -> dict[str, Any]:
    """``link_error``'s first argument: the failing task, its node id and its error."""
    return {"task": node.task, "node": node.name, "error_type": error_type, "message": message}
