"""The checkout saga from the spec: charge, reserve, confirm — compensated LIFO on failure, and
compensated explicitly (never automatically) on a cooperative cancellation request."""

from __future__ import annotations

import time

from harvest_celery import Cancelled, RetryPolicy, Saga, WorkflowContext, activity, workflow

# Stand-ins for the payment and inventory systems, keyed by ids so that compensations are
# idempotent: refunding a charge twice is a no-op (docs/concepts.md, "Idempotency contract").
LEDGER: dict[str, str] = {}


@activity(queue="payments")
def charge_payment(order: dict) -> str:
    charge_id = f"ch_{order['order_id']}"
    LEDGER[charge_id] = "charged"
    return charge_id


@activity(queue="payments")
def refund_payment(charge_id: str) -> None:
    if LEDGER.get(charge_id) == "charged":
        LEDGER[charge_id] = "refunded"


# Out of stock will not fix itself in seconds: one quick retry, then fail and unwind.
@activity(queue="inventory", retry=RetryPolicy(max_attempts=2, initial_interval=0.2))
def reserve_inventory(order: dict) -> str:
    if order.get("reserve_seconds"):
        time.sleep(order["reserve_seconds"])  # a slow inventory system: a cancel can land meanwhile
    if order.get("out_of_stock"):
        raise RuntimeError(f"no stock for order {order['order_id']}")
    rsv_id = f"rsv_{order['order_id']}"
    LEDGER[rsv_id] = "reserved"
    return rsv_id


@activity(queue="inventory")
def release_reservation(rsv_id: str) -> None:
    if LEDGER.get(rsv_id) == "reserved":
        LEDGER[rsv_id] = "released"


@activity(queue="default")
def confirm_checkout(ids: list) -> str:
    return f"confirmed {ids[0]} / {ids[1]}"


@workflow
async def checkout(ctx: WorkflowContext, order: dict) -> str:
    saga = Saga(ctx)
    charge_id = await saga.step(
        lambda: ctx.execute_activity(charge_payment, order, queue="payments"),
        lambda charge_id: ctx.execute_activity(refund_payment, charge_id, queue="payments"),
    )
    reservation_id = await saga.step(
        lambda: ctx.execute_activity(reserve_inventory, order, queue="inventory"),
        lambda rsv_id: ctx.execute_activity(release_reservation, rsv_id, queue="inventory"),
    )
    # A cancel that landed while a step ran is observed here, before committing: compensate
    # explicitly (cancellation never compensates on its own). The release and the refund are
    # activities: they run after harvest.request_cancellation (a cooperative cancel, the run stays
    # live). After cancel_workflow_execution (the seal) they cannot be scheduled, and the branch
    # fails with SagaCompensationFailed (docs/concepts.md, "Cancellation").
    if ctx.is_cancelled():
        await saga.compensate_all()
        raise Cancelled(ctx.cancellation_reason() or "cancelled")
    return await ctx.execute_activity(confirm_checkout, [charge_id, reservation_id])  # type: ignore[no-any-return]
