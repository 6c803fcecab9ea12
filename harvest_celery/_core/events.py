"""The append-only history: typed, versioned events, a closed set.

Events are frozen dataclasses. On disk each is ``{"type": ..., "v": 1, ...fields}`` in the
``events.data`` column, plus the row's ``seq`` and ``recorded_at``. Each type declares on its class
what it is to replay (DESIGN.md, "The replay model"), and every set the engine, the payload
pipeline and erasure use is derived from those declarations:

* ``family``: a **command** event exists only because the workflow issued a command
  (``ActivityScheduled``, ``MarkerRecorded``, ``TimerStarted``); a **result** of a command is
  delivered in history order (``ActivityStarted``, ``ActivityCompleted``, ``ActivityFailed``,
  ``TimerFired``); an **input**, sent to a run from outside, is delivered the same way
  (``SignalReceived``, a cooperative ``WorkflowCancelRequested``, a deadline's
  ``WorkflowTimeoutRequested``, an accepted update's ``UpdateAccepted``); a **lifecycle** event is the
  run's own (``WorkflowStarted``, the seal ``WorkflowCancelled``, and the ``terminal``
  ``WorkflowCompleted`` / ``WorkflowFailed``, never matched);
* ``cursor``: how the command cursor treats it (``Cursor``);
* ``advance``: whether ``Session.advance`` (the warm replay) accepts it after the session's own
  commands;
* its payload fields, as field metadata (``PAYLOAD``; ``SCRUBBED`` for free text that erasure
  replaces, since it may quote a payload).

Adding an event type is declaring its class, adding it to ``AnyEvent``, and giving it an arm in
every exhaustive ``match`` that mypy then points at. A class without its declarations fails at
its creation; one left out of ``AnyEvent`` fails this module's import.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, NoReturn, TypeAlias, cast, get_args

from harvest_celery._errors import CorruptHistory, UnknownEventType

EVENT_VERSION = 1


class Family(enum.Enum):
    COMMAND = "command"
    RESULT = "result"
    INPUT = "input"
    LIFECYCLE = "lifecycle"


class Cursor(enum.Enum):
    """How the command cursor (``Replay.candidates``) treats an event."""

    # met by the command matchers, consumed in order: a command event
    MATCHED = "matched"
    # met and never consumed: any command that meets it diverges (the seal, so nothing is
    # dispatched after a cancel; a WorkflowStarted anywhere but first)
    IN_THE_WAY = "in the way"
    # stepped over by the command matchers, but held on the cursor until the wait that takes it
    # consumes it: a signal (the saga marker's drained-signal check sees it)
    HELD = "held"
    # never on the cursor
    STEPPED_OVER = "stepped over"


_ROLE = "harvest"
# field metadata: a user payload (encoded, offloaded and erased by ``_payloads``)
PAYLOAD: Mapping[str, str] = MappingProxyType({_ROLE: "payload"})
# field metadata: free text replaced by ``[erased]`` on erasure (it often quotes the input)
SCRUBBED: Mapping[str, str] = MappingProxyType({_ROLE: "scrubbed"})


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = ""
    family: ClassVar[Family]
    terminal: ClassVar[bool]
    cursor: ClassVar[Cursor]
    advance: ClassVar[bool]

    def __init_subclass__(
        cls, *, family: Family, terminal: bool, cursor: Cursor, advance: bool, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls.family, cls.terminal, cls.cursor, cls.advance = family, terminal, cursor, advance
        _check_declarations(cls)

    def to_data(self) -> dict[str, Any]:
        data = {"type": self.type, "v": EVENT_VERSION}
        data.update(dataclasses.asdict(self))
        return data


def _check_declarations(cls: type[Event]) -> None:
    """The declarations of one event class, checked at its creation: what the engine assumes."""
    name = cls.__name__
    if not isinstance(cls.__dict__.get("type"), str) or not cls.__dict__["type"]:
        raise TypeError(f"event class {name} declares no stored type name (type: ClassVar[str])")
    if not (
        isinstance(cls.family, Family)
        and isinstance(cls.cursor, Cursor)
        and isinstance(cls.terminal, bool)
        and isinstance(cls.advance, bool)
    ):
        raise TypeError(
            f"event class {name}: family must be a Family, cursor a Cursor, terminal and advance bools"
        )
    if (cls.family is Family.COMMAND) != (cls.cursor is Cursor.MATCHED):
        raise TypeError(f"event class {name}: command events, and only they, are matched by the cursor")
    if cls.terminal and (
        cls.family is not Family.LIFECYCLE or cls.cursor is not Cursor.STEPPED_OVER or cls.advance
    ):
        raise TypeError(
            f"event class {name}: a terminal event is a lifecycle event, off the cursor, never advanced over"
        )
    if cls.advance and cls.cursor not in (Cursor.HELD, Cursor.STEPPED_OVER):
        raise TypeError(
            f"event class {name}: Session.advance accepts only events the command matchers step over"
        )


@dataclass(frozen=True)
class WorkflowStarted(
    Event, family=Family.LIFECYCLE, terminal=False, cursor=Cursor.IN_THE_WAY, advance=False
):
    type: ClassVar[str] = "WorkflowStarted"
    workflow_type: str
    input: Any = field(default=None, metadata=PAYLOAD)
    # A DAG run forked by retry-from-node: {node: {"input": ..., "output": ...}} carried over from
    # the source run's succeeded nodes (their side effects are live, so they stay compensable).
    carried: Any = field(default=None, metadata=PAYLOAD)
    forked_from: str | None = None
    # A link of a continue-as-new chain: the chain's first id and this link's number (0 for the
    # first run), from which the next link's id is derived (``_core.ids.derived_id``).
    continued_from: str | None = None
    chain_id: str | None = None
    link: int = 0
    # a child workflow's parent (every link of a continued child names it too)
    parent_id: str | None = None
    # a schedule's tick: its nominal instant (ISO 8601, UTC), or the trigger time of a
    # trigger-now; never the fire time (docs/schedules.md)
    scheduled_for: str | None = None
    # the start priority (0–9), for display and as the default priority of the run's activities;
    # WorkflowStarted is never matched, so it never enters event matching
    priority: int = 0

    def to_data(self) -> dict[str, Any]:
        data = super().to_data()
        if not data["priority"]:
            del data["priority"]  # histories of priority-0 starts read exactly as before
        return data


@dataclass(frozen=True)
class ActivityScheduled(Event, family=Family.COMMAND, terminal=False, cursor=Cursor.MATCHED, advance=False):
    type: ClassVar[str] = "ActivityScheduled"
    activity_id: str
    activity_name: str
    input: Any = field(default=None, metadata=PAYLOAD)
    queue: str = ""
    # True for a dispatch made while a saga/DAG unwind runs. Not a payload field, so it survives
    # erasure; lets a cancel tell that it landed mid-unwind.
    compensation: bool = False
    # How an adopted task is called with ``input`` (``names.CallConvention``): recorded, never
    # inferred from the input's shape. Absent (None): the input is its one argument, as every
    # history written before the field existed. Not a payload field.
    call_convention: str | None = None
    # The canvas node this dispatch runs (its canvas path, ``1.header.2``): a canvas run keys its
    # dispatches by node, since many nodes may call one task. Its own field, never a key of the
    # invocation (the task is never passed it). Absent (None): keyed by activity name. Not a
    # payload field.
    node: str | None = None

    def to_data(self) -> dict[str, Any]:
        data = super().to_data()
        for optional in ("call_convention", "node"):
            if data[optional] is None:
                del data[optional]  # histories without a call or a node read exactly as before
        return data


@dataclass(frozen=True)
class ActivityStarted(Event, family=Family.RESULT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True):
    type: ClassVar[str] = "ActivityStarted"
    activity_id: str
    attempt: int
    worker_id: str


@dataclass(frozen=True)
class ActivityCompleted(
    Event, family=Family.RESULT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True
):
    type: ClassVar[str] = "ActivityCompleted"
    activity_id: str
    output: Any = field(default=None, metadata=PAYLOAD)
    attempt: int = 1


@dataclass(frozen=True)
class ActivityFailed(Event, family=Family.RESULT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True):
    type: ClassVar[str] = "ActivityFailed"
    activity_id: str
    error_type: str
    message: str = field(metadata=SCRUBBED)
    attempt: int = 1


@dataclass(frozen=True)
class MarkerRecorded(Event, family=Family.COMMAND, terminal=False, cursor=Cursor.MATCHED, advance=False):
    type: ClassVar[str] = "MarkerRecorded"
    name: str
    details: Any = field(default=None, metadata=PAYLOAD)


@dataclass(frozen=True)
class SignalReceived(Event, family=Family.INPUT, terminal=False, cursor=Cursor.HELD, advance=True):
    type: ClassVar[str] = "SignalReceived"
    name: str
    payload: Any = field(default=None, metadata=PAYLOAD)


@dataclass(frozen=True)
class TimerStarted(Event, family=Family.COMMAND, terminal=False, cursor=Cursor.MATCHED, advance=False):
    type: ClassVar[str] = "TimerStarted"
    timer_id: str
    seconds: float
    fire_at: str  # ISO-8601, UTC


@dataclass(frozen=True)
class TimerFired(Event, family=Family.RESULT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True):
    type: ClassVar[str] = "TimerFired"
    timer_id: str


@dataclass(frozen=True)
class WorkflowCancelled(
    Event, family=Family.LIFECYCLE, terminal=False, cursor=Cursor.IN_THE_WAY, advance=False
):
    """The seal: never consumed, it stays in the command cursor's way."""

    type: ClassVar[str] = "WorkflowCancelled"
    reason: str = ""


