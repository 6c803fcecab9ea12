"""Workflows, activities and DAGs of the cancellation tests (``test_cancel.py``): the outcomes of a
sealed run's cancel branch, cooperative cancel with a durable refund, an activity that learns of
a cancel, and the DAG cancel edge. Bodies record what they did under the run's tag and wait on
Redis flags the test raises (``test_cancel.release``), so a test decides when each one ends."""

from __future__ import annotations

import time
from typing import Any

from harvest_celery import (
    ActivityError,
    Cancelled,
    DagBuilder,
    RetryPolicy,
    Saga,
    WorkflowContext,
    activity,
    activity_context,
    dag,
    workflow,
)

from .app import r, record

ONCE = RetryPolicy(max_attempts=1)


def hold(tag: str, name: str, timeout: float = 30.0) -> None:
    """Block until the test releases ``name`` for this tag (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not r.exists(f"release:{tag}:{name}") and time.monotonic() < deadline:
        time.sleep(0.05)


# ── a checkout whose cancel branch refunds ────────────────────────────────────────────────────
@activity(name="cx_charge", queue="payments", retry=ONCE)
def cx_charge(data: dict) -> str:
    record(data["tag"], "charge")
    return f"ch_{data['tag']}"


@activity(name="cx_refund", queue="payments", retry=ONCE)
def cx_refund(data: dict) -> str:
    record(data["tag"], "refund:start", data["charge"])
    if data.get("hold"):
        hold(data["tag"], "refund")
    record(data["tag"], "refund:end", data["charge"])
    return f"refunded {data['charge']}"


@activity(name="cx_pack", queue="alpha", retry=ONCE)
def cx_pack(data: dict) -> str:
    record(data["tag"], "pack:start")
    hold(data["tag"], "pack")
    record(data["tag"], "pack:end")
    return "packed"


@workflow(name="coop_checkout")
async def coop_checkout(ctx: WorkflowContext, data: dict) -> str:
    """Charge (refunded durably on cancel), pack; a cancel observed after packing compensates.
    Under a seal the durable refund cannot run (the spec's known limitation); under a
    cooperative cancel it runs as an activity."""
    saga = Saga(ctx)
    tag = data["tag"]
    charge = await saga.step(
        lambda: ctx.execute_activity(cx_charge, data),
        lambda charge_id: ctx.execute_activity(
            cx_refund, {"tag": tag, "charge": charge_id, "hold": data.get("hold_refund", False)}
        ),
    )
    seen = [ctx.is_cancelled()]
    await ctx.execute_activity(cx_pack, data)
    seen.append(ctx.is_cancelled())
    if ctx.is_cancelled():
        await saga.compensate_all()
        raise Cancelled(ctx.cancellation_reason() or "cancelled")
    return f"{charge} {seen}"


@workflow(name="seal_checkout")
async def seal_checkout(ctx: WorkflowContext, data: dict) -> str:
    """The seal cancel with an in-memory compensation, ending in ``Cancelled``."""
    saga = Saga(ctx)
    undone: list[str] = []
    await saga.step(lambda: ctx.execute_activity(cx_charge, data), lambda cid: undone.append(cid))
    await ctx.execute_activity(cx_pack, data)
    if ctx.is_cancelled():
        await saga.compensate_all()
        raise Cancelled(f"{ctx.cancellation_reason()}; undone {undone}")
    return "shipped"


@workflow(name="cx_parked")
async def cx_parked(ctx: WorkflowContext, data: dict) -> str:
    """Waits for a signal that, once the run is sealed, can never come."""
    return await ctx.wait_signal("go")  # type: ignore[no-any-return]


# ── an activity that learns of a cancel ───────────────────────────────────────────────────────
@activity(name="cx_watch", queue="beta", retry=ONCE)
def cx_watch(data: dict) -> str:
    ctx = activity_context()
    record(data["tag"], "watch:start")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ctx.heartbeat()
        if ctx.is_cancelled():
            record(data["tag"], "watch:stopped")
            raise RuntimeError("stopped early: the run was cancelled")
        time.sleep(0.1)
    return "watched to the end"


@workflow(name="watched")
async def watched(ctx: WorkflowContext, data: dict) -> str:
    try:
        return await ctx.execute_activity(cx_watch, data)  # type: ignore[no-any-return]
    except ActivityError:
        if ctx.is_cancelled():
            raise Cancelled(ctx.cancellation_reason() or "cancelled") from None
        raise


# ── the DAG cancel edge: a → b, a → c → e; b fails, the cancel lands while c runs ─────────────
def _node(name: str, queue: str = "alpha") -> Any:
    def body(value: Any) -> Any:
        conf = value.get("conf", {}) if isinstance(value, dict) else {}
        tag = conf.get("tag") or (value.get("tag") if isinstance(value, dict) else "")
        record(tag, f"{name}:start")
        if name in conf.get("hold", []):
            hold(tag, name)
        if name in conf.get("fail", []):
            raise RuntimeError(f"{name} failed")
        record(tag, f"{name}:end")
        return {"tag": tag, "node": name}

    body.__name__ = name
    return activity(name=name, queue=queue, retry=ONCE)(body)


ce_a, ce_b, ce_c, ce_e = _node("ce_a"), _node("ce_b"), _node("ce_c", "beta"), _node("ce_e")


@activity(name="ce_undo", queue="inventory", retry=ONCE)
def ce_undo(envelope: dict) -> str:
    tag = (envelope.get("input") or {}).get("conf", {}).get("tag", "")
    record(tag, f"undo:{envelope['dag_compensate']}")
    if envelope["dag_compensate"] in (envelope.get("input") or {}).get("conf", {}).get("hold_undo", []):
        hold(tag, f"undo:{envelope['dag_compensate']}")
    return "undone"


@dag
def cancel_edge(g: DagBuilder) -> None:
    a = g.activity(ce_a).compensate(ce_undo)
    g.activity(ce_b).upstream(a).compensate(ce_undo)
    c = g.activity(ce_c).upstream(a).compensate(ce_undo)
    g.activity(ce_e).upstream(c).compensate(ce_undo)


ALL = [
    cx_charge,
    cx_refund,
    cx_pack,
    coop_checkout,
    seal_checkout,
    cx_parked,
    cx_watch,
    watched,
    ce_a,
    ce_b,
    ce_c,
    ce_e,
    ce_undo,
    cancel_edge,
]
