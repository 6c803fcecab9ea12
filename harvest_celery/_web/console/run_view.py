"""What the run page shows, folded from a run's history and its recorded attempt errors. Pure.

* activities: one per activity id, in scheduling order, with its name, queue, whether it was a
  compensation, its status and each attempt (started where and when, how it ended, its error);
* errors: every failed attempt with its traceback (``Store.attempt_errors``), the workflow's
  own failure included (activity id ``""``);
* saga: the saga markers (an unwind began, an unwind had errors) and the compensations run;
* signals: every signal received, with a payload snippet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.names import is_saga_marker


@dataclass
class Attempt:
    number: int
    started_at: datetime | None = None
    worker: str | None = None
    outcome: str = "running"  # running · completed · failed
    finished_at: datetime | None = None
    error_type: str | None = None
    message: str | None = None
    traceback: str | None = None


@dataclass
class Activity:
    activity_id: str
    name: str
    queue: str
    compensation: bool
    scheduled_seq: int
    scheduled_at: datetime
    input: Any = None
    output: Any = None
    status: str = "scheduled"  # scheduled · running · completed · failed
    attempts: dict[int, Attempt] = field(default_factory=dict)

    def attempt(self, number: int) -> Attempt:
        return self.attempts.setdefault(number, Attempt(number))


@dataclass(frozen=True)
class ErrorRow:
    activity_id: str
    who: str  # "workflow" or "<activity name> #<id>"
    attempt: int
    error_type: str
    message: str
    traceback: str
    recorded_at: datetime


@dataclass(frozen=True)
class Marker:
    seq: int
    name: str
    details: Any
    recorded_at: datetime


@dataclass(frozen=True)
class SignalRow:
    seq: int
    name: str
    payload: Any
    recorded_at: datetime


@dataclass
class RunView:
    activities: list[Activity]
    errors: list[ErrorRow]
    markers: list[Marker]
    signals: list[SignalRow]

    @property
    def compensations(self) -> list[Activity]:
        return [a for a in self.activities if a.compensation]


def _fold_event(item: ev.HistoryEvent, acts: dict[str, Activity], view: RunView) -> None:
    event, at = item.event, item.recorded_at
    if isinstance(event, ev.ActivityScheduled):
        acts[event.activity_id] = Activity(event.activity_id, event.activity_name, event.queue,
                                           event.compensation, item.seq, at, input=event.input)
    elif isinstance(event, ev.ActivityStarted) and event.activity_id in acts:
        act = acts[event.activity_id]
        attempt = act.attempt(event.attempt)
        attempt.started_at, attempt.worker, act.status = at, event.worker_id, "running"
    elif isinstance(event, ev.ActivityCompleted) and event.activity_id in acts:
        act = acts[event.activity_id]
        attempt = act.attempt(event.attempt)
        attempt.outcome, attempt.finished_at = "completed", at
        act.status, act.output = "completed", event.output
    elif isinstance(event, ev.ActivityFailed) and event.activity_id in acts:
        act = acts[event.activity_id]
        attempt = act.attempt(event.attempt)
        attempt.outcome, attempt.finished_at = "failed", at
        attempt.error_type, attempt.message = event.error_type, event.message
        act.status = "failed"
    elif isinstance(event, ev.MarkerRecorded) and is_saga_marker(event.name):
        view.markers.append(Marker(item.seq, event.name, event.details, at))
    elif isinstance(event, ev.SignalReceived):
        view.signals.append(SignalRow(item.seq, event.name, event.payload, at))


def build_run_view(history: Sequence[ev.HistoryEvent], attempt_errors: Sequence[Any]) -> RunView:
    """Fold ``history`` and the run's ``AttemptError`` records into a ``RunView``."""
    view = RunView([], [], [], [])
    acts: dict[str, Activity] = {}
    for item in history:
        _fold_event(item, acts, view)
    for err in attempt_errors:
        act = acts.get(err.activity_id)
        if act is not None:
            attempt = act.attempt(err.attempt)
            if attempt.outcome == "running":
                attempt.outcome, attempt.finished_at = "failed", err.recorded_at
            attempt.error_type = attempt.error_type or err.error_type
            attempt.message = attempt.message or err.message
            attempt.traceback = err.traceback
        who = "workflow" if not err.activity_id else (
            f"{act.name} #{err.activity_id}" if act is not None else f"activity #{err.activity_id}")
        view.errors.append(ErrorRow(err.activity_id, who, err.attempt, err.error_type, err.message,
                                    err.traceback, err.recorded_at))
    view.activities = sorted(acts.values(), key=lambda a: a.scheduled_seq)
    return view