@dataclass(frozen=True)
class WorkflowCancelRequested(
    Event, family=Family.INPUT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True
):
    """A cooperative cancellation request (``Harvest.request_cancellation``): an input event,
    delivered in history order like a signal. From its position on ``ctx.is_cancelled()`` is
    true; it never seals the run and no matcher ever meets it. No payload field."""

    type: ClassVar[str] = "WorkflowCancelRequested"
    reason: str = ""


@dataclass(frozen=True)
class WorkflowTimeoutRequested(
    Event, family=Family.INPUT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True
):
    """A deadline expired (``execution_timeout`` or ``run_timeout``; the sweeper appends it): an
    input event delivered exactly like ``WorkflowCancelRequested``. ``timeout`` is
    ``"execution"`` or ``"run"``. Never a command event (no timer): no matcher ever meets it.
    No payload field."""

    type: ClassVar[str] = "WorkflowTimeoutRequested"
    timeout: str = "execution"
    reason: str = ""


@dataclass(frozen=True)
class UpdateAccepted(Event, family=Family.INPUT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True):
    """An update its validator accepted (``Harvest.update``): an input event delivered in history
    order like a signal, which starts the handler ``name`` as a task. Never on the cursor: the
    handler's ``UpdateCompleted`` is what replay matches."""

    type: ClassVar[str] = "UpdateAccepted"
    update_id: str
    name: str
    arg: Any = field(default=None, metadata=PAYLOAD)


