"""Where a limited step's cost goes (docs/performance.md, "Activity limits"), per arm of the
limits scenario (``benchmarks/scenarios/limits.py``), on its pair of workers:

    flock /tmp/harvest-bench.lock python -m benchmarks.profile_limits --steps 20

For each arm (unlimited, ``concurrency=16`` with rows waiting, the same never waiting), one
round of 128 workflows at 64 in flight, then per step: every harvest counter that moved (paths,
fallbacks, warm and cold replays, eager runs), the CPU milliseconds of every process on the
machine grouped by command name (workers, Postgres backends, Redis, this client; run it under
the benchmark lock on an otherwise idle machine), and what Postgres was doing, from
``pg_stat_activity`` sampled every 5 ms (statement, literals blanked, and wait event). Nothing
here is a test and nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2
from prometheus_client import CollectorRegistry, multiprocess

from benchmarks.common import Cluster
from benchmarks.run import deployment_env, setup
from benchmarks.scenarios.limits import OPEN, _round, seq_job

TICK = os.sysconf("SC_CLK_TCK")
ARMS = ("bench_seq", "bench_seq16", OPEN)


def cpu_by_command() -> dict[str, float]:
    """CPU seconds (user + system) of every process, by command name (this one: ``client``)."""
    out: dict[str, float] = collections.defaultdict(float)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = "client" if int(pid) == os.getpid() else raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[name] += (int(fields[11]) + int(fields[12])) / TICK
    return out


def counters(metrics_dir: str) -> dict[str, float]:
    """Every counter sample the workers wrote (``PROMETHEUS_MULTIPROC_DIR``), pid label dropped."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=metrics_dir)
    out: dict[str, float] = collections.defaultdict(float)
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith(("_total", "_count")):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "pid")
                out[f"{s.name}{{{labels}}}"] += s.value
    return out


class Sampler(threading.Thread):
    """``pg_stat_activity``'s active backends of the bench database every 5 ms."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stop, self.samples = dsn, threading.Event(), 0
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not self.stop.is_set():
                cur.execute(
                    "SELECT query, coalesce(wait_event_type, '') || ':' || coalesce(wait_event, '') "
                    "FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
                    "AND pid <> pg_backend_pid()"
                )
                self.samples += 1
                for query, wait in cur.fetchall():
                    self.seen[(re.sub(r"'[^']*'", "?", " ".join(query.split()))[:90], wait)] += 1
                time.sleep(0.005)
        conn.close()


def arm(cluster: Cluster, name: str, steps: int, dsn: str) -> None:
    before, cpu_before, sampler = counters(cluster.metrics_dir), cpu_by_command(), Sampler(dsn)
    sampler.start()
    row = _round(name, steps, 64, 128)
    sampler.stop.set()
    sampler.join()
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_by_command().items()}
    after, n = counters(cluster.metrics_dir), 128 * steps
    print(f"== {name}: {n / row['wall_s']:.0f} steps/s ({row['wall_s']:.1f} s)")
    for key in sorted(after):
        if after[key] - before.get(key, 0.0):
            print(f"   {(after[key] - before.get(key, 0.0)) / n:8.3f}/step  {key}")
    busy = sorted(((v, k) for k, v in cpu.items() if v > 0.05), reverse=True)
    print("   CPU ms/step: " + ", ".join(f"{k} {v * 1000 / n:.2f}" for v, k in busy), end="")
    print(f"; total {sum(v for v, _ in busy) * 1000 / n:.2f}")
    print(f"   Postgres, active backends per sample ({sampler.samples} samples):")
    for (query, wait), count in sampler.seen.most_common(10):
        print(f"   {count / max(sampler.samples, 1):6.2f}  {wait:22s} {query}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_limits", description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    args: Any = p.parse_args(argv)
    deployment_env("threads", "redis")
    setup()
    dsn = "host=127.0.0.1 user=postgres dbname=harvest_bench"
    with Cluster("pair", 4, "limits-profile") as cluster:
        seq_job("bench_seq", args.steps)  # warm-up
        seq_job("bench_seq16", args.steps)
        for name in args.arms.split(","):
            arm(cluster, name, args.steps, dsn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
