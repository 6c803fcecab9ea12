"""The fault rows on RabbitMQ: a node of the suite's own (``servers.RabbitMQ``: its own AMQP and
distribution ports, node name, data directory and a low ``consumer_timeout``), the two workers
and this process's app moved onto it for the module, the fault points and the redelivery switch
staying on the suite's Redis (``HARVEST_FAULTS_REDIS_URL``: never the broker)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.require_services import missing

from .conftest import wait_for
from .harness import RUNS, Worker
from .servers import RABBITMQ_BIN, RabbitMQ

pytestmark = pytest.mark.faults

AMQP_PORT = int(os.environ.get("HARVEST_FAULTS_AMQP_PORT", "26672"))
DIST_PORT = int(os.environ.get("HARVEST_FAULTS_AMQP_DIST_PORT", "26673"))
CONSUMER_TIMEOUT_MS = 5000
# RabbitMQ checks consumer timeouts about once a minute: the channel is closed within this
PAST_CONSUMER_TIMEOUT = float(os.environ.get("HARVEST_FAULTS_PAST_CONSUMER_TIMEOUT", "120"))


def _point(app: Any, url: str) -> None:
    """This process's Celery app sends through ``url`` from now on (its pools made again)."""
    app.conf.broker_url = url
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture(scope="module")
def rabbit(fa: Any, workers: dict[str, Worker], servers: Any) -> Iterator[RabbitMQ]:
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        missing("RabbitMQ", f"no {RABBITMQ_BIN / 'rabbitmq-server'} (HARVEST_FAULTS_RABBITMQ_BIN)")
    node = RabbitMQ(AMQP_PORT, DIST_PORT, CONSUMER_TIMEOUT_MS)
    node.start()
    servers.rabbit = node
    env = {"HARVEST_FAULTS_BROKER_URL": node.url, "HARVEST_FAULTS_REDIS_URL": servers.redis.url}
    try:
        _point(fa.harvest.celery_app, node.url)
        for w in workers.values():
            w.stop()
            w.env.update(env)
            w.start()
        yield node
    finally:
        for w in workers.values():
            w.stop()
            for key in env:
                w.env.pop(key, None)
            w.start()
        _point(fa.harvest.celery_app, servers.redis.url)
        node.destroy()


@pytest.fixture(autouse=True)
def fresh_workers(rabbit: RabbitMQ, workers: dict[str, Worker]) -> None:
    """Both workers started afresh for each row: a row's fault must not leave the next one a
    worker in a state of its own making (a reconnected consumer's prefetch, a shut-down pool)."""
    for w in workers.values():
        w.stop()
        w.start()


def _alive(faults: Any) -> None:
    dead = [w.name for w in faults.workers.values() if not w.alive()]
    assert not dead, f"workers exited: {dead}"


def test_rabbitmq_restart_with_messages_in_flight(rabbit: RabbitMQ, faults: Any) -> None:
    """Half the runs hang mid-body (their messages unacked in the activity worker), the rest
    have messages waiting in their queues; the node is stopped and started again. The workers
    reconnect (no exit); unacked deliveries come back, transient sticky queues do not, and the
    sweeper re-sends what was lost."""
    runs = faults.start(n=2 * RUNS, plan="mid@2", plan_on=RUNS)
    faults.wait_hung(runs[:RUNS])
    time.sleep(0.5)  # the rest are dispatched and waiting in RabbitMQ
    rabbit.restart(down_for=1.0)
    t0 = time.monotonic()
    faults.release(runs[:RUNS])
    time.sleep(3)
    _alive(faults)
    faults.assert_clean(
        "RabbitMQ: broker restart with messages in flight", faults.wait_finished(runs, since=t0)
    )


def test_rabbitmq_kill_9_of_the_activity_worker_during_an_eager_chain(rabbit: RabbitMQ, faults: Any) -> None:
    """Step 2 runs in step 1's eager chain (inline decision in the activity worker, which
    consumes step 2's queue), so step 1's message is still unacked when the worker is killed
    mid-body of step 2: RabbitMQ redelivers that unacked message to the restarted worker (its
    claim is refused: step 1 is done), and step 2's attempt is retried once its lease expires."""
    runs = faults.start(plan="mid@2")
    hung = faults.wait_hung(runs)
    assert {w.name for w in faults.owners([pid for _p, pid in hung.values()])} == {"acts"}
    t0 = faults.kill_and_restart(hung)
    faults.assert_clean(
        "RabbitMQ: kill -9 of the activity worker during an eager chain (unacked message redelivered)",
        faults.wait_finished(since=t0),
    )