@dataclass(frozen=True)
class UpdateCompleted(Event, family=Family.COMMAND, terminal=False, cursor=Cursor.MATCHED, advance=False):
    """An update handler ended: its ``result``, or (``error_type`` set) its error. A command
    event matched by ``update_id``: a handler that no longer completes where it did diverges,
    like a removed step."""

    type: ClassVar[str] = "UpdateCompleted"
    update_id: str
    result: Any = field(default=None, metadata=PAYLOAD)
    error_type: str = ""
    message: str = field(default="", metadata=SCRUBBED)


@dataclass(frozen=True)
class WorkflowCompleted(
    Event, family=Family.LIFECYCLE, terminal=True, cursor=Cursor.STEPPED_OVER, advance=False
):
    type: ClassVar[str] = "WorkflowCompleted"
    result: Any = field(default=None, metadata=PAYLOAD)


@dataclass(frozen=True)
class WorkflowFailed(
    Event, family=Family.LIFECYCLE, terminal=True, cursor=Cursor.STEPPED_OVER, advance=False
):
    type: ClassVar[str] = "WorkflowFailed"
    error_type: str
    message: str = field(metadata=SCRUBBED)


@dataclass(frozen=True)
class ChildWorkflowScheduled(
    Event, family=Family.COMMAND, terminal=False, cursor=Cursor.MATCHED, advance=False
):
    """A child workflow the workflow started (``ctx.execute_child_workflow``). Its ``child_id``
    is decided once, here, and read back on every replay."""

    type: ClassVar[str] = "ChildWorkflowScheduled"
    child_id: str
    workflow_type: str
    input: Any = field(default=None, metadata=PAYLOAD)
    queue: str = ""
    policy: str = "terminate"  # the parent-close policy
    # started inside an unwind: a compensating child (counted as an unwind's dispatch)
    compensation: bool = False


