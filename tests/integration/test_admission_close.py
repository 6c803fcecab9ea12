"""A limited workflow's close in ONE trip (``admission.close_in_one_trip``) on real Postgres, in
process (the engine's in-process dispatcher, as ``test_completion_paths``):

* the close takes the one-statement path (``harvest_decisions_total{path="one_statement"}``, no
  fallback counted), frees its slot and admits the next waiting run in the same trip: the
  admitted run's decision request is staged by that trip;
* a close whose guard refuses it (a signal landed between the claim and the completion) writes
  nothing and admits nothing: the waiting run is still waiting once that trip has returned (it
  ran in autocommit, so what it did is visible to any connection); the ordinary transaction
  then closes the run and admits it;
* with a driver whose trip's statements do not commit together (psycopg 3), the close leaves
  the one-statement path as before (``admission``).
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, activity, workflow
from harvest_celery._store import admission
from harvest_celery._store.dialect import Dialect
from harvest_celery._store.records import Dispatch
from harvest_celery._store.schema import executions, limits

from .conftest import DATABASE_URL
from .paths import counted, decisions, fallbacks, run_id

pytestmark = pytest.mark.integration


@activity(name="ac_step", retry=RetryPolicy(max_attempts=3, initial_interval=0))
def ac_step(x: Any) -> Any:
    return x


@workflow(name="ac_limited", concurrency=1)
async def ac_limited(ctx: WorkflowContext, x: Any) -> Any:
    """Two steps under one global admission limit of 1: its close frees the slot."""
    return await ctx.execute_activity(ac_step, await ctx.execute_activity(ac_step, x))


@workflow(name="ac_nudged", concurrency=1)
async def ac_nudged(ctx: WorkflowContext, x: Any) -> Any:
    """``ac_limited``, saying whether a ``nudge`` signal had arrived when it closed."""
    nudge = ctx.wait_signal("nudge")
    done = await ctx.execute_activity(ac_step, await ctx.execute_activity(ac_step, x))
    return [done, nudge.done()]


_MADE: list[Harvest] = []


@pytest.fixture(autouse=True)
def _dispose() -> Any:
    yield
    while _MADE:
        _MADE.pop().store.dispose()


def make() -> Harvest:
    h = Harvest(DATABASE_URL).register(ac_step, ac_limited, ac_nudged)
    _MADE.append(h)
    return h


def admitted_at(h: Harvest, rid: str) -> Any:
    with h.store.engine.connect() as conn:
        return conn.execute(sa.select(executions.c.admitted_at).where(executions.c.id == rid)).scalar()


def in_use(h: Harvest, name: str) -> int:
    c = limits.c
    with h.store.engine.connect() as conn:
        found = conn.execute(sa.select(c.in_use).where((c.name == name) & (c.key_digest == ""))).scalar()
    return int(found or 0)


def spy(monkeypatch: Any, h: Harvest, waiting: str | list[str]) -> list[tuple[bool, Any, list[str]]]:
    """Each one-trip close: was it written, the waiting run's ``admitted_at`` once it returned
    (read on another connection), and the runs whose decision it requested. ``waiting``: the
    run's id, or a list its id is put in once known."""
    seen: list[tuple[bool, Any, list[str]]] = []
    real = admission.close_in_one_trip

    def close(tx: Any, statement: Any, now: Any) -> bool:
        before = len(tx.dispatches)
        written = real(tx, statement, now)
        decided = [d.execution_id for d in tx.dispatches[before:] if d.kind == Dispatch.DECIDE]
        rid = waiting if isinstance(waiting, str) else waiting[0]
        seen.append((written, admitted_at(h, rid), decided))
        return written

    monkeypatch.setattr(admission, "close_in_one_trip", close)
    return seen


def before_the_close(h: Harvest, rid: str, land: Any) -> list[str]:
    """Land ``land()`` once, as the run's last step completes (its decision closes it)."""
    landed: list[str] = []

    def seam(execution_id: str) -> None:
        completed = [e for e in h.history(rid) if e.event.type == "ActivityCompleted"]
        if execution_id == rid and len(completed) == 1 and not landed:
            landed.append(execution_id)
            land()

    h.runtime.before_inline_decision = seam
    return landed


