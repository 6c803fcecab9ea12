"""The Celery app the benchmark worker runs (``celery -A benchmarks.app worker -Q harvest,default,bench``).

One app carries both sides of the comparison:

* harvest-celery: ``bench_step`` (a no-op activity on queue ``bench``) and ``bench_seq`` (a workflow
  of ``n`` sequential ``bench_step`` activities), with Harvest on the ``harvest_bench`` database;
* the raw-Celery baseline: ``raw_step`` (the same no-op, queue ``bench``) — the only task that
  stores a result, in the Redis result backend (DB 7), so the client can wait on it.

Harvest's own tasks ignore results (``configure_celery`` sets ``task_ignore_result``), so the
result backend is used by the baseline only.
"""

from __future__ import annotations

import os

from celery import Celery

from harvest_celery import WorkflowContext, activity, workflow
from harvest_celery._client import Harvest, configure_celery

DATABASE_URL = os.environ.get("HARVEST_BENCH_DATABASE_URL",
                              "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_bench")
BROKER_URL = os.environ.get("HARVEST_BENCH_BROKER_URL", "redis://127.0.0.1:6379/7")
RESULT_BACKEND = os.environ.get("HARVEST_BENCH_RESULT_BACKEND", "redis://127.0.0.1:6379/7")

app = Celery("harvest_bench", broker=BROKER_URL, backend=RESULT_BACKEND)
configure_celery(app)
app.conf.broker_transport_options = {"visibility_timeout": 3600}
app.conf.result_expires = 600

harvest = Harvest(DATABASE_URL, app)


@activity(queue="bench")
def bench_step(x: int) -> int:
    return x + 1


@workflow
async def bench_seq(ctx: WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.execute_activity(bench_step, x)
    return x


harvest.register(bench_step, bench_seq)


@app.task(name="raw_step", queue="bench", ignore_result=False)
def raw_step(x: int) -> int:
    """The baseline: the same no-op as ``bench_step``, as a plain Celery task."""
    return x + 1
