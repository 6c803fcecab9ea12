"""An existing Celery app, as a user has it before harvest joins: its own result backend, its own
task on Celery's default queue, its own signal handlers (as an error tracker would connect).
The handlers write what they saw to Redis, so the test can read what a Celery user sees."""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery, signals

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, activity, workflow
from tests.integration.brokers import apply_queue_type

BROKER_URL = os.environ["HARVEST_TEST_BROKER_URL"]
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker
DATABASE_URL = os.environ["HARVEST_TEST_DATABASE_URL"]
SEEN = "shop:seen"

app = Celery("shop", broker=BROKER_URL, backend=REDIS_URL)
app.conf.result_expires = 600
apply_queue_type(app)  # HARVEST_TEST_QUEUE_TYPE=quorum: quorum defaults


@app.task(name="shop.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="shop.flaky_charge", autoretry_for=(ConnectionError,), max_retries=5, default_retry_delay=0)
def flaky_charge(data: dict) -> str:
    """The app's own task, with Celery's autoretry_for: adopted, its retries are the engine's."""
    calls = redis.Redis.from_url(REDIS_URL).incr(f"shop:charge:{data['tag']}")
    if calls < data["succeed_on"]:
        raise ConnectionError(f"gateway timeout on call {calls}")
    return f"charged after {calls}"


def _conf() -> dict[str, str]:
    return {key: repr(app.conf[key]) for key in sorted(app.conf.keys())}


BEFORE_HARVEST = _conf()
harvest = Harvest(DATABASE_URL, app, decision_queue="shop_decide")
ONCE_MORE = RetryPolicy(max_attempts=2, initial_interval=0.1)


@activity(queue="shop_q", retry=ONCE_MORE)
def shop_declines(data: dict) -> str:
    raise ValueError(f"card declined for {data['tag']}")


@activity(queue="shop_q")
def shop_ok(data: dict) -> dict:
    return data


@workflow
async def shop_checkout(ctx: WorkflowContext, data: dict) -> Any:
    await ctx.execute_activity(shop_ok, data)
    return await ctx.execute_activity(shop_declines, data)


@workflow
async def shop_adopted(ctx: WorkflowContext, data: dict) -> Any:
    return await ctx.execute_activity("shop.flaky_charge", data)


harvest.register(shop_declines, shop_ok, shop_checkout, shop_adopted)
harvest.adopt_task(
    "shop.flaky_charge", queue="shop_q", retry=RetryPolicy(max_attempts=3, initial_interval=0.1)
)
AFTER_HARVEST = _conf()
_r = redis.Redis.from_url(REDIS_URL)


@signals.task_postrun.connect
def _postrun(sender: Any = None, task_id: str = "", state: str = "", **_kw: Any) -> None:
    request = getattr(sender, "request", None)
    delivery = getattr(request, "delivery_info", None) or {}
    _r.rpush(
        SEEN,
        json.dumps(
            {
                "signal": "postrun",
                "task_id": task_id,
                "name": sender.name,
                "state": state,
                "queue": delivery.get("routing_key"),
            }
        ),
    )


@signals.task_failure.connect
def _failure(
    sender: Any = None, task_id: str = "", exception: Any = None, einfo: Any = None, **_kw: Any
) -> None:
    _r.rpush(
        SEEN,
        json.dumps(
            {
                "signal": "failure",
                "task_id": task_id,
                "name": sender.name,
                "exception": repr(exception),
                "traceback": str(einfo),
            }
        ),
    )


@signals.task_retry.connect
def _retry(sender: Any = None, request: Any = None, reason: Any = None, **_kw: Any) -> None:
    _r.rpush(
        SEEN,
        json.dumps(
            {
                "signal": "retry",
                "task_id": getattr(request, "id", None),
                "name": getattr(sender, "name", None),
                "reason": repr(reason),
            }
        ),
    )
