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


def test_api_serves_the_apps_harvest_on_the_given_address(served, monkeypatch):
    monkeypatch.setenv("HARVEST_API_TOKEN", "t0ken")
    assert main(["--app", APP, "api", "--host", "0.0.0.0", "--port", "8123"]) == 0
    ((app, kwargs),) = served
    assert isinstance(app, FastAPI)
    assert kwargs == {"host": "0.0.0.0", "port": 8123}
    client = TestClient(app, headers={"Authorization": "Bearer t0ken"})
    assert client.get("/healthz").json() == {"status": "ok"}
    started = client.post(
        "/workflows",
        json={"workflow": "order_pipeline", "input": {"order_id": 5, "items": [{"qty": 2, "price": 3}]}},
    )
    assert started.status_code == 201, started.text
    assert client.get(f"/workflows/{started.json()['execution_id']}").json()["status"] == "COMPLETED"


def test_api_defaults_to_localhost_8000_and_honours_the_token(served, monkeypatch):
    monkeypatch.setenv("HARVEST_API_TOKEN", "t0ken")
    assert main(["api", "--app", APP]) == 0
    ((app, kwargs),) = served
    assert kwargs == {"host": "127.0.0.1", "port": 8000}
    client = TestClient(app)
    assert client.post("/workflows", json={"workflow": "order_pipeline"}).status_code == 401
    assert client.get("/workflows").status_code == 401  # reads too
    assert client.get("/healthz").status_code == 200  # but not the health check


def test_api_refuses_to_start_without_a_token(served, monkeypatch, capsys):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    assert main(["api", "--app", APP]) == 2
    assert "HARVEST_API_TOKEN is not set" in capsys.readouterr().err
    assert served == []


def test_insecure_no_auth_serves_every_caller_on_loopback_only(served, monkeypatch, capsys):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    for host in ("0.0.0.0", "192.168.1.5", "example.com", "::"):
        assert main(["api", "--app", APP, "--insecure-no-auth", "--host", host]) == 2
        assert "loopback only" in capsys.readouterr().err
    assert served == []
    for host in ("127.0.0.1", "localhost", "::1"):
        assert main(["api", "--app", APP, "--insecure-no-auth", "--host", host]) == 0
    assert [kw["host"] for _, kw in served] == ["127.0.0.1", "localhost", "::1"]
    assert TestClient(served[0][0]).get("/workflows").status_code == 200


def test_api_needs_an_app(served, capsys):
    assert main(["api"]) == 2
    assert "needs --app" in capsys.readouterr().err
    assert served == []
