"""The ``--app`` of tests/unit/test_replayer.py: three builds of the same workflows on the SQLite
file named by ``HARVEST_CLI_TEST_DB`` (embedded). ``harvest`` is the build that records the
histories; ``swapped`` registers the same names with two steps in the other order (drift);
``longer`` adds a step after the last one (new commands at the frontier)."""

from __future__ import annotations

import os
from typing import Any

from harvest_celery import Cancelled, Harvest, Saga, WorkflowContext, activity, workflow

URL = "sqlite:///" + os.environ["HARVEST_CLI_TEST_DB"]


@activity(name="rp_a")
def rp_a(x: Any) -> str:
    return "a"


@activity(name="rp_b")
def rp_b(x: Any) -> str:
    return "b"


@activity(name="rp_c")
def rp_c(x: Any) -> str:
    return "c"


@activity(name="rp_d")
def rp_d(x: Any) -> str:
    return "d"


@activity(name="rp_undo")
def rp_undo(x: Any) -> None:
    return None


async def _wait_then_c(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    if order.get("wait"):
        await ctx.wait_signal("go")
    return str(await ctx.execute_activity(rp_c, order))


@workflow(name="rp_order")
async def order_v1(ctx: WorkflowContext, order: dict[str, Any]) -> list[str]:
    a = await ctx.execute_activity(rp_a, order)
    b = await ctx.execute_activity(rp_b, order)
    return [a, b, await _wait_then_c(ctx, order)]


@workflow(name="rp_order")
async def order_swapped(ctx: WorkflowContext, order: dict[str, Any]) -> list[str]:
    b = await ctx.execute_activity(rp_b, order)
    a = await ctx.execute_activity(rp_a, order)
    return [a, b, await _wait_then_c(ctx, order)]


@workflow(name="rp_order")
async def order_longer(ctx: WorkflowContext, order: dict[str, Any]) -> list[str]:
    done = await order_v1(ctx, order)
    return [*done, await ctx.execute_activity(rp_d, order)]


async def _cancellable(ctx: WorkflowContext, first: Any, second: Any) -> str:
    """The spec's cancel pattern with durable compensations."""
    saga = Saga(ctx)
    for step in (first, second):
        await saga.step(
            lambda step=step: ctx.execute_activity(step, "x"),
            lambda value: ctx.execute_activity(rp_undo, value),
        )
    if ctx.is_cancelled():
        await saga.compensate_all()  # dispatches diverge against WorkflowCancelled: the pinned case
        raise Cancelled(ctx.cancellation_reason() or "cancelled")
    await ctx.wait_signal("go")
    return "done"


@workflow(name="rp_cancel")
async def cancel_v1(ctx: WorkflowContext, order: Any) -> str:
    return await _cancellable(ctx, rp_a, rp_b)


@workflow(name="rp_cancel")
async def cancel_swapped(ctx: WorkflowContext, order: Any) -> str:
    return await _cancellable(ctx, rp_b, rp_a)


ACTIVITIES = (rp_a, rp_b, rp_c, rp_d, rp_undo)

harvest = Harvest(URL).register(*ACTIVITIES, order_v1, cancel_v1)
swapped = Harvest(URL).register(*ACTIVITIES, order_swapped, cancel_swapped)
longer = Harvest(URL).register(*ACTIVITIES, order_longer, cancel_v1)
