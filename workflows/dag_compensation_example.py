"""A worked example of declarative DAG compensation, with self-checks (run by ``harvest demo``).

A fulfillment whose label printer jams: the reservation and the payment succeeded, the label
failed, so the engine undoes the payment, then the reservation (LIFO), and never the failed label.
"""

from __future__ import annotations

from typing import Any

from harvest_celery import Harvest, HarvestError

from . import fulfillment


def run(harvest: Harvest, order_id: str) -> dict[str, Any]:
    """Run one fulfillment and check what the spec promises about its unwind. Returns findings;
    raises AssertionError if a promise is broken."""
    run_id = harvest.start_workflow("fulfillment", {"order_id": order_id}, execution_id=f"fulfil-{order_id}")
    try:
        result: Any = harvest.result(run_id, timeout=30)
        error = None
    except HarvestError as exc:
        result, error = None, str(exc)
    history = [h.event for h in harvest.history(run_id)]
    undo = [e for e in history if e.type == "ActivityScheduled" and e.compensation]
    if not order_id.endswith("jam"):
        assert error is None, error
        assert undo == [], "a successful DAG compensates nothing"
        assert set(result) == {"reserve_stock", "capture_payment", "print_label"}
        return {"run_id": run_id, "compensated": [], "error": None}
    assert error is not None and "one or more DAG tasks failed" in error, error
    names = [e.activity_name for e in undo]
    assert names == ["refund_capture", "release_stock"], names  # LIFO; the failed node: never
    assert [e.input["dag_compensate"] for e in undo] == ["capture_payment", "reserve_stock"]
    assert undo[0].queue == "payments" and undo[1].queue == "inventory"  # the node's queue
    markers = [e.name for e in history if e.type == "MarkerRecorded"]
    assert markers == ["saga_compensated:1"], markers
    ref = order_id
    state = fulfillment.STATE
    assert state[f"ch-{ref}"] == "refunded" and state[f"rsv-{ref}"] == "released", state
    assert f"lbl-{ref}" not in state
    return {"run_id": run_id, "compensated": names, "error": error}
