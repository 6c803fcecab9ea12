"""Queries end to end on real Postgres, Redis and Celery worker processes: a run parked on a signal
answers through ``Harvest.query``, ``AsyncHarvest.query`` and ``POST /workflows/{id}/queries/
{name}`` while no row of the database changes; a handler that changed a local changes nothing the
next decision sees (the live run's result, and a cold replay of its history, say so); a handler
that schedules an activity, an unknown name and an argument that is not JSON are refused and
write nothing; a closed run answers, an erased one is refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import (
    AsyncHarvest,
    InvalidState,
    PayloadNotSerializable,
    QueryFailed,
    UnknownQuery,
)
from harvest_celery._core.engine import replay_history
from harvest_celery._store.schema import activity_tasks, events, executions, metadata
from harvest_celery._web.api import create_app
from harvest_celery.replay import WorkflowReplayer

from .conftest import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(harvest, workers, monkeypatch) -> TestClient:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    return TestClient(create_app(harvest))


def database(harvest: Any, run_id: str) -> dict[str, Any]:
    """Every table's row count, and every column of the run's row, task rows and events: what a
    query must leave exactly as it found it."""
    with harvest.store.engine.connect() as conn:
        counts = {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in metadata.sorted_tables
        }
        run = dict(conn.execute(sa.select(executions).where(executions.c.id == run_id)).mappings().one())
        tasks = [
            dict(r)
            for r in conn.execute(
                sa.select(activity_tasks)
                .where(activity_tasks.c.execution_id == run_id)
                .order_by(activity_tasks.c.activity_id, activity_tasks.c.attempt)
            ).mappings()
        ]
        history = [
            dict(r)
            for r in conn.execute(
                sa.select(events).where(events.c.execution_id == run_id).order_by(events.c.seq)
            ).mappings()
        ]
    return {"counts": counts, "run": run, "tasks": tasks, "events": history}


def parked(harvest: Any, tag: str) -> str:
    """A qy_parked run that took its step and waits on its signal, no decision pending."""
    run_id = harvest.start_workflow("qy_parked", {"tag": tag}, execution_id=f"qy-{tag}")

    def waiting() -> bool:
        types = [h.event.type for h in harvest.history(run_id)]
        return "ActivityCompleted" in types and harvest.store.decision_request(run_id)[1] is None

    wait_for(waiting, what=f"{run_id} to park on its signal")
    return run_id


def test_a_query_answers_a_run_waiting_on_a_signal_and_changes_no_row(harvest, workers, client, tag):
    run_id = parked(harvest, tag)
    before = database(harvest, run_id)
    stage = {"stage": f"waiting (stepped {tag})", "peeked": 0}
    assert harvest.query(run_id, "stage") == stage
    assert harvest.query(run_id, "echo", {"n": [1, 2]}) == {"arg": {"n": [1, 2]}, "tag": tag}
    # a handler that changes a local: each query replays afresh, so it never accumulates
    assert [harvest.query(run_id, "peek") for _ in range(3)] == [1, 1, 1]
    assert harvest.query(run_id, "stage") == stage
    # over HTTP and through the async client, the same answers
    resp = client.post(f"/workflows/{run_id}/queries/stage")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": run_id, "query": "stage", "result": stage}
    resp = client.post(f"/workflows/{run_id}/queries/echo", json={"arg": "hi"})
    assert resp.json()["result"] == {"arg": "hi", "tag": tag}

    async def asked() -> list[Any]:
        async with AsyncHarvest(harvest) as ah:
            return [await ah.query(run_id, "stage"), await ah.query(run_id, "peek")]

    assert asyncio.run(asked()) == [stage, 1]
    assert database(harvest, run_id) == before  # not a row, not a column, not an updated_at

    # the next decision never sees what the handlers changed: the run ends as if never asked
    harvest.signal(run_id, "approve", "ops")
    assert harvest.result(run_id, timeout=30) == "approved by ops after 0 peeks"
    history = harvest.history(run_id)
    definition = harvest.registry.workflow("qy_parked")
    cold = replay_history(definition, run_id, history, harvest.registry)
    assert cold.nd is None and cold.outcome.result == "approved by ops after 0 peeks"
    assert WorkflowReplayer(harvest).replay_database(ids=[run_id]).passed
    # a closed run answers from its final state
    assert harvest.query(run_id, "stage") == {"stage": "approved by ops after 0 peeks", "peeked": 0}


def test_refused_queries_write_nothing(harvest, workers, client, tag):
    run_id = parked(harvest, tag)
    before = database(harvest, run_id)
    with pytest.raises(QueryFailed) as failed:
        harvest.query(run_id, "schedules")
    assert (failed.value.error_type, failed.value.command) == ("QueryCommand", "ctx.execute_activity")
    with pytest.raises(UnknownQuery) as unknown:
        harvest.query(run_id, "nope")
    assert unknown.value.known == ["echo", "peek", "schedules", "stage"]
    with pytest.raises(PayloadNotSerializable):
        harvest.query(run_id, "echo", float("nan"))

    resp = client.post(f"/workflows/{run_id}/queries/schedules")
    assert (resp.status_code, resp.json()["error"]) == (400, "QueryFailed")
    assert "ctx.execute_activity" in resp.json()["detail"]
    resp = client.post(f"/workflows/{run_id}/queries/nope")
    assert (resp.status_code, resp.json()["error"]) == (404, "UnknownQuery")
    assert "'echo', 'peek', 'schedules', 'stage'" in resp.json()["detail"]
    resp = client.post(
        f"/workflows/{run_id}/queries/echo",
        content=b'{"arg": NaN}',
        headers={"content-type": "application/json"},
    )
    assert (resp.status_code, resp.json()["error"]) == (422, "PayloadNotSerializable")
    resp = client.post(f"/workflows/{run_id}/queries/echo", json={"arg": 1, "extra": 2})
    assert (resp.status_code, resp.json()["error"]) == (422, "ValidationError")
    resp = client.post("/workflows/no-such-run/queries/stage")
    assert (resp.status_code, resp.json()["error"]) == (404, "ExecutionNotFound")
    assert database(harvest, run_id) == before

    # a paused run answers too (nothing is decided: only read)
    harvest.pause(run_id)
    paused = database(harvest, run_id)
    assert harvest.query(run_id, "stage")["stage"] == f"waiting (stepped {tag})"
    assert database(harvest, run_id) == paused
    harvest.resume(run_id)
    harvest.signal(run_id, "approve", "ops")
    assert harvest.result(run_id, timeout=30) == "approved by ops after 0 peeks"


def test_an_erased_run_is_refused(harvest, workers, client, tag):
    run_id = parked(harvest, tag)
    harvest.signal(run_id, "approve", "ops")
    harvest.result(run_id, timeout=30)
    harvest.erase_payloads(run_id)
    before = database(harvest, run_id)
    with pytest.raises(InvalidState) as refused:
        harvest.query(run_id, "stage")
    assert refused.value.status == "erased"
    resp = client.post(f"/workflows/{run_id}/queries/stage")
    assert (resp.status_code, resp.json()["error"]) == (409, "InvalidState")

    async def asked() -> None:
        async with AsyncHarvest(harvest) as ah:
            await ah.query(run_id, "stage")

    with pytest.raises(InvalidState):
        asyncio.run(asked())
    assert database(harvest, run_id) == before
