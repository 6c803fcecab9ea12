"""The closed event set: every event type through the command cursor, ``Session.advance``,
``deliver``, ``describe`` and the timeline, the payload pipeline's encode and decode, and erasure.

The sets below are written out literally, as they were before the event types declared their
families on their classes: replay must not change, so every set derived from the declarations
equals these. A new event type fails ``test_every_type_has_a_sample`` until it is added here, and
every test then tells it what its declarations give it.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import pytest

from harvest_celery._core import events as ev
from harvest_celery._core.engine import Activation, EngineConfig, Replay, Session
from harvest_celery._core.registry import Registry, WorkflowDefinition
from harvest_celery._core.timeline import render_timeline
from harvest_celery._errors import UnknownEventType
from harvest_celery._payloads.erasure import ERASED, ERASED_TEXT, erase_event
from harvest_celery._payloads.fields import PAYLOAD_FIELDS
from harvest_celery._payloads.pipeline import Payloads, needs_decode

SECRET = "4111-1111"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

# one of each type, every payload field holding the secret
SAMPLES: dict[str, ev.Event] = {
    "WorkflowStarted": ev.WorkflowStarted(
        "wf", {"card": SECRET}, {"n": {"input": SECRET, "output": 1}}, "src"
    ),
    "ActivityScheduled": ev.ActivityScheduled("1", "charge", {"card": SECRET}, "payments", False),
    "ActivityStarted": ev.ActivityStarted("1", 1, "worker-1"),
    "ActivityCompleted": ev.ActivityCompleted("1", {"receipt": SECRET}, 1),
    "ActivityFailed": ev.ActivityFailed("2", "ValueError", f"bad card {SECRET}", 3),
    "MarkerRecorded": ev.MarkerRecorded("note", {"seen": SECRET}),
    "SignalReceived": ev.SignalReceived("go", {"card": SECRET}),
    "TimerStarted": ev.TimerStarted("1", 5.0, "2026-01-01T00:00:05+00:00"),
    "TimerFired": ev.TimerFired("1"),
    "WorkflowCancelled": ev.WorkflowCancelled("operator"),
    "WorkflowCancelRequested": ev.WorkflowCancelRequested("please"),
    "WorkflowTimeoutRequested": ev.WorkflowTimeoutRequested("execution", "execution_timeout of 3s expired"),
    "WorkflowCompleted": ev.WorkflowCompleted({"receipt": SECRET}),
    "WorkflowFailed": ev.WorkflowFailed("ValueError", f"bad card {SECRET}"),
    "ChildWorkflowScheduled": ev.ChildWorkflowScheduled(
        "r-1-c1", "book_trip", {"card": SECRET}, "trips", "abandon", True
    ),
    "ChildWorkflowStarted": ev.ChildWorkflowStarted("r-1-c1"),
    "ChildWorkflowStartRefused": ev.ChildWorkflowStartRefused("mine", "other_wf"),
    "ChildWorkflowClosed": ev.ChildWorkflowClosed(
        "r-1-c1", "FAILED", {"receipt": SECRET}, "E", f"no {SECRET}"
    ),
    "WorkflowContinuedAsNew": ev.WorkflowContinuedAsNew("r-1-n1", {"card": SECRET}),
    "UpdateAccepted": ev.UpdateAccepted("u1", "qty", {"card": SECRET}),
    "UpdateCompleted": ev.UpdateCompleted("u1", {"receipt": SECRET}, "E", f"no {SECRET}"),
}
ALL = tuple(SAMPLES)

# ── today's sets, literally ───────────────────────────────────────────────────────────────────
COMMAND = {"ActivityScheduled", "MarkerRecorded", "TimerStarted", "ChildWorkflowScheduled", "UpdateCompleted"}
RESULT = {
    "ActivityStarted",
    "ActivityCompleted",
    "ActivityFailed",
    "TimerFired",
    "ChildWorkflowStarted",
    "ChildWorkflowStartRefused",
    "ChildWorkflowClosed",
}
INPUT = {"SignalReceived", "WorkflowCancelRequested", "WorkflowTimeoutRequested", "UpdateAccepted"}
TERMINAL = {"WorkflowCompleted", "WorkflowFailed", "WorkflowContinuedAsNew"}
# positions a command matcher can meet (past position 0): commands, signals, the cancel seal,
# and a WorkflowStarted anywhere but first (a corrupt history diverges against it)
CANDIDATES = {
    "ActivityScheduled",
    "MarkerRecorded",
    "TimerStarted",
    "SignalReceived",
    "WorkflowCancelled",
    "WorkflowStarted",
    "ChildWorkflowScheduled",
    "UpdateCompleted",
}
# of those, what the command matcher steps over (the saga marker's drained-signal check sees it)
SKIPPED_BY_COMMANDS = {"SignalReceived"}
# what Session.advance accepts after the session's own commands
ADVANCE = {
    "ActivityStarted",
    "ActivityCompleted",
    "ActivityFailed",
    "TimerFired",
    "SignalReceived",
    "WorkflowCancelRequested",
    "WorkflowTimeoutRequested",
    "ChildWorkflowStarted",
    "ChildWorkflowStartRefused",
    "ChildWorkflowClosed",
    "UpdateAccepted",
}
PAYLOADS = {
    "WorkflowStarted": ("input", "carried"),
    "ActivityScheduled": ("input",),
    "ActivityCompleted": ("output",),
    "MarkerRecorded": ("details",),
    "SignalReceived": ("payload",),
    "WorkflowCompleted": ("result",),
    "ChildWorkflowScheduled": ("input",),
    "ChildWorkflowClosed": ("result",),
    "WorkflowContinuedAsNew": ("input",),
    "UpdateAccepted": ("arg",),
    "UpdateCompleted": ("result",),
}
SCRUBBED = {
    "ActivityFailed": ("message",),
    "WorkflowFailed": ("message",),
    "ChildWorkflowClosed": ("message",),
    "UpdateCompleted": ("message",),
}
DESCRIBED = {
    "WorkflowStarted": "WorkflowStarted",
    "ActivityScheduled": "ActivityScheduled(charge)",
    "ActivityStarted": "ActivityStarted(1)",
    "ActivityCompleted": "ActivityCompleted(1)",
    "ActivityFailed": "ActivityFailed(2)",
    "MarkerRecorded": "MarkerRecorded(note)",
    "SignalReceived": "SignalReceived(go)",
    "TimerStarted": "TimerStarted(1)",
    "TimerFired": "TimerFired",
    "WorkflowCancelled": "WorkflowCancelled",
    "WorkflowCancelRequested": "WorkflowCancelRequested",
    "WorkflowTimeoutRequested": "WorkflowTimeoutRequested(execution)",
    "WorkflowCompleted": "WorkflowCompleted",
    "WorkflowFailed": "WorkflowFailed",
    "ChildWorkflowScheduled": "ChildWorkflowScheduled(book_trip)",
    "ChildWorkflowStarted": "ChildWorkflowStarted(r-1-c1)",
    "ChildWorkflowStartRefused": "ChildWorkflowStartRefused(mine)",
    "ChildWorkflowClosed": "ChildWorkflowClosed(r-1-c1)",
    "WorkflowContinuedAsNew": "WorkflowContinuedAsNew(r-1-n1)",
    "UpdateAccepted": "UpdateAccepted(u1)",
    "UpdateCompleted": "UpdateCompleted(u1)",
}
TIMELINE = {
    "WorkflowStarted": 'wf input={"card":"4111-1111"}',
    "ActivityScheduled": "charge #1 queue=payments",
    "ActivityStarted": "charge #1 attempt=1 worker=worker-1",
    "ActivityCompleted": 'charge #1 attempt=1 -> {"receipt":"4111-1111"}',
    "ActivityFailed": "activity #2 attempt=3 ValueError: bad card 4111-1111",
    "MarkerRecorded": 'note {"seen":"4111-1111"}',
    "SignalReceived": 'go payload={"card":"4111-1111"}',
    "TimerStarted": "timer #1 5s (fires 2026-01-01T00:00:05+00:00)",
    "TimerFired": "timer #1",
    "WorkflowCancelled": 'reason="operator"',
    "WorkflowCancelRequested": 'reason="please"',
    "WorkflowTimeoutRequested": 'execution reason="execution_timeout of 3s expired"',
    "WorkflowCompleted": '-> {"receipt":"4111-1111"}',
    "WorkflowFailed": "ValueError: bad card 4111-1111",
    "ChildWorkflowScheduled": 'book_trip id=r-1-c1 policy=abandon input={"card":"4111-1111"} (compensation)',
    "ChildWorkflowStarted": "id=r-1-c1",
    "ChildWorkflowStartRefused": "id=mine exists (other_wf)",
    "ChildWorkflowClosed": "id=r-1-c1 FAILED E: no 4111-1111",
    "WorkflowContinuedAsNew": '-> r-1-n1 input={"card":"4111-1111"}',
    "UpdateAccepted": 'qty id=u1 arg={"card":"4111-1111"}',
    "UpdateCompleted": "id=u1 E: no 4111-1111",
}


def names(classes: Any) -> set[str]:
    return {cls.type for cls in classes}


def test_every_type_has_a_sample() -> None:
    assert set(ev.EVENT_TYPES) == set(SAMPLES) and len(SAMPLES) == 21
    assert all(type(SAMPLES[name]) is cls for name, cls in ev.EVENT_TYPES.items())


def test_the_families_are_todays() -> None:
    for derived, today in (
        (ev.COMMAND_EVENTS, COMMAND),
        (ev.RESULT_EVENTS, RESULT),
        (ev.INPUT_EVENTS, INPUT),
        (ev.TERMINAL_EVENTS, TERMINAL),
    ):
        assert isinstance(derived, tuple)  # usable with isinstance
        assert names(derived) == today


def test_payload_fields_are_todays() -> None:
    assert PAYLOAD_FIELDS == PAYLOADS


# ── the command cursor ─────────────────────────────────────────────────────────────────────────
async def _waits(ctx: Any, _input: Any) -> None:
    await ctx.wait_signal("never")


DEFINITION = WorkflowDefinition("wf", _waits)


def registry() -> Registry:
    reg = Registry()
    reg.add_workflow(DEFINITION)
    return reg


def history(events: list[ev.Event]) -> list[ev.HistoryEvent]:
    return [ev.HistoryEvent(i, e, T0 + timedelta(seconds=i)) for i, e in enumerate(events)]


def replay_of(events: list[ev.Event]) -> Replay:
    return Replay(DEFINITION, Activation("r-1", "wf", history(events)), registry())


def test_candidates_are_todays() -> None:
    events = [SAMPLES["WorkflowStarted"], *SAMPLES.values()]
    replay = replay_of(events)
    met = [type(events[i]).type for i in replay.candidates]
    assert set(met) == CANDIDATES and len(met) == len(CANDIDATES)
    assert replay.candidates[0] > 0  # the first WorkflowStarted never is one
    commands = {type(events[i]).type for i in replay._rest(skip_signals=True)}
    assert commands == CANDIDATES - SKIPPED_BY_COMMANDS
    assert {type(events[i]).type for i in replay._rest(skip_signals=False)} == CANDIDATES


@pytest.mark.parametrize("name", ALL)
def test_advance_accepts_todays_set(name: str) -> None:
    session = Session(DEFINITION, Activation("r-1", "wf", history([SAMPLES["WorkflowStarted"]])), registry())
    assert session.reusable and session.decision.commands == []
    new = [ev.HistoryEvent(1, SAMPLES[name], T0 + timedelta(seconds=1))]
    decision = session.advance(new, EngineConfig())
    assert (decision is not None) == (name in ADVANCE)
    if decision is not None:  # the warm path is the full replay's answer
        fresh = Session(
            DEFINITION,
            Activation("r-1", "wf", history([SAMPLES["WorkflowStarted"], SAMPLES[name]])),
            registry(),
        )
        assert decision == fresh.decision
        assert session.replay.candidates == fresh.replay.candidates


def _state(replay: Replay) -> dict[str, Any]:
    return {
        "results": sorted(replay.results),
        "fired": sorted(replay.fired_timers),
        "buffered": {k: list(v) for k, v in replay.signal_buffer.items()},
        "request": replay.cancel_request,
        "seal": replay.seal_delivered,
        "consumed": sorted(replay.consumed),
        "time": replay.current_time,
        "children": sorted(replay.children.answers),
    }


def test_deliver_every_type() -> None:
    events = [SAMPLES["WorkflowStarted"], *SAMPLES.values()]
    replay = replay_of(events)
    changed: dict[str, set[str]] = {}
    for index in range(1, len(events)):
        before = _state(replay)
        replay.deliver(index)
        after = _state(replay)
        assert after["time"] == T0 + timedelta(seconds=index)
        changed[type(events[index]).type] = {k for k in before if k != "time" and before[k] != after[k]}
    assert changed == {
        "WorkflowStarted": set(),
        "ActivityScheduled": set(),
        "ActivityStarted": set(),
        "ActivityCompleted": {"results"},
        "ActivityFailed": {"results"},
        "MarkerRecorded": set(),
        "SignalReceived": {"buffered"},
        "TimerStarted": set(),
        "TimerFired": {"fired"},
        "WorkflowCancelled": {"seal"},
        "WorkflowCancelRequested": {"request"},
        "WorkflowTimeoutRequested": set(),  # after the request above: the first one stands
        "WorkflowCompleted": set(),
        "WorkflowFailed": set(),
        "ChildWorkflowScheduled": set(),
        "ChildWorkflowStarted": set(),
        "ChildWorkflowStartRefused": {"children"},
        "ChildWorkflowClosed": {"children"},
        "WorkflowContinuedAsNew": set(),
        # no handler named "qty" here: a divergence, which a sealed replay (the sample seal
        # above) never records; the handler's task, had there been one (tests/unit/test_updates.py)
        "UpdateAccepted": set(),
        "UpdateCompleted": set(),  # a command event: met by the cursor, nothing to deliver
    }


# ── describe, the timeline ─────────────────────────────────────────────────────────────────────
def test_describe_every_type() -> None:
    assert {name: ev.describe(e) for name, e in SAMPLES.items()} == DESCRIBED
    assert [h.describe() for h in history(list(SAMPLES.values()))] == list(DESCRIBED.values())


def test_timeline_every_type() -> None:
    lines = render_timeline(history(list(SAMPLES.values())))
    assert len(lines) == len(SAMPLES)
    for line, (name, detail) in zip(lines, TIMELINE.items(), strict=True):
        assert line.split(None, 3)[2:] == [name, detail], line


# ── stored form, payloads, erasure ─────────────────────────────────────────────────────────────
@pytest.mark.parametrize("name", ALL)
def test_stored_form_round_trips(name: str) -> None:
    data = json.loads(json.dumps(SAMPLES[name].to_data()))
    assert data["type"] == name and data["v"] == ev.EVENT_VERSION
    assert ev.event_from_data(data) == SAMPLES[name]


def test_an_unknown_stored_type_is_refused() -> None:
    with pytest.raises(UnknownEventType):
        ev.event_from_data({"type": "FutureEvent", "v": 1})
    with pytest.raises(UnknownEventType):
        ev.event_from_data({"v": 1})


class WrapCodec:
    codec_id = "wrap"

    def encode(self, value: Any) -> dict[str, Any]:
        return {"_harvest_codec": "wrap", "v": value}

    def decode(self, envelope: dict[str, Any]) -> Any:
        return envelope["v"]


class MemoryStore:
    store_id = "mem"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.blobs[key] = data

    def get(self, key: str) -> bytes:
        return self.blobs[key]

    def delete(self, key: str) -> None:
        self.blobs.pop(key, None)


def _changed(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    return {k for k in a if a[k] != b.get(k)}


@pytest.mark.parametrize("name", ALL)
def test_encode_decode_erase_every_type(name: str) -> None:
    data = SAMPLES[name].to_data()
    payload = set(PAYLOADS.get(name, ()))
    store = MemoryStore()
    for pipeline in (Payloads(WrapCodec()), Payloads(WrapCodec(), store, offload_threshold=0)):
        stored = pipeline.encode_event(data, f"r-1/{name}")
        assert _changed(data, stored) == payload  # every payload field encoded, nothing else
        assert needs_decode(stored) == bool(payload)
        assert ev.event_from_data(pipeline.decode_event(stored)) == SAMPLES[name]
        erased, refs, count = erase_event(stored)
        scrubbed = set(SCRUBBED.get(name, ()))
        assert _changed(stored, erased) == payload | scrubbed and count == len(payload)
        assert all(erased[f] == ERASED for f in payload) and all(erased[f] == ERASED_TEXT for f in scrubbed)
        assert SECRET not in json.dumps(erased)
        assert sorted(refs) == sorted(("mem", f"r-1/{name}/{f}") for f in payload if pipeline.store)
        assert erase_event(erased)[1:] == ([], 0)  # idempotent
    assert sorted(store.blobs) == sorted(f"r-1/{name}/{f}" for f in payload)


def test_samples_hold_the_secret_only_in_payload_and_scrubbed_fields() -> None:
    # a field holding the secret that is neither a payload nor scrubbed would survive erasure
    for name, event in SAMPLES.items():
        holding = {f.name for f in dataclasses.fields(event) if SECRET in json.dumps(getattr(event, f.name))}
        assert holding == set(PAYLOADS.get(name, ())) | set(SCRUBBED.get(name, ())), name


# ── the set is closed: what a new event type is told ──────────────────────────────────────────
DECLARED = {  # name: (family, terminal, cursor, advance)
    "WorkflowStarted": ("lifecycle", False, "in the way", False),
    "ActivityScheduled": ("command", False, "matched", False),
    "ActivityStarted": ("result", False, "stepped over", True),
    "ActivityCompleted": ("result", False, "stepped over", True),
    "ActivityFailed": ("result", False, "stepped over", True),
    "MarkerRecorded": ("command", False, "matched", False),
    "SignalReceived": ("input", False, "held", True),
    "TimerStarted": ("command", False, "matched", False),
    "TimerFired": ("result", False, "stepped over", True),
    "WorkflowCancelled": ("lifecycle", False, "in the way", False),
    "WorkflowCancelRequested": ("input", False, "stepped over", True),
    "WorkflowTimeoutRequested": ("input", False, "stepped over", True),
    "WorkflowCompleted": ("lifecycle", True, "stepped over", False),
    "WorkflowFailed": ("lifecycle", True, "stepped over", False),
    "ChildWorkflowScheduled": ("command", False, "matched", False),
    "ChildWorkflowStarted": ("result", False, "stepped over", True),
    "ChildWorkflowStartRefused": ("result", False, "stepped over", True),
    "ChildWorkflowClosed": ("result", False, "stepped over", True),
    "WorkflowContinuedAsNew": ("lifecycle", True, "stepped over", False),
    "UpdateAccepted": ("input", False, "stepped over", True),
    "UpdateCompleted": ("command", False, "matched", False),
}


def test_each_type_declares_what_it_is() -> None:
    got = {
        name: (cls.family.value, cls.terminal, cls.cursor.value, cls.advance)
        for name, cls in ev.EVENT_TYPES.items()
    }
    assert got == DECLARED
    assert ev.EVENT_CLASSES == tuple(ev.EVENT_TYPES.values()) and set(ev.EVENT_CLASSES) == set(
        typing.get_args(ev.AnyEvent)
    )
    mine = {cls for cls in ev.Event.__subclasses__() if cls.__module__ == ev.__name__}
    assert mine == set(ev.EVENT_CLASSES)


def test_a_class_without_declarations_fails_at_creation() -> None:
    with pytest.raises(TypeError, match="family"):

        @dataclasses.dataclass(frozen=True)
        class Bare(ev.Event):  # type: ignore[call-arg]
            type: ClassVar[str] = "Bare"

    with pytest.raises(TypeError, match="family"):  # a subclass of a member declares again

        class Louder(ev.SignalReceived):  # type: ignore[call-arg]
            type: ClassVar[str] = "Louder"


@pytest.mark.parametrize(
    ("family", "terminal", "cursor", "advance", "says"),
    [
        (ev.Family.RESULT, False, ev.Cursor.MATCHED, False, "command events, and only they"),
        (ev.Family.COMMAND, False, ev.Cursor.HELD, False, "command events, and only they"),
        (ev.Family.RESULT, True, ev.Cursor.STEPPED_OVER, False, "terminal"),
        (ev.Family.LIFECYCLE, False, ev.Cursor.IN_THE_WAY, True, "Session.advance"),
        ("input", False, ev.Cursor.HELD, True, "must be a Family"),
    ],
)
def test_contradictory_declarations_fail_at_creation(
    family: Any, terminal: bool, cursor: Any, advance: bool, says: str
) -> None:
    with pytest.raises(TypeError, match=says):

        class Odd(ev.Event, family=family, terminal=terminal, cursor=cursor, advance=advance):
            type: ClassVar[str] = "Odd"


def test_the_registry_check() -> None:
    ev.check_closed_set(ev.EVENT_CLASSES)
    with pytest.raises(TypeError, match="UpdateCompleted"):  # left out of AnyEvent
        ev.check_closed_set(ev.EVENT_CLASSES[:-1])

    @dataclasses.dataclass(frozen=True)
    class Sneaky(ev.Event, family=ev.Family.INPUT, terminal=False, cursor=ev.Cursor.HELD, advance=True):
        type: ClassVar[str] = "Sneaky"
        payload: Any = None  # user JSON, not declared: it would be stored unencrypted, never erased

    with pytest.raises(TypeError, match=r"Sneaky.payload holds user JSON"):
        ev.check_closed_set((*ev.EVENT_CLASSES, Sneaky))

    @dataclasses.dataclass(frozen=True)
    class Again(ev.Event, family=ev.Family.INPUT, terminal=False, cursor=ev.Cursor.HELD, advance=True):
        type: ClassVar[str] = "SignalReceived"

    with pytest.raises(TypeError, match="a stored name twice"):
        ev.check_closed_set((*ev.EVENT_CLASSES, Again))
    with pytest.raises(TypeError, match="declares no stored type name"):

        class Nameless(ev.Event, family=ev.Family.INPUT, terminal=False, cursor=ev.Cursor.HELD, advance=True):
            pass


@dataclasses.dataclass(frozen=True)
class Undeclared(ev.Event, family=ev.Family.INPUT, terminal=False, cursor=ev.Cursor.HELD, advance=True):
    """Declared on its class but never added to AnyEvent: no exhaustive match knows it."""

    type: ClassVar[str] = "Undeclared"
    name: str = "x"


def test_an_event_outside_the_closed_set_fails_loudly() -> None:
    stray = Undeclared()
    with pytest.raises(TypeError, match="not a declared event type"):
        ev.describe(stray)
    with pytest.raises(TypeError, match="not a declared event type"):
        render_timeline(history([SAMPLES["WorkflowStarted"], stray]))
    replay = replay_of([SAMPLES["WorkflowStarted"], stray])
    with pytest.raises(TypeError, match="not a declared event type"):
        replay.deliver(1)
    assert replay.candidates == []  # never met by a matcher either
    with pytest.raises(UnknownEventType):  # and never read back from storage
        ev.event_from_data(stray.to_data())
