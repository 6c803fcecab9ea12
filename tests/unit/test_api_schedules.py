"""The schedules endpoints over an embedded Harvest: the same token auth as every mutating
endpoint, bad input 400 and nothing written, pause with a note, resume, trigger, delete."""

from __future__ import annotations

from fastapi.testclient import TestClient

from harvest_celery import Harvest, WorkflowContext, workflow
from harvest_celery._web.api import create_app

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@workflow(name="as.tick")
async def as_tick(ctx: WorkflowContext, data: object) -> object:
    return data


def _client(tmp_path) -> tuple[Harvest, TestClient]:
    h = Harvest(f"sqlite:///{tmp_path / 'a.db'}").register(as_tick)
    h.migrate()
    return h, TestClient(create_app(h, token=TOKEN))


def test_schedules_over_http(tmp_path):
    h, client = _client(tmp_path)
    body = {
        "name": "hourly",
        "workflow": "as.tick",
        "cron": "0 * * * *",
        "timezone": "Europe/Paris",
        "input": {"v": 1},
    }
    assert client.post("/schedules", json=body).status_code == 401  # no token
    assert h.list_schedules() == []
    created = client.post("/schedules", json=body, headers=AUTH)
    assert created.status_code == 201 and created.json()["cron"] == "0 * * * *"
    assert client.post("/schedules", json=body, headers=AUTH).status_code == 409
    paused = client.post("/schedules/hourly/pause", json={"note": "db migration"}, headers=AUTH).json()
    assert paused["paused"] and paused["pause_note"] == "db migration"
    assert client.post("/schedules/hourly/resume", headers=AUTH).json()["paused"] is False
    run_id = client.post("/schedules/hourly/trigger", headers=AUTH).json()["run_id"]
    assert run_id.startswith("hourly@manual-")
    assert [s["name"] for s in client.get("/schedules", headers=AUTH).json()["schedules"]] == ["hourly"]
    assert client.delete("/schedules/hourly", headers=AUTH).json() == {"name": "hourly", "deleted": True}
    assert client.get("/schedules/hourly", headers=AUTH).status_code == 404


def test_bad_input_is_400_and_writes_nothing(tmp_path):
    h, client = _client(tmp_path)
    for bad in (
        {"name": "x", "workflow": "as.tick", "cron": "* * * * * *"},
        {"name": "x", "workflow": "as.tick"},
        {"name": "a:b", "workflow": "as.tick", "every_seconds": 5},
        {"name": "x", "workflow": "as.tick", "every_seconds": 0.5},
        {"name": "x", "workflow": "as.tick", "every_seconds": 5, "timezone": "UTC"},
        # durations past the 32-bit columns (and past what a timedelta holds): refused, not a 500
        {"name": "x", "workflow": "as.tick", "every_seconds": 1e15},
        {"name": "x", "workflow": "as.tick", "every_seconds": 5, "catchup_seconds": 8.64e13},
        {"name": "x", "workflow": "as.tick", "every_seconds": 5, "catchup_seconds": -1},
        {"name": "x", "workflow": "as.tick", "every_seconds": 5, "max_runs": 2**31},
    ):
        answer = client.post("/schedules", json=bad, headers=AUTH)
        assert answer.status_code == 400 and answer.json()["error"] == "InvalidSchedule", bad
    assert (
        client.post(
            "/schedules", json={"name": "x", "workflow": "nope", "every_seconds": 5}, headers=AUTH
        ).status_code
        == 404
    )
    assert h.list_schedules() == []
