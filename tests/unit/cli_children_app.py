"""The ``--app`` of tests/unit/test_cli_replay_children.py: child workflows and a
continue-as-new chain on the SQLite file named by ``HARVEST_CLI_TEST_DB`` (embedded). ``harvest``
records the histories; ``drifted`` registers the same names with a parent that starts another
child and a chain that starts a child where it continued."""

from __future__ import annotations

import os
from typing import Any

from harvest_celery import ExecutionAlreadyExists, Harvest, WorkflowContext, workflow

URL = "sqlite:///" + os.environ["HARVEST_CLI_TEST_DB"]


@workflow(name="rc_trip")
async def rc_trip(ctx: WorkflowContext, trip: Any) -> str:
    return f"booked-{trip}"


@workflow(name="rc_other_trip")
async def rc_other_trip(ctx: WorkflowContext, trip: Any) -> str:
    return f"other-{trip}"


@workflow(name="rc_waits")
async def rc_waits(ctx: WorkflowContext, _: Any) -> Any:
    return await ctx.wait_signal("go")


@workflow(name="rc_parent")
async def parent_v1(ctx: WorkflowContext, trip: Any) -> Any:
    return await ctx.execute_child_workflow(rc_trip, trip)


@workflow(name="rc_parent")
async def parent_drifted(ctx: WorkflowContext, trip: Any) -> Any:
    return await ctx.execute_child_workflow(rc_other_trip, trip)


@workflow(name="rc_takes_id")
async def rc_takes_id(ctx: WorkflowContext, child_id: str) -> str:
    try:
        await ctx.execute_child_workflow(rc_waits, None, id=child_id)
    except ExecutionAlreadyExists:
        return "refused"
    return "started"


@workflow(name="rc_chain")
async def chain_v1(ctx: WorkflowContext, n: int) -> int:
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


@workflow(name="rc_chain")
async def chain_drifted(ctx: WorkflowContext, n: int) -> int:
    await ctx.execute_child_workflow(rc_trip, n)  # a command where the history closed the run
    return n


COMMON = (rc_trip, rc_other_trip, rc_waits, rc_takes_id)

harvest = Harvest(URL).register(*COMMON, parent_v1, chain_v1)
drifted = Harvest(URL).register(*COMMON, parent_drifted, chain_drifted)
