"""B1 — sequential step latency, in two topologies, against raw Celery and DBOS; and the
per-step database and broker budget (probe counters, pg_stat_database cross-check)."""

from __future__ import annotations

import time
from typing import Any

from benchmarks import probes
from benchmarks.common import (
    REDIS_URL,
    TOPOLOGY_LABELS,
    Cluster,
    harvest_client,
    hit_rate,
    log,
    pg_database_stats,
    pg_statement_calls,
    ratio,
    spread,
    summary,
)

TOPOLOGIES = ("single", "split")  # without --topology; with it, B1 runs that one (as B2 does)


def harvest_run(steps: int) -> tuple[float, list[float], float, dict[str, list[float]]]:
    """One workflow: client wall seconds (start_workflow → result()), per-step intervals from
    the history, the server-side span WorkflowStarted → WorkflowCompleted, and the phases."""
    from harvest_celery._core import events as ev

    harvest = harvest_client()
    t0 = time.perf_counter()
    execution_id = harvest.start_workflow("bench_seq", steps)
    result = harvest.result(execution_id, timeout=max(60.0, steps * 2.0))
    wall = time.perf_counter() - t0
    assert result == steps, result
    history = harvest.history(execution_id)
    marks = [h.recorded_at for h in history if isinstance(h.event, ev.WorkflowStarted | ev.ActivityCompleted)]
    intervals = [(b - a).total_seconds() for a, b in zip(marks, marks[1:], strict=False)]
    span = (history[-1].recorded_at - history[0].recorded_at).total_seconds()
    return wall, intervals, span, phases(history)


def phases(history: list[Any]) -> dict[str, list[float]]:
    """Each step split at its events' ``recorded_at`` stamps (each phase holds one commit):
    decision = Completed (or Started) → Scheduled; dispatch_claim = Scheduled → Started;
    body_complete = Started → Completed."""
    from harvest_celery._core import events as ev

    out: dict[str, list[float]] = {"decision": [], "dispatch_claim": [], "body_complete": []}
    previous = scheduled = started = None
    for h in history:
        e = h.event
        if isinstance(e, ev.WorkflowStarted | ev.ActivityCompleted):
            if isinstance(e, ev.ActivityCompleted) and started is not None:
                out["body_complete"].append((h.recorded_at - started).total_seconds())
            previous = h.recorded_at
        elif isinstance(e, ev.ActivityScheduled) and previous is not None:
            scheduled = h.recorded_at
            out["decision"].append((scheduled - previous).total_seconds())
        elif isinstance(e, ev.ActivityStarted) and scheduled is not None:
            started = h.recorded_at
            out["dispatch_claim"].append((started - scheduled).total_seconds())
    return out


def raw_client_chain(steps: int) -> tuple[float, list[float]]:
    """``steps`` raw_step tasks, the client waiting on each result before sending the next."""
    from benchmarks.app import raw_step

    x, lat = 0, []
    t0 = time.perf_counter()
    for _ in range(steps):
        s = time.perf_counter()
        x = raw_step.apply_async((x,), queue="bench").get(timeout=30)
        lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    assert x == steps, x
    return wall, lat


def raw_celery_chain(steps: int) -> float:
    """One ``celery.chain`` of ``steps`` raw_step tasks (workers forward each result)."""
    from celery import chain

    from benchmarks.app import raw_step

    t0 = time.perf_counter()
    x = chain(raw_step.s(0), *(raw_step.s() for _ in range(steps - 1))).apply_async().get(timeout=60)
    wall = time.perf_counter() - t0
    assert x == steps, x
    return wall


def measure(steps: int, runs: int) -> dict[str, Any]:
    """Warm-up, then ``runs`` rounds of: one harvest run, one raw client-waited chain, one
    celery.chain (interleaved, so drift hits every system alike)."""
    harvest_run(steps)
    raw_client_chain(steps)
    raw_celery_chain(steps)
    walls, intervals, spans, raw_walls, raw_lat, chain_walls = [], [], [], [], [], []
    rounds: list[float] = []  # harvest ÷ raw client-waited chain, per interleaved round
    phase: dict[str, list[float]] = {"decision": [], "dispatch_claim": [], "body_complete": []}
    for _ in range(runs):
        wall, step_s, span, ph = harvest_run(steps)
        walls.append(wall)
        intervals.extend(step_s)
        spans.append(span)
        for key, values in ph.items():
            phase[key].extend(values)
        raw_wall, lat = raw_client_chain(steps)
        raw_walls.append(raw_wall)
        raw_lat.extend(lat)
        rounds.append(ratio(wall, raw_wall))
        chain_walls.append(raw_celery_chain(steps))
    return {
        "harvest": {
            "per_step": summary([w / steps for w in walls]),
            "step_interval": summary(intervals),
            "server_span_per_step": summary([s / steps for s in spans]),
            "phases": {k: summary(v) for k, v in phase.items()},
        },
        "raw_celery": {
            "client_waited": {"per_step": summary([w / steps for w in raw_walls]), "step": summary(raw_lat)},
            "celery_chain": {"per_step": summary([w / steps for w in chain_walls])},
        },
        "harvest_steps_total": (runs + 1) * steps,
        "rounds_harvest_over_raw_celery": spread(rounds),
    }


def redis_commands() -> int:
    import redis

    return int(redis.Redis.from_url(REDIS_URL).info("stats")["total_commands_processed"])


