"""The operator actions of the HTTP API — DAG retry and its refusals, terminate, pause/resume,
reset, erase-payloads, purge — over the test app's Harvest: real Postgres, Redis and workers."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import Harvest, WorkflowFailed
from harvest_celery._dag.retry import COMPENSATED
from harvest_celery._store.blobs import PostgresPayloadStore
from harvest_celery._store.schema import events as events_table
from harvest_celery._store.schema import executions
from harvest_celery._store.store import utcnow
from harvest_celery._web.api import create_app

from .conftest import DATABASE_URL, effects, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(harvest, workers, monkeypatch) -> TestClient:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    return TestClient(create_app(harvest))


def all_runs(harvest) -> dict[str, tuple[Any, ...]]:
    """Every run with what an operator action changes: what a refused request must leave alone."""
    return {
        x.id: (x.status, x.history_length, x.paused_at, x.erased_at, x.forked_to)
        for x in harvest.list(limit=100_000)
    }


def ran(redis_client, tag):
    return [e["name"] for e in effects(redis_client, tag)]


def failed_run(harvest, dag: str, conf: dict[str, Any]) -> str:
    run_id = harvest.start_workflow(dag, conf)
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    return run_id


def wait_status(client: TestClient, run_id: str, status: str, timeout: float = 30) -> dict[str, Any]:
    def reached() -> Any:
        body = client.get(f"/workflows/{run_id}").json()
        return body if body["status"] == status else None

    return wait_for(reached, timeout=timeout, what=f"run {run_id} to be {status}")  # type: ignore[no-any-return]


def refused(resp, reason: str) -> dict[str, Any]:
    assert resp.status_code == 409, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert (body["error"], body["reason"]) == ("RetryRefused", reason)
    return body  # type: ignore[no-any-return]


# ── retry: every refusal ─────────────────────────────────────────────────────────────────────
def test_retry_of_a_compensated_run_is_409_with_the_specs_message(client, harvest, tag):
    source = failed_run(harvest, "diamond", {"tag": tag, "fail": ["dia_d"]})
    before = all_runs(harvest)
    for url in (f"/dags/diamond/runs/{source}/retry", f"/dags/diamond/runs/{source}/retry?dry_run=true"):
        body = refused(client.post(url), "compensated")
        assert body == {"error": "RetryRefused", "detail": COMPENSATED, "reason": "compensated"}
    body = refused(
        client.post(f"/dags/diamond/runs/{source}/retry", json={"from_node": "dia_a"}), "compensated"
    )
    assert body["detail"] == COMPENSATED  # verbatim, whatever the node
    assert all_runs(harvest) == before
    assert client.get(f"/workflows/{source}").json()["forked_to"] is None


def test_retry_of_a_marker_less_unwind_is_409_and_once_erased_409_for_the_erasure(
    client, harvest, redis_client, tag
):
    run_id = harvest.start_workflow("drained", {"tag": tag, "slow": "ds_slow"})
    wait_for(lambda: "ds_slow" in ran(redis_client, tag), what="the slow node")
    harvest.signal(run_id, "stray", {"unsolicited": True})  # drains the frontier: no marker
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    events = client.get(f"/workflows/{run_id}/history").json()["events"]
    assert not any(e["type"] == "MarkerRecorded" for e in events)  # only signal 2 can see it
    assert "undo:ds_first" in ran(redis_client, tag)
    before = all_runs(harvest)
    body = refused(client.post(f"/dags/drained/runs/{run_id}/retry"), "compensated")
    assert body["detail"] == COMPENSATED
    assert all_runs(harvest) == before

    # erasure blinds signal 2 on a marker-less run: the erased row is refused up front
    erased = client.post(f"/workflows/{run_id}/erase-payloads")
    assert erased.status_code == 200, erased.text
    assert erased.json()["execution_id"] == run_id and erased.json()["fields"] > 0
    before = all_runs(harvest)
    for url in (f"/dags/drained/runs/{run_id}/retry", f"/dags/drained/runs/{run_id}/retry?dry_run=true"):
        body = refused(client.post(url), "erased")
        assert "erased" in body["detail"] and run_id in body["detail"]
    assert all_runs(harvest) == before


def test_retry_of_an_erased_run_without_compensators_is_still_409(client, harvest, tag):
    source = failed_run(harvest, "retryable", {"tag": tag, "fail": ["rt_a"]})
    assert client.post(f"/dags/retryable/runs/{source}/retry?dry_run=true").status_code == 200  # retryable
    assert client.post(f"/workflows/{source}/erase-payloads").status_code == 200
    assert client.get(f"/workflows/{source}").json()["erased_at"] is not None
    before = all_runs(harvest)
    body = refused(client.post(f"/dags/retryable/runs/{source}/retry"), "erased")
    assert "were erased" in body["detail"]
    assert all_runs(harvest) == before


def test_retry_of_a_running_run_is_409(client, harvest, redis_client, tag):
    run_id = harvest.start_workflow("cancellable", {"tag": tag, "slow": "cx_slow"})
    wait_for(lambda: "cx_slow" in ran(redis_client, tag), what="the slow node")
    before = all_runs(harvest)
    body = refused(client.post(f"/dags/cancellable/runs/{run_id}/retry"), "running")
    assert body["detail"] == f"run {run_id} is still running"
    assert {k: v for k, v in all_runs(harvest).items() if k != run_id} == {
        k: v for k, v in before.items() if k != run_id
    }  # the live run itself moves on
    assert client.get(f"/workflows/{run_id}").json()["forked_to"] is None
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)


def test_retry_dry_run_then_retry_then_the_completed_fork_is_409(client, harvest, redis_client, tag):
    source = failed_run(harvest, "retryable", {"tag": tag})
    assert ran(redis_client, tag) == ["rt_a", "rt_b"]
    before = all_runs(harvest)
    dry = client.post(f"/dags/retryable/runs/{source}/retry", params={"dry_run": "true"})
    assert dry.status_code == 200, dry.text
    assert dry.json() == {
        "run_id": None,
        "source_run_id": source,
        "retry_from": "rt_b",
        "carried": ["rt_a"],
        "rerun": ["rt_b", "rt_c"],
        "dry_run": True,
    }
    assert all_runs(harvest) == before  # nothing forked
    assert client.get(f"/workflows/{source}").json()["forked_to"] is None

    resp = client.post(f"/dags/retryable/runs/{source}/retry", params={"dry_run": "false"})
    assert resp.status_code == 201, resp.text
    answer = resp.json()
    new = answer["run_id"]
    assert (
        answer["source_run_id"],
        answer["retry_from"],
        answer["carried"],
        answer["rerun"],
        answer["dry_run"],
    ) == (source, "rt_b", ["rt_a"], ["rt_b", "rt_c"], False)
    body = wait_status(client, new, "COMPLETED")
    assert set(body["result"]) == {"rt_a", "rt_b", "rt_c"}
    assert body["forked_from"] == source and body["forked_to"] is None
    assert client.get(f"/workflows/{source}").json()["forked_to"] == new
    assert ran(redis_client, tag) == ["rt_a", "rt_b", "rt_b", "rt_c"]  # rt_a carried, not re-run

    before = all_runs(harvest)
    body = refused(client.post(f"/dags/retryable/runs/{new}/retry"), "completed")
    assert body["detail"] == f"run {new} completed: nothing to retry"
    assert all_runs(harvest) == before


def test_retry_with_an_explicit_node_and_new_id(client, harvest, tag):
    source = failed_run(harvest, "retryable", {"tag": tag})
    resp = client.post(
        f"/dags/retryable/runs/{source}/retry", json={"from_node": "rt_a", "new_execution_id": f"again-{tag}"}
    )
    assert resp.status_code == 201, resp.text
    assert (resp.json()["run_id"], resp.json()["carried"], resp.json()["rerun"]) == (
        f"again-{tag}",
        [],
        ["rt_a", "rt_b", "rt_c"],
    )
    wait_status(client, f"again-{tag}", "COMPLETED")


def test_retry_from_an_unknown_node_is_400_and_unknown_targets_404(client, harvest, tag):
    source = failed_run(harvest, "retryable", {"tag": tag})
    before = all_runs(harvest)
    resp = client.post(f"/dags/retryable/runs/{source}/retry", json={"from_node": "nope"})
    assert resp.status_code == 400
    assert resp.json() == {"error": "UnknownNode", "detail": "dag 'retryable' has no node 'nope'"}
    for url, error in [
        (f"/dags/no_such_dag/runs/{source}/retry", "UnknownDag"),
        (f"/dags/three_steps/runs/{source}/retry", "UnknownDag"),  # a workflow, not a DAG
        (f"/dags/diamond/runs/{source}/retry", "ExecutionNotFound"),  # another DAG's run
        ("/dags/retryable/runs/no-such-run/retry", "ExecutionNotFound"),
    ]:
        resp = client.post(url)
        assert (resp.status_code, resp.json()["error"]) == (404, error), url
        assert resp.json()["detail"]
    assert all_runs(harvest) == before


def test_an_offloaded_payload_without_its_store_fails_closed_with_503(client, harvest, tag):
    """A run written by a Harvest with a payload store, retried through one without: the guard
    cannot read the inputs signal 2 needs, so it refuses (503) naming the blob and the store."""
    from . import dags

    offloading = Harvest(DATABASE_URL, payload_store=PostgresPayloadStore(), offload_threshold=1024)
    offloading.register(*dags.ACTIVITIES, *dags.DAGS)  # embedded: runs the activities in-process
    try:
        source = offloading.start_workflow("retryable", {"tag": tag, "pad": "p" * 2048})
        with pytest.raises(WorkflowFailed):
            offloading.result(source, timeout=30)
        with offloading.store.engine.connect() as conn:
            started = conn.execute(
                sa.select(events_table.c.data).where(
                    (events_table.c.execution_id == source) & (events_table.c.seq == 0)
                )
            ).scalar_one()
        reference = started["input"]
        assert reference["_harvest_offload_envelope"] == 1 and reference["store_id"] == "pg"
        # the store-holding Harvest plans the retry fine
        assert offloading.retry_dag_run("retryable", source, dry_run=True)["retry_from"] == "rt_b"

        before = all_runs(harvest)
        for params in ({}, {"dry_run": "true"}):
            resp = client.post(f"/dags/retryable/runs/{source}/retry", params=params)
            assert resp.status_code == 503, resp.text
            body = resp.json()
            assert body["error"] == "PayloadStoreError"
            assert repr(reference["key"]) in body["detail"] and "'pg'" in body["detail"]
        assert all_runs(harvest) == before
    finally:
        offloading.store.engine.dispose()


# ── terminate / pause / resume ───────────────────────────────────────────────────────────────
def test_terminate_then_409(client, harvest, tag):
    run_id = client.post("/workflows", json={"workflow": "approval", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    resp = client.post(f"/workflows/{run_id}/terminate", json={"reason": "stuck"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": run_id, "status": "TERMINATED"}
    body = client.get(f"/workflows/{run_id}").json()
    assert (body["status"], body["error"]) == ("TERMINATED", {"type": "Terminated", "message": "stuck"})
    assert body["closed_at"] is not None
    events = client.get(f"/workflows/{run_id}/history").json()["events"]
    assert events[-1]["type"] == "WorkflowFailed"
    before = all_runs(harvest)
    again = client.post(f"/workflows/{run_id}/terminate")
    assert again.status_code == 409 and again.json()["error"] == "InvalidState"
    assert "cannot terminate" in again.json()["detail"]
    assert all_runs(harvest) == before
    # no body at all is fine too
    other = client.post("/workflows", json={"workflow": "approval", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    assert client.post(f"/workflows/{other}/terminate").json()["status"] == "TERMINATED"


def test_pause_holds_decisions_and_resume_releases_them(client, harvest, tag):
    run_id = client.post("/workflows", json={"workflow": "approval", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    time.sleep(0.5)
    paused = client.post(f"/workflows/{run_id}/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["execution_id"] == run_id and paused.json()["status"] == "RUNNING"
    paused_at = paused.json()["paused_at"]
    assert paused_at is not None
    assert client.get(f"/workflows/{run_id}").json()["paused_at"] == paused_at
    assert client.post(f"/workflows/{run_id}/pause").json()["paused_at"] == paused_at  # idempotent
    assert client.post(f"/workflows/{run_id}/signals/decision", json={"payload": "yes"}).status_code == 200
    time.sleep(1.5)
    assert client.get(f"/workflows/{run_id}").json()["status"] == "RUNNING"
    resumed = client.post(f"/workflows/{run_id}/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["execution_id"] == run_id and resumed.json()["paused_at"] is None
    assert wait_status(client, run_id, "COMPLETED")["result"] == f"{tag}:yes"

    before = all_runs(harvest)
    not_paused = client.post(f"/workflows/{run_id}/resume")
    assert (not_paused.status_code, not_paused.json()["error"]) == (409, "InvalidState")
    finished = client.post(f"/workflows/{run_id}/pause")
    assert (finished.status_code, finished.json()["error"]) == (409, "InvalidState")
    assert all_runs(harvest) == before


# ── reset ────────────────────────────────────────────────────────────────────────────────────
def test_reset_forks_a_run_and_its_refusals(client, harvest, redis_client, tag):
    source = client.post("/workflows", json={"workflow": "three_steps", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    wait_status(client, source, "COMPLETED")
    new_id = f"reset-{tag}"
    resp = client.post(f"/workflows/{source}/reset", json={"to_seq": 4, "new_execution_id": new_id})
    assert resp.status_code == 201, resp.text
    assert resp.json() == {"run_id": new_id, "forked_from": source}
    body = wait_status(client, new_id, "COMPLETED")
    assert body["result"] == f"done:{tag}" and body["forked_from"] == source
    assert client.get(f"/workflows/{source}").json()["forked_to"] == new_id
    assert ran(redis_client, tag) == ["step_one", "step_two", "step_three", "step_two", "step_three"]

    before = all_runs(harvest)
    taken = client.post(f"/workflows/{source}/reset", json={"to_seq": 4, "new_execution_id": new_id})
    assert (taken.status_code, taken.json()["error"]) == (409, "ExecutionAlreadyExists")
    past = client.post(f"/workflows/{source}/reset", json={"to_seq": 999})
    assert (past.status_code, past.json()["error"]) == (400, "ValueError")
    assert "reset point must be between 1 and" in past.json()["detail"]
    after_end = client.post(f"/workflows/{source}/reset", json={"to_seq": body["history_length"]})
    assert after_end.status_code == 400
    missing = client.post("/workflows/no-such-run/reset", json={"to_seq": 1})
    assert (missing.status_code, missing.json()["error"]) == (404, "ExecutionNotFound")
    assert all_runs(harvest) == before

    # the fork holds copies of the source's payloads: erasing the source alone is refused
    before = all_runs(harvest)
    kept = client.post(f"/workflows/{source}/erase-payloads")
    assert kept.status_code == 409, kept.text
    assert kept.json()["error"] == "ForksHoldCopies" and kept.json()["forks"] == [new_id]
    assert repr(new_id) in kept.json()["detail"] and "with_forks" in kept.json()["detail"]
    assert all_runs(harvest) == before
    assert tag in client.get(f"/workflows/{new_id}/history").text.replace(new_id, "")
    bad = client.post(f"/workflows/{source}/erase-payloads", json={"with_forks": "please"})
    assert bad.status_code == 422 and all_runs(harvest) == before
    both = client.post(f"/workflows/{source}/erase-payloads", json={"with_forks": True})
    assert both.status_code == 200, both.text
    assert both.json()["forks"] == [new_id] and both.json()["fields"] > 0
    for run_id in (source, new_id):
        assert client.get(f"/workflows/{run_id}").json()["erased_at"] is not None
        assert tag not in client.get(f"/workflows/{run_id}/history").text.replace(new_id, "")
    before = all_runs(harvest)
    erased = client.post(f"/workflows/{source}/reset", json={"to_seq": 4})
    assert erased.status_code == 409 and erased.json()["reason"] == "erased"
    assert all_runs(harvest) == before


# ── erase-payloads ───────────────────────────────────────────────────────────────────────────
def test_erase_payloads_counts_is_idempotent_and_refuses_a_live_run(client, harvest, tag):
    secret = f"pan-{tag}"
    done = client.post("/workflows", json={"workflow": "three_steps", "input": {"tag": tag, "card": secret}})
    run_id = done.json()["execution_id"]
    wait_status(client, run_id, "COMPLETED")
    resp = client.post(f"/workflows/{run_id}/erase-payloads")
    assert resp.status_code == 200, resp.text
    counts = resp.json()
    assert counts["execution_id"] == run_id and counts["blobs"] == 0
    assert counts["events"] >= 7 and counts["fields"] > counts["events"]  # 3 inputs + 3 outputs + start
    body = client.get(f"/workflows/{run_id}").json()
    assert body["erased_at"] is not None and body["status"] == "COMPLETED"
    assert secret not in client.get(f"/workflows/{run_id}/history").text
    again = client.post(f"/workflows/{run_id}/erase-payloads")
    assert again.status_code == 200
    assert again.json() == {"execution_id": run_id, "events": 0, "fields": 0, "blobs": 0, "forks": []}

    live = client.post("/workflows", json={"workflow": "approval", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    before = all_runs(harvest)
    refused_ = client.post(f"/workflows/{live}/erase-payloads")
    assert (refused_.status_code, refused_.json()["error"]) == (409, "InvalidState")
    assert all_runs(harvest) == before
    assert tag in client.get(f"/workflows/{live}/history").text  # untouched
    harvest.cancel_workflow_execution(live, reason="cleanup")


# ── purge ────────────────────────────────────────────────────────────────────────────────────
def test_purge_deletes_old_terminal_runs_and_never_a_live_one(client, harvest, tag):
    old = client.post("/workflows", json={"workflow": "three_steps", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    wait_status(client, old, "COMPLETED")
    live = client.post("/workflows", json={"workflow": "approval", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    long_ago = utcnow() - timedelta(days=30 * 365)
    with harvest.store.engine.begin() as conn:  # as if both were 30 years old
        conn.execute(executions.update().where(executions.c.id == old).values(closed_at=long_ago))
        conn.execute(executions.update().where(executions.c.id == live).values(created_at=long_ago))
    events = harvest.describe(old).history_length
    resp = client.post("/admin/purge", json={"older_than_days": 29 * 365, "batch": 1})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"runs": 1, "events": events, "blobs": 0}
    gone = client.get(f"/workflows/{old}")
    assert (gone.status_code, gone.json()["error"]) == (404, "ExecutionNotFound")
    assert client.get(f"/workflows/{live}").json()["status"] == "RUNNING"
    assert client.post("/admin/purge", json={"older_than_days": 29 * 365}).json() == {
        "runs": 0,
        "events": 0,
        "blobs": 0,
    }
    harvest.cancel_workflow_execution(live, reason="cleanup")


# ── auth and malformed requests ──────────────────────────────────────────────────────────────
def test_every_operator_action_needs_the_token_when_one_is_configured(harvest, workers, tag):
    client = TestClient(create_app(harvest, token="s3cret"))
    run_id = harvest.start_workflow("approval", {"tag": tag})
    before = all_runs(harvest)
    for url, body in [
        (f"/workflows/{run_id}/terminate", {"reason": "x"}),
        (f"/workflows/{run_id}/pause", None),
        (f"/workflows/{run_id}/resume", None),
        (f"/workflows/{run_id}/reset", {"to_seq": 1}),
        (f"/workflows/{run_id}/erase-payloads", None),
        ("/admin/purge", {"older_than_days": 0}),
        (f"/dags/retryable/runs/{run_id}/retry", None),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            resp = client.post(url, json=body, headers=headers)
            assert resp.status_code == 401, (url, resp.text)
            assert resp.json()["error"] == "Unauthorized"
    assert all_runs(harvest) == before
    ok = client.post(f"/workflows/{run_id}/terminate", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


@pytest.fixture(scope="module")
def runs(harvest, workers) -> dict[str, str]:
    """A completed workflow run and a failed (retryable) DAG run for the malformed requests."""
    tag = uuid.uuid4().hex[:12]
    done = harvest.start_workflow("three_steps", {"tag": tag})
    harvest.result(done, timeout=30)
    failed = harvest.start_workflow("retryable", {"tag": tag})
    with pytest.raises(WorkflowFailed):
        harvest.result(failed, timeout=30)
    return {"done": done, "failed": failed}


HUGE = "x" * 201


@pytest.mark.parametrize(
    "url, body, status, error",
    [
        # terminate
        ("/workflows/{done}/terminate", '{"reason": ', 422, "ValidationError"),
        ("/workflows/{done}/terminate", {"reason": 5}, 422, "ValidationError"),
        ("/workflows/{done}/terminate", {"reason": "x" * 1001}, 422, "ValidationError"),
        ("/workflows/{done}/terminate", {"reason": "nul\u0000"}, 400, "PayloadNotSerializable"),
        ("/workflows/{done}/terminate", {"why": "x"}, 422, "ValidationError"),
        (f"/workflows/{HUGE}/terminate", None, 400, "ValueError"),
        ("/workflows/%20/terminate", None, 400, "ValueError"),
        # pause / resume / erase
        (f"/workflows/{HUGE}/pause", None, 400, "ValueError"),
        (f"/workflows/{HUGE}/resume", None, 400, "ValueError"),
        (f"/workflows/{HUGE}/erase-payloads", None, 400, "ValueError"),
        ("/workflows/no-such-run/pause", None, 404, "ExecutionNotFound"),
        ("/workflows/no-such-run/resume", None, 404, "ExecutionNotFound"),
        ("/workflows/no-such-run/terminate", None, 404, "ExecutionNotFound"),
        ("/workflows/no-such-run/erase-payloads", None, 404, "ExecutionNotFound"),
        # reset
        ("/workflows/{done}/reset", '{"to_seq": ', 422, "ValidationError"),
        ("/workflows/{done}/reset", None, 422, "ValidationError"),
        ("/workflows/{done}/reset", {}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": "four"}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": 1.5}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": -1}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": 0}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": 2**63}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": 1, "extra": 1}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": 1, "new_execution_id": HUGE}, 400, "ValueError"),
        ("/workflows/{done}/reset", {"to_seq": 1, "new_execution_id": " "}, 400, "ValueError"),
        ("/workflows/{done}/reset", {"to_seq": 1, "new_execution_id": "nul\u0000"}, 400, "ValueError"),
        ("/workflows/{done}/reset", {"to_seq": 1, "new_execution_id": 7}, 422, "ValidationError"),
        ("/workflows/{done}/reset", {"to_seq": 10_000}, 400, "ValueError"),
        (f"/workflows/{HUGE}/reset", {"to_seq": 1}, 400, "ValueError"),
        # retry
        ("/dags/retryable/runs/{failed}/retry", '{"from_node": ', 422, "ValidationError"),
        ("/dags/retryable/runs/{failed}/retry", {"from_node": 5}, 422, "ValidationError"),
        ("/dags/retryable/runs/{failed}/retry", {"from_node": ""}, 400, "ValueError"),
        ("/dags/retryable/runs/{failed}/retry", {"from_node": HUGE}, 400, "ValueError"),
        ("/dags/retryable/runs/{failed}/retry", {"node": "rt_a"}, 422, "ValidationError"),
        ("/dags/retryable/runs/{failed}/retry", {"new_execution_id": HUGE}, 400, "ValueError"),
        ("/dags/retryable/runs/{failed}/retry", [1, 2], 422, "ValidationError"),
        ("/dags/retryable/runs/{failed}/retry?dry_run=maybe", None, 422, "ValidationError"),
        (
            "/dags/retryable/runs/{failed}/retry",
            {"new_execution_id": "{done}"},
            409,
            "ExecutionAlreadyExists",
        ),
        (f"/dags/retryable/runs/{HUGE}/retry", None, 400, "ValueError"),
        (f"/dags/{HUGE}/runs/{{failed}}/retry", None, 400, "ValueError"),
        # purge
        ("/admin/purge", '{"older_than_days": ', 422, "ValidationError"),
        ("/admin/purge", None, 422, "ValidationError"),
        ("/admin/purge", {}, 422, "ValidationError"),
        ("/admin/purge", {"older_than_days": -1}, 422, "ValidationError"),
        ("/admin/purge", {"older_than_days": "soon"}, 422, "ValidationError"),
        ("/admin/purge", {"older_than_days": 10**9}, 422, "ValidationError"),
        ("/admin/purge", '{"older_than_days": 1e400}', 422, "ValidationError"),
        ("/admin/purge", '{"older_than_days": NaN}', 422, "ValidationError"),
        ("/admin/purge", {"older_than_days": 0, "batch": 0}, 422, "ValidationError"),
        ("/admin/purge", {"older_than_days": 0, "batch": 10**9}, 422, "ValidationError"),
        ("/admin/purge", {"older_than_days": 0, "everything": True}, 422, "ValidationError"),
    ],
)
def test_malformed_operator_requests_are_json_and_write_nothing(
    client, harvest, runs, url, body, status, error
):
    url = url.format(**runs)
    if isinstance(body, dict):
        body = {k: v.format(**runs) if isinstance(v, str) else v for k, v in body.items()}
    before = all_runs(harvest)
    if isinstance(body, str):  # raw text: truncated JSON, or JSON that json.dumps would refuse
        resp = client.post(url, content=body, headers={"content-type": "application/json"})
    else:
        resp = client.post(url, json=body)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"] == error
    assert resp.json()["detail"]
    assert all_runs(harvest) == before


def test_the_openapi_document_is_valid_and_names_the_operator_endpoints(client):
    from openapi_spec_validator import validate

    spec = client.get("/openapi.json").json()
    validate(spec)
    paths = spec["paths"]
    for path in (
        "/workflows/{execution_id}/terminate",
        "/workflows/{execution_id}/pause",
        "/workflows/{execution_id}/resume",
        "/workflows/{execution_id}/reset",
        "/workflows/{execution_id}/erase-payloads",
        "/admin/purge",
        "/dags/{name}/runs/{execution_id}/retry",
    ):
        assert "post" in paths[path], path
    retry = paths["/dags/{name}/runs/{execution_id}/retry"]["post"]
    assert {"200", "201", "400", "404", "409", "422", "503"} <= set(retry["responses"])
    assert retry["responses"]["409"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/RetryRefusedBody"
    )
    assert paths["/workflows/{execution_id}/reset"]["post"]["responses"].keys() >= {"201", "409"}
    described = spec["components"]["schemas"]["WorkflowDescription"]["properties"]
    assert {"forked_from", "forked_to", "paused_at", "erased_at"} <= set(described)
