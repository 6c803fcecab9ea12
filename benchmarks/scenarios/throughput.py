"""B2 — throughput (steps/s) with C workflows in flight, on 2 worker processes, against raw
Celery client-waited chains at the same C and DBOS workflows at the same C.

Both Celery systems get the same two worker processes (each consuming every queue); each of C
client threads runs one workflow (or one client-waited chain) after another, ``max(min_jobs,
2C)`` in all. DBOS runs its workflows in the client process (no worker)."""

from __future__ import annotations

from typing import Any

from benchmarks.common import TOPOLOGY_LABELS, Cluster, closed_loop, harvest_client, log, ratio
from benchmarks.scenarios.sequential import raw_client_chain

TOPOLOGY = "pair"


def harvest_job(steps: int) -> None:
    harvest = harvest_client()
    execution_id = harvest.start_workflow("bench_seq", steps)
    result = harvest.result(execution_id, timeout=max(120.0, steps * 5.0))
    assert result == steps, result


def _rate(row: dict[str, Any], steps: int) -> dict[str, Any]:
    if "error" not in row:
        row["steps_per_s"] = row["jobs"] * steps / row["wall_s"]
        row["workflows_per_s"] = row["jobs"] / row["wall_s"]
    return row


def run(args: Any, dbos: dict[str, Any]) -> dict[str, Any]:
    steps = args.steps
    dbos_rows = {} if "error" in dbos else {r["inflight"]: _rate(r, steps) for r in dbos["rows"]}
    levels = []
    log(f"B2 throughput on {TOPOLOGY_LABELS[TOPOLOGY]}, in flight {args.inflight}…")
    with Cluster(TOPOLOGY, args.worker_concurrency, "b2"):
        harvest_job(steps)  # warm-up
        raw_client_chain(steps)
        for c in args.inflight:
            total = max(args.min_jobs, 2 * c)
            log(f"   {c} in flight: {total} workflows of {steps} steps per system…")
            h = _rate(closed_loop(lambda: harvest_job(steps), c, total), steps)
            r = _rate(closed_loop(lambda: raw_client_chain(steps), c, total), steps)
            d = dbos_rows.get(c, {"error": dbos.get("error", "not run at this level")})
            levels.append({"inflight": c, "harvest": h, "raw_celery": r, "dbos": d,
                           "raw_over_harvest": ratio(r.get("steps_per_s"), h.get("steps_per_s")),
                           "dbos_over_harvest": ratio(d.get("steps_per_s"), h.get("steps_per_s"))})
    return {"steps": steps, "topology": TOPOLOGY_LABELS[TOPOLOGY],
            "worker_concurrency": args.worker_concurrency, "levels": levels}
