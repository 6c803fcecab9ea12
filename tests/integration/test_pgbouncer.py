"""Through PgBouncer in transaction pooling mode (tests/integration/pgbouncer.py), on real
workers: the core scenarios and the transactional start, with psycopg2 and psycopg 3, on
harvest's own engine and on an application's connection (``start_workflow(connection=...)``).

Each deployment is a pair of workers and a client whose database URL goes through the pooler
and is marked pooled (``HARVEST_DATABASE_POOLED=1``): with ``listen_url`` pointing at Postgres
directly, or without one, where nothing listens and runs complete by polling, which each process
logs. psycopg 3 makes no server-side prepared statement: not on harvest's pooled engines, not on
an application's connection, whatever its ``prepare_threshold``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg2
import pytest
import sqlalchemy as sa
from celery import Celery

from harvest_celery import Harvest, WorkflowFailed
from harvest_celery._client import configure_dedicated_celery_app

from . import pgbouncer
from .conftest import BROKER_URL, DATABASE_URL, DB_NAME, METRICS_PORTS, Worker, effects

pytestmark = pytest.mark.integration

DIRECT_DSN = DATABASE_URL.replace("postgresql+psycopg2://", "postgresql://")
POLLING_LOG = "nothing LISTENs"
DEPLOYMENTS = [
    ("psycopg2", "listen"),
    ("psycopg2", "polling"),
    ("psycopg", "listen"),
    ("psycopg", "polling"),
]


@pytest.fixture(scope="module")
def bouncer(harvest: Any) -> Iterator[pgbouncer.PgBouncer]:
    with pgbouncer.running() as running:
        yield running


class Deployment:
    def __init__(self, bouncer: pgbouncer.PgBouncer, driver: str, mode: str) -> None:
        self.driver = driver
        self.mode = mode
        self.url = bouncer.url(DB_NAME, driver)
        self.dsn = bouncer.dsn(DB_NAME)
        self.listen_url = DATABASE_URL if mode == "listen" else None
        env = {
            "HARVEST_TEST_DATABASE_URL": self.url,
            "HARVEST_DATABASE_POOLED": "1",
            "HARVEST_LISTEN_URL": self.listen_url or "",
        }
        self.workers = [
            Worker(
                f"pb1-{driver}-{mode}",
                "harvest,default,alpha",
                {**env, "HARVEST_METRICS_PORT": str(METRICS_PORTS["w1"])},
            ),
            Worker(f"pb2-{driver}-{mode}", "beta", {**env, "HARVEST_METRICS_PORT": str(METRICS_PORTS["w2"])}),
        ]
        self.client = self._client()

    def _client(self) -> Harvest:
        from tests.integration import app

        celery = Celery("harvest_pgb", broker=BROKER_URL)
        configure_dedicated_celery_app(celery)
        client = Harvest(
            self.url,
            celery,
            pooled=True,
            listen_url=self.listen_url,
            timings=app.harvest.runtime.settings.timings,
        )
        client.register(
            app.step_one, app.step_two, app.step_three, app.three_steps, app.forward, app.undo, app.saga_steps
        )
        return client

    def mark_logs(self) -> None:
        self.offsets = [w.log.stat().st_size if w.log.exists() else 0 for w in self.workers]

    def worker_logs(self) -> str:
        """What the workers logged since this deployment started (the files outlive sessions)."""
        return "".join(
            w.log.read_bytes()[start:].decode(errors="replace")
            for w, start in zip(self.workers, self.offsets, strict=True)
        )


@pytest.fixture(scope="module", params=DEPLOYMENTS, ids=["-".join(d) for d in DEPLOYMENTS])
def deployment(request: Any, bouncer: pgbouncer.PgBouncer) -> Iterator[Deployment]:
    made = Deployment(bouncer, *request.param)
    made.mark_logs()
    try:
        for worker in made.workers:
            worker.start()
        yield made
    finally:
        for worker in made.workers:
            worker.stop()
        made.client.store.dispose()


def test_three_steps_and_a_saga_complete_through_the_pooler(deployment, redis_client, tag):
    h = deployment.client
    run_id = h.start_workflow("three_steps", {"tag": tag}, execution_id=f"pb3-{tag}")
    assert h.result(run_id, timeout=60) == f"done:{tag}"
    assert [e["name"] for e in effects(redis_client, tag)] == ["step_one", "step_two", "step_three"]
    saga = h.start_workflow("saga_steps", {"tag": tag, "n": 3, "fail_at": 3}, execution_id=f"pbs-{tag}")
    with pytest.raises(WorkflowFailed, match="forward 3 failed"):
        h.result(saga, timeout=60)
    undone = sorted(e["name"] for e in effects(redis_client, tag) if e["name"].startswith("undo:"))
    assert undone == ["undo:1", "undo:2"]  # each compensation once


@pytest.mark.parametrize("app_driver", [psycopg2, psycopg], ids=["app-psycopg2", "app-psycopg3"])
def test_a_start_in_the_applications_transaction_through_the_pooler(deployment, tag, app_driver):
    h = deployment.client
    run_id = f"pbtx-{app_driver.__name__}-{tag}"
    conn = app_driver.connect(deployment.dsn)
    try:
        h.start_workflow("three_steps", {"tag": tag}, run_id, connection=conn)
        conn.rollback()
        assert _runs(run_id) == 0
        h.start_workflow("three_steps", {"tag": tag}, run_id, connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert h.result(run_id, timeout=60) == f"done:{tag}"


def test_a_start_on_a_core_connection_through_the_pooler(deployment, tag):
    """No after-commit hook: the worker's listener hears it (listen_url), or its sweeper's
    lost-message pass finds it (polling, ``redispatch_after``: 3 s in the test app)."""
    h = deployment.client
    engine = sa.create_engine(deployment.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            h.start_workflow("three_steps", {"tag": tag}, f"pbcore-{tag}", connection=conn)
            conn.commit()
    finally:
        engine.dispose()
    assert h.result(f"pbcore-{tag}", timeout=60) == f"done:{tag}"


def test_without_listen_url_every_process_says_it_polls(deployment, tag):
    h = deployment.client
    run_id = h.start_workflow("three_steps", {"tag": tag}, execution_id=f"pblog-{tag}")
    assert h.result(run_id, timeout=60) == f"done:{tag}"
    told = deployment.worker_logs().count(POLLING_LOG)
    if deployment.mode == "polling":
        assert told >= 1  # the decision worker's sweeper
        assert h.store.listener is not None and not h.store.listener.connected.is_set()
    else:
        assert told == 0
        assert h.store.listener is not None and h.store.listener.connected.is_set()


def test_harvests_own_engines_prepare_nothing_when_pooled(deployment):
    """psycopg 3: no server-side prepares (``prepare_threshold=None``); psycopg2 never makes any."""
    store = deployment.client.store
    for engine in (store.engine, store.autocommit_engine):
        with engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert getattr(dbapi, "prepare_threshold", None) is None
            assert type(dbapi).__module__.split(".")[0] == deployment.driver


def test_an_applications_psycopg3_connection_gets_no_prepared_statement(harvest, tag):
    """Directly on Postgres (one session, so its prepared statements are visible): a connection
    that would prepare every statement (``prepare_threshold=0``) still gets none from harvest."""
    conn = psycopg.connect(DIRECT_DSN, prepare_threshold=0)
    try:
        for i in range(6):
            harvest.start_workflow("three_steps", {"tag": tag}, f"prep-{i}-{tag}", connection=conn)
            harvest.start_workflow("three_steps", {"tag": tag}, f"prep-{i}-{tag}", connection=conn)  # reuse
        with conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False)
            row = cursor.fetchone()
        conn.rollback()
    finally:
        conn.close()
    assert row is not None and row[0] == 0


def _runs(run_id: str) -> int:
    engine = sa.create_engine(DATABASE_URL, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT count(*) FROM harvest_executions WHERE id = :id"), {"id": run_id}
            )
            return int(found.scalar_one())
    finally:
        engine.dispose()
