"""The Flask integration on a real Flask app with Flask-SQLAlchemy on the harvest Postgres and a
real worker (webapps.py), on psycopg2 and psycopg 3: a view that starts a workflow inside
``db.session``'s transaction and then fails leaves no order, no run and no message; one that
commits gives a run that completes. Errors answer the HTTP API's JSON (409, 404), not an HTML
500; ``flask harvest …`` is the harvest command line."""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery._errors import ExecutionAlreadyExists, error_body

from .conftest import DATABASE_URL, wait_for

pytestmark = pytest.mark.integration

DRIVERS = ["psycopg2", "psycopg"]


@pytest.fixture(scope="module")
def engine() -> Any:
    engine = sa.create_engine(DATABASE_URL)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def apps(webapps: Any) -> Any:
    """One app per driver for the module (each has its engine: disposed at the end)."""
    made = {driver: webapps.create_app(driver) for driver in DRIVERS}
    for app in made.values():
        app.testing = True
    yield made
    for app in made.values():
        with app.app_context():
            webapps.db.engine.dispose()


@pytest.fixture(params=DRIVERS, ids=["psycopg2", "psycopg3"])
def app(request: Any, apps: Any) -> Any:
    return apps[request.param]


def count(engine: Any, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar_one())


def test_the_app_session_is_on_the_drivers_connection(app):
    from tests.integration.webapps import db

    with app.app_context():
        raw = db.session.connection().connection.driver_connection
        assert (
            type(raw).__module__.split(".")[0]
            == app.config["SQLALCHEMY_DATABASE_URI"].split("+")[1].split(":")[0]
        )


def test_a_view_that_fails_after_the_start_leaves_no_run(app, webapps, engine, tag):
    with pytest.raises(RuntimeError, match="failed after starting"):
        app.test_client().post("/orders", json={"tag": tag, "total": 3, "note": "n" * 400, "fail": True})
    assert count(engine, "SELECT count(*) FROM wa_orders WHERE tag = :t", t=tag) == 0
    assert count(engine, "SELECT count(*) FROM harvest_executions WHERE id = :i", i=f"order-{tag}") == 0
    assert count(engine, "SELECT count(*) FROM harvest_blobs WHERE key LIKE :k", k=f"order-{tag}/%") == 0
    time.sleep(1.0)
    assert webapps.effects(tag) == []


def test_a_view_that_commits_gives_a_run_that_completes(app, webapps, engine, tag):
    began = time.monotonic()
    resp = app.test_client().post("/orders", json={"tag": tag, "total": 3, "note": "n" * 400})
    assert resp.status_code == 202, resp.get_data(as_text=True)
    run_id = resp.get_json()["run_id"]
    harvest = app.extensions["harvest"].harvest
    assert harvest.result(run_id, timeout=15) == f"charged:{tag}"
    assert time.monotonic() - began < 15  # dispatched on commit, not by the minute-long sweep
    assert count(engine, "SELECT count(*) FROM wa_orders WHERE tag = :t", t=tag) == 1
    assert count(engine, "SELECT count(*) FROM harvest_blobs WHERE key LIKE :k", k=f"{run_id}/%") >= 1
    assert [e["name"] for e in webapps.effects(tag)] == ["wa_charge"]


def test_a_conflicting_start_answers_409_json_and_rolls_back(app, engine, tag):
    client = app.test_client()
    assert client.post("/orders", json={"tag": tag, "total": 3}).status_code == 202
    resp = client.post("/orders", json={"tag": tag, "total": 4})  # same id, another input
    assert resp.status_code == 409 and resp.is_json
    body = resp.get_json()
    assert body["error"] == "ExecutionAlreadyExists" and body["conflict"] == "input"
    assert f"order-{tag}" in body["detail"]
    assert count(engine, "SELECT count(*) FROM wa_orders WHERE tag = :t", t=tag) == 1
    # the same request again is the same start: idempotent, 202
    assert client.post("/orders", json={"tag": tag, "total": 3}).status_code == 202


