"""Eager execution and limits (docs/flow-control.md, "eager execution"): a limited activity runs
eagerly in the deciding thread only if its slot, and its token, are taken in the transaction
that records its ActivityScheduled and ActivityStarted. Staging writes its row ``waiting`` and
stages an ``EagerTake``; the settle of its limit, in the lock order just before commit, claims
it for the thread only if it releases it (a free slot, a free token, nothing of equal or higher
rank waiting ahead). Else it waits as before, with no message. Pure staging first, then the
embedded SQLite store with messages delivered by hand; after each store test, ``in_use``
equals the scheduled and running rows of its limit."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import Any

import pytest

from harvest_celery import Harvest, WorkflowContext, activity, workflow
from harvest_celery._core.commands import Decision, ScheduleActivity
from harvest_celery._core.registry import Registry, register_into
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store.records import EagerClaim, RunRow, Timings
from harvest_celery._store.staging import stage_decision
from tests.unit.test_limits_slots import assert_in_use_matches

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


# ── staging (pure) ───────────────────────────────────────────────────────────────────────────
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


def test_a_limited_activity_is_staged_waiting_to_be_taken_at_its_settle_not_claimed():
    for name in ("le_limited", "le_rated"):
        staged, asked = _stage(name)
        assert asked == [name] and staged.claimed is None  # nothing claimed in staging
        assert staged.taking is not None and staged.taking.key == ("run-1", "2")
        assert staged.taking.claim.started_seq is None  # its seq comes with the settle's take
        assert staged.dispatches == []  # no message: its settle releases or claims it
        (task,) = staged.write.tasks
        assert task["status"] == "waiting" and task["limit_digest"] is not None
        assert [e["type"] for e in staged.write.events] == ["ActivityScheduled"]  # no ActivityStarted yet


def test_an_unlimited_activity_beside_it_is_claimed_in_the_write_and_nothing_is_taken():
    staged, asked = _stage("le_limited", "le_plain")
    assert asked == ["le_plain"] and staged.claimed is not None and staged.taking is None
    assert staged.claimed.activity_name == "le_plain"
    assert {t["activity_name"]: t["status"] for t in staged.write.tasks} == {
        "le_limited": "waiting",
        "le_plain": "running",
    }


# ── on the store: the settle decides ─────────────────────────────────────────────────────────
@activity(name="le_one", concurrency=1)
def le_one(x: Any) -> Any:
    return x


@activity(name="le_two", concurrency=2)
def le_two(x: Any) -> Any:
    return x


@activity(name="le_rate", rate_limit="1/h")
def le_rate(x: Any) -> Any:
    return x


@workflow(name="le_call")
async def le_call(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    return await ctx.execute_activity(data["activity"], data["label"], priority=data.get("priority", 0))


@workflow(name="le_pair")
async def le_pair(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    await ctx.execute_activity(data["activity"], "first")
    return await ctx.execute_activity(data["activity"], "second", priority=data.get("priority", 0))


@pytest.fixture
def h(tmp_path):
    # eager_start=False: a run's first decision is taken by a "worker thread" here (``start``)
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}", eager_start=False).register(
        le_call, le_pair, le_one, le_two, le_rate
    )
    harvest.migrate()
    harvest._inline = None  # deliver messages by hand
    harvest.runtime.dispatcher = InlineDispatcher()
    harvest.runtime.local_queues = frozenset({"default"})  # this "worker" consumes the queue
    yield harvest
    assert_in_use_matches(harvest)


def messages(h: Harvest) -> list[Any]:
    queue = h.runtime.dispatcher.queue
    sent = [m for m in queue if m.task_name != "harvest.decide"]
    queue.clear()
    return sent


def statuses(h: Harvest, run_id: str) -> list[str]:
    return [r["status"] for r in h.store.activity_rows(run_id)]


def decide_eagerly(h: Harvest, run_id: str) -> Any:
    """The run's decision taken by a thread in an eager scope: what the thread then runs."""
    with h.runtime.eager_scope(True) as take:
        h.runtime.run_decision(run_id)
        return take()


def start(h: Harvest, workflow_type: str, data: dict[str, Any], *, eager: bool = False) -> tuple[str, Any]:
    run_id = h.start_workflow(workflow_type, data)
    held = decide_eagerly(h, run_id) if eager else h.runtime.run_decision(run_id)
    return run_id, held


