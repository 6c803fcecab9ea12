"""Workflow admission (docs/flow-control.md, "Workflow admission"), run only when named
(``--scenarios admission``), on the B2 pair of workers:

* **keyed:** 64 workflows in flight over 4 keys at ``concurrency=16`` (``bench_adm``) against
  the same workflow unlimited (``bench_seq``) and raw Celery client-waited chains, interleaved
  repeats as B2 does; steps/s and the ratios side by side;
* **hot:** ``hot_runs`` one-step runs of one key at ``concurrency=4`` (``bench_hot``), started at
  once from 8 client threads, so every start and close of both workers locks one limit row:
  admissions per second (first to last ``admitted_at``), the admission latency after a close
  (a run's ``admitted_at`` minus the latest close of the key before it: 0 since the close and
  the next admission are one trip) and the time from a run's admission to its first decision's
  ``ActivityScheduled`` (the admitted run under way), read from the run rows and histories.

Nothing here is a test: there are no timed assertions."""

from __future__ import annotations

import itertools
import statistics
import threading
from typing import Any

from benchmarks.common import TOPOLOGY_LABELS, Cluster, closed_loop, harvest_client, log, pct, ratio, spread
from benchmarks.scenarios.sequential import raw_client_chain
from benchmarks.scenarios.throughput import harvest_job

INFLIGHT, KEYS = 64, 4


def limited_job(steps: int, key: int) -> None:
    harvest = harvest_client()
    execution_id = harvest.start_workflow("bench_adm", {"n": steps, "key": f"k{key % KEYS}"})
    result = harvest.result(execution_id, timeout=max(120.0, steps * 5.0))
    assert result == steps, result


def keyed(steps: int, total: int, repeats: int) -> dict[str, Any]:
    keys, lock, mine = itertools.count(), threading.Lock(), threading.local()

    def next_key() -> int:
        """Each client thread keeps one key: 16 of the 64 threads per key, so the limit is
        full but never exceeded (the admission path's cost, no run waiting for long)."""
        if not hasattr(mine, "key"):
            with lock:
                mine.key = next(keys)
        return int(mine.key)

    systems = {
        "limited": lambda: limited_job(steps, next_key()),
        "unlimited": lambda: harvest_job(steps),
        "raw": lambda: raw_client_chain(steps),
    }
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for i in range(repeats):
        order = list(systems) if i % 2 == 0 else list(reversed(systems))
        for name in order:
            row = closed_loop(systems[name], INFLIGHT, total)
            if "error" in row:
                return {"error": f"{name}: {row['error']}"}
            rates[name].append(total * steps / row["wall_s"])
    med = {name: statistics.median(v) for name, v in rates.items()}
    return {
        "inflight": INFLIGHT,
        "keys": KEYS,
        "concurrency": 16,
        "jobs": total,
        "steps_per_s": med,
        "repeats": rates,
        # cost ratios (> 1: slower): unlimited ÷ limited throughput
        "limited_over_unlimited": ratio(med["unlimited"], med["limited"]),
        "repeats_limited_over_unlimited": spread(
            [ratio(u, lim) for u, lim in zip(rates["unlimited"], rates["limited"], strict=True)]
        ),
        "limited_over_raw": ratio(med["raw"], med["limited"]),
        "unlimited_over_raw": ratio(med["raw"], med["unlimited"]),
    }


def hot(runs: int) -> dict[str, Any]:
    import sqlalchemy as sa

    from harvest_celery._store.schema import events, executions

    harvest = harvest_client()
    ids: list[str] = []
    lock = threading.Lock()

    def starter(n: int) -> None:
        for _ in range(n):
            run_id = harvest.start_workflow("bench_hot", None)
            with lock:
                ids.append(run_id)

    threads = [threading.Thread(target=starter, args=(runs // 8,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for run_id in ids:
        harvest.result(run_id, timeout=300)
    c, e = executions.c, events.c
    with harvest.store.engine.connect() as conn:
        rows = conn.execute(sa.select(c.id, c.admitted_at, c.closed_at).where(c.id.in_(ids))).all()
        first_step = dict(
            conn.execute(
                sa.select(e.execution_id, sa.func.min(e.recorded_at))
                .where(e.execution_id.in_(ids) & (e.type == "ActivityScheduled"))
                .group_by(e.execution_id)
            ).all()
        )
    # from its admission to its first decision's ActivityScheduled: the admitted run under way
    # (its admission itself is written by the close that freed the slot, in that same trip)
    onward = [(first_step[r.id] - r.admitted_at).total_seconds() for r in rows if r.id in first_step]
    admitted = sorted(r.admitted_at.timestamp() for r in rows)
    closes = sorted(r.closed_at.timestamp() for r in rows)
    latency = []
    for at in admitted[4:]:  # the first 4 took free slots at their start
        before = [x for x in closes if x <= at]
        if before:
            latency.append(at - before[-1])
    span = admitted[-1] - admitted[0]
    return {
        "runs": len(ids),
        "concurrency": 4,
        "admissions_per_s": (len(admitted) - 1) / span if span > 0 else None,
        "latency_ms": _ms(latency),
        "first_step_after_admission_ms": _ms(onward),
    }


def _ms(seconds: list[float]) -> dict[str, float | None]:
    return {
        "median": statistics.median(seconds) * 1000 if seconds else None,
        "p95": pct(seconds, 95) * 1000 if seconds else None,
        "max": max(seconds) * 1000 if seconds else None,
    }


def run(args: Any, _dbos: dict[str, Any]) -> dict[str, Any]:
    steps, total = args.steps, max(args.min_jobs, 2 * INFLIGHT)
    log(f"admission on {TOPOLOGY_LABELS['pair']}: {INFLIGHT} in flight over {KEYS} keys, then a hot key…")
    with Cluster("pair", args.worker_concurrency, "adm"):
        harvest_job(steps)  # warm-up
        limited_job(steps, 0)
        raw_client_chain(steps)
        out = {"steps": steps, "keyed": keyed(steps, total, args.repeats), "hot": hot(args.hot_runs)}
    return out
