"""Activity limits (docs/flow-control.md): what a concurrency limit costs, and how closely a rate
limit keeps its rate, on 2 worker processes each consuming every queue (so two sweepers, and two
wakers racing on the one limit row).

* concurrency: ``bench_seq16`` (every step under ``concurrency=16``) against ``bench_seq`` (the
  same no-op, unlimited) at 64 in flight, interleaved, ``--repeats`` rounds: steps/s of each and
  limited ÷ unlimited. A limited step completes through the ordinary transaction (no
  one-statement completion), and its slot is settled in the lock order. A third arm runs
  ``bench_seq16`` with an override of 1000 (no row ever waits): the limited path's cost
  without the wait. A fourth arm, ``bench_seq_keyed``, puts every step under ``limit_key``
  with a per-key ``concurrency=4`` and spreads its runs over 4 keys round-robin: the same 16
  slots in all, on 4 limit rows instead of one (the keyed row).
* rate: 300 workflows of one ``bench_rated`` call (``rate_limit="20/s"``, one key: the hot limit
  row) started back to back. From the task rows: the release span (first to last
  ``dispatched_at``), the achieved rate (299 ÷ span) over the configured 20/s, each release's
  lateness (its ``dispatched_at`` minus the previous one's plus 1/20 s: GCRA with burst one
  spaces releases from the previous release), and the wall time from the first start to the
  last result against the nominal 15 s.

Nothing here is asserted: the numbers go to the JSON and the table.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

import sqlalchemy as sa

from benchmarks.common import Cluster, closed_loop, harvest_client, log, pct, ratio, spread

RATE = 20.0
CALLS = 300


KEYS = 4  # the keyed arm's keys: 4 x concurrency=4 = the 16 slots of bench_seq16


def seq_job(workflow: str, steps: int, key: str | None = None) -> None:
    harvest = harvest_client()
    run_id = harvest.start_workflow(workflow, steps if key is None else {"n": steps, "key": key})
    assert harvest.result(run_id, timeout=max(120.0, steps * 5.0)) == steps


OPEN = "bench_seq16 open"  # the same limited workflow with an override no run reaches: no row waits
KEYED = "bench_seq_keyed"


def _round(name: str, steps: int, inflight: int, total: int) -> dict[str, Any]:
    if name == KEYED:
        keys = itertools.count()  # round-robin over the keys (next() is atomic under the GIL)
        return closed_loop(lambda: seq_job(KEYED, steps, f"k{next(keys) % KEYS}"), inflight, total)
    if name != OPEN:
        return closed_loop(lambda: seq_job(name, steps), inflight, total)
    harvest_client().set_limit("bench_step16", 1000)
    try:
        return closed_loop(lambda: seq_job("bench_seq16", steps), inflight, total)
    finally:
        harvest_client().set_limit("bench_step16", clear=True)


def concurrency(steps: int, inflight: int, total: int, repeats: int) -> dict[str, Any]:
    arms = ("bench_seq", "bench_seq16", OPEN, KEYED)
    rates: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(repeats):
        for name in arms[i % len(arms) :] + arms[: i % len(arms)]:  # rotated each round
            row = _round(name, steps, inflight, total)
            if "error" in row:
                return {"error": f"{name}: {row['error']}"}
            rates[name].append(total * steps / row["wall_s"])
    per_round = [ratio(a, b) for a, b in zip(rates["bench_seq16"], rates["bench_seq"], strict=True)]
    per_round_open = [ratio(a, b) for a, b in zip(rates[OPEN], rates["bench_seq"], strict=True)]
    per_round_keyed = [ratio(a, b) for a, b in zip(rates[KEYED], rates["bench_seq"], strict=True)]
    keyed_over_one = [ratio(a, b) for a, b in zip(rates[KEYED], rates["bench_seq16"], strict=True)]
    return {
        "inflight": inflight,
        "jobs": total,
        "unlimited_steps_per_s": statistics.median(rates["bench_seq"]),
        "limited_steps_per_s": statistics.median(rates["bench_seq16"]),
        "limited_over_unlimited": statistics.median(per_round),
        "repeats_limited_over_unlimited": spread(per_round),
        # the path without the wait: limited rows that never wait (override 1000)
        "open_steps_per_s": statistics.median(rates[OPEN]),
        "open_over_unlimited": statistics.median(per_round_open),
        "repeats_open_over_unlimited": spread(per_round_open),
        # limit_key over 4 keys at concurrency=4 each: the same 16 slots on 4 limit rows
        "keyed_keys": KEYS,
        "keyed_concurrency_per_key": 4,
        "keyed_steps_per_s": statistics.median(rates[KEYED]),
        "keyed_over_unlimited": statistics.median(per_round_keyed),
        "repeats_keyed_over_unlimited": spread(per_round_keyed),
        "keyed_over_one_key": statistics.median(keyed_over_one),
    }


def rate() -> dict[str, Any]:
    from harvest_celery._store.schema import activity_tasks

    harvest = harvest_client()
    t0 = time.perf_counter()
    runs = [harvest.start_workflow("bench_rate_call", i) for i in range(CALLS)]
    submitted = time.perf_counter() - t0
    for i, run_id in enumerate(runs):
        assert harvest.result(run_id, timeout=300) == i
    wall = time.perf_counter() - t0
    t = activity_tasks.c
    with harvest.store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.dispatched_at, t.started_at).where(t.execution_id.in_(runs)).order_by(t.dispatched_at)
        ).all()
    released = [r.dispatched_at.timestamp() for r in rows]
    started = sorted(r.started_at.timestamp() for r in rows)
    span = released[-1] - released[0]
    late = [max(0.0, b - a - 1.0 / RATE) for a, b in zip(released, released[1:], strict=False)]
    achieved = (len(released) - 1) / span if span > 0 else float("nan")
    return {
        "calls": CALLS,
        "configured_per_s": RATE,
        "submitted_s": submitted,
        "release_span_s": span,
        "achieved_per_s": achieved,
        "achieved_over_configured": achieved / RATE,
        "release_lateness_ms": {
            "median": statistics.median(late) * 1000,
            "p95": pct(late, 95) * 1000,
            "max": max(late) * 1000,
        },
        "first_start_to_last_start_s": started[-1] - started[0],
        "wall_s": wall,
        "nominal_s": (CALLS - 1) / RATE,
        "wall_over_nominal": wall / ((CALLS - 1) / RATE),
    }


def run(args: Any, _dbos: dict[str, Any]) -> dict[str, Any]:
    steps = args.steps
    total = max(args.min_jobs, 128)
    log(
        f"limits: concurrency=16, one key and {KEYS} keys, vs unlimited at 64 in flight ({total} workflows), "
        f"then {CALLS} at 20/s…"
    )
    with Cluster("pair", args.worker_concurrency, "limits"):
        seq_job("bench_seq", steps)  # warm-up
        seq_job("bench_seq16", steps)
        seq_job(KEYED, steps, "k0")
        out = {
            "topology": "2 processes, each every queue",
            "steps": steps,
            "concurrency": concurrency(steps, 64, total, args.repeats),
            "rate": rate(),
        }
    c, r = out["concurrency"], out["rate"]
    if "error" not in c:
        log(
            f"   concurrency=16: {c['limited_steps_per_s']:.0f} steps/s vs unlimited "
            f"{c['unlimited_steps_per_s']:.0f} ({c['limited_over_unlimited']:.2f}×); never waiting "
            f"{c['open_steps_per_s']:.0f} ({c['open_over_unlimited']:.2f}×); {KEYS} keys at "
            f"concurrency=4 each {c['keyed_steps_per_s']:.0f} ({c['keyed_over_unlimited']:.2f}×, "
            f"{c['keyed_over_one_key']:.2f}× the one key)"
        )
    log(
        f"   rate 20/s: achieved {r['achieved_per_s']:.2f}/s ({r['achieved_over_configured']:.3f}×), "
        f"lateness median {r['release_lateness_ms']['median']:.1f} ms p95 {r['release_lateness_ms']['p95']:.1f} ms, "
        f"{r['calls']} calls in {r['wall_s']:.2f} s (nominal {r['nominal_s']:.2f} s)"
    )
    return out
