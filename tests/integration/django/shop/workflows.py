"""Found by autodiscovery: activities are named, not imported (they live in activities.py)."""

from __future__ import annotations

from harvest_celery import WorkflowContext, workflow


@workflow
async def dj_checkout(ctx: WorkflowContext, order: dict) -> str:
    return await ctx.execute_activity("dj_charge", order)  # type: ignore[no-any-return]


@workflow
async def dj_gate(ctx: WorkflowContext, data: dict) -> str:
    await ctx.execute_activity("dj_step", data)
    return str(await ctx.wait_signal("go"))
