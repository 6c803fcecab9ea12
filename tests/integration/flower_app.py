"""A dedicated Celery app for the Flower test (``celery -A tests.integration.flower_app``).

Its own decision queue, its own activity queues and its own database: no worker of the shared
session (started without task events) takes its tasks, and no other app's sweeper fires its
retries (a message sent by another app carries no ``task-sent`` event, so Flower would show no
queue for it). The saga: reserve stock, charge the card, ship — shipping fails twice, so the
charge is refunded and the stock released. The order's card number is the secret that must
never reach Flower.

Every body records what Celery told it (task id, queue, eager or delivered, worker) in Redis
under ``flower:ran:{execution_id}``, and ``task_postrun`` records each task's final state under
``flower:postrun`` — the ground truth the test compares Flower's view with.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery, current_task, signals

from harvest_celery import RetryPolicy, Saga, WorkflowContext, activity, workflow
from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._store.store import Timings
from tests.integration.brokers import apply_queue_type

BROKER_URL = os.environ["HARVEST_TEST_BROKER_URL"]
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker
DATABASE_URL = os.environ["HARVEST_TEST_DATABASE_URL"] + "_flower"
DECIDE, QUEUE_A, QUEUE_B = "flower_decide", "flower_a", "flower_b"
POSTRUN = "flower:postrun"

app = Celery("harvest_flower", broker=BROKER_URL)
apply_queue_type(app)  # HARVEST_TEST_QUEUE_TYPE=quorum: quorum defaults
configure_dedicated_celery_app(app)
# Flower's queue column (routing_key) is filled from the sender's task-sent event only: a user
# who wants it sets this on their own app (harvest never sets it app-wide), see docs/flower.md
app.conf.task_send_sent_event = True

# a short redispatch_after: a lost message (or a held eager dispatch) is re-sent within seconds
harvest = Harvest(
    DATABASE_URL, app, decision_queue=DECIDE, sweep_interval=0.3, timings=Timings(redispatch_after=5.0)
)
_r = redis.Redis.from_url(REDIS_URL)


def _record(name: str) -> None:
    request = current_task.request
    delivery = request.delivery_info or {}
    execution_id = str(request.id).rsplit(":", 2)[0]
    _r.rpush(
        f"flower:ran:{execution_id}",
        json.dumps(
            {
                "task_id": request.id,
                "name": name,
                "queue": delivery.get("routing_key"),
                "eager": bool(delivery.get("harvest_eager")),
                "worker": request.hostname,
            }
        ),
    )


@activity(queue=QUEUE_A)
def reserve_stock(order: dict) -> str:
    _record("reserve_stock")
    return f"res-{order['order_id']}"


@activity(queue=QUEUE_A)
def release_stock(reservation: str) -> None:
    _record("release_stock")


@activity(queue=QUEUE_B)
def charge_card(order: dict) -> dict:
    _record("charge_card")
    # the output carries the card too: outputs stay in Postgres, like inputs
    return {"charge_id": f"ch-{order['order_id']}", "card": order["card"]}


@activity(queue=QUEUE_B)
def refund_card(charge: dict) -> None:
    _record("refund_card")


@activity(queue=QUEUE_B, retry=RetryPolicy(max_attempts=2, initial_interval=0.2))
def ship_order(order: dict) -> str:
    _record("ship_order")
    raise ValueError(f"courier refused {order['order_id']}")


@workflow
async def flower_checkout(ctx: WorkflowContext, order: dict) -> str:
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(reserve_stock, order),
        lambda reservation: ctx.execute_activity(release_stock, reservation),
    )
    await saga.step(
        lambda: ctx.execute_activity(charge_card, order),
        lambda charge: ctx.execute_activity(refund_card, charge),
    )
    await saga.step(lambda: ctx.execute_activity(ship_order, order))
    return "shipped"


@app.task(name="flower_it.ping")
def ping() -> str:
    """A plain Celery task: a marker that a worker's earlier events have gone out."""
    return "pong"


harvest.register(reserve_stock, release_stock, charge_card, refund_card, ship_order, flower_checkout)


@signals.task_postrun.connect
def _postrun(sender: Any = None, task_id: str = "", state: str = "", **_kw: Any) -> None:
    _r.hset(POSTRUN, task_id, json.dumps({"name": sender.name, "state": state}))
