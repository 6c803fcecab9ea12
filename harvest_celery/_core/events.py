"""The append-only history: typed, versioned events.

Events are frozen dataclasses. On disk each is ``{"type": ..., "v": 1, ...fields}`` in the
``events.data`` column, plus the row's ``seq`` and ``recorded_at``. Three families matter to replay
(see DESIGN.md, "The replay model"):

* command events exist only because the workflow issued a command and are matched in order:
  ``ActivityScheduled``, ``MarkerRecorded``, ``TimerStarted``;
* result events are delivered to the workflow in history order: ``ActivityStarted``,
  ``ActivityCompleted``, ``ActivityFailed``, ``TimerFired``, ``SignalReceived``;
* lifecycle events: ``WorkflowStarted``, ``WorkflowCancelled`` (never consumed: it stays at the
  replay cursor), ``WorkflowCancelRequested`` (a cooperative request: delivered in history order,
  never met by a matcher) and the terminal ``WorkflowCompleted`` / ``WorkflowFailed`` (never
  matched).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from harvest_celery._errors import CorruptHistory, UnknownEventType

EVENT_VERSION = 1


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = ""

    def to_data(self) -> dict[str, Any]:
        data = {"type": self.type, "v": EVENT_VERSION}
        data.update(dataclasses.asdict(self))
        return data


@dataclass(frozen=True)
class WorkflowStarted(Event):
    type: ClassVar[str] = "WorkflowStarted"
    workflow_type: str
    input: Any = None
    # A DAG run forked by retry-from-node: {node: {"input": ..., "output": ...}} carried over from
    # the source run's succeeded nodes (their side effects are live, so they stay compensable).
    carried: Any = None
    forked_from: str | None = None


@dataclass(frozen=True)
class ActivityScheduled(Event):
    type: ClassVar[str] = "ActivityScheduled"
    activity_id: str
    activity_name: str
    input: Any = None
    queue: str = ""
    # True for a dispatch made while a saga/DAG unwind runs. Not a payload field, so it survives
    # erasure; lets a cancel tell that it landed mid-unwind.
    compensation: bool = False


@dataclass(frozen=True)
class ActivityStarted(Event):
    type: ClassVar[str] = "ActivityStarted"
    activity_id: str
    attempt: int
    worker_id: str


@dataclass(frozen=True)
class ActivityCompleted(Event):
    type: ClassVar[str] = "ActivityCompleted"
    activity_id: str
    output: Any = None
    attempt: int = 1


@dataclass(frozen=True)
class ActivityFailed(Event):
    type: ClassVar[str] = "ActivityFailed"
    activity_id: str
    error_type: str
    message: str
    attempt: int = 1


@dataclass(frozen=True)
class MarkerRecorded(Event):
    type: ClassVar[str] = "MarkerRecorded"
    name: str
    details: Any = None


@dataclass(frozen=True)
class SignalReceived(Event):
    type: ClassVar[str] = "SignalReceived"
    name: str
    payload: Any = None


@dataclass(frozen=True)
class TimerStarted(Event):
    type: ClassVar[str] = "TimerStarted"
    timer_id: str
    seconds: float
    fire_at: str  # ISO-8601, UTC


@dataclass(frozen=True)
class TimerFired(Event):
    type: ClassVar[str] = "TimerFired"
    timer_id: str


@dataclass(frozen=True)
class WorkflowCancelled(Event):
    type: ClassVar[str] = "WorkflowCancelled"
    reason: str = ""


@dataclass(frozen=True)
class WorkflowCancelRequested(Event):
    """A cooperative cancellation request (``Harvest.request_cancellation``): an input event,
    delivered in history order like a signal. From its position on ``ctx.is_cancelled()`` is
    true; it never seals the run and no matcher ever meets it. No payload field."""

    type: ClassVar[str] = "WorkflowCancelRequested"
    reason: str = ""


@dataclass(frozen=True)
class WorkflowCompleted(Event):
    type: ClassVar[str] = "WorkflowCompleted"
    result: Any = None


@dataclass(frozen=True)
class WorkflowFailed(Event):
    type: ClassVar[str] = "WorkflowFailed"
    error_type: str
    message: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        WorkflowStarted, ActivityScheduled, ActivityStarted, ActivityCompleted, ActivityFailed,
        MarkerRecorded, SignalReceived, TimerStarted, TimerFired, WorkflowCancelled,
        WorkflowCancelRequested, WorkflowCompleted, WorkflowFailed,
    )
}

COMMAND_EVENTS = (ActivityScheduled, MarkerRecorded, TimerStarted)
# results of commands, delivered in history order; never met by a command matcher. Signals are
# delivered too, but a command matcher sees them (the saga marker's drained-signal check).
RESULT_EVENTS = (ActivityStarted, ActivityCompleted, ActivityFailed, TimerFired)
TERMINAL_EVENTS = (WorkflowCompleted, WorkflowFailed)
# sent to a run from outside, delivered in history order: a command matcher never meets a
# cancellation request (nor does the saga marker matcher); signals it steps over
INPUT_EVENTS = (SignalReceived, WorkflowCancelRequested)



_PLAIN: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "bool": bool,
                                            "str | None": (str, type(None))}


def event_from_data(data: dict[str, Any]) -> Event:
    """Rebuild an event from its stored JSON (unknown keys from newer versions are ignored).
    A stored event missing a field, or with a field of the wrong JSON type, is a
    ``CorruptHistory`` — never an error of another kind from deep inside a replay."""
    if not isinstance(data, dict):
        raise CorruptHistory(f"a stored event is not a JSON object: {type(data).__name__}")
    cls = EVENT_TYPES.get(data.get("type", ""))
    if cls is None:
        raise UnknownEventType(str(data.get("type")))
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        expected = _PLAIN.get(str(f.type))
        value = data[f.name]
        if expected is not None and (not isinstance(value, expected)
                                     or (expected is int and isinstance(value, bool))):
            raise CorruptHistory(f"{cls.type} event: field {f.name!r} holds "
                                 f"{type(value).__name__}, not {f.type}")
        values[f.name] = value
    try:
        return cls(**values)
    except TypeError as exc:  # a required field missing
        raise CorruptHistory(f"{cls.type} event: {exc}") from None


@dataclass(frozen=True)
class HistoryEvent:
    """An event as recorded: its position and time as well as its content."""

    seq: int
    event: Event
    recorded_at: datetime

    def describe(self) -> str:
        return describe(self.event)


def describe(event: Event) -> str:
    """Short human form used in divergence messages and timelines: ``ActivityScheduled(x)``."""
    if isinstance(event, ActivityScheduled):
        return f"ActivityScheduled({event.activity_name})"
    if isinstance(event, MarkerRecorded):
        return f"MarkerRecorded({event.name})"
    if isinstance(event, TimerStarted):
        return f"TimerStarted({event.timer_id})"
    if isinstance(event, SignalReceived):
        return f"SignalReceived({event.name})"
    if isinstance(event, (ActivityStarted, ActivityCompleted, ActivityFailed)):
        return f"{event.type}({event.activity_id})"
    return event.type
