"""``benchmarks.profile --threads``: an activity thread's time from run histories — the share
inside attempts, the gap before a delivered attempt (an eager one, stamped by the write that
claimed it, leaves none), a delivered attempt's wait and the start to the first decision."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from benchmarks.profile import analyse_threads
from harvest_celery._core import events as ev

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def run(thread: str, offset: float) -> list[ev.HistoryEvent]:
    """Started at ``offset`` ms; step a delivered (scheduled at +10, claimed at +30, done at
    +34), step b eager (scheduled and claimed in a's completion write at +34, done at +38)."""
    events = [
        (0, ev.WorkflowStarted("w")),
        (10, ev.ActivityScheduled("a", "step")),
        (30, ev.ActivityStarted("a", 1, thread)),
        (34, ev.ActivityCompleted("a", 1, 1)),
        (34, ev.ActivityScheduled("b", "step")),
        (34, ev.ActivityStarted("b", 1, thread)),
        (38, ev.ActivityCompleted("b", 2, 1)),
    ]
    return [ev.HistoryEvent(seq, e, at(offset + ms)) for seq, (ms, e) in enumerate(events)]


def test_two_runs_on_one_thread_one_after_the_other():
    since, until = T0.timestamp(), at(100).timestamp()
    out = analyse_threads([run("t1", 0), run("t1", 50)], since, until)
    thread = out["threads"]["t1"]
    assert out["runs"] == 2 and thread["attempts"] == 4
    # inside attempts 8 ms of each run, over the thread's span 30..88 ms
    assert thread["in_attempt_share"] == round(16 / 58, 3)
    # one delivered attempt after another of this thread's: 38 -> 80 ms
    assert thread["gap_before_delivered"] == {"n": 1, "p50_ms": 42.0, "p90_ms": 42.0}
    assert out["delivered_attempt_wait"]["p50_ms"] == 30.0  # start (0) to claim (30)
    assert out["start_to_first_decision"]["p50_ms"] == 10.0
