"""The one fold of a DAG run's history into its dispatches: what each ``ActivityScheduled`` became.

``fold_dispatches(history)`` walks a *decoded* history once and yields, per dispatch (one
``ActivityScheduled``; all attempts share its activity id): when it was scheduled, its latest
``ActivityStarted``, the highest attempt seen, and its final result — **a completion wins over any
failure; otherwise the last failure recorded; otherwise it is still open**.

Each dispatch is classified **forward** or **compensation** by history alone (never the
definition, so the rule cannot drift across definition versions): a compensation dispatch is an
``ActivityScheduled`` whose input is a compensation envelope naming a node dispatched forward
earlier in the same run, or carried over by the retry-from-node fork this run is (a compensation
always follows the dispatch of the node it undoes). A forward input that merely has the envelope's
keys but names nothing dispatched is forward. A compensator dispatch is never read as a forward
node, even when a later definition version declares a node under the compensator's name.

The corroboration reads ``ActivityScheduled.input``, a payload-bearing field, so the fold takes
decoded history. Its readers: the run graph (``graph``), the retry guard and plan (``retry``) and
the run page's compensation badges (``_web.pages``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.names import START_TO_CLOSE_TIMEOUT
from harvest_celery._dag.model import is_envelope

SUCCEEDED, FAILED, TIMED_OUT, OPEN = "succeeded", "failed", "timed_out", "open"
OUTCOMES = (SUCCEEDED, FAILED, TIMED_OUT, OPEN)


@dataclass(frozen=True)
class Dispatch:
    """One ``ActivityScheduled`` and what history recorded for its activity id."""

    item: ev.HistoryEvent  # the ActivityScheduled as recorded (seq, recorded_at)
    scheduled: ev.ActivityScheduled
    started_at: datetime | None  # the latest ActivityStarted
    finished_at: datetime | None  # when the final result was recorded
    attempts: int  # the highest attempt on any start or result (0: never claimed)
    result: ev.ActivityCompleted | ev.ActivityFailed | None  # the final result (see the module)
    compensates: str | None = None  # a compensation dispatch: the node it undoes

    @property
    def activity_id(self) -> str:
        return self.scheduled.activity_id

    @property
    def activity_name(self) -> str:
        return self.scheduled.activity_name

    @property
    def input(self) -> Any:
        return self.scheduled.input

    @property
    def seq(self) -> int:
        return self.item.seq

    @property
    def scheduled_at(self) -> datetime:
        return self.item.recorded_at

    @property
    def forward(self) -> bool:
        return self.compensates is None

    @property
    def started(self) -> bool:
        """An ``ActivityStarted`` exists: without one, the body provably never ran."""
        return self.started_at is not None

    @property
    def outcome(self) -> str:
        """``succeeded`` · ``failed`` · ``timed_out`` (a start-to-close timeout) · ``open``."""
        if isinstance(self.result, ev.ActivityCompleted):
            return SUCCEEDED
        if isinstance(self.result, ev.ActivityFailed):
            return TIMED_OUT if self.result.error_type == START_TO_CLOSE_TIMEOUT else FAILED
        return OPEN

    @property
    def error_type(self) -> str | None:
        return self.result.error_type if isinstance(self.result, ev.ActivityFailed) else None

    @property
    def error(self) -> str | None:
        """The failure's message, raw (truncated only when rendered)."""
        return self.result.message if isinstance(self.result, ev.ActivityFailed) else None


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
        """Forward dispatches by activity (node) name, in dispatch order (a mapped node has one
        per cell)."""
        out: dict[str, list[Dispatch]] = {}
        for d in self.forward():
            out.setdefault(d.activity_name, []).append(d)
        return out


def carried_nodes(history: Sequence[ev.HistoryEvent]) -> list[str]:
    """Nodes a retry-from-node fork carried over from its source run (they succeeded there)."""
    started = history[0].event if history else None
    carried = getattr(started, "carried", None) or {}
    return list(carried) if isinstance(carried, dict) else []


def is_compensation_dispatch(event: ev.Event, dispatched_names: Iterable[str]) -> bool:
    """``event`` is an ``ActivityScheduled`` whose input is a compensation envelope naming one of
    ``dispatched_names`` (the nodes dispatched forward, or carried, before it)."""
    return (isinstance(event, ev.ActivityScheduled) and is_envelope(event.input)
            and event.input["dag_compensate"] in dispatched_names)


@dataclass
class _Results:
    """Per activity id: the latest start, the highest attempt, the final result."""

    started: dict[str, datetime]
    attempts: dict[str, int]
    final: dict[str, ev.HistoryEvent]

    def add(self, item: ev.HistoryEvent) -> None:
        event = item.event
        if not isinstance(event, (ev.ActivityStarted, ev.ActivityCompleted, ev.ActivityFailed)):
            return
        aid = event.activity_id
        self.attempts[aid] = max(self.attempts.get(aid, 0), event.attempt)
        if isinstance(event, ev.ActivityStarted):
            self.started[aid] = item.recorded_at
            return
        prev = self.final.get(aid)
        if prev is None or not isinstance(prev.event, ev.ActivityCompleted):
            self.final[aid] = item  # a completion wins; otherwise the last failure


def fold_dispatches(history: Sequence[ev.HistoryEvent]) -> DispatchFold:
    """The run's dispatches, forward and compensation, from its decoded history (one pass)."""
    carried = carried_nodes(history)
    seen: set[str] = set(carried)  # forward names so far: the corroborating set
    scheduled: list[tuple[ev.HistoryEvent, ev.ActivityScheduled, str | None]] = []
    results = _Results({}, {}, {})
    for item in history:
        event = item.event
        if isinstance(event, ev.ActivityScheduled):
            if is_compensation_dispatch(event, seen):
                scheduled.append((item, event, event.input["dag_compensate"]))
            else:
                seen.add(event.activity_name)
                scheduled.append((item, event, None))
        else:
            results.add(item)
    dispatches = []
    for item, event, compensates in scheduled:
        end = results.final.get(event.activity_id)
        result = end.event if end is not None else None
        assert result is None or isinstance(result, (ev.ActivityCompleted, ev.ActivityFailed))
        dispatches.append(Dispatch(
            item, event, started_at=results.started.get(event.activity_id),
            finished_at=end.recorded_at if end is not None else None,
            attempts=results.attempts.get(event.activity_id, 0), result=result,
            compensates=compensates))
    return DispatchFold(tuple(dispatches), tuple(carried))


def forward_dispatches(history: Sequence[ev.HistoryEvent]) -> list[ev.HistoryEvent]:
    """Every ``ActivityScheduled`` that is not a compensation dispatch, in history order."""
    return [d.item for d in fold_dispatches(history).forward()]