def start_waiting(name: str, x: Any, rid: str) -> None:
    """A start that waits for the slot, made by another client (embedded mode runs a start's
    work before returning: this client's own queue is not drained here)."""
    other = make()
    other.start_workflow(name, x, execution_id=rid)
    assert admitted_at(other, rid) is None


def test_a_one_trip_close_frees_its_slot_and_admits_the_next_waiting_run(harvest, monkeypatch):
    h = make()
    first, second = run_id("ac"), run_id("ac")
    trips = spy(monkeypatch, h, second)
    landed = before_the_close(h, first, lambda: start_waiting("ac_limited", 2, second))
    before, steps = fallbacks(), decisions("one_statement", "ac_limited")
    h.start_workflow("ac_limited", 1, execution_id=first)
    assert h.result(first, timeout=20) == 1 and h.result(second, timeout=20) == 2
    assert landed == [first]
    assert counted(before) == {}  # no close left the one-statement path
    assert decisions("one_statement", "ac_limited") - steps == 4  # both steps of both runs
    assert len(trips) == 2
    (wrote, admitted, decided), (wrote_again, _, decided_again) = trips
    assert wrote and admitted is not None and decided == [second]  # the first's close admitted it
    assert wrote_again and decided_again == []  # nobody waits behind the second
    assert in_use(h, "ac_limited") == 0  # stored by the last close's settle


def test_a_guard_refused_one_trip_close_admits_nothing(harvest, monkeypatch):
    h = make()
    rid, waiting = run_id("ac"), run_id("ac")
    trips = spy(monkeypatch, h, waiting)

    def land() -> None:
        start_waiting("ac_nudged", 4, waiting)
        h.signal(rid, "nudge", {"n": 1})  # the run moves on: the guard refuses the write

    landed = before_the_close(h, rid, land)
    before = fallbacks()
    h.start_workflow("ac_nudged", 3, execution_id=rid)
    assert h.result(rid, timeout=20) == [3, True]
    assert h.result(waiting, timeout=20) == [4, False]
    assert landed == [rid]
    # the refused trip: nothing written, the waiting run still waiting, no decision requested
    assert trips[0] == (False, None, [])
    assert counted(before) == {"guard": 1}  # the ordinary transaction closed it and admitted
    assert [wrote for wrote, _, _ in trips[1:]] == [True]  # the admitted run's own close


def test_a_one_trip_close_defers_admitting_a_reset_with_held_rows_to_a_transaction_of_its_own(
    harvest, monkeypatch
):
    h = make()
    source, holder, new = run_id("ac"), run_id("ac"), []
    assert h.start_workflow("ac_limited", 7, execution_id=source) is not None
    assert h.result(source, timeout=20) == 7
    trips = spy(monkeypatch, h, new)

    def reset_behind() -> None:
        other = make()
        kinds = [e.event.type for e in other.history(source)]
        # to just after ActivityScheduled: its activity is re-dispatched held (the slot is busy)
        new.append(other.reset(source, kinds.index("ActivityScheduled") + 1))
        assert admitted_at(other, new[0]) is None

    landed = before_the_close(h, holder, reset_behind)
    h.start_workflow("ac_limited", 8, execution_id=holder)
    assert h.result(holder, timeout=20) == 8 and landed == [holder]
    assert h.result(new[0], timeout=20) == 7
    # the holder's trip closed it and admitted nothing (the reset's rows are held: release_held
    # is Python's); a transaction of its own admitted the reset and released its rows
    assert trips[0] == (True, None, [])
    assert admitted_at(h, new[0]) is not None
    assert in_use(h, "ac_limited") == 0


def test_a_driver_whose_trip_does_not_commit_together_closes_the_ordinary_way(harvest, monkeypatch):
    monkeypatch.setattr(Dialect, "trip_commits_together", lambda self, driver: False)
    h = make()
    first, second = run_id("ac"), run_id("ac")
    trips = spy(monkeypatch, h, second)
    before_the_close(h, first, lambda: start_waiting("ac_limited", 6, second))
    before = fallbacks()
    h.start_workflow("ac_limited", 5, execution_id=first)
    assert h.result(first, timeout=20) == 5 and h.result(second, timeout=20) == 6
    assert counted(before) == {"admission": 2} and trips == []
    assert in_use(h, "ac_limited") == 0
