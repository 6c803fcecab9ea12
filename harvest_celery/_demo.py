"""``harvest demo``: the example workflows end to end on a laptop — no Postgres, no Redis.

Embedded mode (SQLite in a temp dir, in-process worker). The order pipeline, a checkout that
succeeds, a checkout that fails and compensates, a checkout cancelled (sealed) while a step is
running, the same with a cooperative cancel (its durable refund runs), and the fulfillment DAG.
"""

from __future__ import annotations

import shutil
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from harvest_celery._client import Harvest
from harvest_celery._core.timeline import render_status, render_timeline
from harvest_celery._errors import HarvestError
from harvest_celery.examples import checkout, dag_compensation_example, fulfillment, orders

# A scenario's explanation is printed under its title, before the run: the reader knows what to
# expect before the output shows an error.
CANCEL_NOTE = (
    "what to expect, a known limitation: once WorkflowCancelled is recorded, a durable compensation "
    "cannot be scheduled (its dispatch diverges: expected ActivityScheduled(..), got "
    "WorkflowCancelled), so the unwind fails with SagaCompensationFailed and the charge and "
    'reservation are left for manual reconciliation (or reset); see docs/concepts.md, "Known '
    'limitation: durable compensations after a recorded cancel". The cooperative cancel of (d2) '
    "undoes them."
)

COOPERATIVE_NOTE = (
    "what to expect: request_cancellation does not seal the run: it shows CANCELLING, "
    "ctx.is_cancelled() turns true at the request, and the cancel branch's compensations run as "
    "activities (with retries); the run ends CANCELLED when the workflow raises Cancelled. See "
    'docs/concepts.md, "Cancellation".'
)

ORDER = {"order_id": 1, "items": [{"sku": "tea", "qty": 2, "price": 4}, {"sku": "mug", "qty": 1, "price": 9}]}

Begin = Callable[[Harvest, TextIO], Any]  # starts the scenario's run (and cancels it, for a cancel)


@dataclass(frozen=True)
class Scenario:
    label: str
    title: str
    execution_id: str
    begin: Begin
    note: str = ""  # printed before the run
    order_id: int | None = None  # whose ledger entries are printed after it


def scenarios() -> list[Scenario]:
    """What the demo runs, in order."""
    return [
        Scenario(
            "a",
            "order_pipeline: validate, price, confirm",
            "demo-order-1",
            _starting("order_pipeline", ORDER, "demo-order-1"),
        ),
        Scenario(
            "b",
            "checkout: charge, reserve, confirm",
            "demo-checkout-2",
            _starting("checkout", {"order_id": 2}, "demo-checkout-2"),
            order_id=2,
        ),
        Scenario(
            "c",
            "checkout, out of stock: reserve fails (after one retry), the saga refunds the charge",
            "demo-checkout-3",
            _starting("checkout", {"order_id": 3, "out_of_stock": True}, "demo-checkout-3"),
            order_id=3,
        ),
        Scenario(
            "d",
            "checkout cancelled while reserving: the cancel-and-compensate branch",
            "demo-checkout-4",
            _cancelling("demo-checkout-4", cooperative=False),
            note=CANCEL_NOTE,
            order_id=4,
        ),
        Scenario(
            "d2",
            "checkout, cooperative cancel while reserving: the release and the refund run as activities",
            "demo-checkout-7",
            _cancelling("demo-checkout-7", cooperative=True),
            note=COOPERATIVE_NOTE,
            order_id=7,
        ),
        Scenario("e", "fulfillment DAG: reserve → capture → print label", "fulfil-5", _fulfilling("5")),
        Scenario(
            "f",
            "fulfillment DAG, printer jam: the engine refunds, then releases (LIFO); self-checks pass",
            "fulfil-6jam",
            _fulfilling("6jam"),
        ),
    ]


def run_demo(out: TextIO, *, keep: bool = False) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="harvest-demo-"))
    url = f"sqlite:///{workdir / 'harvest.db'}"
    try:
        print(
            f"harvest demo: embedded mode, SQLite database {workdir / 'harvest.db'} (no Postgres, no Redis)",
            file=out,
        )
        harvest = Harvest(url)
        harvest.migrate()
        harvest.register(orders, checkout, fulfillment)
        outcomes = [_report(harvest, out, scenario) for scenario in scenarios()]
        print("\nsummary:", file=out)
        for label, workflow, status, error in outcomes:
            print(f"  ({label}) {workflow:<15} {status:<10} {error}".rstrip(), file=out)
        if keep:
            print(
                f"\nkept {workdir}; inspect it with:\n"
                f"  harvest --database-url {url} list\n"
                f"  harvest --database-url {url} show demo-checkout-3",
                file=out,
            )
        return 0
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _report(harvest: Harvest, out: TextIO, scenario: Scenario) -> tuple[str, str, str, str]:
    """Run one scenario and print its explanation, status, timeline, outcome and ledger; returns
    its line of the summary."""
    print(f"\n== ({scenario.label}) {scenario.title} ==", file=out)
    if scenario.note:
        print(textwrap.fill(scenario.note, 100, initial_indent="  ", subsequent_indent="  "), file=out)
    scenario.begin(harvest, out)
    execution_id = scenario.execution_id
    outcome = _settle(harvest, execution_id)
    row = harvest.describe(execution_id)
    for line in render_status(row):
        print(line, file=out)
    print("  timeline:", file=out)
    for line in render_timeline(harvest.history(execution_id), harvest.store.attempt_errors(execution_id)):
        print("  " + line, file=out)
    print(f"  outcome   {outcome}", file=out)
    if scenario.order_id is not None:
        entries = {k: v for k, v in checkout.LEDGER.items() if k.endswith(f"_{scenario.order_id}")}
        print(
            "  ledger    " + (", ".join(f"{k}={v}" for k, v in sorted(entries.items())) or "(nothing)"),
            file=out,
        )
    error = (row.error or {}).get("type", "") if isinstance(row.error, dict) else ""
    return scenario.label, row.workflow_type, row.status, f"({error})" if error else ""


def _starting(workflow: str, data: Any, execution_id: str) -> Begin:
    return lambda harvest, out: _start(harvest, workflow, data, execution_id)


def _fulfilling(order_id: str) -> Begin:
    return lambda harvest, out: dag_compensation_example.run(harvest, order_id)


def _cancelling(execution_id: str, *, cooperative: bool) -> Begin:
    return lambda harvest, out: _cancel_while_reserving(harvest, out, execution_id, cooperative=cooperative)


def _cancel_while_reserving(
    harvest: Harvest, out: TextIO, execution_id: str, *, cooperative: bool = False
) -> None:
    # An operator cancels while reserve_inventory's body is running (the in-process
    # worker runs it on another thread): the body keeps its claim, its result is recorded,
    # and the next decision takes the workflow's compensate_all() branch.
    order_id = int(execution_id.rsplit("-", 1)[1])
    starter = threading.Thread(
        target=_start,
        args=(harvest, "checkout", {"order_id": order_id, "reserve_seconds": 1.0}, execution_id),
    )
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
        if any(
            getattr(h.event, "activity_id", None) == activity_id and h.event.type == "ActivityStarted"
            for h in history
        ):
            return
        time.sleep(0.02)
    raise TimeoutError(f"activity {activity_id} of {execution_id} did not start")
