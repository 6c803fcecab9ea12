"""The DAG view of a run's activities: what each ``ActivityScheduled`` became, forward or
compensation.

The activities and their results come from the one activity fold, ``_core.activities``:
per dispatch (one ``ActivityScheduled``; all attempts share its activity id) when it was
scheduled, its latest ``ActivityStarted``, the highest attempt seen, and its final result — **a
completion wins over any failure; otherwise the last failure recorded; otherwise it is still
open** — and its status in the run-graph API's words. This view adds the envelope handling:

Each dispatch is classified **forward** or **compensation** by history alone (never the
definition, so the rule cannot drift across definition versions): a compensation dispatch is an
``ActivityScheduled`` whose input is a compensation envelope naming a node dispatched forward
earlier in the same run, or carried over by the retry-from-node fork this run is (a compensation
always follows the dispatch of the node it undoes). A forward input that merely has the envelope's
keys but names nothing dispatched is forward. A compensator dispatch is never read as a forward
node, even when a later definition version declares a node under the compensator's name.

The corroboration reads ``ActivityScheduled.input``, a payload-bearing field, so the fold takes
decoded history. Its readers: the run graph (``graph``), the retry guard and plan (``retry``),
the run page's compensation badges (``_web.pages``) and a reset's open dispatches (``_store.runs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from harvest_celery._core import activities as acts
from harvest_celery._core import events as ev
from harvest_celery._dag.model import is_envelope

# a dispatch's outcome, as the DAG readers ask it: finished how, or still open (no result yet)
SUCCEEDED, FAILED, TIMED_OUT, OPEN = acts.SUCCEEDED, acts.FAILED, acts.TIMED_OUT, "open"
OUTCOMES = (SUCCEEDED, FAILED, TIMED_OUT, OPEN)


@dataclass(frozen=True)
class Dispatch:
    """One ``ActivityScheduled`` and what history recorded for its activity id (the core
    fold's ``Activity``), with the node it compensates, if it is a compensation dispatch."""

    activity: acts.Activity
    compensates: str | None = None  # a compensation dispatch: the node it undoes

    @property
    def item(self) -> ev.HistoryEvent:
        return self.activity.item  # the ActivityScheduled as recorded (seq, recorded_at)

    @property
    def scheduled(self) -> ev.ActivityScheduled:
        return self.activity.scheduled

    @property
    def started_at(self) -> datetime | None:
        return self.activity.started_at  # the latest ActivityStarted

    @property
    def finished_at(self) -> datetime | None:
        return self.activity.finished_at  # when the final result was recorded

    @property
    def attempts(self) -> int:
        return self.activity.attempt_count  # the highest attempt on any start or result

    @property
    def result(self) -> ev.ActivityCompleted | ev.ActivityFailed | None:
        return self.activity.result

    @property
    def status(self) -> acts.Status:
        """The core fold's status (``succeeded`` · ``failed`` · ``timed_out`` · ``cancelled`` ·
        ``running`` · ``pending``)."""
        return self.activity.status

    @property
    def activity_id(self) -> str:
        return self.activity.activity_id

    @property
    def node(self) -> str:
        """The node this dispatch belongs to: a canvas dispatch's recorded node id, else its
        activity name (a declared DAG's node is named after its activity)."""
        return self.activity.scheduled.node or self.activity.activity_name

    @property
    def activity_name(self) -> str:
        return self.activity.activity_name

    @property
    def input(self) -> Any:
        return self.activity.input

    @property
    def seq(self) -> int:
        return self.activity.seq

    @property
    def scheduled_at(self) -> datetime:
        return self.activity.scheduled_at

    @property
    def forward(self) -> bool:
        return self.compensates is None

    @property
    def started(self) -> bool:
        """An ``ActivityStarted`` exists: without one, the body provably never ran."""
        return self.activity.started

    @property
    def outcome(self) -> str:
        """``succeeded`` · ``failed`` · ``timed_out`` (a start-to-close timeout) · ``open``."""
        return self.activity.status if self.activity.finished else OPEN

    @property
    def error_type(self) -> str | None:
        return self.activity.error_type

    @property
    def error(self) -> str | None:
        """The failure's message, raw (truncated only when rendered)."""
        return self.activity.error


@dataclass(frozen=True)
class DispatchFold:
    """Every dispatch of a run in history order, and the nodes its fork carried over."""

    dispatches: tuple[Dispatch, ...]
    carried: tuple[str, ...]

    def forward(self) -> list[Dispatch]:
        return [d for d in self.dispatches if d.forward]

    def compensations(self) -> list[Dispatch]:
        return [d for d in self.dispatches if not d.forward]

    def forward_by_name(self) -> dict[str, list[Dispatch]]:
        """Forward dispatches by node, in dispatch order (a mapped node has one per cell): a
        declared DAG's node is its activity name, a canvas run's its node id (``Dispatch.node``),
        since a group of one task is many nodes with one name."""
        out: dict[str, list[Dispatch]] = {}
        for d in self.forward():
            out.setdefault(d.node, []).append(d)
        return out


def carried_nodes(history: Sequence[ev.HistoryEvent]) -> list[str]:
    """Nodes a retry-from-node fork carried over from its source run (they succeeded there)."""
    started = history[0].event if history else None
    carried = getattr(started, "carried", None) or {}
    return list(carried) if isinstance(carried, dict) else []


def is_compensation_dispatch(event: ev.Event, dispatched_names: Iterable[str]) -> bool:
    """``event`` is an ``ActivityScheduled`` whose input is a compensation envelope naming one of
    ``dispatched_names`` (the nodes dispatched forward, or carried, before it: activity names
    for a declared DAG, node ids for a canvas run, whose envelope's ``dag_compensate`` is the
    node id)."""
    return (
        isinstance(event, ev.ActivityScheduled)
        and is_envelope(event.input)
        and event.input["dag_compensate"] in dispatched_names
    )


def fold_dispatches(history: Sequence[ev.HistoryEvent], live: bool | None = None) -> DispatchFold:
    """The run's dispatches, forward and compensation, from its decoded history: the core fold
    (``live`` as there), each classified in scheduling order."""
    carried = carried_nodes(history)
    seen: set[str] = set(carried)  # forward names so far: the corroborating set
    dispatches = []
    for activity in acts.fold_activities(history, live):
        if is_compensation_dispatch(activity.scheduled, seen):
            dispatches.append(Dispatch(activity, activity.scheduled.input["dag_compensate"]))
        else:
            seen.add(activity.scheduled.node or activity.activity_name)  # keyed by node id
            dispatches.append(Dispatch(activity))
    return DispatchFold(tuple(dispatches), tuple(carried))


def forward_dispatches(history: Sequence[ev.HistoryEvent]) -> list[ev.HistoryEvent]:
    """Every ``ActivityScheduled`` that is not a compensation dispatch, in history order."""
    return [d.item for d in fold_dispatches(history).forward()]
