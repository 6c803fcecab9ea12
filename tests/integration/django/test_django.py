"""The Django integration with pytest-django, on real Postgres with a real Celery worker started
as a Django project runs it: a view that starts a workflow inside ``transaction.atomic()`` and
then fails leaves no order, no run and no message; one that commits gives a run that completes
(its activity updating the order through the ORM in the worker). On psycopg 3 here, and on
psycopg2 in a child pytest run of this same module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from django.db import connection, transaction
from django.test import Client

from harvest_celery import ExecutionAlreadyExists
from harvest_celery.contrib.django import get_harvest, harvest
from tests.integration.django.conftest import CHILD, DRIVER
from tests.integration.django.shop.activities import effects
from tests.integration.django.shop.models import Order

from ..conftest import DATABASE_URL, ROOT, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def client(django_worker: Any) -> Client:
    return Client()


def count(sql: str, **params: Any) -> int:
    engine = sa.create_engine(DATABASE_URL, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar_one())


def post(client: Client, path: str, body: dict[str, Any] | None = None) -> Any:
    return client.post(path, data=json.dumps(body or {}), content_type="application/json")


def test_django_runs_on_the_expected_driver():
    connection.ensure_connection()
    assert type(connection.connection).__module__.split(".")[0] == DRIVER


def test_settings_and_autodiscovery_build_the_projects_harvest():
    h = get_harvest()
    assert h is get_harvest()  # one per process
    assert h.database_alias == "default"
    assert {"dj_checkout", "dj_gate"} <= set(h.registry.workflows)
    assert {"dj_charge", "dj_step"} <= set(h.registry.activities)  # from activities.py
    assert h.runtime.settings.decision_queue == "dj_decide"
    assert h.database_url.startswith("postgresql+psycopg2://")


def test_a_view_that_fails_after_the_start_leaves_no_run(client, tag):
    with pytest.raises(RuntimeError, match="failed after starting"):
        post(client, "/orders/", {"tag": tag, "total": 5, "note": "n" * 400, "fail": True})
    assert not Order.objects.filter(tag=tag).exists()
    assert count("SELECT count(*) FROM harvest_executions WHERE id = :i", i=f"order-{tag}") == 0
    assert count("SELECT count(*) FROM harvest_blobs WHERE key LIKE :k", k=f"order-{tag}/%") == 0
    time.sleep(1.0)
    assert effects(tag) == []


def test_a_view_that_commits_gives_a_run_that_completes(client, tag):
    began = time.monotonic()
    resp = post(client, "/orders/", {"tag": tag, "total": 5, "note": "n" * 400})
    assert resp.status_code == 202
    run_id, order_id = resp.json()["run_id"], resp.json()["order_id"]
    assert harvest.result(run_id, timeout=15) == f"charged:{tag}"
    assert time.monotonic() - began < 15  # dispatched on commit, not by the minute-long sweep
    assert Order.objects.get(pk=order_id).status == "paid"  # the worker's ORM write
    assert count("SELECT count(*) FROM harvest_blobs WHERE key LIKE :k", k=f"{run_id}/%") >= 1
    assert [e["name"] for e in effects(tag)] == ["dj_charge"]


def test_a_start_outside_atomic_is_its_own_transaction(django_worker, tag):
    assert connection.get_autocommit()
    run_id = harvest.start_workflow("dj_checkout", {"order_id": 0, "tag": tag}, f"plain-{tag}")
    assert harvest.result(run_id, timeout=15) == f"charged:{tag}"


def test_a_conflicting_id_answers_409_and_rolls_the_order_back(client, tag):
    assert post(client, "/orders/", {"tag": tag, "total": 5}).status_code == 202
    again = post(client, "/orders/", {"tag": tag, "total": 6})  # a new order row: another input
    assert again.status_code == 409
    body = again.json()
    assert (body["error"], body["conflict"]) == ("ExecutionAlreadyExists", "input")
    assert Order.objects.filter(tag=tag).count() == 1
    with pytest.raises(ExecutionAlreadyExists):
        with transaction.atomic():
            harvest.start_workflow("dj_gate", {"tag": tag}, f"order-{tag}")  # another workflow


def test_the_cancel_view_answers_json_404_and_409(client, tag):
    missing = post(client, f"/runs/nope-{tag}/cancel/")
    assert missing.status_code == 404 and missing.json()["error"] == "ExecutionNotFound"
    run_id = post(client, f"/gates/{tag}/").json()["run_id"]
    assert post(client, f"/runs/{run_id}/cancel/").json() == {"status": "CANCELLED"}
    again = post(client, f"/runs/{run_id}/cancel/")
    assert again.status_code == 409 and again.json()["error"] == "InvalidState"


def test_start_on_commit_runs_after_the_commit_only(django_worker, tag):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            harvest.start_workflow_on_commit("dj_checkout", {"order_id": 0, "tag": tag}, f"later-{tag}")
            raise RuntimeError("rolled back")
    assert count("SELECT count(*) FROM harvest_executions WHERE id = :i", i=f"later-{tag}") == 0
    with transaction.atomic():
        run_id = harvest.start_workflow_on_commit("dj_checkout", {"order_id": 0, "tag": tag}, f"later-{tag}")
        assert count("SELECT count(*) FROM harvest_executions WHERE id = :i", i=run_id) == 0
    assert harvest.result(run_id, timeout=15) == f"charged:{tag}"


def test_manage_py_harvest_is_the_command_line(django_worker, tag, capsys):
    from django.core.management import CommandError, call_command

    call_command("harvest", "db", "upgrade")
    assert "upgraded to head" in capsys.readouterr().out
    run_id = harvest.start_workflow("dj_gate", {"tag": tag}, f"cli-{tag}")
    wait_for(lambda: harvest.describe(run_id).history_length >= 4, what="the gate waiting")
    call_command("harvest", "signal", run_id, "go", '"from manage.py"')
    call_command("harvest", "result", run_id, "--timeout", "15")
    assert "from manage.py" in capsys.readouterr().out
    with pytest.raises(CommandError, match="exited with status 2"):
        call_command("harvest", "show", f"nope-{tag}")


def test_settings_mistakes_are_improperly_configured(settings):
    from django.core.exceptions import ImproperlyConfigured

    from harvest_celery.contrib.django.conf import database_url, harvest_settings

    settings.HARVEST = {"DATABSE_ALIAS": "default"}
    with pytest.raises(ImproperlyConfigured, match="unknown HARVEST key"):
        harvest_settings()
    settings.HARVEST = {
        "DATABASE_ALIAS": "default",
        "DATABASE_URL": "postgresql+psycopg2://postgres@127.0.0.1:5432/another_db",
    }
    with pytest.raises(ImproperlyConfigured, match="name different databases"):
        database_url(harvest_settings())
    settings.HARVEST = {"DATABASE_ALIAS": "nope"}
    with pytest.raises(ImproperlyConfigured, match="not in DATABASES"):
        database_url(harvest_settings())
    settings.HARVEST = {}
    settings.HARVEST_DATABASE_URL = "postgresql://h/x"
    assert database_url(harvest_settings()) == "postgresql://h/x"


@pytest.mark.skipif(CHILD, reason="the child run is this test's own")
def test_the_same_tests_pass_on_psycopg2(django_worker):
    env = dict(os.environ, HARVEST_DJANGO_CHILD="1", HARVEST_DJANGO_DRIVER="psycopg2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_manage_py_harvest_worker_runs_celery_on_the_projects_app(monkeypatch, tag):
    """``manage.py harvest worker`` execs ``celery -A harvest_celery._cli:celery_app``, which
    resolves, in that new process, to the project's Celery app with the harvest tasks on it."""
    from django.core.management import call_command

    import harvest_celery._cli as cli

    execs: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(cli, "_exec", lambda argv, env: execs.append((argv, env)))
    call_command("harvest", "worker", "-Q", "dj_decide,dj_q")
    argv, env = execs[0]
    assert argv[argv.index("-A") + 1] == "harvest_celery._cli:celery_app"
    assert env["HARVEST_APP"] == "harvest_celery.contrib.django:get_harvest"
    probe = (
        "from harvest_celery._cli import celery_app; "
        "print(celery_app.main, sorted(t for t in celery_app.tasks if not t.startswith('celery.')))"
    )
    child = dict(
        os.environ,
        HARVEST_APP=env["HARVEST_APP"],
        PYTHONPATH=str(ROOT),
        DJANGO_SETTINGS_MODULE="tests.integration.django.settings",
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=child, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("djshop ")
    assert all(name in out.stdout for name in ("harvest.decide", "dj_charge", "dj_step"))
