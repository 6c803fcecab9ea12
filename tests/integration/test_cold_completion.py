"""A completion whose run is NOT warm in this process, on real Postgres, in process (the engine's
in-process dispatcher, as ``test_completion_paths``): the cold one-statement path
(``_runtime.cold``).

* with no warm replay kept here (every session dropped, as in the split topology's activity
  worker), a short run's completions are written in one statement from a cold replay: path
  ``one_statement``, ``decision_replays{replay="cold"}``, no fallback (no ``not_warm``);
* a cold read gone stale (a signal lands between the read and the write) is refused by the
  guard: the ordinary transaction records the completion (``guard``), nothing lost or doubled;
* a run whose history is past ``inline_cold_max_events`` is not read: the old way (``not_warm``);
* a warm replay left behind by a decision taken elsewhere reads only the events since and
  catches up over them (``Session.catch_up``): one statement, no ``not_positioned``.
"""

from __future__ import annotations

from typing import Any

import pytest

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, activity, workflow
from harvest_celery._runtime.metrics import METRICS

from .conftest import DATABASE_URL
from .paths import counted, decisions, fallbacks, run_id

pytestmark = pytest.mark.integration


@activity(name="cc_step", retry=RetryPolicy(max_attempts=3, initial_interval=0))
def cc_step(x: Any) -> Any:
    return x + 1


@workflow(name="cc_three")
async def cc_three(ctx: WorkflowContext, x: int) -> int:
    for _ in range(3):
        x = await ctx.execute_activity(cc_step, x)
    return x


@workflow(name="cc_nudged")
async def cc_nudged(ctx: WorkflowContext, x: int) -> list[Any]:
    """Two steps, saying whether a ``nudge`` signal had arrived when it closed."""
    nudge = ctx.wait_signal("nudge")
    done = await ctx.execute_activity(cc_step, await ctx.execute_activity(cc_step, x))
    return [done, nudge.done()]


_MADE: list[Harvest] = []


@pytest.fixture(autouse=True)
def _dispose() -> Any:
    yield
    while _MADE:
        _MADE.pop().store.dispose()


def make(**kwargs: Any) -> Harvest:
    """A client that keeps no warm replay: every completion of its runs is cold here."""
    h = Harvest(DATABASE_URL, **kwargs).register(cc_step, cc_three, cc_nudged)
    h.runtime.sessions.put = lambda execution_id, session: session.close()  # type: ignore[method-assign]
    _MADE.append(h)
    return h


def replays(kind: str) -> float:
    return METRICS.value("decision_replays", {"replay": kind})


def kinds(h: Harvest, rid: str) -> list[str]:
    return [e.event.type for e in h.history(rid)]


def test_a_cold_completion_of_a_short_run_is_written_in_one_statement(harvest):
    h = make()
    rid = run_id("cc")
    before, steps, cold = fallbacks(), decisions("one_statement", "cc_three"), replays("cold")
    h.start_workflow("cc_three", 1, execution_id=rid)
    assert h.result(rid, timeout=20) == 4
    assert counted(before) == {}  # no not_warm: every completion took the cold one-statement path
    assert decisions("one_statement", "cc_three") - steps == 3
    assert replays("cold") - cold >= 3  # each completion replayed cold (and the start's decision)
    assert kinds(h, rid).count("ActivityCompleted") == 3


def test_a_stale_cold_read_is_refused_by_the_guard_and_recorded_the_ordinary_way(harvest):
    h = make()
    rid, landed = run_id("cc"), []

    def seam(execution_id: str) -> None:  # after the cold read, before the guarded write
        if execution_id == rid and not landed:
            landed.append(execution_id)
            h.signal(rid, "nudge", {"n": 1})  # the run moves on: the read is stale

    h.runtime.before_inline_decision = seam
    before, steps = fallbacks(), decisions("one_statement", "cc_nudged")
    h.start_workflow("cc_nudged", 1, execution_id=rid)
    assert h.result(rid, timeout=20) == [3, True]
    assert landed == [rid]
    assert counted(before) == {"guard": 1}  # the ordinary transaction recorded the first step
    assert decisions("one_statement", "cc_nudged") - steps == 1  # the second step: cold, one statement
    history = kinds(h, rid)
    assert history.count("ActivityCompleted") == 2 and history.count("SignalReceived") == 1


def test_a_long_history_is_not_read_cold(harvest):
    # the first step's ActivityStarted is at seq 2 (next seq 3 <= 4): cold one statement; the
    # later ones are past 4 events: the old way, not_warm (and the decision task: cold_history)
    h = make(inline_cold_max_events=4)
    rid = run_id("cc")
    before, steps = fallbacks(), decisions("one_statement", "cc_three")
    h.start_workflow("cc_three", 1, execution_id=rid)
    assert h.result(rid, timeout=20) == 4
    assert counted(before) == {"not_warm": 2}
    assert decisions("one_statement", "cc_three") - steps == 1


def test_a_replay_left_behind_catches_up_over_the_tail_and_completes_in_one_statement(harvest):
    """The second step's completion is taken as if in another process (this one's replay is
    set aside, so it is decided cold); the third finds the replay set aside, one decision
    behind, and catches it up instead of leaving the one-statement path (``not_positioned``)."""
    h = Harvest(DATABASE_URL).register(cc_step, cc_three, cc_nudged)
    _MADE.append(h)
    rid, aside = run_id("cc"), []
    cache, take = h.runtime.sessions, h.runtime.sessions.take

    def taking(execution_id: str) -> Any:
        session = take(execution_id)
        if execution_id != rid or session is None:
            return session
        if not aside:  # the second completion: decided elsewhere (cold here)
            aside.append((session, len(session.events)))
            return None
        if len(aside) == 1:  # the third: the replay kept here, left behind
            aside.append(session)
            session.close()
            return aside[0][0]
        return session

    cache.take = taking  # type: ignore[method-assign]
    before, steps, warm = fallbacks(), decisions("one_statement", "cc_three"), replays("warm")
    h.start_workflow("cc_three", 1, execution_id=rid)
    assert h.result(rid, timeout=20) == 4
    assert len(aside) == 2, aside
    behind, at = aside[0]
    assert len(behind.events) > at  # it was caught up and taken further
    assert counted(before) == {}  # no not_positioned: every completion took one statement
    assert decisions("one_statement", "cc_three") - steps == 3
    assert replays("warm") - warm >= 2  # the first completion's, and the caught-up third's
    assert kinds(h, rid).count("ActivityCompleted") == 3
