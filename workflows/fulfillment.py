"""The fulfillment DAG from the spec: reserve → charge → print a label, each node declaring the
activity that undoes it. On terminal failure the engine unwinds the succeeded nodes LIFO.

Compensators receive the envelope ``{"dag_compensate": node, "input": ..., "output": ...}`` and
undo by the id read from ``output`` — idempotent, so a replay that re-runs them is harmless.
"""

from __future__ import annotations

from harvest_celery import DagBuilder, RetryPolicy, activity, dag

# Stand-in for the warehouse, payment and shipping systems, keyed by ids.
STATE: dict[str, str] = {}
ONCE = RetryPolicy(max_attempts=1)


@activity(queue="inventory", retry=ONCE)
def reserve_stock(task: dict) -> dict:
    order = task["conf"]
    rsv_id = f"rsv-{order['order_id']}"
    STATE[rsv_id] = "reserved"
    return {"reservation_id": rsv_id}


@activity(queue="inventory", retry=ONCE)
def release_stock(envelope: dict) -> None:
    rsv_id = envelope["output"]["reservation_id"]
    if STATE.get(rsv_id) == "reserved":
        STATE[rsv_id] = "released"


@activity(queue="payments", retry=ONCE)
def capture_payment(reservation: dict) -> dict:
    charge_id = "ch-" + reservation["reservation_id"].removeprefix("rsv-")
    STATE[charge_id] = "captured"
    return {"charge_id": charge_id}


@activity(queue="payments", retry=ONCE)
def refund_capture(envelope: dict) -> None:
    charge_id = envelope["output"]["charge_id"]
    if STATE.get(charge_id) == "captured":
        STATE[charge_id] = "refunded"


@activity(queue="default", retry=ONCE)
def print_label(charge: dict) -> dict:
    order_ref = charge["charge_id"].removeprefix("ch-")
    if order_ref.endswith("jam"):
        raise RuntimeError(f"printer jammed on order {order_ref}")
    label_id = f"lbl-{order_ref}"
    STATE[label_id] = "printed"
    return {"label_id": label_id}


@activity(queue="default", retry=ONCE)
def void_label(envelope: dict) -> None:
    label_id = envelope["output"]["label_id"]
    if STATE.get(label_id) == "printed":
        STATE[label_id] = "void"


@dag
def fulfillment(g: DagBuilder) -> None:
    reserve = g.activity(reserve_stock).compensate(release_stock)
    charge = g.activity(capture_payment).input_from(reserve).compensate(refund_capture)
    g.activity(print_label).input_from(charge).compensate(void_label)
