"""B4 — fan-out and unwind: the DAG ``bench_fanout`` maps ``fan_cell`` over N cells (1,000 by
default), then ``fan_fail`` fails, so the mapped node is compensated; timed from
``start_workflow`` to ``result()`` raising. Documented deployment (decision + activity worker).

DAG compensation is node-granular (docs/dags.md): the mapped node's compensator ``fan_undo`` runs
once, with all N cell outputs, and undoes them in one activity. The baselines:

* raw Celery, per-cell undo: a ``group`` of N ``raw_step`` tasks, then a ``group`` of N
  ``raw_undo`` tasks (the client waits for each group) — the comparison asked for;
* raw Celery, batch undo: the same group, then one ``raw_undo`` task given all N outputs —
  what harvest's node-granular unwind does;
* DBOS: a workflow starting N child workflows (one step each), waiting for all, then N undo
  children."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import TOPOLOGY_LABELS, Cluster, error_text, harvest_client, log, ratio

TOPOLOGY = "split"


def harvest_fanout(cells: int, timeout: float) -> dict[str, Any]:
    from harvest_celery import WorkflowFailed

    harvest = harvest_client()
    t0 = time.perf_counter()
    execution_id = harvest.start_workflow("bench_fanout", {"cells": cells})
    outcome: dict[str, Any]
    try:
        result = harvest.result(execution_id, timeout=timeout)
        outcome = {"unexpected": f"the run completed: {str(result)[:200]}"}
    except WorkflowFailed as exc:
        outcome = {"failed_with": str(exc)[:300]}
    except TimeoutError as exc:
        outcome = {"unexpected": error_text(exc)}
    wall = time.perf_counter() - t0
    return {"execution_id": execution_id, "wall_s": wall, **outcome, **check(execution_id, cells)}


def check(execution_id: str, cells: int) -> dict[str, Any]:
    """What the history says happened: cells completed, and the compensation's output."""
    from harvest_celery._core import events as ev

    names: dict[str, str] = {}
    completed = {"fan_cell": 0, "fan_undo": 0}
    undone = None
    for h in harvest_client().history(execution_id):
        e = h.event
        if isinstance(e, ev.ActivityScheduled):
            names[e.activity_id] = e.activity_name
        elif isinstance(e, ev.ActivityCompleted) and names.get(e.activity_id) in completed:
            completed[names[e.activity_id]] += 1
            if names[e.activity_id] == "fan_undo":
                undone = e.output
    ok = completed["fan_cell"] == cells and completed["fan_undo"] == 1 and undone == cells
    return {
        "cells_completed": completed["fan_cell"],
        "undo_activities": completed["fan_undo"],
        "cells_undone": undone,
        "as_expected": ok,
    }


def raw_fanout(cells: int, batch_undo: bool) -> float:
    from celery import group

    from benchmarks.app import raw_step, raw_undo

    t0 = time.perf_counter()
    outputs = group(raw_step.s(i) for i in range(cells)).apply_async().get(timeout=300)
    if batch_undo:
        undone = raw_undo.apply_async((outputs,)).get(timeout=300)
    else:
        undone = sum(group(raw_undo.s(x) for x in outputs).apply_async().get(timeout=300))
    wall = time.perf_counter() - t0
    assert undone == cells, undone
    return wall


def run(args: Any, dbos: dict[str, Any]) -> dict[str, Any]:
    cells = args.fanout_cells
    log(f"B4 fan-out of {cells} cells + unwind, {TOPOLOGY_LABELS[TOPOLOGY]}…")
    with Cluster(TOPOLOGY, args.worker_concurrency, "b4"):
        harvest_fanout(10, 120)  # warm-up (code paths, connections)
        raw_fanout(10, False)
        harvest = harvest_fanout(cells, 120 + cells * 0.5)
        raw = {"per_cell_undo_s": raw_fanout(cells, False), "batch_undo_s": raw_fanout(cells, True)}
    dbos_s = dbos.get("wall_s")
    return {
        "cells": cells,
        "topology": TOPOLOGY_LABELS[TOPOLOGY],
        "harvest": harvest,
        "raw_celery": raw,
        "dbos": dbos,
        "ratios": {
            "harvest_over_raw_per_cell_undo": ratio(harvest["wall_s"], raw["per_cell_undo_s"]),
            "harvest_over_raw_batch_undo": ratio(harvest["wall_s"], raw["batch_undo_s"]),
            "harvest_over_dbos": ratio(harvest["wall_s"], dbos_s),
        },
    }
