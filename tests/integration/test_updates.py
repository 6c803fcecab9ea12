"""Updates end to end on real Postgres, Redis and Celery worker processes: an update rejected by
its validator writes nothing (no event, no ``harvest_workflow_updates`` row, no decision
request); an accepted update whose handler awaits an activity returns its value through
``Harvest.update``, ``AsyncHarvest.update`` and ``POST /workflows/{id}/updates/{name}``; an
update id is idempotent, even for two concurrent calls; runs in the wrong state refuse; and an
update accepted before a kill -9 of every worker completes after their restart."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import AsyncHarvest, InvalidState, UnknownUpdate, UpdateRejected, WorkflowCancelledError
from harvest_celery._core.engine import replay_history
from harvest_celery._store.schema import events, executions, metadata, workflow_updates

from .conftest import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(harvest, workers, monkeypatch) -> TestClient:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    return TestClient(create_app_for(harvest))


def create_app_for(harvest: Any) -> Any:
    from harvest_celery._web.api import create_app

    return create_app(harvest)


def database(harvest: Any, run_id: str) -> dict[str, Any]:
    """Every table's row count, the run's row and its events: what a refused update must leave
    exactly as it found it."""
    with harvest.store.engine.connect() as conn:
        counts = {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in metadata.sorted_tables
        }
        run = dict(conn.execute(sa.select(executions).where(executions.c.id == run_id)).mappings().one())
        history = [
            dict(r)
            for r in conn.execute(
                sa.select(events).where(events.c.execution_id == run_id).order_by(events.c.seq)
            ).mappings()
        ]
    return {"counts": counts, "run": run, "events": history}


def update_rows(harvest: Any, run_id: str) -> list[str]:
    t = workflow_updates
    with harvest.store.engine.connect() as conn:
        q = sa.select(t.c.update_id).where(t.c.execution_id == run_id).order_by(t.c.update_id)
        return list(conn.execute(q).scalars())


def types(harvest: Any, run_id: str) -> list[str]:
    return [h.event.type for h in harvest.history(run_id)]


def parked(harvest: Any, tag: str, **data: Any) -> str:
    """An up_counter run parked on its signal, no decision pending."""
    run_id = harvest.start_workflow("up_counter", {"tag": tag, **data}, execution_id=f"up-{tag}")

    def waiting() -> bool:
        return harvest.store.decision_request(run_id)[1] is None and len(types(harvest, run_id)) >= 1

    wait_for(waiting, what=f"{run_id} to park on its signal")
    return run_id


def test_an_update_rejected_by_its_validator_writes_nothing(harvest, workers, client, tag):
    run_id = parked(harvest, tag)
    before = database(harvest, run_id)
    with pytest.raises(UpdateRejected) as rejected:
        harvest.update(run_id, "add", -1)
    assert rejected.value.error_type == "ValueError" and "not a positive int" in rejected.value.error_message
    with pytest.raises(UnknownUpdate) as unknown:
        harvest.update(run_id, "nope", 1)
    assert unknown.value.known == ["add", "slow_add"]
    resp = client.post(f"/workflows/{run_id}/updates/add", json={"arg": "five"})
    assert (resp.status_code, resp.json()["error"]) == (400, "UpdateRejected")
    after = database(harvest, run_id)
    assert after == before  # no event, no updates row, no decision request, not an updated_at
    assert after["run"]["decision_requested_at"] is None and update_rows(harvest, run_id) == []
    harvest.signal(run_id, "stop")
    assert harvest.result(run_id, timeout=30) == 0


def test_an_accepted_update_awaiting_an_activity_returns_its_value_and_is_idempotent(
    harvest, workers, client, tag
):
    run_id = parked(harvest, tag)
    assert harvest.update(run_id, "add", 5, update_id="u1", timeout=30) == 10
    once = database(harvest, run_id)
    assert harvest.update(run_id, "add", 5, update_id="u1") == 10  # the same id: nothing runs
    assert database(harvest, run_id) == once
    resp = client.post(f"/workflows/{run_id}/updates/add", json={"arg": 2, "update_id": "h1"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": run_id, "update": "add", "update_id": "h1", "result": 14}

    async def sent() -> list[Any]:
        async with AsyncHarvest(harvest) as ah:
            return [
                await ah.update(run_id, "add", 1, update_id="a1"),
                await ah.update(run_id, "add", 1, update_id="a1"),
            ]

    assert asyncio.run(sent()) == [16, 16]
    assert update_rows(harvest, run_id) == ["a1", "h1", "u1"]
    assert harvest.query(run_id, "total") == 16
    harvest.signal(run_id, "stop")
    assert harvest.result(run_id, timeout=30) == 16
    history = harvest.history(run_id)
    kinds = [h.event.type for h in history]
    assert kinds.count("UpdateAccepted") == kinds.count("UpdateCompleted") == 3
    cold = replay_history(harvest.registry.workflow("up_counter"), run_id, history, harvest.registry)
    assert cold.nd is None and cold.outcome.result == 16


def test_two_concurrent_calls_with_one_update_id_accept_once(harvest, workers, tag):
    run_id = parked(harvest, tag)
    answers: list[Any] = []

    def call() -> None:
        answers.append(harvest.update(run_id, "add", 3, update_id="same", timeout=30))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == [6, 6, 6, 6]
    kinds = types(harvest, run_id)
    assert kinds.count("UpdateAccepted") == kinds.count("UpdateCompleted") == 1
    assert update_rows(harvest, run_id) == ["same"]
    harvest.signal(run_id, "stop")
    assert harvest.result(run_id, timeout=30) == 6


def test_updates_on_paused_sealed_closed_and_erased_runs_are_invalid_state(harvest, workers, client, tag):
    paused = parked(harvest, f"{tag}p")
    harvest.pause(paused)
    sealed = parked(harvest, f"{tag}s")
    harvest.cancel_workflow_execution(sealed, "stop")
    with pytest.raises(WorkflowCancelledError):  # its post-cancel decision has settled
        harvest.result(sealed, timeout=30)
    closed = parked(harvest, f"{tag}c")
    harvest.signal(closed, "stop")
    harvest.result(closed, timeout=30)
    erased = parked(harvest, f"{tag}e")
    harvest.signal(erased, "stop")
    harvest.result(erased, timeout=30)
    harvest.erase_payloads(erased)
    refusals = ((paused, "paused"), (sealed, "CANCELLED"), (closed, "COMPLETED"), (erased, "erased"))
    for run_id, status in refusals:
        before = database(harvest, run_id)
        with pytest.raises(InvalidState) as refused:
            harvest.update(run_id, "add", 1)
        assert (refused.value.status, refused.value.operation) == (status, "send an update to")
        resp = client.post(f"/workflows/{run_id}/updates/add", json={"arg": 1})
        assert (resp.status_code, resp.json()["error"]) == (409, "InvalidState")
        assert database(harvest, run_id) == before
    harvest.resume(paused)
    harvest.signal(paused, "stop")
    assert harvest.result(paused, timeout=30) == 0


def test_an_update_accepted_before_a_kill_9_of_every_worker_completes_after_restart(harvest, workers, tag):
    run_id = parked(harvest, tag, sleep=3)
    errors: list[BaseException] = []

    def first_call() -> None:
        try:
            harvest.update(run_id, "slow_add", 4, update_id="k1", timeout=5)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    caller = threading.Thread(target=first_call)
    caller.start()
    wait_for(lambda: "ActivityStarted" in types(harvest, run_id), what="the handler's activity to start")
    # kill -9 of every worker while the handler's activity runs: its body is redelivered after
    # the restart, and the update's UpdateCompleted is recorded once
    for name in ("w2", "w1"):
        workers[name].kill9()
    for name in ("w1", "w2"):
        workers[name].start()
    caller.join(30)
    # the first caller got the value, or timed out while the worker was down: a second call with
    # the same id waits again and gets it
    assert harvest.update(run_id, "slow_add", 4, update_id="k1", timeout=60) == 8
    assert not errors or isinstance(errors[0], TimeoutError), errors
    kinds = types(harvest, run_id)
    assert kinds.count("UpdateAccepted") == kinds.count("UpdateCompleted") == 1
    harvest.signal(run_id, "stop")
    assert harvest.result(run_id, timeout=60) == 8
