"""The DAG run graph (``GET /dags/{name}/runs/{id}``): a pure projection of one run.

Topology comes from the registered ``DagDefinition``, which carries forward nodes only, so a
compensator never appears as a node (the spec's known limitation: to see whether a run unwound,
read its history or its ``saga_compensated:{seq}`` marker). Status, timings, attempts and the
truncated error come from the recorded history. No payload is ever surfaced: a node carries its
name, status, upstreams, timings, attempts and a first-line error cut at 200 characters.

**Compensation dispatches are excluded from name-keyed history reads.** A compensator dispatch is
an ordinary ``ActivityScheduled`` under the compensator's name. Within one definition version
``CompensatorNameCollidesWithNode`` keeps the names apart, but a later version may declare a forward
node named like an older version's compensator; reading the old dispatch as that node would show a
node that never ran as succeeded/failed with the compensation's timings. Both readers —
``node_outcome`` (status) and ``latest_scheduled`` (timings, attempts, error) — and the graph
itself read the forward dispatches of ``folds.fold_dispatches``, which sets aside a dispatch whose
input is a compensation envelope naming a node dispatched earlier in the same run. That
corroboration reads history only, never the definition, so it cannot drift across versions.

**The readers must decode before they filter.** The corroboration reads
``ActivityScheduled.input``, a payload-bearing field, so these readers take *decoded* history:
``Store.history`` inflates and decodes after releasing its connection, skipping the pass when no
field is opaque. The run graph is a read-only surface and reads with ``strict=False`` (a payload
that cannot be decoded is logged and left raw; the page still renders); the retry guard reads
strictly and fails closed.

The run row is read through ``RunRow`` (id, status, created_at, closed_at): any object with those
fields will do, so this package needs nothing from the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from harvest_celery._core import activities as acts
from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import TERMINAL_STATUSES
from harvest_celery._dag.folds import OPEN, Dispatch, fold_dispatches
from harvest_celery._dag.model import CollectAll, DagDefinition, Node

ERROR_MAX_CHARS = 200

NODE_STATUSES = acts.STATUSES  # the core fold's words, the API's NodeStatus


class RunRow(Protocol):
    """The fields of a run the graph reads (the store's ``Execution`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def closed_at(self) -> datetime | None: ...


# ── a node's forward dispatches, by name ──────────────────────────────────────────────────────
def latest_scheduled(history: Sequence[ev.HistoryEvent], node_name: str) -> Dispatch | None:
    """The node's latest forward dispatch (timings, attempts, error); compensation dispatches
    under the same name are skipped. ``None`` if the node was never dispatched."""
    found = fold_dispatches(history).forward_by_name().get(node_name)
    return found[-1] if found else None


def node_outcome(history: Sequence[ev.HistoryEvent], node_name: str) -> str:
    """The outcome of the node's latest forward dispatch: ``succeeded``, ``failed``,
    ``timed_out``, ``open`` (scheduled, no result yet) or ``not_attempted``. Skips compensation
    dispatches exactly as ``latest_scheduled`` does, so the two describe the same attempt."""
    latest = latest_scheduled(history, node_name)
    return "not_attempted" if latest is None else latest.outcome


# ── rendering ─────────────────────────────────────────────────────────────────────────────────
def first_line(message: str | None, limit: int = ERROR_MAX_CHARS) -> str | None:
    """The first line of ``message``, cut at ``limit`` characters (``None`` when empty)."""
    if not message:
        return None
    lines = message.splitlines()
    return (lines[0][:limit] or None) if lines else None


def _node(
    node: Node,
    status: str,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    attempts: int = 0,
    failure: Dispatch | None = None,
) -> dict[str, Any]:
    out = {
        "node_name": node.name,
        "status": status,
        "depends_on": list(node.upstreams),
        "started_at": started_at,
        "finished_at": finished_at,
        "attempts": attempts,
        "error_type": failure.error_type if failure is not None else None,
        "error": first_line(failure.error) if failure is not None else None,
    }
    if node.task is not None:
        out["task"] = node.task  # a canvas node: named by its node id, calling this task
    return out


def _open_status(live: bool) -> str:
    # scheduled with no result: in flight on a live run; on a sealed run it never will finish. A
    # node shows running from its dispatch on (the core fold's pending too: the graph has always
    # drawn a dispatched node as running, its start falling back to the dispatch's time)
    return acts.RUNNING if live else acts.CANCELLED


def _activity_node(node: Node, dispatches: list[Dispatch], live: bool) -> dict[str, Any]:
    d = dispatches[-1]
    status = _open_status(live) if d.outcome == OPEN else d.outcome
    failure = d if status in (acts.FAILED, acts.TIMED_OUT) else None
    return _node(node, status, d.started_at or d.scheduled_at, d.finished_at, d.attempts, failure)


def _mapped_node(node: Node, cells: list[Dispatch], live: bool) -> dict[str, Any]:
    """A mapped node from all its cells: open if any cell is; else failed (timed_out if the first
    failing cell timed out) when any cell failed — unless the node is ``CollectAll``, which always
    succeeds; attempts is the most any cell took."""
    failed = [c for c in cells if c.outcome in (acts.FAILED, acts.TIMED_OUT)]
    failure = None
    if any(c.outcome == OPEN for c in cells):
        status = _open_status(live)
    elif failed and node.policy is not CollectAll:
        failure = failed[0]
        status = failure.outcome
    else:
        status = "succeeded"
    started = min(c.started_at or c.scheduled_at for c in cells)
    finished = None
    if all(c.finished_at is not None for c in cells):
        finished = max(c.finished_at for c in cells if c.finished_at is not None)
    return _node(node, status, started, finished, max(c.attempts for c in cells), failure)


def build_run_graph(
    definition: DagDefinition, execution: RunRow, history: Sequence[ev.HistoryEvent], note: str | None = None
) -> dict[str, Any]:
    """``{run_id, dag_name, state, started_at, finished_at, nodes: [...]}`` for one DAG run, from
    its decoded history.

    Nodes in declaration order, each ``{node_name, status, depends_on, started_at, finished_at,
    attempts, error_type, error}``; a canvas run's nodes are named by node id and add ``task``.

    Nodes a retry-from-node fork carried over show ``succeeded`` with no timings (they ran in
    the source run). Limitations, history alone cannot tell: a node never dispatched is ``skipped`` on a terminal
    run and ``pending`` on a live one (an empty mapped fan-out, which dispatches nothing, shows
    the same way); a signal gate is ``succeeded`` once its signal has been delivered.
    """
    live = execution.status not in TERMINAL_STATUSES
    fold = fold_dispatches(history)
    by_name = fold.forward_by_name()
    signals: dict[str, datetime] = {}
    for item in history:
        if isinstance(item.event, ev.SignalReceived):
            signals.setdefault(item.event.name, item.recorded_at)
    carried = set(fold.carried)
    nodes = []
    for node in definition.nodes:
        dispatches = by_name.get(node.name)
        if node.name in carried and not dispatches:
            nodes.append(_node(node, "succeeded"))  # carried over by a retry: it ran in the source
        elif node.kind == "gate" and node.name in signals:
            nodes.append(_node(node, "succeeded", finished_at=signals[node.name]))
        elif node.kind != "gate" and dispatches:
            build = _mapped_node if node.kind == "mapped" else _activity_node
            nodes.append(build(node, dispatches, live))
        else:
            nodes.append(_node(node, "pending" if live else "skipped"))
    graph = {
        "run_id": execution.id,
        "dag_name": definition.name,
        "state": execution.status,
        "started_at": execution.created_at,
        "finished_at": execution.closed_at,
        "nodes": nodes,
    }
    if note is not None:
        graph["note"] = note  # a canvas run whose stored graph cannot be read
    return graph
