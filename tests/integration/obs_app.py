"""A dedicated Celery app for the observability tests (``celery -A tests.integration.obs_app``).

Its own database, decision queue and activity queues. Worker A consumes the decisions and
``obs_a``, worker B ``obs_b``, so one run of ``obs_flow`` has each kind of attempt:

1. ``obs_a_ok``: scheduled by the start's decision task on A, run **eagerly** on A;
2. ``obs_b_ok``: scheduled inline on A, **delivered** to B;
3. ``obs_b_fail``: scheduled inline on B, run **eagerly** on B, raises;
4. ``obs_a_fail``: scheduled inline on B, **delivered** to A, raises.

Every body records what Celery told it; listeners on ``task_prerun``, ``task_postrun`` and
``task_failure`` record what they saw (the task id, ``current_task``'s request id, the eager
mark, the args, the state) — in Redis under ``obs:seen:{execution_id}``, the ground truth the
test compares the two paths with. ``HARVEST_LOG_FORMAT`` (the worker's environment) switches
harvest's loggers to JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery, current_task, signals

from harvest_celery import ActivityError, RetryPolicy, WorkflowContext, activity, workflow
from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._store.store import Timings
from tests.integration.brokers import apply_queue_type

BROKER_URL = os.environ["HARVEST_TEST_BROKER_URL"]
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker
DATABASE_URL = os.environ["HARVEST_TEST_DATABASE_URL"] + "_obs"
DECIDE, QUEUE_A, QUEUE_B = "obs_decide", "obs_a", "obs_b"

app = Celery("harvest_obs", broker=BROKER_URL)
apply_queue_type(app)
configure_dedicated_celery_app(app)
harvest = Harvest(
    DATABASE_URL, app, decision_queue=DECIDE, sweep_interval=0.3, timings=Timings(redispatch_after=5.0)
)
_r = redis.Redis.from_url(REDIS_URL)
ONCE = RetryPolicy(max_attempts=1)


def _push(signal: str, task_id: str, args: Any = None, **more: Any) -> None:
    request = current_task.request if current_task else None
    delivery = (getattr(request, "delivery_info", None) or {}) if request else {}
    execution_id = str(task_id).rsplit(":", 2)[0]
    _r.rpush(
        f"obs:seen:{execution_id}",
        json.dumps(
            {
                "signal": signal,
                "task_id": task_id,
                "current": getattr(request, "id", None),
                "current_name": getattr(current_task, "name", None) if current_task else None,
                "eager": bool(delivery.get("harvest_eager")),
                "queue": delivery.get("routing_key"),
                "args": list(args) if args is not None else None,
                "pid": os.getpid(),
                **more,
            }
        ),
    )


def _body(name: str) -> None:
    _push("body", current_task.request.id, current_task.request.args, name=name)


@activity(queue=QUEUE_A)
def obs_a_ok(x: int) -> int:
    _body("obs_a_ok")
    return x + 1


@activity(queue=QUEUE_B)
def obs_b_ok(x: int) -> int:
    _body("obs_b_ok")
    return x + 1


@activity(queue=QUEUE_B, retry=ONCE)
def obs_b_fail(x: int) -> int:
    _body("obs_b_fail")
    raise ValueError(f"b refused {x}")


@activity(queue=QUEUE_A, retry=ONCE)
def obs_a_fail(x: int) -> int:
    _body("obs_a_fail")
    raise ValueError(f"a refused {x}")


@workflow
async def obs_flow(ctx: WorkflowContext, x: int) -> int:
    x = await ctx.execute_activity(obs_a_ok, x)
    x = await ctx.execute_activity(obs_b_ok, x)
    for failing in (obs_b_fail, obs_a_fail):
        try:
            await ctx.execute_activity(failing, x)
        except ActivityError:
            x += 10
    return x


harvest.register(obs_a_ok, obs_b_ok, obs_b_fail, obs_a_fail, obs_flow)


def _ours(sender: Any) -> bool:
    return getattr(sender, "name", "").startswith("obs_")


@signals.task_prerun.connect
def _prerun(sender: Any = None, task_id: str = "", args: Any = None, **_kw: Any) -> None:
    if _ours(sender):
        _push("prerun", task_id, args)


@signals.task_postrun.connect
def _postrun(sender: Any = None, task_id: str = "", args: Any = None, state: str = "", **_kw: Any) -> None:
    if _ours(sender):
        _push("postrun", task_id, args, state=state)


@signals.task_failure.connect
def _failure(
    sender: Any = None, task_id: str = "", args: Any = None, exception: Any = None, **_kw: Any
) -> None:
    if _ours(sender):
        _push("failure", task_id, args, exception=type(exception).__name__)
