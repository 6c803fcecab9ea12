"""A limited activity's completion in ONE trip (``_store.handoff``) on real Postgres, in process
(the engine's in-process dispatcher, as ``test_completion_paths``):

* a step under a concurrency limit completes on the one-statement path
  (``harvest_decisions_total{path="one_statement"}``, no fallback counted); the slot it held is
  handed on in the same trip, to its run's next step under the same limit when nothing waits
  ahead of it, and the last step's slot, which nobody takes, is settled under the lock in a
  transaction of its own;
* the hand-off goes to the row waiting longest, not to the run's own next step;
* a completion whose guard refuses it (a signal landed between the claim and the completion)
  writes nothing and hands nothing on: the waiting row is still waiting once that trip returned
  (it ran in autocommit: what it did is visible to any connection);
* a next step under another key of a keyed limit leaves the path (``limited``);
* after every test, each limit's ``in_use`` equals its scheduled and running rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harvest_celery import Harvest, WorkflowContext, activity, workflow
from harvest_celery._store import handoff

from .conftest import DATABASE_URL
from .paths import counted, decisions, fallbacks, run_id
from .test_limits import assert_in_use_matches

pytestmark = pytest.mark.integration


@activity(name="lt_step", concurrency=1)
def lt_step(x: Any) -> Any:
    return x


@activity(name="lt_keyed", concurrency=1, limit_key=lambda i: i["key"])
def lt_keyed(x: Any) -> Any:
    return x["n"]


@workflow(name="lt_seq")
async def lt_seq(ctx: WorkflowContext, n: int) -> int:
    """``n`` steps under ``concurrency=1``, one after another."""
    total = 0
    for i in range(n):
        total += await ctx.execute_activity(lt_step, i + 1)
    return total


@workflow(name="lt_nudged")
async def lt_nudged(ctx: WorkflowContext, n: int) -> list[Any]:
    """Two limited steps, saying whether a ``nudge`` signal had arrived when it closed."""
    nudge = ctx.wait_signal("nudge")
    first = await ctx.execute_activity(lt_step, n)
    second = await ctx.execute_activity(lt_step, first + 1)
    return [second, nudge.done()]


@workflow(name="lt_keys")
async def lt_keys(ctx: WorkflowContext, keys: list[str]) -> list[Any]:
    """One ``lt_keyed`` step per key, one after another."""
    return [await ctx.execute_activity(lt_keyed, {"key": k, "n": i}) for i, k in enumerate(keys)]


_MADE: list[Harvest] = []


@pytest.fixture(autouse=True)
def _dispose(harvest: Any) -> Iterator[None]:
    yield
    assert_in_use_matches(harvest)
    while _MADE:
        _MADE.pop().store.dispose()


def make() -> Harvest:
    h = Harvest(DATABASE_URL).register(lt_step, lt_keyed, lt_seq, lt_nudged, lt_keys)
    _MADE.append(h)
    return h


def status(h: Harvest, rid: str) -> str:
    """The status of the run's first activity row."""
    return str(h.store.activity_rows(rid)[0]["status"])


def spy(monkeypatch: Any, watch: Any = None) -> list[tuple[bool, list[str], bool, Any]]:
    """Each one-trip write: was it written, the runs whose rows it released (claimed for the
    thread or staged), whether it left its slot to the settle after it, and ``watch()`` read
    once it returned (on another connection)."""
    seen: list[tuple[bool, list[str], bool, Any]] = []
    real = handoff.write

    def write(tx: Any, guarded: Any, taking: Any, now: Any) -> bool:
        before = len(tx.dispatches)
        written = real(tx, guarded, taking, now)
        released = [d.execution_id for d in tx.dispatches[before:]]
        seen.append((written, released, bool(tx.settle_after), watch() if watch else None))
        return written

    monkeypatch.setattr(handoff, "write", write)
    return seen


def at_completion(h: Harvest, rid: str, nth: int, land: Any) -> list[str]:
    """Land ``land()`` once, as the run's ``nth`` step completes (before its decision's write)."""
    landed: list[str] = []

    def seam(execution_id: str) -> None:
        completed = [e for e in h.history(rid) if e.event.type == "ActivityCompleted"]
        if execution_id == rid and len(completed) == nth - 1 and not landed:
            landed.append(execution_id)
            land()

    h.runtime.before_inline_decision = seam
    return landed


