"""B3 — does a step get dearer as the history grows? One run of N sequential steps (1,000 by
default) per topology; the cost of step k is the time from the previous step's
``ActivityCompleted`` (the first: from ``WorkflowStarted``) to its own ``ActivityCompleted``, from
the events' ``recorded_at`` stamps. Early = mean of the first 10 % of steps, late = mean of the
last 10 %; late/early ≈ 1 means flat.

Topologies: 1 and 2 decision workers beside one activity worker (the documented deployment), and
2 processes each consuming every queue (so completions, and the inline decisions they carry,
alternate between processes whose warm sessions go stale). DBOS: one workflow of N steps, each
``@DBOS.step()`` call timed.

The chain row: ``bench_loop``, ``--chain-iterations`` steps (20,000) that continue as new every
``CHAIN_EVENTS`` events (500: 166 steps a link), in the documented deployment. Its step costs run
across the links in order (a link's first step is timed from the previous link's last
``ActivityCompleted``, so the continuation is inside it); late/early ≈ 1 means a chain never
gets dearer, however long it runs."""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.common import TOPOLOGY_LABELS, Cluster, harvest_client, log, ratio

TOPOLOGIES = ("split", "split_2dec", "pair")
CHAIN_EVENTS = 500  # events per link: WorkflowStarted, 3 per step, WorkflowContinuedAsNew
PER_LINK = (CHAIN_EVENTS - 2) // 3


def step_costs(execution_id: str) -> list[float]:
    from harvest_celery._core import events as ev

    history = harvest_client().history(execution_id)
    marks = [h.recorded_at for h in history if isinstance(h.event, ev.WorkflowStarted | ev.ActivityCompleted)]
    return [(b - a).total_seconds() for a, b in zip(marks, marks[1:], strict=False)]


def early_late(costs_s: list[float]) -> dict[str, Any]:
    window = max(1, len(costs_s) // 10)
    early = statistics.fmean(costs_s[:window]) * 1000
    late = statistics.fmean(costs_s[-window:]) * 1000
    return {
        "steps": len(costs_s),
        "window": window,
        "early_mean_ms": early,
        "late_mean_ms": late,
        "late_over_early": ratio(late, early),
        "early_median_ms": statistics.median(costs_s[:window]) * 1000,
        "late_median_ms": statistics.median(costs_s[-window:]) * 1000,
        "series_ms": [round(c * 1000, 3) for c in costs_s],
    }


def topology(name: str, args: Any) -> dict[str, Any]:
    harvest = harvest_client()
    steps = args.history_steps
    with Cluster(name, args.worker_concurrency, f"b3-{name}"):
        warm = harvest.start_workflow("bench_seq", 5)
        assert harvest.result(warm, timeout=60) == 5
        t0 = time.perf_counter()
        execution_id = harvest.start_workflow("bench_seq", steps)
        result = harvest.result(execution_id, timeout=120 + steps * 0.5)
        wall = time.perf_counter() - t0
    assert result == steps, result
    costs = step_costs(execution_id)
    assert len(costs) == steps, (len(costs), steps)
    return {"label": TOPOLOGY_LABELS[name], "wall_s": wall, "execution_id": execution_id, **early_late(costs)}


def chain_costs(first: str) -> tuple[list[float], list[str]]:
    """Step costs along a continue-as-new chain, and its run ids in order."""
    from harvest_celery._core import events as ev

    harvest = harvest_client()
    ids, marks = [first], []
    while True:
        history = harvest.history(ids[-1])
        if not marks:
            marks.append(history[0].recorded_at)  # the first link's WorkflowStarted
        marks += [h.recorded_at for h in history if isinstance(h.event, ev.ActivityCompleted)]
        following = harvest.describe(ids[-1]).continued_to
        if following is None:
            return [(b - a).total_seconds() for a, b in zip(marks, marks[1:], strict=False)], ids
        ids.append(following)


def chain(args: Any) -> dict[str, Any]:
    harvest = harvest_client()
    steps = args.chain_iterations
    with Cluster("split", args.worker_concurrency, "b3-chain"):
        warm = harvest.start_workflow("bench_loop", {"x": 0, "to": 5, "per_link": 2})
        assert harvest.result(warm, timeout=60) == 5
        t0 = time.perf_counter()
        first = harvest.start_workflow("bench_loop", {"x": 0, "to": steps, "per_link": PER_LINK})
        result = harvest.result(first, timeout=120 + steps * 0.5)
        wall = time.perf_counter() - t0
    assert result == steps, result
    costs, ids = chain_costs(first)
    assert len(costs) == steps, (len(costs), steps)
    return {
        "label": f"{TOPOLOGY_LABELS['split']}, continue-as-new every {CHAIN_EVENTS} events",
        "wall_s": wall,
        "execution_id": first,
        "links": len(ids),
        "longest_history": max(harvest.describe(i).history_length for i in ids),
        **early_late(costs),
    }


def run(args: Any, dbos: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {"steps": args.history_steps, "topologies": {}}
    for name in TOPOLOGIES:
        log(f"B3 history length, {args.history_steps} steps, topology {name} ({TOPOLOGY_LABELS[name]})…")
        try:
            res["topologies"][name] = topology(name, args)
        except Exception as exc:  # noqa: BLE001 - reported; the other topologies still run
            res["topologies"][name] = {
                "label": TOPOLOGY_LABELS[name],
                "error": f"{type(exc).__name__}: {exc}",
            }
    log(
        f"B3 history length, a {args.chain_iterations}-step loop continuing as new every {CHAIN_EVENTS} events…"
    )
    try:
        res["chain"] = chain(args)
    except Exception as exc:  # noqa: BLE001 - reported beside the other rows
        res["chain"] = {"label": "continue-as-new chain", "error": f"{type(exc).__name__}: {exc}"}
    res["dbos"] = (
        dbos if "error" in dbos else {"wall_s": dbos["wall_s"], **early_late(dbos["step_latencies"])}
    )
    return res
