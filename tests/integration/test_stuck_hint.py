"""Stuck runs explain themselves: a run whose activity waits on a queue no live worker consumes
says so through ``Harvest.stuck``, ``harvest show`` and ``GET /workflows/{id}`` — real Postgres,
real Redis, the shared worker processes (none consumes ``nobody_listens``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from harvest_celery._cli import main
from harvest_celery._runtime.consumers import QueueConsumers
from harvest_celery._store.records import aware, utcnow
from harvest_celery._web.app import create_app

from .conftest import WORKER_QUEUES, wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.app:harvest"
QUEUE = "nobody_listens"


def open_row(harvest, run_id):
    rows = [r for r in harvest.store.activity_rows(run_id) if r["status"] == "scheduled"]
    return rows[0] if rows else None


@pytest.fixture
def stuck_run(harvest, workers, tag):
    assert all(QUEUE not in queues.split(",") for queues in WORKER_QUEUES.values())
    run_id = harvest.start_workflow("waits_on_nobody", {"tag": tag}, execution_id=f"stuck-{tag}")
    try:
        yield run_id
    finally:
        harvest.terminate(run_id, reason="test over")  # it would wait forever


def test_a_run_waiting_on_a_queue_nobody_consumes_says_so(harvest, stuck_run, capsys, monkeypatch):
    row = wait_for(lambda: open_row(harvest, stuck_run), what="the activity to be scheduled")
    assert row["queue"] == QUEUE
    # wait past a re-send by the sweeper (redispatch_after=3s in the test app): it moves
    # dispatched_at forward, and the reported wait must still count from the scheduling
    wait_for(
        lambda: aware(harvest.store.activity_rows(stuck_run)[0]["dispatched_at"]) > utcnow(),
        timeout=20,
        what="the sweeper to re-send the message",
    )
    harvest._consumers.forget()  # workers are up: ask them now, not from an earlier cache

    hints = harvest.stuck(stuck_run)
    assert hints is not None and len(hints) == 1, hints
    hint = hints[0]
    assert (hint["kind"], hint["activity"], hint["queue"]) == ("activity", "unheard", QUEUE)
    assert hint["waiting_seconds"] >= 3.0

    # the CLI
    capsys.readouterr()
    assert main(["-A", APP, "show", stuck_run]) == 0
    out = capsys.readouterr().out
    assert "RUNNING" in out
    assert f"waiting: activity unheard on queue '{QUEUE}' for " in out
    assert f"no live worker consumes '{QUEUE}' (start one: harvest worker -A {APP} -Q {QUEUE})" in out
    assert out.index("waiting:") < out.index("timeline:")

    # the API (reads need the token too)
    client = TestClient(create_app(harvest, token="s3cret"), headers={"Authorization": "Bearer s3cret"})
    body = client.get(f"/workflows/{stuck_run}").json()
    assert body["status"] == "RUNNING"
    assert [(w["kind"], w["activity"], w["queue"]) for w in body["waiting"]] == [
        ("activity", "unheard", QUEUE)
    ]
    assert body["waiting"][0]["waiting_seconds"] >= 3.0

    # the workers cannot be asked: unknown (null), never an error
    def broker_down():
        raise ConnectionError("broker down")

    monkeypatch.setattr(harvest, "_consumers", QueueConsumers(harvest.celery_app, inspector=broker_down))
    assert harvest.stuck(stuck_run) is None
    resp = client.get(f"/workflows/{stuck_run}")
    assert resp.status_code == 200 and resp.json()["waiting"] is None
    capsys.readouterr()
    assert main(["-A", APP, "show", stuck_run]) == 0
    assert "waiting:" not in capsys.readouterr().out


def test_a_run_whose_queues_are_consumed_waits_on_nothing(harvest, workers, tag):
    run_id = harvest.start_workflow("three_steps", {"tag": tag})
    assert harvest.result(run_id, timeout=30) == f"done:{tag}"
    assert harvest.stuck(run_id) == []
    assert TestClient(create_app(harvest)).get(f"/workflows/{run_id}").json()["waiting"] == []
    waiting = harvest.start_workflow("approval", {"tag": tag})  # waits on a signal: nothing queued
    wait_for(lambda: harvest.store.decision_request(waiting)[1] is None, what="the first decision")
    assert harvest.stuck(waiting) == []
    harvest.cancel_workflow_execution(waiting)


def test_a_terminated_run_waits_on_nothing(harvest, workers, tag):
    run_id = harvest.start_workflow("waits_on_nobody", {"tag": tag})
    wait_for(lambda: open_row(harvest, run_id), what="the activity to be scheduled")
    harvest.terminate(run_id)
    assert harvest.stuck(run_id) == []
