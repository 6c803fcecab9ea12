"""Sticky queues on a real RabbitMQ, under quorum defaults, with real worker processes: each
thread-pool worker's ``<decision queue>@<node>`` is classic, transient (durable from RabbitMQ
4.3) and expiring; a sender in another process declares it exactly as its consumer did; a
stopped worker's queue is gone from the vhost within its expiry, and the run whose decision
request went to it completes on the other worker (``stale_decisions`` re-requests it).

The test runs on RabbitMQ whichever broker the session's leg uses: a vhost of its own, named
after the run's database, created and deleted here."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._runtime.sticky import DURABLE_FROM
from harvest_celery._store.records import Timings
from harvest_celery._store.schema import executions
from tests.require_services import missing

from . import brokers
from .conftest import DATABASE_URL, DB_NAME, Worker, wait_for

EXPIRES = 10.0  # the sticky queues' x-expires here (seconds)
RABBITMQ = os.environ.get("HARVEST_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")


@pytest.fixture(scope="module")
def vhost() -> Iterator[str]:
    why = brokers.rabbitmq_missing()
    if why:
        missing("RabbitMQ", why)
    name = brokers.vhost_name(DB_NAME, "_sticky")
    brokers.create_vhost(name)
    try:
        yield name
    finally:
        brokers.delete_vhost(name)


@pytest.fixture(scope="module")
def deciders(harvest: Any, vhost: str) -> Iterator[list[Worker]]:
    """Two decision workers (threads) on the vhost, the app under quorum defaults."""
    env = {
        "HARVEST_TEST_BROKER_URL": brokers.with_vhost(RABBITMQ, vhost),
        "HARVEST_TEST_QUEUE_TYPE": "quorum",
        "HARVEST_TEST_STICKY_EXPIRES": str(EXPIRES),
    }
    started = [Worker(f"sticky{i}", "harvest", dict(env)) for i in (1, 2)]
    try:
        for worker in started:
            worker.start()
            assert (worker.transport or "").startswith("amqp://"), worker.transport
        yield started
    finally:
        for worker in started:
            worker.stop()


def _sticky_name(worker: Worker) -> str:
    """The sticky queue its latest start's banner lists (``.> harvest@<node> exchange=...``)."""
    for line in reversed(worker.log.read_text(errors="replace").splitlines()):
        if ".> harvest@" in line:
            return line.split(".> ", 1)[1].split()[0]
    raise AssertionError(f"no sticky queue in {worker.log}")


def _sender(vhost: str) -> Harvest:
    """Another process's Harvest (this test's) on the vhost, the same quorum defaults."""
    from tests.integration.app import approval

    app = Celery("sticky_sender", broker=brokers.with_vhost(RABBITMQ, vhost))
    configure_dedicated_celery_app(app)
    brokers.apply_queue_type_to(app, "quorum")
    # eager_start=False: a decision worker takes the first decision and holds the replay
    harvest = Harvest(
        DATABASE_URL,
        app,
        timings=Timings(redispatch_after=3.0),
        sticky_queue_expires=EXPIRES,
        eager_start=False,
    )
    harvest.register(approval)
    return harvest


def test_a_stopped_workers_sticky_queue_expires_and_its_run_completes(
    harvest: Any, vhost: str, deciders: list[Worker], tag: str
) -> None:
    declared = brokers.queues(vhost)
    sticky = {worker.name: _sticky_name(worker) for worker in deciders}
    assert declared["harvest"]["type"] == "quorum"  # the app's own queue: its quorum default
    transient = brokers.server_version() < DURABLE_FROM
    for name in sticky.values():
        row = declared[name]
        assert row["type"] == "classic", row
        assert row["durable"] == ("false" if transient else "true"), row
        assert f'{{"x-expires",{int(EXPIRES * 1000)}}}' in row["arguments"], row

    sender = _sender(vhost)
    run_id = sender.start_workflow("approval", {"tag": tag})
    holder_queue = wait_for(lambda: _sticky_of(run_id), what="the run's warm replay held by a worker")
    holder = next(w for w in deciders if sticky[w.name] == holder_queue)
    holder.stop()

    # the decision request goes to the stopped worker's queue, declared by this process as
    # the worker declared it (no PRECONDITION_FAILED, no quorum queue of the same name)
    sender.signal(run_id, "decision", "yes")
    assert sender.result(run_id, timeout=120) == f"{tag}:yes"
    wait_for(lambda: holder_queue not in brokers.queues(vhost), timeout=120, what="the queue's expiry")
    others = [sticky[w.name] for w in deciders if w is not holder]
    assert all(name in brokers.queues(vhost) for name in others)  # a live worker's queue stays


def _sticky_of(run_id: str) -> str | None:
    engine = sa.create_engine(DATABASE_URL, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(
                sa.select(executions.c.sticky_queue).where(executions.c.id == run_id)
            ).scalar()
    finally:
        engine.dispose()
