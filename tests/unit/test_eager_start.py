"""Eager workflow start (docs/operations.md, "The completion paths"): a start in its own
transaction, in a process that registered the workflow, writes the run's first decision with
its ``WorkflowStarted`` and sends the first activity's message, not a ``harvest.decide``. A
decision that raises there falls back to the ordinary start; a run of a limited workflow, a start
on the application's connection and ``eager_start=False`` take none. Embedded mode (SQLite)
with its in-process dispatcher as the message sink: the dispatcher is what a Celery app's client
sends through (the real-worker path is tests/integration/test_core.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, Timings, WorkflowContext, activity, workflow
from harvest_celery._runtime.messages import DECIDE_TASK
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._store.schema import executions


@activity(name="es_step")
def es_step(x: Any) -> Any:
    return x + 1


@workflow(name="es_flow")
async def es_flow(ctx: WorkflowContext, x: Any) -> Any:
    y = await ctx.execute_activity(es_step, x)
    return await ctx.execute_activity(es_step, y)


@workflow(name="es_none")
async def es_none(ctx: WorkflowContext, x: Any) -> Any:
    return x  # closes in its first decision


@workflow(name="es_admitted", concurrency=1)
async def es_admitted(ctx: WorkflowContext, x: Any) -> Any:
    return await ctx.execute_activity(es_step, x)


def _client(tmp_path: Any, **options: Any) -> tuple[Harvest, Any]:
    """A Harvest whose start behaves as a Celery app's client does (no in-process drain after
    the start); the in-process dispatcher keeps what it sends."""
    h = Harvest(f"sqlite:///{tmp_path / 'h.db'}", **options).register(es_step, es_flow, es_none, es_admitted)
    h.migrate()
    inline, h._inline = h._inline, None
    return h, inline


def _sent(inline: Any) -> list[str]:
    return [m.task_name for m in inline.queue]


def _types(h: Harvest, rid: str) -> list[str]:
    return [e.event.type for e in h.history(rid)]


def _requested(h: Harvest, rid: str) -> Any:
    with h.store.engine.connect() as conn:
        return conn.execute(
            sa.select(executions.c.decision_requested_at).where(executions.c.id == rid)
        ).scalar_one()


def _started_decisions(name: str) -> float:
    return METRICS.value("decisions", {"workflow": name, "path": "start"})


def test_the_start_takes_the_first_decision_and_sends_the_first_activity(tmp_path):
    h, inline = _client(tmp_path)
    before = _started_decisions("es_flow")
    rid = h.start_workflow("es_flow", 1)
    assert _types(h, rid) == ["WorkflowStarted", "ActivityScheduled"]  # one transaction
    assert _sent(inline) == ["es_step"]  # no harvest.decide: the decision is taken
    assert _requested(h, rid) is None  # the request the start wrote was cleared by it
    assert _started_decisions("es_flow") == before + 1
    inline.drain(h.runtime, h.registry)
    assert h.result(rid, timeout=5) == 3


def test_a_workflow_that_closes_at_once_is_closed_by_its_start(tmp_path):
    h, inline = _client(tmp_path)
    rid = h.start_workflow("es_none", {"a": 1})
    assert _types(h, rid) == ["WorkflowStarted", "WorkflowCompleted"]
    assert _sent(inline) == []
    assert h.result(rid, timeout=5) == {"a": 1}


def test_a_repeated_start_decides_nothing_again(tmp_path):
    h, inline = _client(tmp_path)
    rid = h.start_workflow("es_flow", 1, execution_id="es-once")
    inline.queue.clear()
    assert h.start_workflow("es_flow", 1, execution_id="es-once") == rid  # idempotent answer
    assert _sent(inline) == [] and _types(h, rid) == ["WorkflowStarted", "ActivityScheduled"]


def test_a_decision_that_raises_falls_back_to_the_ordinary_start(tmp_path, monkeypatch, caplog):
    h, inline = _client(tmp_path)

    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("a bug in the decision")

    monkeypatch.setattr(h.runtime, "_decide", broken)
    with caplog.at_level(logging.WARNING, logger="harvest_celery"):
        rid = h.start_workflow("es_flow", 1)
    assert "started the ordinary way" in caplog.text
    assert _types(h, rid) == ["WorkflowStarted"]  # the eager attempt was rolled back whole
    assert _sent(inline) == [DECIDE_TASK] and _requested(h, rid) is not None
    monkeypatch.undo()
    inline.drain(h.runtime, h.registry)
    assert h.result(rid, timeout=5) == 3


def test_a_shutdown_inside_the_decision_is_not_swallowed(tmp_path, monkeypatch):
    h, _inline = _client(tmp_path)

    def interrupted(*_a: Any, **_k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(h.runtime, "_decide", interrupted)
    with pytest.raises(KeyboardInterrupt):
        h.start_workflow("es_flow", 1, execution_id="es-int")
    monkeypatch.undo()
    with h.store.engine.connect() as conn:  # rolled back: nothing was started
        assert conn.execute(sa.select(executions.c.id).where(executions.c.id == "es-int")).first() is None


@pytest.mark.parametrize("off", [{"eager_start": False}, {"fast_paths": False}])
def test_no_eager_decision_when_switched_off(tmp_path, off):
    h, inline = _client(tmp_path, **off)
    rid = h.start_workflow("es_flow", 1)
    assert _types(h, rid) == ["WorkflowStarted"] and _sent(inline) == [DECIDE_TASK]


def test_no_eager_decision_on_the_applications_connection(tmp_path):
    h, inline = _client(tmp_path)
    with h.store.engine.begin() as conn:
        rid = h.start_workflow("es_flow", 1, connection=conn)
    assert _types(h, rid) == ["WorkflowStarted"]  # the application's transaction runs no workflow code


def test_no_eager_decision_for_a_run_of_a_limited_workflow(tmp_path):
    # its admission is settled just before the commit, after the start's write: a run that
    # takes a slot is decided by the decision task; one that waits has no request at all
    h, inline = _client(tmp_path)
    first = h.start_workflow("es_admitted", 1)
    assert _types(h, first) == ["WorkflowStarted"] and _sent(inline) == [DECIDE_TASK]
    inline.queue.clear()
    second = h.start_workflow("es_admitted", 2)
    assert _types(h, second) == ["WorkflowStarted"] and _sent(inline) == []


def test_a_first_activity_whose_message_is_lost_after_the_commit_is_sent_again(tmp_path):
    # the starting process dies between its commit and its send: the scheduled task row is the
    # durable record, and the sweeper re-sends it after redispatch_after, as for any decision
    h, inline = _client(tmp_path, timings=Timings(redispatch_after=0.05))
    rid = h.start_workflow("es_flow", 1)
    inline.queue.clear()  # the message never left
    time.sleep(0.1)
    h.runtime.sweep_once()
    assert _sent(inline) == ["es_step"]
    inline.drain(h.runtime, h.registry)
    assert h.result(rid, timeout=5) == 3