def test_a_limited_step_completes_in_one_trip_and_hands_its_slot_to_the_next_step(harvest, monkeypatch):
    h = make()
    rid = run_id("lt")
    trips = spy(monkeypatch)
    before, steps = fallbacks(), decisions("one_statement", "lt_seq")
    h.start_workflow("lt_seq", 3, execution_id=rid)
    assert h.result(rid, timeout=20) == 6
    assert counted(before) == {}  # no completion left the one-statement path
    assert decisions("one_statement", "lt_seq") - steps == 3
    # steps 1 and 2 handed their slot to the run's next step; nobody took the last one's slot,
    # so it was settled under the lock after that trip (in_use back to 0: the autouse check)
    assert trips == [(True, [rid], False, None), (True, [rid], False, None), (True, [], True, None)]


def test_the_hand_off_goes_to_the_row_waiting_longest_not_to_the_runs_next_step(harvest, monkeypatch):
    h = make()
    first, second = run_id("lt"), run_id("lt")
    trips = spy(monkeypatch)

    def start_behind() -> None:  # another client's start: its step waits for the slot
        other = make()
        other.start_workflow("lt_seq", 1, execution_id=second)
        assert status(other, second) == "waiting"

    landed = at_completion(h, first, 1, start_behind)
    h.start_workflow("lt_seq", 2, execution_id=first)
    assert h.result(first, timeout=20) == 3 and h.result(second, timeout=20) == 1
    assert landed == [first]
    # the first step's slot went to the other run's row, queued before this run's next step
    assert trips[0] == (True, [second], False, None)
    # the other run's step (cold in this process, its history short: the cold one-statement
    # path, ``_runtime.cold``) handed the slot back to this run's next step in its own trip,
    # which started only once that step had completed
    assert trips[1] == (True, [first], False, None)
    assert trips[2:] == [(True, [], True, None)]  # this run's last step: nobody takes its slot
    done = [e.recorded_at for e in h.history(second) if e.event.type == "ActivityCompleted"]
    started = [e.recorded_at for e in h.history(first) if e.event.type == "ActivityStarted"]
    assert done[0] <= started[1]


def test_a_guard_refused_one_trip_write_hands_nothing_on(harvest, monkeypatch):
    h = make()
    rid, behind = run_id("lt"), run_id("lt")
    trips = spy(monkeypatch, watch=lambda: status(h, behind))

    def land() -> None:
        make().start_workflow("lt_seq", 1, execution_id=behind)  # waits for the slot
        h.signal(rid, "nudge", {"n": 1})  # the run moves on: the guard refuses the write

    landed = at_completion(h, rid, 1, land)
    before = fallbacks()
    h.start_workflow("lt_nudged", 3, execution_id=rid)
    assert h.result(rid, timeout=20) == [4, True] and h.result(behind, timeout=20) == 1
    assert landed == [rid]
    assert trips[0] == (False, [], False, "waiting")  # refused: the row behind still waits
    # the ordinary transaction recorded it and handed its slot to the row behind, whose run is
    # cold in this process (another client decided it): its completion took the cold
    # one-statement path (``_runtime.cold``), no fallback counted
    assert counted(before) == {"guard": 1}


def test_a_next_step_under_another_key_leaves_the_one_trip_path(harvest, monkeypatch):
    h = make()
    same, other = run_id("lt"), run_id("lt")
    trips = spy(monkeypatch)
    before = fallbacks()
    h.start_workflow("lt_keys", ["k1", "k1"], execution_id=same)
    assert h.result(same, timeout=20) == [0, 1]
    assert counted(before) == {} and [released for _, released, _, _ in trips] == [[same], []]
    del trips[:]
    h.start_workflow("lt_keys", ["k1", "k2"], execution_id=other)
    assert h.result(other, timeout=20) == [0, 1]
    # the step under k2 settles its own key in the lock order: the ordinary transaction
    assert counted(before) == {"limited": 1} and len(trips) == 1