def budget(cluster: Cluster, steps: int, idle_s: float = 1.5) -> dict[str, Any]:
    """Per-step worker-side counts over one ``steps``-step run, minus the idle background (the
    sweeper, the workers' broker polling) measured over ``idle_s`` just before; the client's own
    counts per workflow. ``redis_commands`` is server-wide (the client's publish included)."""
    harvest = harvest_client()
    c0, r0 = cluster.counters(), redis_commands()
    t0 = time.monotonic()
    time.sleep(idle_s)
    c1, r1 = cluster.counters(), redis_commands()
    idle = time.monotonic() - t0
    local0 = probes.snapshot()["counters"]
    t1 = time.monotonic()
    execution_id = harvest.start_workflow("bench_seq", steps)
    assert harvest.result(execution_id, timeout=max(60.0, steps * 2.0)) == steps
    elapsed = time.monotonic() - t1
    c2, r2 = cluster.counters(), redis_commands()
    local = probes.diff(probes.snapshot()["counters"], local0)
    c0["redis_commands"], c1["redis_commands"], c2["redis_commands"] = r0, r1, r2
    background = {k: v / idle for k, v in probes.diff(c1, c0).items()}
    run_delta = probes.diff(c2, c1)
    per_step = {k: (run_delta[k] - background.get(k, 0.0) * elapsed) / steps for k in run_delta}
    return {
        "probe_steps": steps,
        "probe_wall_s": elapsed,
        "workers_per_step": per_step,
        "workers_background_per_s": background,
        "client_per_workflow": local,
    }


def topology(name: str, args: Any) -> dict[str, Any]:
    harvest = harvest_client()
    harvest.store.dispose()
    calls0, _ = pg_statement_calls()
    time.sleep(0.5)  # let the exiting backends flush their statistics
    pg0 = pg_database_stats()
    local0 = probes.snapshot()["counters"]
    with Cluster(name, args.worker_concurrency, f"b1-{name}") as cluster:
        out = measure(args.steps, args.runs)
        out["replays"] = hit_rate({}, cluster.replays())  # warm-up and timed runs
        out["budget"] = budget(cluster, args.budget_steps)
        workers_total = cluster.counters()
    harvest.store.dispose()
    time.sleep(0.5)  # let the exiting backends flush their statistics
    pg = probes.diff(pg_database_stats(), pg0)
    calls1, why = pg_statement_calls()
    local = probes.diff(probes.snapshot()["counters"], local0)
    steps_total = out.pop("harvest_steps_total") + args.budget_steps
    counted = workers_total.get("pg_transactions", 0) + local.get("pg_transactions", 0)
    hidden = (pg.get("xact_commit", 0) - counted) / steps_total
    out["pg_stat_database"] = {
        "segment_steps": steps_total,
        "delta": pg,
        "xact_commit_per_step": pg.get("xact_commit", 0) / steps_total,
        "rows_written_per_step": sum(pg.get(k, 0) for k in ("tup_inserted", "tup_updated", "tup_deleted"))
        / steps_total,
        "wal_bytes_per_step": pg.get("wal_bytes", 0) / steps_total,
        "wal_syncs_per_step": pg.get("wal_sync", 0) / steps_total,
        "probe_counted_pg_transactions": counted,
        "uncounted_transactions_per_step": hidden,
        "note": "whole segment: worker start-up, warm-up, every run, the probe, client start "
        "commits and the sweeper; wal_* are cluster-wide. probe_counted_pg_transactions: the same segment as "
        "the SQLAlchemy probes count it (workers + client); the difference is what the "
        "driver sends on its own (e.g. psycopg2's SET when a pooled connection is "
        "switched to AUTOCOMMIT), spread over the segment's steps",
    }
    out["pg_stat_statements"] = (
        {
            "calls_per_step": (calls1 - calls0) / steps_total,
            "note": "whole segment, every statement "
            "(BEGIN/COMMIT included if track_utility) of workers, client and the harness's own reads",
        }
        if calls0 is not None and calls1 is not None
        else {"unavailable": why}
    )
    per_step = out["budget"]["workers_per_step"]
    out["budget"]["postgres_view_per_step"] = {
        "pg_transactions": per_step["pg_transactions"] + hidden,
        "round_trips": per_step["round_trips"] + hidden,
    }
    out["label"] = TOPOLOGY_LABELS[name]
    return out


def run(args: Any, dbos: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {"steps": args.steps, "runs": args.runs, "topologies": {}}
    res["pool"], res["broker"] = args.pool, args.broker
    for name in (args.b2_topology,) if args.topology is not None else TOPOLOGIES:
        log(f"B1 sequential, topology {name} ({TOPOLOGY_LABELS[name]})…")
        res["topologies"][name] = topology(name, args)
    res["dbos"] = dbos_summary(dbos, args.steps)
    dbos_ms = res["dbos"].get("per_step", {}).get("median_ms")
    for t in res["topologies"].values():
        h = t["harvest"]["per_step"]["median_ms"]
        span = t["harvest"]["server_span_per_step"]["median_ms"]
        raw = t["raw_celery"]["client_waited"]["per_step"]["median_ms"]
        t["ratios"] = {
            "harvest_over_raw_celery": ratio(h, raw),
            # the median of per-round ratios, with its spread: the criterion figure
            "rounds_harvest_over_raw_celery": t.pop("rounds_harvest_over_raw_celery"),
            "harvest_span_over_raw_celery": ratio(span, raw),
            "harvest_over_raw_chain": ratio(h, t["raw_celery"]["celery_chain"]["per_step"]["median_ms"]),
            "harvest_over_dbos": ratio(h, dbos_ms),
        }
    return res


def dbos_summary(dbos: dict[str, Any], steps: int) -> dict[str, Any]:
    if "error" in dbos:
        return dbos
    return {
        "per_step": summary([w / steps for w in dbos["walls"]]),
        "step_call": summary(dbos["step_latencies"]),
    }
