"""Memory — the RSS of the decision worker holding N warm runs (1,000 by default; the runtime
keeps at most ``Settings.max_sessions`` = 1,000 warm sessions per process).

Documented deployment. N ``bench_wait`` workflows are started; each is decided once by the
decision worker and then waits for the signal ``go``, its replay kept warm in that process. The
worker's VmRSS and VmHWM (peak) come from ``/proc/<pid>/status`` through the ``bench_stats``
remote-control command (``-P threads``: the worker is one process, no pool children), before
and after; the runs are left waiting (the database is dropped at the next run)."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import TOPOLOGY_LABELS, Cluster, harvest_client, log

TOPOLOGY = "split"


def wait_warm(cluster: Cluster, node: str, base: dict[str, Any], n: int, timeout: float) -> dict[str, Any]:
    """Poll the decision worker until it holds ``n`` more warm sessions (or, if the runtime does
    not expose them, ran ``n`` more tasks), then a moment more for stragglers."""
    deadline = time.monotonic() + timeout
    while True:
        stats = cluster.stats()[node]
        sessions = stats.get("warm_sessions")
        if sessions is not None:
            done = sessions - (base.get("warm_sessions") or 0) >= n
        else:
            done = stats["counters"]["tasks_run"] - base["counters"]["tasks_run"] >= n
        if done:
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"decision worker not warm with {n} runs after {timeout}s: "
                f"warm_sessions={sessions}, tasks_run={stats['counters']['tasks_run']}"
            )
        time.sleep(0.5)


def run(args: Any, _dbos: dict[str, Any]) -> dict[str, Any]:
    n = args.memory_runs
    harvest = harvest_client()
    log(f"memory: {n} warm runs on the decision worker, {TOPOLOGY_LABELS[TOPOLOGY]}…")
    with Cluster(TOPOLOGY, args.worker_concurrency, "mem") as cluster:
        node = cluster.by_role("decision")[0].node
        warm = harvest.start_workflow("bench_wait")  # warm-up: one wait, signalled, finished
        harvest.signal(warm, "go", 1)
        assert harvest.result(warm, timeout=60) == 1
        before = cluster.stats()[node]
        t0 = time.perf_counter()
        for _ in range(n):
            harvest.start_workflow("bench_wait")
        started_s = time.perf_counter() - t0
        after = wait_warm(cluster, node, before, n, 60 + n * 0.2)
        warm_s = time.perf_counter() - t0
    rss0, rss1 = before.get("vmrss_kib"), after.get("vmrss_kib")
    per_run = (rss1 - rss0) / n if rss0 is not None and rss1 is not None else None
    return {
        "runs": n,
        "topology": TOPOLOGY_LABELS[TOPOLOGY],
        "pid": after["pid"],
        "before": {k: before.get(k) for k in ("vmrss_kib", "vmhwm_kib", "warm_sessions")},
        "after": {k: after.get(k) for k in ("vmrss_kib", "vmhwm_kib", "warm_sessions")},
        "rss_growth_kib_per_run": per_run,
        "start_s": started_s,
        "all_warm_s": warm_s,
    }
