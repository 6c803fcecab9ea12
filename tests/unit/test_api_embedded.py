"""The operator API over an embedded (SQLite, in-process) Harvest with encrypted payloads: the run
graph filters compensation dispatches on *decoded* history, and never shows a payload."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient

from harvest_celery import DagBuilder, Harvest, RetryPolicy, activity, dag
from harvest_celery._payloads.codec import FernetCodec
from harvest_celery._store.schema import events as events_table
from harvest_celery._web.api import create_app

ONCE = RetryPolicy(max_attempts=1)
SECRET = "pan-4111-1111"


@activity(retry=ONCE)
def reserve(value: dict) -> dict:
    return {"reserved": SECRET}


@activity(retry=ONCE)
def charge(value: dict) -> dict:
    raise RuntimeError("card declined\nTraceback: ...")


@activity(retry=ONCE)
def release(envelope: dict) -> str:
    return "released"


@dag(name="checkout_dag")
def checkout_v1(g: DagBuilder) -> None:
    r = g.activity(reserve).compensate(release)
    g.activity(charge).upstream(r)


@dag(name="checkout_dag")
def checkout_v2(g: DagBuilder) -> None:
    """A later version: ``release`` is now a forward node (the old compensator's name)."""
    r = g.activity(reserve)
    g.activity(release).upstream(r)


@pytest.fixture
def harvests(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    url = f"sqlite:///{tmp_path / 'api.db'}"
    codec = FernetCodec({"k1": Fernet.generate_key()}, primary="k1")
    v1 = Harvest(url, codec=codec).register(reserve, charge, release, checkout_v1)
    v1.migrate()
    v2 = Harvest(url, codec=codec).register(reserve, charge, release, checkout_v2)
    return v1, v2


def test_the_run_graph_reads_decoded_history_across_definition_versions(harvests):
    v1, v2 = harvests
    run_id = v1.start_workflow("checkout_dag", {"card": SECRET})
    assert v1.describe(run_id).status == "FAILED"
    stored = v1.store.history(run_id)
    assert [h.event.activity_name for h in stored if h.event.type == "ActivityScheduled"] == [
        "reserve",
        "charge",
        "release",
    ]

    v1_graph = TestClient(create_app(v1)).get(f"/dags/checkout_dag/runs/{run_id}")
    assert v1_graph.status_code == 200, v1_graph.text
    assert [(n["node_name"], n["status"]) for n in v1_graph.json()["nodes"]] == [
        ("reserve", "succeeded"),
        ("charge", "failed"),
    ]
    assert v1_graph.json()["nodes"][1]["error"] == "card declined"

    # v2 reads the old run: the old compensation dispatch of "release" is not the new node
    v2_graph = TestClient(create_app(v2)).get(f"/dags/checkout_dag/runs/{run_id}")
    release_node = v2_graph.json()["nodes"][1]
    assert (release_node["node_name"], release_node["status"], release_node["attempts"]) == (
        "release",
        "skipped",
        0,
    )
    for resp in (v1_graph, v2_graph):
        assert SECRET not in resp.text


def test_history_is_served_decoded(harvests):
    v1, _ = harvests
    run_id = v1.start_workflow("checkout_dag", {"card": SECRET})
    events = TestClient(create_app(v1)).get(f"/workflows/{run_id}/history").json()["events"]
    assert events[0]["data"]["input"] == {"card": SECRET}
    with v1.store.engine.connect() as conn:  # at rest it is ciphertext
        at_rest = (
            conn.execute(sa.select(events_table.c.data).where(events_table.c.execution_id == run_id))
            .scalars()
            .all()
        )
    assert SECRET not in json.dumps(at_rest)