def run_body(h: Harvest, message: Any, *, eager: bool = False) -> Any:
    claim = h.runtime.claim(*message.args)
    assert claim is not None
    with h.runtime.eager_scope(eager) as take:
        h.runtime.execute(claim, h.registry.activity(message.task_name).fn)
        return take()


def folded(h: Harvest, run_id: str) -> list[str]:
    """Activities whose ActivityStarted directly follows their ActivityScheduled at the same
    time: claimed in the write that scheduled them."""
    history = h.history(run_id)
    return [
        b.event.activity_id
        for a, b in itertools.pairwise(history)
        if a.event.type == "ActivityScheduled"
        and b.event.type == "ActivityStarted"
        and a.event.activity_id == b.event.activity_id
        and a.recorded_at == b.recorded_at
    ]


def test_a_free_slot_is_taken_and_claimed_in_the_deciding_write(h):
    run_id, held = start(h, "le_call", {"activity": "le_one", "label": "a"}, eager=True)
    assert held is not None and held.claimed is not None  # the thread runs it: no claim statement
    assert (held.execution_id, held.activity_name) == (run_id, "le_one")
    assert statuses(h, run_id) == ["running"] and messages(h) == []  # no message for it
    assert folded(h, run_id) == [held.activity_id]  # ActivityStarted in the same write
    assert held.claimed.started_seq == len(h.history(run_id)) - 1
    h.runtime.execute(held.claimed, le_one)  # what the eager chain does with it
    assert h.describe(run_id).status == "COMPLETED"


def test_a_busy_slot_leaves_it_waiting_with_no_claim_and_no_message(h):
    holder, _ = start(h, "le_call", {"activity": "le_one", "label": "hold"})
    (sent,) = messages(h)
    run_id, held = start(h, "le_call", {"activity": "le_one", "label": "b"}, eager=True)
    assert held is None and statuses(h, run_id) == ["waiting"] and messages(h) == []
    assert folded(h, run_id) == []
    run_body(h, sent)  # its completion frees the slot and releases the waiter, to the broker
    assert statuses(h, run_id) == ["scheduled"] and len(messages(h)) == 1
    assert folded(h, run_id) == []


def test_work_of_equal_priority_waiting_ahead_is_released_instead(h):
    """One of two slots frees in the transaction that schedules a pair's second step: the run
    queued earlier at the same priority gets it; the second step waits behind it."""
    pair, _ = start(h, "le_pair", {"activity": "le_two"})
    other, _ = start(h, "le_call", {"activity": "le_two", "label": "other"})
    ahead, _ = start(h, "le_call", {"activity": "le_two", "label": "ahead"})
    first, _other_message = messages(h)
    assert statuses(h, ahead) == ["waiting"]
    held = run_body(h, first, eager=True)  # completes the pair's first step, decides its second
    assert statuses(h, pair) == ["completed", "waiting"]
    assert statuses(h, ahead) == ["scheduled"]  # the slot went to the row queued ahead
    assert held is None or held.claimed is None  # nothing claimed for this thread
    assert folded(h, pair) == []


def test_a_higher_priority_step_goes_ahead_of_lower_priority_waiting_work_and_runs_here(h):
    pair, _ = start(h, "le_pair", {"activity": "le_two", "priority": 9})
    other, _ = start(h, "le_call", {"activity": "le_two", "label": "other"})
    behind, _ = start(h, "le_call", {"activity": "le_two", "label": "behind"})
    first, _other_message = messages(h)
    held = run_body(h, first, eager=True)
    assert held is not None and held.claimed is not None and held.execution_id == pair
    assert statuses(h, pair) == ["completed", "running"] and statuses(h, behind) == ["waiting"]
    assert folded(h, pair) == [held.activity_id]


def test_a_rate_limit_runs_it_eagerly_only_with_its_token(h):
    first, held = start(h, "le_call", {"activity": "le_rate", "label": "a"}, eager=True)
    assert held is not None and held.claimed is not None  # the token was free: taken here
    assert statuses(h, first) == ["running"]
    second, held = start(h, "le_call", {"activity": "le_rate", "label": "b"}, eager=True)
    assert held is None and statuses(h, second) == ["waiting"]  # the next token is an hour away
    assert messages(h) == []
