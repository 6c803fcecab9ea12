"""``harvest api``: uvicorn serves the operator API of the --app's Harvest."""

from __future__ import annotations

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from harvest_celery._cli import main

APP = "tests.unit.cli_app"


@pytest.fixture
def served(cli_db, monkeypatch):
    cli_db(APP)
    calls: list[tuple[object, dict]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    return calls


def test_api_serves_the_apps_harvest_on_the_given_address(served):
    assert main(["--app", APP, "api", "--host", "0.0.0.0", "--port", "8123"]) == 0
    (app, kwargs), = served
    assert isinstance(app, FastAPI)
    assert kwargs == {"host": "0.0.0.0", "port": 8123}
    client = TestClient(app)
    assert client.get("/healthz").json() == {"status": "ok"}
    started = client.post("/workflows", json={"workflow": "order_pipeline", "input": {"order_id": 5, "items": [{"qty": 2, "price": 3}]}})
    assert started.status_code == 201, started.text
    assert client.get(f"/workflows/{started.json()['execution_id']}").json()["status"] == "COMPLETED"


def test_api_defaults_to_localhost_8000_and_honours_the_token(served, monkeypatch):
    monkeypatch.setenv("HARVEST_API_TOKEN", "t0ken")
    assert main(["api", "--app", APP]) == 0
    (app, kwargs), = served
    assert kwargs == {"host": "127.0.0.1", "port": 8000}
    assert TestClient(app).post("/workflows", json={"workflow": "order_pipeline"}).status_code == 401


def test_api_needs_an_app(served, capsys):
    assert main(["api"]) == 2
    assert "needs --app" in capsys.readouterr().err
    assert served == []