def test_rabbitmq_an_activity_longer_than_consumer_timeout(rabbit: RabbitMQ, faults: Any) -> None:
    """Bodies held past the node's consumer_timeout: RabbitMQ closes the activity worker's
    channel (PRECONDITION_FAILED, delivery acknowledgement timed out) and requeues its unacked
    messages. Celery treats that channel error as unrecoverable: the worker shuts down once the
    bodies it holds return (they record their outcomes in Postgres; their acks are lost) and is
    started again, as its supervisor would. The requeued copies' claims are refused."""
    runs = faults.start(plan="mid@2")
    faults.wait_hung(runs)
    acts = faults.workers["acts"]
    timed_out = "PRECONDITION_FAILED - delivery acknowledgement"
    wait_for(lambda: timed_out in acts.log.read_text(errors="replace"), PAST_CONSUMER_TIMEOUT, timed_out)
    t0 = time.monotonic()
    faults.release(runs)
    wait_for(lambda: not acts.alive(), 60, "the activity worker's shutdown (Celery: unrecoverable)")
    acts.start()
    faults.assert_clean(
        f"RabbitMQ: activity longer than consumer_timeout ({CONSUMER_TIMEOUT_MS / 1000:.0f} s; "
        "the worker shuts down, restarted)",
        faults.wait_finished(since=t0),
    )


def test_rabbitmq_a_dropped_connection_mid_delivery(rabbit: RabbitMQ, faults: Any) -> None:
    """Half the runs hang mid-body, the rest have messages on their way; RabbitMQ closes every
    client connection (``close_all_connections``: a network cut as the broker sees it). The
    workers reconnect; the unacked deliveries are requeued and their claims refused or retried."""
    runs = faults.start(n=2 * RUNS, plan="mid@2", plan_on=RUNS)
    faults.wait_hung(runs[:RUNS])
    rabbit.ctl("close_all_connections", "harvest fault suite: dropped connection")
    t0 = time.monotonic()
    faults.release(runs[:RUNS])
    time.sleep(3)
    _alive(faults)
    faults.assert_clean("RabbitMQ: dropped connection mid-delivery", faults.wait_finished(runs, since=t0))


DELIVERY_LIMIT = 1


def _queue_type(app: Any, queue_type: str) -> None:
    """This process's app declares its queues as ``queue_type`` from now on."""
    app.conf.update(task_default_queue_type=queue_type, task_create_missing_queue_type=queue_type)
    app.amqp.__dict__.pop("queues", None)
    app.amqp.__dict__.pop("router", None)


@pytest.fixture
def quorum(rabbit: RabbitMQ, fa: Any, workers: dict[str, Worker], servers: Any) -> Iterator[str]:
    """A vhost of quorum queues whose ``faults`` queue has a delivery limit of DELIVERY_LIMIT
    (a policy), the workers and this process's app on it under quorum defaults."""
    vhost = "quorum"
    rabbit.ctl("add_vhost", vhost)
    rabbit.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    rabbit.ctl(
        "set_policy",
        "-p",
        vhost,
        "--apply-to",
        "queues",  # quorum_queues is RabbitMQ 3.12+
        "faults-delivery-limit",
        "^faults$",
        f'{{"delivery-limit":{DELIVERY_LIMIT}}}',
    )
    url = f"amqp://guest:guest@127.0.0.1:{rabbit.port}/{vhost}"
    env = {"HARVEST_FAULTS_BROKER_URL": url, "HARVEST_FAULTS_QUEUE_TYPE": "quorum"}
    app = fa.harvest.celery_app
    try:
        _point(app, url)
        _queue_type(app, "quorum")
        for w in workers.values():
            w.stop()
            w.env.update(env)
            w.start()
        yield vhost
    finally:
        for w in workers.values():
            w.stop()
            w.env.update({"HARVEST_FAULTS_BROKER_URL": rabbit.url})
            w.env.pop("HARVEST_FAULTS_QUEUE_TYPE", None)
            w.start()
        _queue_type(app, "classic")
        _point(app, rabbit.url)


def test_rabbitmq_a_message_past_a_quorum_queues_delivery_limit(
    quorum: str, rabbit: RabbitMQ, faults: Any
) -> None:
    """Step 1's message is delivered and its worker killed before the claim commits, twice:
    past the delivery limit (1, by policy) RabbitMQ drops the message. Nothing is lost: the
    attempt is still scheduled in Postgres and the sweeper sends it again."""
    queues = rabbit.ctl("list_queues", "-p", quorum, "name", "type", "--no-table-headers").stdout
    assert "faults\tquorum" in queues, queues
    runs = faults.start(plan="claim@1")
    for kill in range(DELIVERY_LIMIT + 1):
        hung = faults.wait_hung(runs)
        for run in runs:
            faults.redis.delete(f"hung:{run}")  # the redelivered message hangs there again...
            if kill == DELIVERY_LIMIT:
                faults.redis.delete(f"hang:{run}")  # ...until the last kill: then the re-send runs
        t0 = faults.kill_and_restart(hung)
    faults.assert_clean(
        f"RabbitMQ: message past a quorum queue's delivery limit ({DELIVERY_LIMIT}, by policy), dropped",
        faults.wait_finished(since=t0),
    )
