"""The operator HTTP API over the test app's Harvest: real Postgres, real Redis, real workers."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from harvest_celery._web.api import create_app

from .conftest import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(harvest, workers, monkeypatch) -> TestClient:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    return TestClient(create_app(harvest))


def all_runs(harvest) -> dict[str, int]:
    """Every run's id and history length: what a rejected request must leave unchanged."""
    return {x.id: x.history_length for x in harvest.list(limit=100_000)}


def wait_terminal(client: TestClient, run_id: str, timeout: float = 30) -> dict[str, Any]:
    def done() -> Any:
        body = client.get(f"/workflows/{run_id}").json()
        return body if body["status"] != "RUNNING" else None

    return wait_for(done, timeout=timeout, what=f"run {run_id} to finish")  # type: ignore[no-any-return]


def test_start_describe_history(client, tag):
    resp = client.post(
        "/workflows", json={"workflow": "three_steps", "input": {"tag": tag}, "execution_id": f"api-{tag}"}
    )
    assert resp.status_code == 201, resp.text
    assert resp.json() == {"execution_id": f"api-{tag}"}
    body = wait_terminal(client, f"api-{tag}")
    assert body["status"] == "COMPLETED"
    assert body["workflow_type"] == "three_steps"
    assert body["result"] == f"done:{tag}"
    assert body["error"] is None and body["closed_at"] is not None
    assert (
        body["nd_blocked"],
        body["nd_blocked_at"],
        body["nd_block_reason"],
        body["nd_block_count"],
        body["nd_details"],
    ) == (False, None, None, 0, None)
    history = client.get(f"/workflows/api-{tag}/history").json()
    types = [e["type"] for e in history["events"]]
    assert types[0] == "WorkflowStarted" and types[-1] == "WorkflowCompleted"
    assert types.count("ActivityScheduled") == 3
    assert [e["seq"] for e in history["events"]] == list(range(len(types)))
    started = history["events"][0]["data"]
    assert (started["workflow_type"], started["input"]) == ("three_steps", {"tag": tag})
    # an idempotent start answers with the same id and writes nothing
    again = client.post(
        "/workflows", json={"workflow": "three_steps", "input": {"tag": tag}, "execution_id": f"api-{tag}"}
    )
    assert again.status_code == 201 and again.json() == {"execution_id": f"api-{tag}"}
    assert len(client.get(f"/workflows/api-{tag}/history").json()["events"]) == len(types)


