"""Eager execution and limits (docs/flow-control.md, "eager execution"): this build never runs a
limited activity eagerly. Its row is staged ``waiting`` with no message, and its slot is settled
in the lock order just before commit, after the eager claim is decided, so the deciding thread
is never offered it (``harvest_activity_eager_total`` does not move). An unlimited activity of
the same decision is still claimed. Pure staging: no services."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from harvest_celery import activity
from harvest_celery._core.commands import Decision, ScheduleActivity
from harvest_celery._core.registry import Registry, register_into
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._store.records import EagerClaim, RunRow, Timings
from harvest_celery._store.staging import stage_decision

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


@activity(name="le_limited", concurrency=1)
def le_limited(x: Any) -> Any:
    return x


@activity(name="le_rated", rate_limit="20/s")
def le_rated(x: Any) -> Any:
    return x


@activity(name="le_plain")
def le_plain(x: Any) -> Any:
    return x


def _stage(*names: str) -> tuple[Any, list[str]]:
    registry = Registry()
    register_into(registry, [le_limited, le_rated, le_plain])
    commands = [ScheduleActivity(str(i + 2), name, i, "default") for i, name in enumerate(names)]
    asked: list[str] = []
    eager = EagerClaim("w", 60.0, lambda d: asked.append(d.activity_name) or True)
    row = RunRow.assumed("run-1", "le_flow", 1, None)
    staged = stage_decision(
        row, [], Decision(commands=commands), registry, NOW, Timings(), "le_flow", Payloads(None), eager=eager
    )
    return staged, asked


def test_a_limited_activity_is_never_claimed_eagerly_even_with_its_slot_free():
    for name in ("le_limited", "le_rated"):
        staged, asked = _stage(name)
        assert staged.claimed is None and asked == []  # never offered to the deciding thread
        assert staged.dispatches == []  # no message: its settle releases it after the write
        (task,) = staged.write.tasks
        assert task["status"] == "waiting" and task["limit_digest"] is not None
        assert [e["type"] for e in staged.write.events] == ["ActivityScheduled"]  # no ActivityStarted


def test_an_unlimited_activity_beside_it_is_still_claimed():
    staged, asked = _stage("le_limited", "le_plain")
    assert asked == ["le_plain"] and staged.claimed is not None
    assert staged.claimed.activity_name == "le_plain"
    assert {t["activity_name"]: t["status"] for t in staged.write.tasks} == {
        "le_limited": "waiting",
        "le_plain": "running",
    }