def test_the_cancel_endpoint_answers_json_404_and_409(app, tag):
    client = app.test_client()
    missing = client.post(f"/runs/nope-{tag}/cancel")
    assert missing.status_code == 404 and missing.get_json()["error"] == "ExecutionNotFound"
    run_id = client.post(f"/gates/{tag}").get_json()["run_id"]
    first = client.post(f"/runs/{run_id}/cancel")
    assert first.status_code == 200 and first.get_json()["status"] == "CANCELLED"
    again = client.post(f"/runs/{run_id}/cancel")  # a second click
    assert again.status_code == 409 and again.is_json
    assert again.get_json()["error"] == "InvalidState"
    bad = client.post("/runs/a:b/cancel")
    assert bad.status_code == 404 and bad.is_json  # an id that cannot exist is not found


def test_the_error_body_is_the_apis(app):
    exc = ExecutionAlreadyExists("r1", "wa_checkout", "input")
    with app.test_request_context():
        from harvest_celery.contrib.flask import error_response

        response, status = error_response(exc)
        assert (status, response.get_json()) == (409, error_body(exc))


def test_flask_harvest_is_the_command_line(app, tag):
    runner = app.test_cli_runner()
    upgraded = runner.invoke(args=["harvest", "db", "upgrade"])
    assert upgraded.exit_code == 0 and "upgraded to head" in upgraded.output
    run_id = app.test_client().post(f"/gates/{tag}").get_json()["run_id"]
    harvest = app.extensions["harvest"].harvest
    wait_for(lambda: harvest.describe(run_id).history_length >= 4, what="the gate waiting")
    shown = runner.invoke(args=["harvest", "show", run_id])
    assert shown.exit_code == 0 and run_id in shown.output and "RUNNING" in shown.output
    signalled = runner.invoke(args=["harvest", "signal", run_id, "go", '"cli"'])
    assert signalled.exit_code == 0, signalled.output
    result = runner.invoke(args=["harvest", "result", run_id, "--timeout", "15"])
    assert result.exit_code == 0 and "cli" in result.output
    unknown = runner.invoke(args=["harvest", "show", f"nope-{tag}"])
    assert unknown.exit_code == 2


def test_flask_harvest_worker_runs_celery_on_the_apps_harvest(app, monkeypatch):
    """``flask harvest worker`` execs ``celery -A harvest_celery._cli:celery_app``, which loads the
    Flask app again in that process (``HARVEST_FLASK_APP``) and finds its Celery app."""
    import os
    import subprocess
    import sys

    import harvest_celery._cli as cli

    from .conftest import ROOT

    execs: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(cli, "_exec", lambda argv, env: execs.append((argv, env)))
    monkeypatch.delenv("HARVEST_FLASK_APP", raising=False)
    runner = app.test_cli_runner()
    from flask.cli import ScriptInfo

    info = ScriptInfo(app_import_path="tests.integration.webapps:app", create_app=lambda: app)
    result = runner.invoke(args=["harvest", "worker", "-Q", "wa_decide,wa_q"], obj=info)
    assert result.exit_code == 0, result.output
    argv, env = execs[0]
    assert argv[argv.index("-A") + 1] == "harvest_celery._cli:celery_app"
    assert env["HARVEST_APP"] == "harvest_celery.contrib.flask:current_harvest"
    assert env["HARVEST_FLASK_APP"] == "tests.integration.webapps:app"
    probe = (
        "from harvest_celery._cli import celery_app; "
        "print(celery_app.main, sorted(t for t in celery_app.tasks if not t.startswith('celery.')))"
    )
    child = dict(
        os.environ,
        HARVEST_APP=env["HARVEST_APP"],
        HARVEST_FLASK_APP=env["HARVEST_FLASK_APP"],
        PYTHONPATH=str(ROOT),
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=child, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("webapps ") and "wa_charge" in out.stdout and "harvest.decide" in out.stdout
