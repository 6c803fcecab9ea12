"""The one fold of a run's history into its activities and their attempts. Pure.

``fold_activities(history)`` walks a history once and returns, per ``ActivityScheduled`` (one
activity id; all its attempts share it) in scheduling order, an ``Activity``: the scheduling
event, each attempt (started where and when, how it ended), its latest start, the highest
attempt seen, its final result and its status. Its readers are views: the DAG run graph and
retry plan (``_dag.folds``, which adds the compensation-envelope classification) and the
console's run page (``_web.console.run_view``, which adds the recorded attempt errors).

**The words** are the run-graph API's (``STATUSES``; ``NODE_STATUSES`` and the API's
``NodeStatus`` are this set):

* ``succeeded`` — an ``ActivityCompleted`` is recorded. **A completion wins over any failure.**
* ``failed`` / ``timed_out`` — otherwise **the last** ``ActivityFailed`` recorded decides;
  ``timed_out`` when its error type is ``StartToCloseTimeout`` (the lease expired or
  start_to_close overran).
* ``cancelled`` — no result, and the run is sealed (a cancel, terminate or outcome is recorded):
  it never will finish.
* ``running`` — no result, an ``ActivityStarted`` is recorded, the run is live.
* ``pending`` — no result and no ``ActivityStarted``, the run is live: scheduled, its body not
  begun (a task row waiting for its message, or a waiting row held back by a limit on the
  activity: no attempt of it has started). Once an attempt started, history alone cannot tell a
  row waiting for its retry from one still running (the failed attempt's error is in the store,
  not in history): both are ``running``.
* ``skipped`` — never produced here (an activity that exists was scheduled); a view uses it for
  what was never scheduled (a DAG node on a finished run).

An attempt's status: its own result (``succeeded``, ``failed``, ``timed_out``); without one,
``failed`` when a later attempt exists (it ended without a recorded result: its error is in the
store's attempt errors, never in history), else ``running`` on a live run and ``cancelled`` on a
sealed one.

**Every event type is decided here.** The fold matches each event exhaustively over the closed
set (``events.AnyEvent``): those that do not concern activities are explicit no-ops, mypy names
this match when a type is added, and an event class outside the set raises ``TypeError``
(``events.known``) instead of being silently ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, get_args

from harvest_celery._core import events as ev
from harvest_celery._core.names import START_TO_CLOSE_TIMEOUT

Status = Literal["succeeded", "failed", "timed_out", "cancelled", "running", "pending", "skipped"]
STATUSES: Final[tuple[str, ...]] = get_args(Status)
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
TIMED_OUT: Final = "timed_out"
CANCELLED: Final = "cancelled"
RUNNING: Final = "running"
PENDING: Final = "pending"
SKIPPED: Final = "skipped"
FINISHED: Final = frozenset({SUCCEEDED, FAILED, TIMED_OUT})  # a result is recorded
UNFINISHED: Final = frozenset({CANCELLED, RUNNING, PENDING})  # scheduled, no result


def failure_status(error_type: str | None) -> Status:
    """``timed_out`` for a start-to-close timeout, else ``failed``."""
    return TIMED_OUT if error_type == START_TO_CLOSE_TIMEOUT else FAILED


@dataclass(frozen=True)
class Attempt:
    """One attempt of an activity, as history recorded it."""

    number: int
    status: Status
    started_at: datetime | None = None  # its ActivityStarted (None: no start recorded)
    worker: str | None = None
    finished_at: datetime | None = None  # its own result
    error_type: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Activity:
    """One ``ActivityScheduled`` and what history recorded for its activity id."""

    item: ev.HistoryEvent  # the ActivityScheduled as recorded (seq, recorded_at)
    scheduled: ev.ActivityScheduled
    status: Status
    attempts: tuple[Attempt, ...]  # by attempt number
    attempt_count: int  # the highest attempt on any start or result (0: never claimed)
    started_at: datetime | None  # the latest ActivityStarted
    finished_at: datetime | None  # when the final result was recorded
    result: ev.ActivityCompleted | ev.ActivityFailed | None  # the final result (see the module)

    @property
    def activity_id(self) -> str:
        return self.scheduled.activity_id

    @property
    def activity_name(self) -> str:
        return self.scheduled.activity_name

    @property
    def queue(self) -> str:
        return self.scheduled.queue

    @property
    def compensation(self) -> bool:
        """Dispatched while an unwind ran (the event's flag; a DAG view corroborates by envelope)."""
        return self.scheduled.compensation

    @property
    def input(self) -> Any:
        return self.scheduled.input

    @property
    def output(self) -> Any:
        return self.result.output if isinstance(self.result, ev.ActivityCompleted) else None

    @property
    def seq(self) -> int:
        return self.item.seq

    @property
    def scheduled_at(self) -> datetime:
        return self.item.recorded_at

    @property
    def started(self) -> bool:
        """An ``ActivityStarted`` exists: without one, the body provably never ran."""
        return self.started_at is not None

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def error_type(self) -> str | None:
        return self.result.error_type if isinstance(self.result, ev.ActivityFailed) else None

    @property
    def error(self) -> str | None:
        """The final failure's message, raw (truncated only when rendered)."""
        return self.result.message if isinstance(self.result, ev.ActivityFailed) else None


@dataclass
class _Open:
    """What the walk has gathered for one activity id."""

    item: ev.HistoryEvent
    starts: dict[int, tuple[datetime, str]] = field(default_factory=dict)  # attempt → (at, worker)
    results: dict[int, ev.HistoryEvent] = field(default_factory=dict)  # attempt → its result
    final: ev.HistoryEvent | None = None
    started_at: datetime | None = None
    attempt_count: int = 0

    def add(
        self,
        item: ev.HistoryEvent,
        event: ev.ActivityStarted | ev.ActivityCompleted | ev.ActivityFailed,
    ) -> None:
        self.attempt_count = max(self.attempt_count, event.attempt)
        if isinstance(event, ev.ActivityStarted):
            self.starts[event.attempt] = (item.recorded_at, event.worker_id)
            self.started_at = item.recorded_at
            return
        mine = self.results.get(event.attempt)
        if mine is None or not isinstance(mine.event, ev.ActivityCompleted):
            self.results[event.attempt] = item  # within an attempt too: a completion wins
        if self.final is None or not isinstance(self.final.event, ev.ActivityCompleted):
            self.final = item  # a completion wins; otherwise the last failure


def _result_status(result: ev.Event) -> Status:
    return (
        SUCCEEDED
        if isinstance(result, ev.ActivityCompleted)
        else failure_status(getattr(result, "error_type", None))
    )


def _attempt(number: int, acc: _Open, live: bool) -> Attempt:
    at, worker = acc.starts.get(number, (None, None))
    end = acc.results.get(number)
    if end is None:
        status: Status = FAILED if number < acc.attempt_count else (RUNNING if live else CANCELLED)
        return Attempt(number, status, at, worker)
    failed = end.event if isinstance(end.event, ev.ActivityFailed) else None
    return Attempt(
        number,
        _result_status(end.event),
        at,
        worker,
        end.recorded_at,
        failed.error_type if failed else None,
        failed.message if failed else None,
    )


def _activity(acc: _Open, live: bool) -> Activity:
    scheduled = acc.item.event
    assert isinstance(scheduled, ev.ActivityScheduled)
    end = acc.final
    result = end.event if end is not None else None
    assert result is None or isinstance(result, (ev.ActivityCompleted, ev.ActivityFailed))
    if result is not None:
        status = _result_status(result)
    elif not live:
        status = CANCELLED
    else:
        status = RUNNING if acc.started_at is not None else PENDING
    numbers = sorted(set(acc.starts) | set(acc.results))
    return Activity(
        acc.item,
        scheduled,
        status,
        tuple(_attempt(n, acc, live) for n in numbers),
        acc.attempt_count,
        acc.started_at,
        end.recorded_at if end is not None else None,
        result,
    )


def _step(item: ev.HistoryEvent, acts: dict[str, _Open]) -> bool:
    """Fold one event; True when it seals the run (a cancel, a terminate or the run's outcome:
    nothing more will start, though a late result of a body that ran is still recorded)."""
    event = ev.known(item.event)  # the closed set: an undeclared class raises here
    match event:
        case ev.ActivityScheduled():
            acts[event.activity_id] = _Open(item)
        case ev.ActivityStarted() | ev.ActivityCompleted() | ev.ActivityFailed():
            if event.activity_id in acts:  # an id never scheduled in this run: nothing to attach to
                acts[event.activity_id].add(item, event)
        case (
            ev.WorkflowCancelled()
            | ev.WorkflowCompleted()
            | ev.WorkflowFailed()
            | ev.WorkflowContinuedAsNew()
        ):
            return True
        case (
            ev.WorkflowStarted()
            | ev.WorkflowCancelRequested()
            | ev.WorkflowTimeoutRequested()
            | ev.UpdateAccepted()
            | ev.UpdateCompleted()
            | ev.MarkerRecorded()
            | ev.SignalReceived()
            | ev.TimerStarted()
            | ev.TimerFired()
            | ev.ChildWorkflowScheduled()
            | ev.ChildWorkflowStarted()
            | ev.ChildWorkflowStartRefused()
            | ev.ChildWorkflowClosed()
        ):
            pass  # no activity's business
        case other:
            ev.unhandled(other)  # mypy proves this unreachable; a new member of AnyEvent needs an arm
    return False


def fold_activities(history: Sequence[ev.HistoryEvent], live: bool | None = None) -> list[Activity]:
    """Every activity of the run in scheduling order (one pass). ``live``: is the run still
    running (an unfinished activity is then ``running``/``pending``, else ``cancelled``); by
    default read from history (sealed by a cancel, a terminate or the run's outcome)."""
    acts: dict[str, _Open] = {}
    is_sealed = False
    for item in history:
        is_sealed = _step(item, acts) or is_sealed
    alive = not is_sealed if live is None else live
    return [_activity(acc, alive) for acc in acts.values()]
