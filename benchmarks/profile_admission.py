"""What a run of a limited workflow costs over the same run unlimited, statement by statement
(docs/performance.md, "Workflow admission"): ``bench_adm`` (one key, never full) against
``bench_seq``, ``--runs`` runs each, one at a time on B2's pair of workers, so nothing waits.
Prints per run: transactions, statements and the statements that differ, for the workers and
the client. Take the benchmark lock (it recreates ``harvest_bench``)::

    flock /tmp/harvest-bench.lock python -m benchmarks.profile_admission --runs 20

Nothing here is a test: there are no timed assertions."""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from typing import Any

os.environ["HARVEST_BENCH_STATEMENTS"] = "1"  # before benchmarks.probes is imported

from benchmarks import probes  # noqa: E402
from benchmarks.common import Cluster, harvest_client  # noqa: E402
from benchmarks.run import setup  # noqa: E402


def _cpu_ms(pid: int) -> float:
    """A process's user + system CPU time so far (Linux ``/proc``), in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _texts(cluster: Cluster) -> tuple[Counter[str], dict[str, float]]:
    texts: Counter[str] = Counter(probes.snapshot().get("statements", {}))
    counts: Counter[str] = Counter(probes.snapshot()["counters"])
    for stats in cluster.stats().values():
        texts.update(stats.get("statements", {}))
        counts.update(stats["counters"])
    out: dict[str, float] = dict(counts)
    out["client_cpu_ms"] = _cpu_ms(os.getpid())
    out["workers_cpu_ms"] = sum(_cpu_ms(w.proc.pid) for w in cluster.workers if w.proc is not None)
    out["wal_bytes"] = _wal_position()
    return texts, out


def _wal_position() -> float:
    """The server's WAL insert position in bytes (cluster-wide: other databases' writes count)."""
    import sqlalchemy as sa

    with harvest_client().store.engine.connect() as conn:
        return float(conn.execute(sa.text("SELECT pg_current_wal_insert_lsn() - '0/0'")).scalar_one())


def measure(cluster: Cluster, workflow: str, steps: int, runs: int) -> tuple[Counter[str], dict[str, float]]:
    harvest = harvest_client()
    t0, c0 = _texts(cluster)
    started = time.monotonic()
    for i in range(runs):
        data: Any = {"n": steps, "key": "k0"} if workflow == "bench_adm" else steps
        run_id = harvest.start_workflow(workflow, data, f"prof-{workflow}-{i}-{time.time_ns()}")
        assert harvest.result(run_id, timeout=120) == steps
    wall = time.monotonic() - started
    t1, c1 = _texts(cluster)
    texts = Counter({k: v - t0.get(k, 0) for k, v in t1.items() if v - t0.get(k, 0)})
    per_run = {k: (v - c0.get(k, 0)) / runs for k, v in c1.items()}
    per_run["wall_ms"] = wall * 1000 / runs
    return texts, per_run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    setup()
    with Cluster("pair", 4, "admprof") as cluster:
        for name in ("bench_seq", "bench_adm"):  # warm-up
            measure(cluster, name, args.steps, 2)
        seq_texts, seq = measure(cluster, "bench_seq", args.steps, args.runs)
        adm_texts, adm = measure(cluster, "bench_adm", args.steps, args.runs)
    keys = (
        "wall_ms",
        "workers_cpu_ms",
        "client_cpu_ms",
        "wal_bytes",
        "statements",
        "commits",
        "autocommit_statements",
        "pg_transactions",
        "published",
    )
    print(f"{'per run':28} {'unlimited':>10} {'limited':>10}")
    for k in keys:
        print(f"{k:28} {seq.get(k, 0):10.1f} {adm.get(k, 0):10.1f}")
    print("\nstatements per run, limited minus unlimited (|difference| >= 0.5):")
    for text in sorted(set(seq_texts) | set(adm_texts)):
        d = (adm_texts.get(text, 0) - seq_texts.get(text, 0)) / args.runs
        if abs(d) >= 0.5:
            print(f"{d:+6.1f}  {adm_texts.get(text, 0) / args.runs:5.1f}  {text}")


if __name__ == "__main__":
    main()