@dataclass(frozen=True)
class ChildWorkflowStarted(
    Event, family=Family.RESULT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True
):
    """The child's run exists: written with its ``WorkflowStarted``, in the parent's write."""

    type: ClassVar[str] = "ChildWorkflowStarted"
    child_id: str


@dataclass(frozen=True)
class ChildWorkflowStartRefused(
    Event, family=Family.RESULT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True
):
    """A user-given child id that already names a run: the parent's await raises
    ``ExecutionAlreadyExists``, on every replay, without asking again."""

    type: ClassVar[str] = "ChildWorkflowStartRefused"
    child_id: str
    existing_workflow_type: str = ""


@dataclass(frozen=True)
class ChildWorkflowClosed(
    Event, family=Family.RESULT, terminal=False, cursor=Cursor.STEPPED_OVER, advance=True
):
    """A child's close, applied from its notice: once per child id."""

    type: ClassVar[str] = "ChildWorkflowClosed"
    child_id: str
    status: str
    result: Any = field(default=None, metadata=PAYLOAD)
    error_type: str = ""
    message: str = field(default="", metadata=SCRUBBED)


@dataclass(frozen=True)
class WorkflowContinuedAsNew(
    Event, family=Family.LIFECYCLE, terminal=True, cursor=Cursor.STEPPED_OVER, advance=False
):
    """The run ended CONTINUED_AS_NEW; ``next_id`` was created in the same transaction."""

    type: ClassVar[str] = "WorkflowContinuedAsNew"
    next_id: str
    input: Any = field(default=None, metadata=PAYLOAD)


# The closed set: every exhaustive ``match`` over events is checked by mypy against this union.
AnyEvent: TypeAlias = (
    WorkflowStarted
    | ActivityScheduled
    | ActivityStarted
    | ActivityCompleted
    | ActivityFailed
    | MarkerRecorded
    | SignalReceived
    | TimerStarted
    | TimerFired
    | WorkflowCancelled
    | WorkflowCancelRequested
    | WorkflowTimeoutRequested
    | WorkflowCompleted
    | WorkflowFailed
    | ChildWorkflowScheduled
    | ChildWorkflowStarted
    | ChildWorkflowStartRefused
    | ChildWorkflowClosed
    | WorkflowContinuedAsNew
    | UpdateAccepted
    | UpdateCompleted
)
EVENT_CLASSES: tuple[type[Event], ...] = get_args(AnyEvent)
EVENT_TYPES: dict[str, type[Event]] = {cls.type: cls for cls in EVENT_CLASSES}
_CLOSED = frozenset(EVENT_CLASSES)


def _marked(cls: type[Event], role: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(_ROLE) == role[_ROLE])


def payload_fields(cls: type[Event]) -> tuple[str, ...]:
    """The fields of ``cls`` that hold user payloads, in field order."""
    return _marked(cls, PAYLOAD)


def scrubbed_fields(cls: type[Event]) -> tuple[str, ...]:
    """The free-text fields of ``cls`` that erasure replaces by ``[erased]``."""
    return _marked(cls, SCRUBBED)


def check_closed_set(classes: tuple[type[Event], ...]) -> None:
    """Run at import over ``AnyEvent``: every event class of this module is in it, once by stored
    name, and each field typed ``Any`` (user JSON) is declared a payload, so the codec and erasure
    see it."""
    ours = {cls.__name__ for cls in Event.__subclasses__() if cls.__module__ == __name__}
    left_out = ours - {cls.__name__ for cls in classes}
    if left_out or len({cls.type for cls in classes}) != len(classes):
        raise TypeError(f"event classes left out of AnyEvent, or a stored name twice: {sorted(left_out)}")
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.type in ("Any", Any) and f.metadata.get(_ROLE) != PAYLOAD[_ROLE]:
                raise TypeError(f"{cls.__name__}.{f.name} holds user JSON: declare it metadata=PAYLOAD")


