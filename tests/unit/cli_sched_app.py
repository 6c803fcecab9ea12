"""The ``--app`` of tests/unit/test_cli_schedules.py and test_cli_chains.py: a ``Harvest`` on the
SQLite file named by ``HARVEST_CLI_TEST_DB`` (embedded), with a workflow that fails when its
input says so and one that continues as new three times, then waits for a signal."""

from __future__ import annotations

import os

from harvest_celery import Harvest, WorkflowContext, workflow

harvest = Harvest("sqlite:///" + os.environ["HARVEST_CLI_TEST_DB"])


@workflow(name="cs.job")
async def cs_job(ctx: WorkflowContext, data: dict) -> str:
    if data.get("fail"):
        raise RuntimeError("the job failed")
    return "done"


@workflow(name="cs.chain")
async def cs_chain(ctx: WorkflowContext, n: int) -> int:
    if n < 3:
        ctx.continue_as_new(n + 1)
    return n + await ctx.wait_signal("last", cancellable=True)


harvest.register(cs_job, cs_chain)
