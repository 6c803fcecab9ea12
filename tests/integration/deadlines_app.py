"""The worker app of tests/integration/test_deadlines.py: its own decision and activity queues
(so the suite's shared workers never decide its runs) and short timings — a 2 s grace period
after a timeout, a 0.3 s sweep — so a deadline's whole outcome table runs in seconds.

The queue names end in ``HARVEST_TEST_DL_SUFFIX``, which the module's fixture sets to a name of
this session's own before it imports this module and starts the worker (which inherits it): a
worker of any other run on the same broker — another session's, or one left over from a run that
was killed — consumes other queues, so it can never take this run's decision requests."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from harvest_celery import Cancelled, Harvest, RetryPolicy, Saga, Timings, WorkflowContext, activity, workflow
from harvest_celery._client import configure_dedicated_celery_app

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_it"
)
BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")
SUFFIX = os.environ.get("HARVEST_TEST_DL_SUFFIX", "")
DECIDE, QUEUE = f"dl_decide{SUFFIX}", f"dl_q{SUFFIX}"
GRACE = 2.0

app = Celery("harvest_dl", broker=BROKER_URL)
configure_dedicated_celery_app(app)
harvest = Harvest(
    DATABASE_URL,
    app,
    decision_queue=DECIDE,
    timings=Timings(default_lease=30.0, redispatch_after=3.0, timeout_grace=GRACE),
    sweep_interval=0.3,
)
r = redis.Redis.from_url(REDIS_URL)
ONCE = RetryPolicy(max_attempts=1)


def note(tag: str, name: str, value: Any = None) -> None:
    r.rpush(f"dl:{tag}", json.dumps({"name": name, "value": value, "at": time.time()}))


@activity(queue=QUEUE, retry=ONCE)
def dl_charge(data: dict) -> str:
    note(data["tag"], "charge")
    return f"ch-{data['tag']}"


@activity(queue=QUEUE, retry=ONCE)
def dl_refund(data: dict) -> str:
    note(data["tag"], "refund", data.get("reason"))
    return f"refunded {data['charge']}"


@activity(queue=QUEUE, retry=ONCE)
def dl_hold(tag: str) -> str:
    """A body that runs until the test releases it (at most a minute)."""
    note(tag, "hold:start")
    limit = time.monotonic() + 60
    while not r.get(f"dl-release:{tag}") and time.monotonic() < limit:
        time.sleep(0.05)
    note(tag, "hold:end")
    return "held"


async def _charged(ctx: WorkflowContext, data: dict) -> Saga:
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(dl_charge, data),
        lambda charge: ctx.execute_activity(
            dl_refund, {"tag": data["tag"], "charge": charge, "reason": ctx.cancellation_reason()}
        ),
    )
    return saga


@workflow(name="dl_parked")
async def dl_parked(ctx: WorkflowContext, data: dict) -> Any:
    """Charged, then parked on a signal; a timeout refunds durably and ends it."""
    saga = await _charged(ctx, data)
    try:
        return await ctx.wait_signal("approve", cancellable=True)
    except Cancelled:
        await saga.compensate_all()
        raise


@workflow(name="dl_napper")
async def dl_napper(ctx: WorkflowContext, data: dict) -> Any:
    """Charged, then an hour's cancellable sleep."""
    saga = await _charged(ctx, data)
    try:
        await ctx.sleep(3600, cancellable=True)
    except Cancelled:
        await saga.compensate_all()
        raise
    return "slept"


@workflow(name="dl_stubborn")
async def dl_stubborn(ctx: WorkflowContext, data: dict) -> Any:
    """Waits on a signal it does not let a cancellation interrupt, then completes anyway."""
    await ctx.wait_signal("go")
    return {"done": "anyway", "cancelled": ctx.is_cancelled()}


@workflow(name="dl_sleepy")
async def dl_sleepy(ctx: WorkflowContext, data: dict) -> Any:
    """A body running beside an hour's plain sleep: only the grace period's seal ends it."""
    return await ctx.gather(ctx.execute_activity(dl_hold, data["tag"]), ctx.sleep(3600))


@workflow(name="dl_breaks")
async def dl_breaks(ctx: WorkflowContext, data: dict) -> Any:
    try:
        await ctx.wait_signal("go", cancellable=True)
    except Cancelled:
        raise RuntimeError("undo failed") from None
    return "went"


@workflow(name="dl_unwinding")
async def dl_unwinding(ctx: WorkflowContext, data: dict) -> Any:
    """Mid-unwind when the grace ends: its refund dispatched, it waits for a confirmation."""
    saga = await _charged(ctx, data)
    try:
        await ctx.wait_signal("approve", cancellable=True)
    except Cancelled:
        await saga.compensate_all()
        await ctx.wait_signal("confirmed")
        raise
    return "approved"


harvest.register(
    dl_charge, dl_refund, dl_hold, dl_parked, dl_napper, dl_stubborn, dl_sleepy, dl_breaks, dl_unwinding
)
__all__ = ["DECIDE", "GRACE", "QUEUE", "app", "harvest"]
