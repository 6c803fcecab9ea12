"""How decisions and operator actions change a run — pure rules shared by the store (which applies
them in SQL) and the in-memory ``testing.Simulator``."""

from __future__ import annotations

from collections.abc import Sequence

from harvest_celery._core import events as ev
from harvest_celery._core.commands import (
    Completed,
    Decision,
    Failed,
    RecordMarker,
    ScheduleActivity,
    StartTimer,
)
from harvest_celery._core.names import SAGA_COMPENSATED, is_marker

RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TERMINATED = "TERMINATED"
TERMINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED, TERMINATED})


def decision_events(decision: Decision, history: Sequence[ev.Event]) -> list[ev.Event]:
    """Events a (non-divergent) decision appends, in command order, then its outcome.

    After a cancel the workflow's own outcome is still appended (unmatched), once.
    """
    out: list[ev.Event] = []
    for command in decision.commands:
        if isinstance(command, ScheduleActivity):
            out.append(ev.ActivityScheduled(command.activity_id, command.activity_name,
                                            command.input, command.queue, command.compensation))
        elif isinstance(command, RecordMarker):
            out.append(ev.MarkerRecorded(command.name, command.details))
        elif isinstance(command, StartTimer):
            out.append(ev.TimerStarted(command.timer_id, command.seconds, command.fire_at))
    outcome = decision.outcome
    if outcome is not None and not has_outcome(history):
        if isinstance(outcome, Completed):
            out.append(ev.WorkflowCompleted(outcome.result))
        elif isinstance(outcome, Failed):
            out.append(ev.WorkflowFailed(outcome.error_type, outcome.message))
    return out


def has_outcome(history: Sequence[ev.Event]) -> bool:
    return any(isinstance(e, ev.TERMINAL_EVENTS) for e in history)


def status_for_outcome(decision: Decision, current: str) -> str:
    """A live run takes its outcome's status; a sealed (cancelled) run keeps the status the cancel
    gave it."""
    if current != RUNNING or decision.outcome is None:
        return current
    return COMPLETED if isinstance(decision.outcome, Completed) else FAILED


def unwind_begun(history: Sequence[ev.Event]) -> bool:
    """An unwind has begun: a saga marker or a compensation dispatch is recorded."""
    for e in history:
        if isinstance(e, ev.MarkerRecorded) and is_marker(e.name, SAGA_COMPENSATED):
            return True
        if isinstance(e, ev.ActivityScheduled) and e.compensation:
            return True
    return False


def status_after_cancel(history: Sequence[ev.Event]) -> str:
    """CANCELLED at once; FAILED when the cancel lands mid-unwind (the remaining compensators
    never run, and the dangling state needs reconciliation)."""
    return FAILED if unwind_begun(history) else CANCELLED


def open_activity_ids(history: Sequence[ev.Event]) -> list[str]:
    """Activities scheduled with no final result yet, in dispatch order."""
    done = {e.activity_id for e in history if isinstance(e, (ev.ActivityCompleted, ev.ActivityFailed))}
    return [e.activity_id for e in history
            if isinstance(e, ev.ActivityScheduled) and e.activity_id not in done]
