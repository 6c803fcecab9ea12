"""B2 — throughput (steps/s) with C workflows in flight, on 2 worker processes, against raw
Celery client-waited chains at the same C and DBOS workflows at the same C.

Both Celery systems get the same two worker processes (each consuming every queue); each of C
client threads runs one workflow (or one client-waited chain) after another, ``max(min_jobs,
2C)`` in all, repeated ``--repeats`` times per level with the two systems interleaved (the
order alternating), so drift hits both alike. A level's steps/s is the median over its repeats;
its ratio is the median of the per-repeat ratios, with their spread. DBOS runs its workflows in
the client process (no worker)."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import (
    TOPOLOGY_LABELS,
    Cluster,
    closed_loop,
    harvest_client,
    hit_rate,
    log,
    ratio,
    spread,
)
from benchmarks.scenarios.sequential import raw_client_chain

TOPOLOGY = "pair"  # the default; --b2-topology split runs the documented deployment instead


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
    topology = args.b2_topology
    log(f"B2 throughput on {TOPOLOGY_LABELS[topology]}, in flight {args.inflight}…")
    with Cluster(topology, args.worker_concurrency, "b2") as cluster:
        harvest_job(steps)  # warm-up
        raw_client_chain(steps)
        for c in args.inflight:
            total = max(args.min_jobs, 2 * c)
            log(f"   {c} in flight: {total} workflows of {steps} steps per system, {args.repeats} repeats…")
            before = cluster.replays()
            h, r = _interleaved(c, total, steps, args.repeats)
            h["replays"] = hit_rate(before, cluster.replays())
            d = dbos_rows.get(c, {"error": dbos.get("error", "not run at this level")})
            levels.append(
                {
                    "inflight": c,
                    "harvest": h,
                    "raw_celery": r,
                    "dbos": d,
                    "raw_over_harvest": ratio(r.get("steps_per_s"), h.get("steps_per_s")),
                    "repeats_raw_over_harvest": spread(
                        [
                            ratio(a, b)
                            for a, b in zip(r.get("repeats", []), h.get("repeats", []), strict=False)
                        ]
                    ),
                    "dbos_over_harvest": ratio(d.get("steps_per_s"), h.get("steps_per_s")),
                }
            )
    return {
        "steps": steps,
        "topology": TOPOLOGY_LABELS[topology],
        "topology_name": topology,
        "pool": args.pool,
        "broker": args.broker,
        "worker_concurrency": args.worker_concurrency,
        "levels": levels,
    }


def _interleaved(c: int, total: int, steps: int, repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``repeats`` rounds of harvest and raw Celery at ``c`` in flight, the order alternating;
    each system's row holds its per-repeat steps/s and their median (or the first error)."""
    systems = {"harvest": lambda: harvest_job(steps), "raw": lambda: raw_client_chain(steps)}
    rates: dict[str, list[float]] = {"harvest": [], "raw": []}
    for i in range(repeats):
        for name in ("harvest", "raw") if i % 2 == 0 else ("raw", "harvest"):
            row = _rate(closed_loop(systems[name], c, total), steps)
            if "error" in row:
                return (
                    (row, {"error": "not measured"})
                    if name == "harvest"
                    else ({"error": "not measured"}, row)
                )
            rates[name].append(row["steps_per_s"])

    def row(values: list[float]) -> dict[str, Any]:
        return {"inflight": c, "jobs": total, "repeats": values, "steps_per_s": statistics.median(values)}

    return row(rates["harvest"]), row(rates["raw"])
