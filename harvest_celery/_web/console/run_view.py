"""What the run page shows, folded from a run's history and its recorded attempt errors. Pure.

* activities: the console's view of the one activity fold (``_core.activities``): one per
  activity id, in scheduling order, with its name, queue, whether it was a compensation, its
  status and each attempt (started where and when, how it ended, its error). Statuses are the
  core fold's words (``succeeded``, ``failed``, ``timed_out``, ``cancelled``, ``running``,
  ``pending``); ``run_page`` maps them for display. The recorded attempt errors add what history
  never holds: the error (and traceback) of an attempt that was retried, and whether it failed
  or timed out;
* errors: every failed attempt with its traceback (``Store.attempt_errors``), the workflow's
  own failure included (activity id ``""``);
* saga: the saga markers (an unwind began, an unwind had errors) and the compensations run;
* signals: every signal received, with a payload snippet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from harvest_celery._core import activities as core
from harvest_celery._core import events as ev
from harvest_celery._core.names import is_saga_marker


@dataclass
class Attempt:
    number: int
    started_at: datetime | None = None
    worker: str | None = None
    status: str = core.FAILED  # the core fold's word (an attempt known only from its error: failed)
    finished_at: datetime | None = None
    error_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    recorded: bool = False  # history holds its own result (its status is not the attempt error's)


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
    status: str = core.PENDING  # the core fold's word
    attempts: dict[int, Attempt] = field(default_factory=dict)
    held: str | None = None  # "waiting for a slot of charge (3/3 in use)": a limit holds it back

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


def _activity(a: core.Activity) -> Activity:
    act = Activity(
        a.activity_id,
        a.activity_name,
        a.queue,
        a.compensation,
        a.seq,
        a.scheduled_at,
        input=a.input,
        output=a.output,
        status=a.status,
    )
    for t in a.attempts:
        act.attempts[t.number] = Attempt(
            t.number,
            t.started_at,
            t.worker,
            t.status,
            t.finished_at,
            t.error_type,
            t.message,
            recorded=t.finished_at is not None,
        )
    return act


def _add_error(view: RunView, acts: dict[str, Activity], err: Any) -> None:
    act = acts.get(err.activity_id)
    if act is not None:
        attempt = act.attempt(err.attempt)
        if not attempt.recorded:  # retried, or its result is not in history: the error tells
            attempt.status, attempt.finished_at = core.failure_status(err.error_type), err.recorded_at
        attempt.error_type = attempt.error_type or err.error_type
        attempt.message = attempt.message or err.message
        attempt.traceback = err.traceback
    who = (
        "workflow"
        if not err.activity_id
        else (f"{act.name} #{err.activity_id}" if act is not None else f"activity #{err.activity_id}")
    )
    view.errors.append(
        ErrorRow(
            err.activity_id, who, err.attempt, err.error_type, err.message, err.traceback, err.recorded_at
        )
    )


def build_run_view(
    history: Sequence[ev.HistoryEvent],
    attempt_errors: Sequence[Any],
    live: bool | None = None,
    held: Mapping[str, str] | None = None,
) -> RunView:
    """Fold ``history`` and the run's ``AttemptError`` records into a ``RunView`` (``live`` as in
    ``fold_activities``: by default read from history). ``held``: activity id → the slot text of
    each task row a limit holds back (``waiting``; the store knows it, history does not)."""
    acts = {a.activity_id: _activity(a) for a in core.fold_activities(history, live)}
    for activity_id, text in (held or {}).items():
        if activity_id in acts:
            acts[activity_id].held = text
    view = RunView(list(acts.values()), [], [], [])
    for item in history:
        event, at = item.event, item.recorded_at
        if isinstance(event, ev.MarkerRecorded) and is_saga_marker(event.name):
            view.markers.append(Marker(item.seq, event.name, event.details, at))
        elif isinstance(event, ev.SignalReceived):
            view.signals.append(SignalRow(item.seq, event.name, event.payload, at))
    for err in attempt_errors:
        _add_error(view, acts, err)
    return view