check_closed_set(EVENT_CLASSES)


def _family(*families: Family) -> tuple[type[Event], ...]:
    return tuple(cls for cls in EVENT_CLASSES if cls.family in families)


COMMAND_EVENTS = _family(Family.COMMAND)
RESULT_EVENTS = _family(Family.RESULT)
INPUT_EVENTS = _family(Family.INPUT)
TERMINAL_EVENTS = tuple(cls for cls in EVENT_CLASSES if cls.terminal)
# what a command matcher can meet (``Replay.candidates``; never the first WorkflowStarted), and of
# those what the command matchers step over
CANDIDATE_EVENTS = tuple(cls for cls in EVENT_CLASSES if cls.cursor is not Cursor.STEPPED_OVER)
HELD_EVENTS = tuple(cls for cls in EVENT_CLASSES if cls.cursor is Cursor.HELD)
# what ``Session.advance`` accepts after the session's own commands
ADVANCE_EVENTS = tuple(cls for cls in EVENT_CLASSES if cls.advance)
# a cooperative cancellation request, an operator's or a deadline's: delivered alike
CANCEL_REQUESTS = (WorkflowCancelRequested, WorkflowTimeoutRequested)


def known(event: Event) -> AnyEvent:
    """``event`` as a member of the closed set, the subject of an exhaustive ``match``. Any other
    class (one never added to ``AnyEvent``, a subclass of a member) is a programming error."""
    if type(event) not in _CLOSED:
        raise TypeError(f"{type(event).__name__} is not a declared event type (events.AnyEvent)")
    return cast(AnyEvent, event)


def unhandled(event: NoReturn) -> NoReturn:
    """The last arm of an exhaustive ``match``: mypy proves it unreachable."""
    raise TypeError(f"unhandled event type {type(event).__name__}")


_PLAIN: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "bool": bool,
    "str | None": (str, type(None)),
}


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
        if expected is not None and (
            not isinstance(value, expected) or (expected is int and isinstance(value, bool))
        ):
            raise CorruptHistory(
                f"{cls.type} event: field {f.name!r} holds {type(value).__name__}, not {f.type}"
            )
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
    match known(event):
        case ActivityScheduled(activity_name=name, call_convention=None):
            return f"ActivityScheduled({name})"
        case ActivityScheduled(activity_name=name):
            return f"ActivityScheduled({name}, task call)"
        case MarkerRecorded(name=name) | SignalReceived(name=name):
            return f"{event.type}({name})"
        case TimerStarted(timer_id=timer_id):
            return f"TimerStarted({timer_id})"
        case ChildWorkflowScheduled(workflow_type=workflow_type):
            return f"ChildWorkflowScheduled({workflow_type})"
        case (
            ChildWorkflowStarted(child_id=child_id)
            | ChildWorkflowStartRefused(child_id=child_id)
            | ChildWorkflowClosed(child_id=child_id)
        ):
            return f"{event.type}({child_id})"
        case WorkflowContinuedAsNew(next_id=next_id):
            return f"WorkflowContinuedAsNew({next_id})"
        case UpdateAccepted(update_id=update_id) | UpdateCompleted(update_id=update_id):
            return f"{event.type}({update_id})"
        case (
            ActivityStarted(activity_id=activity_id)
            | ActivityCompleted(activity_id=activity_id)
            | ActivityFailed(activity_id=activity_id)
        ):
            return f"{event.type}({activity_id})"
        case (
            WorkflowStarted()
            | TimerFired()
            | WorkflowCancelled()
            | WorkflowCancelRequested()
            | WorkflowCompleted()
            | WorkflowFailed()
        ):
            return event.type
        case WorkflowTimeoutRequested(timeout=timeout):
            return f"WorkflowTimeoutRequested({timeout})"
        case other:
            unhandled(other)