def test_list_filters(client, tag):
    run_id = client.post("/workflows", json={"workflow": "three_steps", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    wait_terminal(client, run_id)
    listed = client.get(
        "/workflows", params={"workflow": "three_steps", "status": "COMPLETED", "limit": 1000}
    )
    assert listed.status_code == 200
    assert run_id in [x["execution_id"] for x in listed.json()["workflows"]]
    blocked = client.get("/workflows", params={"nd_blocked": "true", "workflow": "three_steps"})
    assert blocked.status_code == 200
    assert run_id not in [x["execution_id"] for x in blocked.json()["workflows"]]
    assert all(x["nd_blocked"] for x in blocked.json()["workflows"])
    unblocked = client.get(
        "/workflows", params={"nd_blocked": "false", "workflow": "three_steps", "limit": 1000}
    )
    assert run_id in [x["execution_id"] for x in unblocked.json()["workflows"]]
    page = client.get("/workflows", params={"limit": 1, "offset": 0}).json()
    assert (len(page["workflows"]), page["limit"], page["offset"]) == (1, 1, 0)
    bad = client.get("/workflows", params={"status": "SLEEPING"})
    assert bad.status_code == 422 and bad.json()["error"] == "ValidationError"
    assert client.get("/workflows", params={"limit": 0}).status_code == 422


def test_signal_then_cancel(client, harvest, tag):
    signalled = client.post("/workflows", json={"workflow": "approval", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    resp = client.post(f"/workflows/{signalled}/signals/decision", json={"payload": "yes"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": signalled, "signal": "decision"}
    assert harvest.result(signalled, timeout=30) == f"{tag}:yes"

    waiting = client.post("/workflows", json={"workflow": "approval", "input": {"tag": tag}}).json()[
        "execution_id"
    ]
    resp = client.post(f"/workflows/{waiting}/cancel", json={"reason": "operator asked"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": waiting, "status": "CANCELLED"}
    body = client.get(f"/workflows/{waiting}").json()
    assert (body["status"], body["cancel_reason"]) == ("CANCELLED", "operator asked")
    assert body["cancelled_at"] is not None

    before = all_runs(harvest)
    again = client.post(f"/workflows/{waiting}/cancel", json={"reason": "twice"})
    assert again.status_code == 409 and again.json()["error"] == "InvalidState"
    late = client.post(f"/workflows/{waiting}/signals/decision", json={"payload": "no"})
    assert late.status_code == 409 and late.json()["error"] == "InvalidState"
    assert all_runs(harvest) == before


def test_mutating_endpoints_need_the_token_when_one_is_configured(harvest, workers, tag):
    client = TestClient(create_app(harvest, token="s3cret"))
    start = {"workflow": "approval", "input": {"tag": tag}}
    before = all_runs(harvest)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        resp = client.post("/workflows", json=start, headers=headers)
        assert resp.status_code == 401
        assert resp.json()["error"] == "Unauthorized"
        assert resp.headers["www-authenticate"] == "Bearer"
    assert all_runs(harvest) == before
    ok = client.post("/workflows", json=start, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 201
    run_id = ok.json()["execution_id"]
    assert client.post(f"/workflows/{run_id}/cancel", json={}).status_code == 401
    assert client.post(f"/workflows/{run_id}/signals/decision", json={}).status_code == 401
    assert client.get(f"/workflows/{run_id}").status_code == 401  # reads need the token too
    assert (
        client.get(f"/workflows/{run_id}", headers={"Authorization": "Bearer s3cret"}).json()["status"]
        == "RUNNING"
    )
    cancelled = client.post(f"/workflows/{run_id}/cancel", headers={"Authorization": "Bearer s3cret"})
    assert cancelled.status_code == 200


def test_the_token_may_come_from_the_environment(harvest, workers, monkeypatch):
    monkeypatch.setenv("HARVEST_API_TOKEN", "from-env")
    client = TestClient(create_app(harvest))
    assert client.post("/workflows", json={"workflow": "approval"}).status_code == 401


@pytest.mark.parametrize(
    "request_, status, error",
    [
        (("post", "/workflows", {"workflow": "no_such_workflow", "input": {}}), 404, "UnknownWorkflow"),
        (("get", "/workflows/no-such-run", None), 404, "ExecutionNotFound"),
        (("get", "/workflows/no-such-run/history", None), 404, "ExecutionNotFound"),
        (("post", "/workflows/no-such-run/signals/decision", {"payload": 1}), 404, "ExecutionNotFound"),
        (("post", "/workflows/no-such-run/cancel", {"reason": "x"}), 404, "ExecutionNotFound"),
        (("post", "/workflows", {"workflow": "approval", "execution_id": "x" * 201}), 400, "ValueError"),
        (("post", "/workflows", {"workflow": "approval", "execution_id": "   "}), 400, "ValueError"),
        (("post", "/workflows", {"workflow": "approval", "execution_id": ""}), 400, "ValueError"),
        (("get", "/workflows/" + "x" * 201, None), 400, "ValueError"),
        (("post", "/workflows/%20/cancel", {}), 400, "ValueError"),
        (
            ("post", "/workflows", {"workflow": "approval", "input": {"a": "nul\u0000"}}),
            400,
            "PayloadNotSerializable",
        ),
        (("post", "/workflows", '{"workflow": "approval", "input": 1e400}'), 400, "PayloadNotSerializable"),
        (("post", "/workflows", {"workflow": "approval", "input": {}, "extra": 1}), 422, "ValidationError"),
        (("post", "/workflows", {"input": {}}), 422, "ValidationError"),
        (("get", "/workflows?limit=-1", None), 422, "ValidationError"),
    ],
)
def test_rejections_are_json_and_write_nothing(client, harvest, request_, status, error):
    method, url, body = request_
    before = all_runs(harvest)
    if isinstance(body, str):  # raw JSON that json.dumps would refuse to write
        resp = client.request(method, url, content=body, headers={"content-type": "application/json"})
    else:
        resp = client.request(method, url, json=body)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"] == error
    assert resp.json()["detail"]
    assert all_runs(harvest) == before


def test_an_id_reused_for_another_workflow_is_a_conflict_that_writes_nothing(client, harvest, tag):
    run_id = f"taken-{tag}"
    assert (
        client.post(
            "/workflows", json={"workflow": "approval", "input": {"tag": tag}, "execution_id": run_id}
        ).status_code
        == 201
    )
    before = all_runs(harvest)
    resp = client.post(
        "/workflows", json={"workflow": "three_steps", "input": {"tag": tag}, "execution_id": run_id}
    )
    assert resp.status_code == 409
    assert resp.json()["error"] == "ExecutionAlreadyExists"
    assert all_runs(harvest) == before
    assert client.get(f"/workflows/{run_id}").json()["workflow_type"] == "approval"
    harvest.cancel_workflow_execution(run_id, reason="cleanup")


def test_the_run_graph_of_a_compensated_diamond(client, harvest, tag):
    run_id = client.post(
        "/workflows", json={"workflow": "diamond", "input": {"tag": tag, "fail": ["dia_d"]}}
    ).json()["execution_id"]
    body = wait_terminal(client, run_id)
    assert body["status"] == "FAILED"
    # the unwind happened: three compensator dispatches in the raw history
    events = client.get(f"/workflows/{run_id}/history").json()["events"]
    compensations = [
        e["data"]
        for e in events
        if e["type"] == "ActivityScheduled" and e["data"]["activity_name"] == "undo_node"
    ]
    assert [c["input"]["dag_compensate"] for c in compensations] == ["dia_c", "dia_b", "dia_a"]

    resp = client.get(f"/dags/diamond/runs/{run_id}")
    assert resp.status_code == 200, resp.text
    graph = resp.json()
    assert (graph["run_id"], graph["dag_name"], graph["state"]) == (run_id, "diamond", "FAILED")
    assert graph["started_at"] and graph["finished_at"]
    nodes = {n["node_name"]: n for n in graph["nodes"]}
    assert list(nodes) == ["dia_a", "dia_b", "dia_c", "dia_d"]  # no compensation as a node
    assert {name: n["status"] for name, n in nodes.items()} == {
        "dia_a": "succeeded",
        "dia_b": "succeeded",
        "dia_c": "succeeded",
        "dia_d": "failed",
    }
    assert nodes["dia_d"]["depends_on"] == ["dia_b", "dia_c"]
    assert (nodes["dia_d"]["error_type"], nodes["dia_d"]["error"]) == ("RuntimeError", "dia_d failed")
    assert all(n["attempts"] == 1 and n["started_at"] and n["finished_at"] for n in nodes.values())
    assert tag not in resp.text  # never a payload: the tag sits in every input and output

    assert client.get(f"/dags/no_such_dag/runs/{run_id}").json()["error"] == "UnknownDag"
    assert client.get(f"/dags/three_steps/runs/{run_id}").status_code == 404  # a workflow, not a DAG
    assert client.get(f"/dags/shapes/runs/{run_id}").status_code == 404  # a run of another DAG
    missing = client.get("/dags/diamond/runs/no-such-run")
    assert (missing.status_code, missing.json()["error"]) == (404, "ExecutionNotFound")


def test_metrics_and_healthz(client):
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "harvest_saga_compensated_total" in metrics.text
    health = client.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})


def test_openapi_names_every_endpoint(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths) == {
        "/workflows",
        "/workflows/{execution_id}",
        "/workflows/{execution_id}/history",
        "/workflows/{execution_id}/errors",
        "/workflows/{execution_id}/signals/{name}",
        "/workflows/{execution_id}/cancel",
        "/workflows/{execution_id}/request-cancel",
        "/dags/{name}/runs/{execution_id}",
        "/metrics",
        "/healthz",
        "/workflows/{execution_id}/terminate",
        "/workflows/{execution_id}/pause",
        "/workflows/{execution_id}/resume",
        "/workflows/{execution_id}/reset",
        "/workflows/{execution_id}/erase-payloads",
        "/admin/purge",
        "/dags/{name}/runs/{execution_id}/retry",
        "/ui/dags/{name}/runs/{run_id}",
        "/schedules",
        "/schedules/{name}",
        "/schedules/{name}/pause",
        "/schedules/{name}/resume",
        "/schedules/{name}/trigger",
        "/limits",
        "/limits/{name}",
        "/workflows/{execution_id}/queries/{name}",
        "/workflows/{execution_id}/updates/{name}",
    }


def _chain(client: TestClient, first: str) -> list[dict[str, Any]]:
    links = [client.get(f"/workflows/{first}").json()]
    while links[-1]["continued_to"] is not None:
        links.append(client.get(f"/workflows/{links[-1]['continued_to']}").json())
    return links


def test_a_runs_links_to_its_parent_children_and_chain(client, harvest, tag):
    parent = f"api-links-{tag}"
    harvest.start_workflow("ch_checkout", {"tag": tag}, execution_id=parent)
    assert harvest.result(parent, timeout=60) == "shipped"
    child = f"{parent}-c1"
    body = client.get(f"/workflows/{parent}").json()
    assert body["children"] == [{"id": child, "workflow": "ch_book_trip", "status": "COMPLETED"}]
    assert body["parent_id"] is None
    assert client.get(f"/workflows/{child}").json()["parent_id"] == parent
    first = f"api-chain-{tag}"
    waits = {"n": 0, "to": 2, "every": 1, "signal_at": 2}  # its second link waits for "mid"
    harvest.start_workflow("ch_counter", waits, execution_id=first)
    wait_for(lambda: len(_chain(client, first)) == 2, what="the second link")
    resp = client.post(f"/workflows/{first}/signals/mid", json={"payload": "hi"})  # to the first id
    assert resp.status_code == 200, resp.text
    assert harvest.result(first, timeout=60) == {"n": 2, "got": ["hi"]}  # the current run got it
    links = _chain(client, first)
    assert [x["status"] for x in links] == ["CONTINUED_AS_NEW", "CONTINUED_AS_NEW", "COMPLETED"]
    assert [x["continued_from"] for x in links] == [None, first, links[1]["execution_id"]]
    listed = client.get("/workflows", params={"status": "CONTINUED_AS_NEW", "limit": 1000}).json()
    assert {first, links[1]["execution_id"]} <= {x["execution_id"] for x in listed["workflows"]}
    other = f"api-chain-t-{tag}"
    harvest.start_workflow("ch_counter", waits, execution_id=other)
    wait_for(lambda: len(_chain(client, other)) == 2, what="the second link")
    assert client.post(f"/workflows/{other}/terminate", json={"reason": "ops"}).status_code == 200
    assert [x["status"] for x in _chain(client, other)] == ["CONTINUED_AS_NEW", "TERMINATED"]
