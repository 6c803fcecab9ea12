"""Workflows and activities of the child-workflow tests (``test_children.py``): a trip booked by
a child with its own saga, undone by a compensating child; a child whose cancel branch refunds
durably; children left open by a parent that completes; a counter that continues as new. Bodies
record what they did under the run's tag."""

from __future__ import annotations

from harvest_celery import (
    Cancelled,
    ChildWorkflowFailed,
    ExecutionAlreadyExists,
    RetryPolicy,
    Saga,
    WorkflowContext,
    activity,
    workflow,
)

from .app import record

ONCE = RetryPolicy(max_attempts=1)


@activity(name="ch_act", queue="alpha", retry=ONCE)
def ch_act(data: dict) -> str:
    """Records ``name``; fails when ``fail`` is set."""
    record(data["tag"], data["name"], data.get("value"))
    if data.get("fail"):
        raise RuntimeError(f"{data['name']} failed")
    return f"{data['name']}-done"


def act(ctx: WorkflowContext, tag: str, name: str, **more: object):
    return ctx.execute_activity(ch_act, {"tag": tag, "name": name, **more})


@workflow(name="ch_book_trip")
async def ch_book_trip(ctx: WorkflowContext, data: dict) -> dict:
    tag = data["tag"]
    saga = Saga(ctx)
    await saga.step(lambda: act(ctx, tag, "hotel"), lambda _: act(ctx, tag, "unhotel"))
    await saga.step(
        lambda: act(ctx, tag, "flight", fail=data.get("fail_flight")), lambda _: act(ctx, tag, "unflight")
    )
    return {"trip": f"trip-{tag}"}


@workflow(name="ch_cancel_trip")
async def ch_cancel_trip(ctx: WorkflowContext, data: dict) -> str:
    await act(ctx, data["tag"], "cancel_trip", value=data["booking"])
    return "trip cancelled"


@workflow(name="ch_checkout")
async def ch_checkout(ctx: WorkflowContext, data: dict) -> str:
    tag = data["tag"]
    saga = Saga(ctx)
    await saga.step(lambda: act(ctx, tag, "charge"), lambda _: act(ctx, tag, "refund"))
    await saga.step(
        lambda: ctx.execute_child_workflow(ch_book_trip, data),
        lambda booking: ctx.execute_child_workflow(ch_cancel_trip, {"tag": tag, "booking": booking}),
    )
    await saga.step(lambda: act(ctx, tag, "ship", fail=data.get("fail_ship")))
    return "shipped"


@workflow(name="ch_cancel_parent")
async def ch_cancel_parent(ctx: WorkflowContext, data: dict) -> str:
    try:
        await ctx.execute_child_workflow(ch_refunding_child_safe, data)
    except ChildWorkflowFailed as exc:
        await act(ctx, data["tag"], "parent_saw", value=exc.status)
    if ctx.is_cancelled():
        raise Cancelled(ctx.cancellation_reason() or "cancelled")
    return "not cancelled"


@workflow(name="ch_refunding_child_safe")
async def ch_refunding_child_safe(ctx: WorkflowContext, data: dict) -> str:
    tag = data["tag"]
    await act(ctx, tag, "child_charge")
    try:
        await ctx.wait_signal("never", cancellable=True)
    except Cancelled:
        await act(ctx, tag, "child_refund")  # durably, as an activity: the run is live
        raise
    return "unreachable"


@workflow(name="ch_waits")
async def ch_waits(ctx: WorkflowContext, data: dict) -> str:
    return await ctx.wait_signal("go", cancellable=True)  # type: ignore[no-any-return]


@workflow(name="ch_leaves_open")
async def ch_leaves_open(ctx: WorkflowContext, data: dict) -> str:
    handle = ctx.start_child_workflow(ch_waits, data, parent_close_policy=data["policy"])
    return handle.id


@workflow(name="ch_takes_id")
async def ch_takes_id(ctx: WorkflowContext, data: dict) -> str:
    try:
        await ctx.execute_child_workflow(ch_waits, data, id=data["child_id"])
    except ExecutionAlreadyExists:
        return "refused"
    return "started"


@workflow(name="ch_counter")
async def ch_counter(ctx: WorkflowContext, data: dict) -> dict:
    """Counts to ``to``, one activity per iteration, continuing as new every ``every``."""
    n, got = data["n"], data.get("got", [])
    for _ in range(data["every"]):
        if n >= data["to"]:
            return {"n": n, "got": got}
        await ctx.execute_activity(ch_tick, n)
        n += 1
        if n == data.get("signal_at"):
            got = [*got, await ctx.wait_signal("mid")]
    ctx.continue_as_new({**data, "n": n, "got": got})


@activity(name="ch_tick", queue="alpha")
def ch_tick(n: int) -> int:
    return n


@workflow(name="ch_sealed_parent")
async def ch_sealed_parent(ctx: WorkflowContext, data: dict) -> str:
    """Starts a child it abandons on a seal; in the cancel branch, tries to start another, then
    waits for the first child's close (which a sealed run still records)."""
    handle = ctx.start_child_workflow(ch_waits, data, parent_close_policy="abandon")
    try:
        await ctx.wait_signal("never", cancellable=True)
    except Cancelled:
        try:
            ctx.start_child_workflow(ch_waits, data)
        except Exception as exc:  # noqa: BLE001 - what the cancel branch saw (a test probe)
            record(data["tag"], "after_seal", type(exc).__name__)
    return await handle  # type: ignore[no-any-return]


@workflow(name="ch_compensating_parent")
async def ch_compensating_parent(ctx: WorkflowContext, data: dict) -> str:
    """Its unwind starts a compensating child that waits: a seal then lands mid-unwind."""
    saga = Saga(ctx)
    await saga.step(
        lambda: act(ctx, data["tag"], "charge"), lambda _: ctx.execute_child_workflow(ch_waits, data)
    )
    await saga.step(lambda: act(ctx, data["tag"], "ship", fail=True))  # fails: the unwind starts
    return "never"


@workflow(name="ch_bad_starts")
async def ch_bad_starts(ctx: WorkflowContext, data: dict) -> list[str]:
    """Each bad child start and a bad continue-as-new, caught: what each raised (its type and
    message). The activity records what the first decision saw; its result makes the next
    decision replay every attempt, and that replay's view is the run's result."""
    attempts = [
        lambda: ctx.start_child_workflow("ch_no_such_workflow", data),
        lambda: ctx.start_child_workflow(ch_waits, data, id="has:colon"),
        lambda: ctx.start_child_workflow(ch_waits, data, parent_close_policy="bogus"),
        lambda: ctx.start_child_workflow(ch_waits, {"not json": {1, 2}}),
        lambda: ctx.continue_as_new({"not json": {1, 2}}),
    ]
    seen = []
    for attempt in attempts:
        try:
            attempt()
        except Exception as exc:  # noqa: BLE001 - what each raised (a test probe)
            seen.append([type(exc).__name__, str(exc)])
    await act(ctx, data["tag"], "after_bad", value=seen)
    return seen


ALL = (
    ch_bad_starts,
    ch_sealed_parent,
    ch_compensating_parent,
    ch_act,
    ch_tick,
    ch_book_trip,
    ch_cancel_trip,
    ch_checkout,
    ch_cancel_parent,
    ch_refunding_child_safe,
    ch_waits,
    ch_leaves_open,
    ch_takes_id,
    ch_counter,
)
