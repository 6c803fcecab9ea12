"""Property tests of the pure engine (issue 14, "Property tests"), through the in-memory Simulator.

One workflow, ``prop_program``, interprets a random *program* given as its input: sequences and
gathers of activities (caught or not), signal waits, sleeps, saga steps (unwound or not, on
cancellation too), ``ctx.patched`` branches and ``ctx.random`` branches. A random *driver* then
plays the world: it completes, fails or starts activities in random order, fires timers, sends
signals (awaited or stray) and sometimes cancels (where the build has cooperative
cancellation, it also requests it, and signal waits may be cancellable). The histories so
recorded are valid by construction, and:

* they replay deterministically: deciding twice gives the same decision, and so does a fresh
  Simulator given the same events (and a sticky, warm replay records what a cold one does);
* every prefix that ends where a decision's output begins decides exactly that output;
* reordered or corrupted copies give a clean ``HarvestError`` or an nd decision — never another
  exception type, never a hang (each replay runs under a wall-clock alarm).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest_celery import ActivityError, Cancelled, Saga, SagaCompensationFailed, activity, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.commands import Decision, RecordMarker
from harvest_celery._core.engine import Activation, EngineConfig, Session, decide, replay_history
from harvest_celery._core.lifecycle import RUNNING, decision_events, has_outcome
from harvest_celery._errors import HarvestError
from harvest_celery.testing import SimRun, Simulator

# ── the program interpreter ──────────────────────────────────────────────────────────────────
ACTS = ["p_act0", "p_act1", "p_act2", "p_act3"]
SIGNALS = ["s0", "s1"]
WF = "prop_program"
# Cooperative cancellation (WorkflowCancelRequested, wait_signal(cancellable=True)) is covered
# when this build has it.
COOPERATIVE = hasattr(SimRun, "request_cancellation")


def _activity(name: str) -> Any:
    return activity(name=name)(lambda x: x)


ACTIVITIES = [_activity(n) for n in [*ACTS, "p_undo"]]


async def _seq(ctx: Any, steps: list[dict[str, Any]]) -> list[Any]:
    return [await _step(ctx, s) for s in steps]


async def _step(ctx: Any, step: dict[str, Any]) -> Any:
    kind = step["k"]
    try:
        if kind == "act":
            return await ctx.execute_activity(ACTS[step["n"]], step["n"])
        if kind == "gather":
            return await ctx.gather(*(_seq(ctx, m) for m in step["members"]))
        if kind == "signal":
            if step.get("cancellable") and COOPERATIVE:
                return await ctx.wait_signal(step["name"], cancellable=True)
            return await ctx.wait_signal(step["name"])
        if kind == "sleep":
            return await ctx.sleep(step["s"])
        if kind == "saga":
            return await _saga(ctx, step)
        if kind == "patch":
            return await _seq(ctx, step["then"]) if ctx.patched(step["id"]) else "old"
        if kind == "rand":
            return await _seq(ctx, step["a"] if ctx.random() < 0.5 else step["b"])
    except (ActivityError, SagaCompensationFailed) as err:
        if step.get("catch"):
            return f"caught {type(err).__name__}"
        raise
    raise AssertionError(kind)


async def _saga(ctx: Any, step: dict[str, Any]) -> str:
    saga = Saga(ctx)
    for n in step["steps"]:
        await saga.step(
            lambda n=n: ctx.execute_activity(ACTS[n], n), lambda value: ctx.execute_activity("p_undo", value)
        )
    if ctx.is_cancelled():
        await saga.compensate_all()
        raise Cancelled(ctx.cancellation_reason() or "cancelled")
    if step["unwind"]:
        await saga.compensate_all()
    return "saga"


@workflow(name=WF)
async def prop_program(ctx: Any, program: list[dict[str, Any]]) -> Any:
    return await _seq(ctx, program)


def programs() -> st.SearchStrategy[list[dict[str, Any]]]:
    leaf = st.one_of(
        st.builds(lambda n, c: {"k": "act", "n": n, "catch": c}, st.integers(0, 3), st.booleans()),
        st.builds(
            lambda s, c: {"k": "signal", "name": s, "cancellable": c}, st.sampled_from(SIGNALS), st.booleans()
        ),
        st.builds(lambda s: {"k": "sleep", "s": s}, st.sampled_from([0, 1, 30])),
        st.builds(
            lambda ns, u, c: {"k": "saga", "steps": ns, "unwind": u, "catch": c},
            st.lists(st.integers(0, 3), min_size=1, max_size=3),
            st.booleans(),
            st.booleans(),
        ),
    )

    def compound(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        inner = st.lists(children, min_size=1, max_size=2)
        return st.one_of(
            st.builds(
                lambda ms, c: {"k": "gather", "members": ms, "catch": c},
                st.lists(inner, min_size=1, max_size=3),
                st.booleans(),
            ),
            st.builds(lambda i, t: {"k": "patch", "id": i, "then": t}, st.sampled_from(["p1", "p2"]), inner),
            st.builds(lambda a, b: {"k": "rand", "a": a, "b": b}, inner, inner),
        )

    return st.lists(st.recursive(leaf, compound, max_leaves=6), min_size=1, max_size=4)


# ── the random world ─────────────────────────────────────────────────────────────────────────
def new_sim(*, sticky: bool = False) -> Simulator:
    return Simulator(prop_program, *ACTIVITIES, sticky=sticky)


def _options(run: SimRun) -> list[tuple[str, str]]:
    """The moves the world can make now, progress first: finish or start an open activity, fire
    a timer, then send a signal (awaited or stray). After a cancel, ``open_activities()`` holds
    only bodies that were already running: they still finish."""
    events = run.events
    started = {e.activity_id for e in events if isinstance(e, ev.ActivityStarted)}
    out: list[tuple[str, str]] = []
    for a in run.open_activities():
        out += [("complete", a.activity_id), ("fail", a.activity_id)]
        if a.activity_id not in started:
            out.append(("start", a.activity_id))
    if run.status == RUNNING:
        fired = {e.timer_id for e in events if isinstance(e, ev.TimerFired)}
        out += [
            ("fire", e.timer_id) for e in events if isinstance(e, ev.TimerStarted) and e.timer_id not in fired
        ]
        out += [("signal", s) for s in SIGNALS]
    return out


def _act(run: SimRun, verb: str, arg: str) -> None:
    started = any(isinstance(e, ev.ActivityStarted) and e.activity_id == arg for e in run.events)
    if verb == "start":
        run.start_activity(arg)
    elif verb == "complete":
        run.complete(arg, f"out-{arg}", started=not started)
    elif verb == "fail":
        run.fail(arg, "RuntimeError", f"boom-{arg}", started=not started)
    elif verb == "fire":
        run.append(ev.TimerFired(arg))
    elif verb == "signal":
        run.signal(arg, {"from": "driver"})
    elif verb == "cancel":
        run.cancel("driver")
    elif verb == "request":
        run.request_cancellation("driver")  # type: ignore[attr-defined]


def drive(
    run: SimRun, choose: Any, cancel_at: int | None = None, request_at: int | None = None, max_moves: int = 30
) -> list[tuple[str, str]]:
    """Play the world until the run has an outcome, nothing can move, or ``max_moves``; returns
    the moves made. ``choose(options)`` picks one; the run is cancelled (sealed) at move
    ``cancel_at``, and asked to cancel (cooperatively) at move ``request_at``."""
    moves: list[tuple[str, str]] = []
    run.decide()
    for i in range(max_moves):
        assert run.nd is None, f"a valid history diverged: {run.nd}"
        if has_outcome(run.events):
            break
        options = _options(run)
        if i == cancel_at and run.status == RUNNING:
            options = [("cancel", "")]
        elif i == request_at and run.status == RUNNING and COOPERATIVE:
            options = [("request", "")]
        if not options:
            break
        move = choose(options)
        moves.append(move)
        _act(run, *move)
        if move[0] != "cancel":  # cancel() runs the post-cancel decision itself
            run.decide()
    return moves


@dataclass
class Recorded:
    program: list[dict[str, Any]]
    run: SimRun
    moves: list[tuple[str, str]]


@st.composite
def recorded_runs(draw: Any, sticky: bool | None = None) -> Recorded:
    program = draw(programs())
    warm = draw(st.booleans()) if sticky is None else sticky
    run = new_sim(sticky=warm).start(WF, program, execution_id=draw(st.sampled_from(["r-1", "r-2"])))
    cancel_at, request_at = (draw(st.one_of(st.none(), st.integers(0, 12))) for _ in range(2))
    picks = iter(draw(st.lists(st.integers(0, 11), min_size=30, max_size=30)))
    moves = drive(run, lambda options: options[next(picks) % len(options)], cancel_at, request_at)
    return Recorded(program, run, moves)


# ── helpers ──────────────────────────────────────────────────────────────────────────────────
class Hang(Exception):
    pass


@contextmanager
def deadline(seconds: float = 3.0) -> Iterator[None]:
    """A per-example wall-clock deadline (SIGALRM) that interrupts a replay that does not return.
    The alarm pytest-timeout may have set is put back, less the time spent here."""

    def alarm(_signum: int, _frame: Any) -> None:
        raise Hang(f"no answer within {seconds}s")

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, alarm)
    outer, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001), interval)


def cold(history: list[ev.HistoryEvent], execution_id: str) -> Decision:
    sim = new_sim()
    activation = Activation(execution_id, WF, list(history), EngineConfig())
    return decide(sim.registry.workflow(WF), activation, sim.registry)


COMMANDS = ev.COMMAND_EVENTS


# deadline=None: hypothesis's own deadline only flags slow examples after they return; the
# SIGALRM deadline above is what stops a hang. database=None: nothing written into the tree.
PROPS = settings(deadline=None, max_examples=80, database=None, suppress_health_check=[HealthCheck.too_slow])


# ── valid histories ──────────────────────────────────────────────────────────────────────────
@PROPS
@given(recorded_runs())
def test_a_recorded_history_replays_deterministically(rec: Recorded):
    run = rec.run
    with deadline():
        first = cold(run.history, run.execution_id)
        second = cold(run.history, run.execution_id)
        fresh = new_sim().run_from_history(WF, run.events, run.execution_id)
        again = fresh.decide()
        probe = run.replay()
    assert first == second == again
    assert first.nd is None
    assert fresh.history[: len(run.history)] == run.history  # same events, same times
    if has_outcome(run.events):
        assert first.commands == [] and first.outcome is not None
    # the probe never records: same non-marker commands, same outcome
    assert probe.nd is None and probe.outcome == first.outcome
    assert [c for c in probe.commands if not _is_marker(c)] == [
        c for c in first.commands if not _is_marker(c)
    ]


def _is_marker(command: Any) -> bool:
    return isinstance(command, RecordMarker)


@PROPS
@given(st.data())
def test_a_warm_sticky_replay_records_what_a_cold_replay_records(data: Any):
    rec = data.draw(recorded_runs(sticky=True))
    cold_run = new_sim(sticky=False).start(WF, rec.program, execution_id=rec.run.execution_id)
    moves = iter(rec.moves)
    replayed = drive(cold_run, lambda options: next(moves))
    assert replayed == rec.moves
    assert cold_run.history == rec.run.history and cold_run.status == rec.run.status


@PROPS
@given(recorded_runs(), st.data())
def test_a_replay_left_behind_catches_up_to_what_a_cold_replay_decides(rec: Recorded, data: Any):
    """``Session.catch_up``: a replay kept at any point of a history (another process took the
    decisions since), fed the rest, decides what a cold replay of the whole decides; it may
    refuse, never decide otherwise, and it does not refuse a whole tail of commands and results."""
    history, run_id = rec.run.history, rec.run.execution_id
    k = data.draw(st.integers(1, len(history)))
    j = data.draw(st.integers(k, len(history)))
    sim = new_sim()
    with deadline():
        kept = Session(
            sim.registry.workflow(WF), Activation(run_id, WF, history[:k], EngineConfig()), sim.registry
        )
        try:
            reusable, pending = kept.reusable, len(kept.decision.commands)
            caught = kept.catch_up(history[k:j], EngineConfig())
        finally:
            kept.close()
        whole = cold(history[:j], run_id)
    if caught is not None:
        assert caught == whole
    # what a caller gives: a tail of commands and results that ends between two decisions (a
    # decision's commands are written together), holding the commands the replay has yet to see
    takeable = all(isinstance(h.event, COMMANDS + ev.ADVANCE_EVENTS) for h in history[k:j])
    mid_block = 0 < j < len(history) and all(isinstance(h.event, COMMANDS) for h in history[j - 1 : j + 1])
    if reusable and takeable and not mid_block and (j > k or not pending) and whole.nd is None:
        assert caught is not None, (k, j, [h.event.type for h in history[k:j]])


@PROPS
@given(recorded_runs())
def test_a_catch_up_refuses_a_tail_whose_commands_the_code_does_not_issue(rec: Recorded):
    """A recorded command changed under a replay kept before it (another activity name): the
    catch-up refuses (None), where a full replay would report the divergence."""
    history, run_id = rec.run.history, rec.run.execution_id
    at = next((i for i, h in enumerate(history) if i and isinstance(h.event, ev.ActivityScheduled)), None)
    if at is None:
        return
    changed = [*history[:at], _renamed(history[at]), *history[at + 1 :]]
    sim = new_sim()
    with deadline():
        kept = Session(
            sim.registry.workflow(WF), Activation(run_id, WF, history[:1], EngineConfig()), sim.registry
        )
        try:
            assert kept.catch_up(changed[1:], EngineConfig()) is None
        finally:
            kept.close()


def _renamed(item: ev.HistoryEvent) -> ev.HistoryEvent:
    assert isinstance(item.event, ev.ActivityScheduled)
    event = dataclasses.replace(item.event, activity_name="p_other")
    return ev.HistoryEvent(item.seq, event, item.recorded_at)


@PROPS
@given(recorded_runs())
def test_every_prefix_replays_to_the_commands_recorded_next(rec: Recorded):
    """For every prefix: the decision taken on it appends exactly what the history holds next —
    the next decision's commands and outcome where one begins, nothing between two decisions
    (a decision with nothing new to act on issues nothing), the rest of the block mid-block."""
    history = rec.run.history
    events = rec.run.events
    for k in range(1, len(history) + 1):
        with deadline():
            decision = cold(history[:k], rec.run.execution_id)
        assert decision.nd is None, (k, decision.nd)
        produced = decision_events(decision, events[:k])
        assert produced == _block(events, k), (k, produced, _block(events, k))


def _block(events: list[ev.Event], k: int) -> list[ev.Event]:
    """The output of the decision taken on ``events[:k]``: its commands, then its outcome."""
    j = k
    while j < len(events) and isinstance(events[j], COMMANDS):
        j += 1
    if j < len(events) and isinstance(events[j], ev.TERMINAL_EVENTS):
        j += 1
    return events[k:j]


# ── reordered and corrupted histories ───────────────────────────────────────────────────────
def _data(history: list[ev.HistoryEvent]) -> list[dict[str, Any]]:
    return [h.event.to_data() for h in history]


def _rebuild(items: list[dict[str, Any]], like: list[ev.HistoryEvent]) -> list[ev.HistoryEvent]:
    times = [h.recorded_at for h in like]
    times += [times[-1]] * (len(items) - len(times))
    return [ev.HistoryEvent(i, ev.event_from_data(d), times[i]) for i, d in enumerate(items)]


TEXT_FIELDS = {
    "ActivityScheduled": ["activity_name", "activity_id"],
    "MarkerRecorded": ["name"],
    "TimerStarted": ["timer_id"],
    "TimerFired": ["timer_id"],
    "SignalReceived": ["name"],
    "ActivityCompleted": ["activity_id"],
    "ActivityFailed": ["activity_id", "error_type"],
    "ActivityStarted": ["activity_id"],
}


def mutations(items: list[dict[str, Any]]) -> st.SearchStrategy[tuple[str, Any]]:
    n = len(items)
    commands = [
        i for i, d in enumerate(items) if d["type"] in ("ActivityScheduled", "MarkerRecorded", "TimerStarted")
    ]
    options: list[st.SearchStrategy[tuple[str, Any]]] = []
    if len(commands) >= 2:
        options.append(
            st.tuples(
                st.just("swap"), st.lists(st.sampled_from(commands), min_size=2, max_size=2, unique=True)
            )
        )
    scheduled = [i for i in commands if items[i]["type"] == "ActivityScheduled"]
    if scheduled:
        options.append(
            st.tuples(
                st.just("rename"),
                st.tuples(st.sampled_from(scheduled), st.sampled_from([*ACTS, "p_undo", "gone"])),
            )
        )
    if n > 1:
        options.append(st.tuples(st.just("drop"), st.integers(1, n - 1)))
    options += [
        st.tuples(st.just("truncate"), st.tuples(st.integers(1, max(1, n - 1)), st.integers(0, 3))),
        st.tuples(st.just("unknown"), st.integers(1, n)),
    ]
    return st.one_of(options)


def mutate(items: list[dict[str, Any]], mutation: tuple[str, Any]) -> list[dict[str, Any]] | None:
    """A corrupted copy, or None when the mutation changes nothing."""
    kind, arg = mutation
    out = [dict(d) for d in items]
    if kind == "unknown":
        out.insert(min(arg, len(out)), {"type": "ActivityTeleported", "v": 1, "activity_id": "1"})
    elif kind == "drop":
        del out[arg]
    elif kind == "swap":
        i, j = arg
        if out[i] == out[j]:
            return None
        out[i], out[j] = out[j], out[i]
    elif kind == "rename":
        i, name = arg
        if out[i]["activity_name"] == name:
            return None
        out[i]["activity_name"] = name
    elif kind == "truncate":
        i, keep = arg
        fields = TEXT_FIELDS.get(out[i]["type"], [])
        if not fields:
            return None
        for f in fields:
            out[i][f] = str(out[i][f])[:keep]
        if out[i] == items[i]:
            return None
    return out


def _sealed(items: list[dict[str, Any]]) -> bool:
    return any(d["type"] == "WorkflowCancelled" for d in items)


@settings(PROPS, max_examples=150)
@given(st.data())
def test_reordered_or_corrupted_histories_give_a_clean_error_or_an_nd_decision(data: Any):
    rec = data.draw(recorded_runs())
    items = _data(rec.run.history)
    mutation = data.draw(mutations(items))
    corrupted = mutate(items, mutation)
    if corrupted is None:
        return
    sim = new_sim()
    outcome: Any
    try:
        with deadline():
            history = _rebuild(corrupted, rec.run.history)
            outcome = cold(history, rec.run.execution_id)
            probe = replay_history(sim.registry.workflow(WF), rec.run.execution_id, history, sim.registry)
            assert (probe.nd is None) == (outcome.nd is None)
    except HarvestError as exc:
        outcome = exc
    # a Hang or any other exception type fails the test here
    if mutation[0] == "unknown":
        assert type(outcome).__name__ == "UnknownEventType"
    elif _matcher_sees(mutation, items) and not _sealed(items):
        # a recorded command the code does not issue at that point is always a divergence
        assert isinstance(outcome, Decision) and outcome.nd is not None, (mutation, outcome)


def _match_key(data: dict[str, Any]) -> tuple[str, ...]:
    """What a command matcher compares: the kind, and the activity or marker name. A timer is
    matched by kind alone (its id and duration are read back from the history)."""
    if data["type"] == "ActivityScheduled":
        return ("activity", data["activity_name"])
    if data["type"] == "MarkerRecorded":
        return ("marker", data["name"])
    return (data["type"],)


def _matcher_sees(mutation: tuple[str, Any], items: list[dict[str, Any]]) -> bool:
    if mutation[0] == "rename":
        return True
    if mutation[0] == "swap":
        i, j = mutation[1]
        return _match_key(items[i]) != _match_key(items[j])
    return False


# ── findings: engine behaviour the properties flagged (see the report of issue 14) ───────────
def test_an_event_missing_a_required_field_is_a_clean_harvest_error():
    data = {"type": "ActivityScheduled", "v": 1, "activity_name": "p_act0"}
    with pytest.raises(HarvestError):
        ev.event_from_data(data)


def test_a_history_without_its_workflow_started_is_a_clean_harvest_error():
    run = new_sim().start(WF, [{"k": "act", "n": 0, "catch": False}])
    run.decide()
    run.complete("1", "x")
    headless = [ev.HistoryEvent(i, h.event, h.recorded_at) for i, h in enumerate(run.history[1:])]
    with pytest.raises(HarvestError):
        cold(headless, run.execution_id)
    with pytest.raises(HarvestError):
        replay_history(new_sim().registry.workflow(WF), run.execution_id, headless, new_sim().registry)


def test_an_event_field_of_the_wrong_type_is_a_clean_harvest_error():
    run = new_sim().start(WF, [{"k": "act", "n": 0, "catch": False}])
    run.decide()
    run.complete("1", "x")
    items = _data(run.history)
    items[-1]["activity_id"] = ["1"]
    with pytest.raises(HarvestError):
        cold(_rebuild(items, run.history), run.execution_id)
