"""The app of the schedule tests' scheduler and worker processes: its own decision queue
(``HARVEST_TEST_SCHED_QUEUE``), so the suite's shared workers never fire its schedules, and a
codec when ``HARVEST_TEST_SCHED_CODEC`` holds a Fernet key. ``sched.beat_add`` is a plain Celery
task, adopted, that the import-beat test's schedules start; its body records each call in Redis
(``beat-effects``)."""

from __future__ import annotations

import json
import os

import redis
from celery import Celery

from harvest_celery import FernetCodec, PostgresPayloadStore, WorkflowContext, workflow
from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._store.store import Timings

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_it"
)
BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")
QUEUE = os.environ.get("HARVEST_TEST_SCHED_QUEUE", "sched")
KEY = os.environ.get("HARVEST_TEST_SCHED_CODEC")
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker

app = Celery("harvest_sched", broker=BROKER_URL)
configure_dedicated_celery_app(app)

harvest = Harvest(
    DATABASE_URL,
    app,
    decision_queue=QUEUE,
    codec=FernetCodec({"k1": KEY}, "k1") if KEY else None,
    payload_store=PostgresPayloadStore(),
    offload_threshold=1024,
    timings=Timings(redispatch_after=3.0),
    sweep_interval=0.3,
)


@workflow(name="sched.tick")
async def tick(ctx: WorkflowContext, data: object) -> dict[str, object]:
    when = ctx.info.scheduled_for
    return {"scheduled_for": when.isoformat() if when else None, "now": ctx.now().isoformat()}


@workflow(name="sched.slow")
async def slow(ctx: WorkflowContext, data: object) -> str:
    await ctx.sleep(5)
    return "slept"


@workflow(name="sched.chain")
async def chain(ctx: WorkflowContext, data: object) -> str:
    """Continues as new once, then its second link waits for the signal ``go``."""
    if data != "second":
        ctx.continue_as_new("second")
    return await ctx.wait_signal("go")  # type: ignore[no-any-return]


harvest.register(tick, slow, chain)


@app.task(name="sched.beat_add")
def beat_add(x: int, y: int, tag: str = "") -> int:
    """A Beat task as it was: its body records the call, so a test sees that it ran."""
    redis.Redis.from_url(REDIS_URL).rpush(f"beat-effects:{tag}", json.dumps([x, y]))
    return x + y


harvest.adopt_task("sched.beat_add", queue=QUEUE)
