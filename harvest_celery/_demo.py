"""``harvest demo``: the example workflows end to end on a laptop — no Postgres, no Redis.

Embedded mode (SQLite in a temp dir, in-process worker). The order pipeline, a checkout that
succeeds, a checkout that fails and compensates, a checkout cancelled (sealed) while a step is
running, the same with a cooperative cancel (its durable refund runs), and the fulfillment DAG.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from harvest_celery._client import Harvest
from harvest_celery._core.timeline import render_status, render_timeline
from harvest_celery._errors import HarvestError
from harvest_celery.examples import checkout, dag_compensation_example, fulfillment, orders

CANCEL_NOTE = (
    "known limitation: once WorkflowCancelled is recorded, a durable compensation cannot be "
    "scheduled (its dispatch diverges: expected ActivityScheduled(..), got WorkflowCancelled), so "
    "the unwind fails with SagaCompensationFailed and the charge and reservation are left for manual "
    "reconciliation (or reset); see docs/concepts.md, \"Known limitation: durable compensations after a recorded cancel\"."
)


COOPERATIVE_NOTE = (
    "request_cancellation does not seal the run: it shows CANCELLING, ctx.is_cancelled() turns "
    "true at the request, and the cancel branch's compensations run as activities (with retries); "
    "the run ends CANCELLED when the workflow raises Cancelled. See docs/concepts.md, \"Cancellation\"."
)


def run_demo(out: TextIO, *, keep: bool = False) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="harvest-demo-"))
    url = f"sqlite:///{workdir / 'harvest.db'}"
    try:
        print(f"harvest demo: embedded mode, SQLite database {workdir / 'harvest.db'} "
              "(no Postgres, no Redis)", file=out)
        harvest = Harvest(url)
        harvest.migrate()
        harvest.register(orders, checkout, fulfillment)
        outcomes: list[tuple[str, str, str, str]] = []

        run = partial(_report, harvest, out, outcomes, checkout.LEDGER)

        order = {"order_id": 1, "items": [{"sku": "tea", "qty": 2, "price": 4}, {"sku": "mug", "qty": 1, "price": 9}]}
        run("a", "order_pipeline: validate, price, confirm", "demo-order-1",
            lambda: _start(harvest, "order_pipeline", order, "demo-order-1"))

        run("b", "checkout: charge, reserve, confirm", "demo-checkout-2",
            lambda: _start(harvest, "checkout", {"order_id": 2}, "demo-checkout-2"), order_id=2)

        run("c", "checkout, out of stock: reserve fails (after one retry), the saga refunds the charge",
            "demo-checkout-3",
            lambda: _start(harvest, "checkout", {"order_id": 3, "out_of_stock": True}, "demo-checkout-3"),
            order_id=3)

        run("d", "checkout cancelled while reserving: the cancel-and-compensate branch",
            "demo-checkout-4", partial(_cancel_while_reserving, harvest, out, "demo-checkout-4"),
            note=CANCEL_NOTE, order_id=4)

        run("d2", "checkout, cooperative cancel while reserving: the release and the refund run "
            "as activities", "demo-checkout-7",
            partial(_cancel_while_reserving, harvest, out, "demo-checkout-7", cooperative=True),
            note=COOPERATIVE_NOTE, order_id=7)

        run("e", "fulfillment DAG: reserve → capture → print label", "fulfil-5",
            lambda: dag_compensation_example.run(harvest, "5"))
        run("f", "fulfillment DAG, printer jam: the engine refunds, then releases (LIFO); "
            "self-checks pass", "fulfil-6jam",
            lambda: dag_compensation_example.run(harvest, "6jam"))

        print("\nsummary:", file=out)
        for label, workflow, status, error in outcomes:
            print(f"  ({label}) {workflow:<15} {status:<10} {error}".rstrip(), file=out)
        if keep:
            print(f"\nkept {workdir}; inspect it with:\n"
                  f"  harvest --database-url {url} list\n"
                  f"  harvest --database-url {url} show demo-checkout-3", file=out)
        return 0
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _report(harvest: Harvest, out: TextIO, outcomes: list[tuple[str, str, str, str]],
            ledger: dict[str, Any], label: str,
            title: str, execution_id: str, begin: Callable[[], Any], note: str = "",
            order_id: int | None = None) -> None:
    """Run one demo scenario and print its status, timeline, outcome and ledger."""
    print(f"\n== ({label}) {title} ==", file=out)
    begin()
    outcome = _settle(harvest, execution_id)
    row = harvest.describe(execution_id)
    for line in render_status(row):
        print(line, file=out)
    print("  timeline:", file=out)
    for line in render_timeline(harvest.history(execution_id)):
        print("  " + line, file=out)
    print(f"  outcome   {outcome}", file=out)
    if order_id is not None:
        entries = {k: v for k, v in ledger.items() if k.endswith(f"_{order_id}")}
        print("  ledger    " + (", ".join(f"{k}={v}" for k, v in sorted(entries.items()))
                                or "(nothing)"), file=out)
    if note:
        print(f"  note: {note}", file=out)
    error = (row.error or {}).get("type", "") if isinstance(row.error, dict) else ""
    outcomes.append((label, row.workflow_type, row.status, f"({error})" if error else ""))


def _cancel_while_reserving(harvest: Harvest, out: TextIO, execution_id: str, *,
                            cooperative: bool = False) -> None:
    # An operator cancels while reserve_inventory's body is running (the in-process
    # worker runs it on another thread): the body keeps its claim, its result is recorded,
    # and the next decision takes the workflow's compensate_all() branch.
    order_id = int(execution_id.rsplit("-", 1)[1])
    starter = threading.Thread(target=_start, args=(
        harvest, "checkout", {"order_id": order_id, "reserve_seconds": 1.0}, execution_id))
    starter.start()
    _wait_started(harvest, execution_id, "2")
    if cooperative:
        print("  reserve_inventory is running; the customer requests a cancellation now", file=out)
        harvest.request_cancellation(execution_id, reason="customer changed their mind")
    else:
        print("  reserve_inventory is running; an operator cancels the run now", file=out)
        harvest.cancel_workflow_execution(execution_id, reason="customer changed their mind")
    starter.join()


def _start(harvest: Harvest, workflow: str, data: Any, execution_id: str) -> None:
    harvest.start_workflow(workflow, data, execution_id=execution_id)


def _settle(harvest: Harvest, execution_id: str) -> str:
    """Drive the run (retries included) until it is terminal or parked; describe how it ended."""
    try:
        return f"result {harvest.result(execution_id, timeout=10)!r}"
    except TimeoutError:
        return "still running (parked)"
    except HarvestError as exc:
        return f"{type(exc).__name__}: {exc}"


def _wait_started(harvest: Harvest, execution_id: str, activity_id: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            history = harvest.history(execution_id)
        except HarvestError:
            history = []
        if any(getattr(h.event, "activity_id", None) == activity_id and h.event.type == "ActivityStarted"
               for h in history):
            return
        time.sleep(0.02)
    raise TimeoutError(f"activity {activity_id} of {execution_id} did not start")
