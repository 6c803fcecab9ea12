"""A plain three-step workflow: validate, price, confirm."""

from __future__ import annotations

from harvest_celery import WorkflowContext, activity, workflow


@activity(queue="default")
def validate_order(order: dict) -> dict:
    if not order.get("items"):
        raise ValueError("an order needs at least one item")
    return {"order_id": order["order_id"], "items": order["items"]}


@activity(queue="pricing")
def price_order(order: dict) -> dict:
    total = sum(item.get("qty", 1) * item.get("price", 0) for item in order["items"])
    return {"order_id": order["order_id"], "total": total}


@activity(queue="default")
def confirm_order(priced: dict) -> str:
    return f"order {priced['order_id']} confirmed for {priced['total']}"


@workflow
async def order_pipeline(ctx: WorkflowContext, order: dict) -> str:
    valid = await ctx.execute_activity(validate_order, order)
    priced = await ctx.execute_activity(price_order, valid)
    return await ctx.execute_activity(confirm_order, priced)  # type: ignore[no-any-return]
