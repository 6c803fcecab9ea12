"""The worker app of tests/integration/test_task_calls.py: the user's existing Celery app
(``task_calls_tasks``) joined by harvest, which adopts its tasks and calls them durably."""

from __future__ import annotations

import os
from typing import Any

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, workflow
from harvest_celery._store.records import Timings
from tests.integration.task_calls_tasks import BROKER_URL, add, app, bound, scale

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_it"
)
# a worker started with HARVEST_TEST_TC_QUEUES="<decide>,<tasks>" serves another database's runs
DECIDE, QUEUE = (os.environ.get("HARVEST_TEST_TC_QUEUES") or "tc_decide,tc_q").split(",")

harvest = Harvest(
    DATABASE_URL,
    app,
    decision_queue=DECIDE,
    # a killed worker's attempt waits out a short lease before the engine retries it
    timings=Timings(default_lease=3.0, redispatch_after=3.0),
    sweep_interval=0.3,
)
QUICK = RetryPolicy(max_attempts=3, initial_interval=0.1)
for name in ("tc.add", "tc.scale", "tc.spread", "tc.bound", "tc.noted"):
    harvest.adopt_task(name, queue=QUEUE)
harvest.adopt_task("tc.flaky", queue=QUEUE, retry=QUICK)
harvest.adopt_task("tc.stuck_once", queue=QUEUE, retry=QUICK)


@workflow(name="tc_shapes")
async def tc_shapes(ctx: WorkflowContext, _: Any) -> list[Any]:
    """Every task shape through ctx.execute_task, with a task object or a name."""
    return [
        await ctx.execute_task(add, 2, 3),
        await ctx.execute_task(scale, [1, 2], factor=3),
        await ctx.execute_task("tc.spread", 1, (2, 3), k="v"),
        await ctx.execute_task(bound, 4, 5, flag=True),
    ]


@workflow(name="tc_single")
async def tc_single(ctx: WorkflowContext, value: Any) -> Any:
    """execute_activity of an adopted task keeps passing the input as its one argument."""
    return await ctx.execute_activity("tc.spread", value)


@workflow(name="tc_signature")
async def tc_signature(ctx: WorkflowContext, _: Any) -> Any:
    """A signature is refused by ctx.execute_task (it takes the task and its arguments)."""
    return await ctx.execute_task(add.s(1, 2))


harvest.register(tc_shapes, tc_single, tc_signature)
__all__ = ["BROKER_URL", "DECIDE", "QUEUE", "app", "harvest"]
