"""The one activity fold (``_core.activities``): a run's history into its activities and attempts,
in the run-graph API's words."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import ClassVar

import pytest

from harvest_celery._core import activities as core
from harvest_celery._core import events as ev
from harvest_celery._dag.graph import NODE_STATUSES
from harvest_celery._web import models

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def history(*events: ev.Event) -> list[ev.HistoryEvent]:
    return [ev.HistoryEvent(i, e, T0 + timedelta(seconds=i)) for i, e in enumerate(events)]


def fold(*events: ev.Event, live: bool | None = None) -> list[core.Activity]:
    return core.fold_activities(history(ev.WorkflowStarted("w"), *events), live)


def test_the_words_are_one_set_defined_in_core():
    assert core.STATUSES == ("succeeded", "failed", "timed_out", "cancelled", "running", "pending", "skipped")
    assert NODE_STATUSES is core.STATUSES
    assert typing.get_args(models.NodeStatus) == core.STATUSES
    assert core.FINISHED | core.UNFINISHED | {core.SKIPPED} == set(core.STATUSES)


def test_scheduled_but_not_started_is_pending():
    (a,) = fold(ev.ActivityScheduled("1", "a", {}))
    assert (a.status, a.started, a.attempts, a.attempt_count) == ("pending", False, (), 0)


def test_started_without_a_result_is_running():
    (a,) = fold(ev.ActivityScheduled("1", "a", {}, "q"), ev.ActivityStarted("1", 1, "w1"))
    assert (a.status, a.queue, a.started_at) == ("running", "q", T0 + timedelta(seconds=2))
    assert a.attempts == (core.Attempt(1, "running", T0 + timedelta(seconds=2), "w1"),)


@pytest.mark.parametrize(
    "seal", [ev.WorkflowCancelled("stop"), ev.WorkflowFailed("Terminated", "op"), ev.WorkflowCompleted(None)]
)
def test_without_a_result_on_a_sealed_run_it_is_cancelled(seal):
    started, never = fold(
        ev.ActivityScheduled("1", "a", {}),
        ev.ActivityScheduled("2", "b", {}),
        ev.ActivityStarted("1", 1, "w"),
        seal,
    )
    assert (started.status, never.status) == ("cancelled", "cancelled")
    assert started.attempts[0].status == "cancelled"


def test_live_overrides_what_history_says():
    (a,) = fold(ev.ActivityScheduled("1", "a", {}), ev.ActivityStarted("1", 1, "w"), live=False)
    assert a.status == "cancelled"
    (b,) = fold(ev.ActivityScheduled("1", "a", {}), ev.WorkflowCancelled(), live=True)
    assert b.status == "pending"


def test_a_start_to_close_timeout_is_timed_out_and_other_failures_failed():
    timed, failed = fold(
        ev.ActivityScheduled("1", "a", {}),
        ev.ActivityScheduled("2", "b", {}),
        ev.ActivityStarted("1", 1, "w"),
        ev.ActivityFailed("1", "StartToCloseTimeout", "late", 1),
        ev.ActivityFailed("2", "ValueError", "bad", 1),
    )
    assert (timed.status, timed.error_type, timed.error) == ("timed_out", "StartToCloseTimeout", "late")
    assert timed.attempts[0].status == "timed_out"
    assert (failed.status, failed.attempts[0].status, failed.attempts[0].started_at) == (
        "failed",
        "failed",
        None,
    )


def test_a_completion_wins_and_each_attempt_keeps_its_own_end():
    (a,) = fold(
        ev.ActivityScheduled("1", "a", {}),
        ev.ActivityStarted("1", 1, "w"),
        ev.ActivityStarted("1", 2, "w"),
        ev.ActivityCompleted("1", "out", 2),
        ev.ActivityFailed("1", "RuntimeError", "late", 3),
    )
    done = T0 + timedelta(seconds=4)
    assert (a.status, a.output, a.attempt_count, a.finished_at) == ("succeeded", "out", 3, done)
    # attempt 1 was retried without a result in history (its error is an attempt error)
    assert [(t.number, t.status) for t in a.attempts] == [(1, "failed"), (2, "succeeded"), (3, "failed")]
    assert a.attempts[1].finished_at == done and a.attempts[0].finished_at is None


def test_without_a_completion_the_last_failure_decides():
    (a,) = fold(
        ev.ActivityScheduled("1", "a", {}),
        ev.ActivityFailed("1", "RuntimeError", "first", 1),
        ev.ActivityFailed("1", "StartToCloseTimeout", "second", 2),
    )
    assert (a.status, a.error) == ("timed_out", "second")


def test_results_for_an_id_never_scheduled_attach_to_nothing():
    assert fold(ev.ActivityStarted("9", 1, "w"), ev.ActivityCompleted("9", "x")) == []


def test_activities_come_in_scheduling_order_with_their_flags():
    acts = fold(ev.ActivityScheduled("2", "b", {}), ev.ActivityScheduled("1", "a", {}, compensation=True))
    assert [(a.activity_id, a.seq, a.compensation) for a in acts] == [("2", 1, False), ("1", 2, True)]


def test_every_known_event_type_is_decided():
    one_of_each = [
        cls(
            **{
                f: "x"
                for f in (
                    "workflow_type",
                    "activity_id",
                    "activity_name",
                    "worker_id",
                    "error_type",
                    "message",
                    "name",
                    "timer_id",
                    "fire_at",
                    "child_id",
                    "status",
                    "next_id",
                    "update_id",
                )
                if f in cls.__dataclass_fields__
            },
            **({"attempt": 1} if "attempt" in cls.__dataclass_fields__ else {}),
            **({"seconds": 1.0} if "seconds" in cls.__dataclass_fields__ else {}),
        )
        for cls in ev.EVENT_TYPES.values()
    ]
    acts = core.fold_activities(history(*one_of_each))
    assert [a.activity_id for a in acts] == ["x"]


@dataclass(frozen=True)
class _NewEvent(
    ev.Event, family=ev.Family.RESULT, terminal=False, cursor=ev.Cursor.STEPPED_OVER, advance=True
):
    """An event type declared but never added to the closed set (``events.AnyEvent``)."""

    type: ClassVar[str] = "ActivityPaused"
    activity_id: str = "1"


def test_an_event_type_the_fold_does_not_know_fails_loudly():
    with pytest.raises(TypeError, match="_NewEvent is not a declared event type"):
        fold(ev.ActivityScheduled("1", "a", {}), _NewEvent())
