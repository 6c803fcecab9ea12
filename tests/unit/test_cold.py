"""The cold one-statement completion's pure parts (``_runtime.cold``): when a completion whose
run is not warm here is worth a cold read, and why a run as read is left to the ordinary path."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from harvest_celery._runtime import cold
from harvest_celery._runtime.completion import FALLBACK_REASONS
from harvest_celery._store.records import Claim, RunRow

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def rt(max_events: int = 10, registered: bool = True) -> Any:
    registry = SimpleNamespace(has_workflow=lambda name: registered)
    return SimpleNamespace(settings=SimpleNamespace(inline_cold_max_events=max_events), registry=registry)


def claim(started_seq: int | None = 4) -> Claim:
    return Claim(
        "r1", "a1", "step", 1, None, None, "w", started_seq, NOW if started_seq is not None else None
    )


def row(**changes: Any) -> RunRow:
    return dataclasses.replace(RunRow.assumed("r1", "wf", 5, "someone-else"), **changes)


def test_a_short_history_is_worth_a_cold_read_a_long_one_is_not():
    assert cold.eligible(rt(max_events=5), claim(4))  # next seq 5 <= 5, as ``inline_or_task``
    assert not cold.eligible(rt(max_events=4), claim(4))
    assert not cold.eligible(rt(), claim(None))  # the claim does not say where it started


def test_a_replay_left_behind_is_worth_its_tail_whatever_the_history_before_it():
    behind = SimpleNamespace(events=[None] * 400)  # a replay kept here, 400 events in
    assert cold.eligible(rt(max_events=10), claim(405), behind)  # 5 events to catch up over
    assert not cold.eligible(rt(max_events=10), claim(405))  # from the start: 405
    assert not cold.eligible(rt(max_events=4), claim(405), behind)
    assert not cold.eligible(rt(), claim(None), behind)


def test_a_run_as_the_guard_requires_is_not_refused_whoever_holds_its_warm_replay():
    assert cold.refusal(rt(), claim(4), row()) == ""
    assert cold.refusal(rt(), claim(4), row(sticky_queue=None)) == ""


@pytest.mark.parametrize(
    ("changes", "registered", "reason"),
    [
        ({"paused_at": NOW}, True, "not_decidable"),
        ({"status": "completed"}, True, "not_decidable"),
        ({"decision_requested_at": NOW}, True, "decision_pending"),
        ({}, False, "not_registered"),
        ({"next_seq": 6}, True, "not_positioned"),  # appended to since the ActivityStarted
        ({"cancel_requested_at": NOW}, True, "guard"),
        ({"nd_blocked_at": NOW}, True, "guard"),
    ],
)
def test_a_run_the_guard_would_refuse_is_left_to_the_ordinary_path(changes, registered, reason):
    assert reason in FALLBACK_REASONS
    assert cold.refusal(rt(registered=registered), claim(4), row(**changes)) == reason


def test_a_run_that_is_gone_is_not_decidable():
    assert cold.refusal(rt(), claim(4), None) == "not_decidable"
