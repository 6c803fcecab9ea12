"""What every scenario shares: the services, the worker subprocesses, statistics and probes.

Same Postgres (127.0.0.1:5432, databases ``harvest_bench`` and ``dbos_bench``, both recreated
each run) and the same Redis (127.0.0.1:6379, DB 7, flushed each run) for every system.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PG_ADMIN_URL = os.environ.get(
    "HARVEST_BENCH_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)
HARVEST_DB = "harvest_bench"
DBOS_DB = "dbos_bench"
DBOS_URL = f"postgresql://postgres@127.0.0.1:5432/{DBOS_DB}"
REDIS_URL = "redis://127.0.0.1:6379/7"
ALL_QUEUES = "harvest,default,bench"
DECISION_QUEUES = "harvest"
ACTIVITY_QUEUES = "default,bench"

# Topologies: (role, queues) per worker process. "split" is the documented deployment.
TOPOLOGIES: dict[str, list[tuple[str, str]]] = {
    "single": [("all", ALL_QUEUES)],
    "split": [("decision", DECISION_QUEUES), ("activity", ACTIVITY_QUEUES)],
    "split_2dec": [
        ("decision", DECISION_QUEUES),
        ("decision", DECISION_QUEUES),
        ("activity", ACTIVITY_QUEUES),
    ],
    "pair": [("all", ALL_QUEUES), ("all", ALL_QUEUES)],
}
TOPOLOGY_LABELS = {
    "single": "1 process, every queue",
    "split": "decision (-Q harvest) + activity (-Q default,bench)",
    "split_2dec": "2 decision (-Q harvest) + 1 activity (-Q default,bench)",
    "pair": "2 processes, each every queue",
}


def split_topology(decision: int, activity: int) -> str:
    """The split deployment with ``decision`` decision and ``activity`` activity worker
    processes (``--decision-procs``/``--activity-procs``): its name, registered on first use."""
    if (decision, activity) == (1, 1):
        return "split"
    name = f"split_{decision}d{activity}a"
    TOPOLOGIES.setdefault(
        name, [("decision", DECISION_QUEUES)] * decision + [("activity", ACTIVITY_QUEUES)] * activity
    )
    TOPOLOGY_LABELS.setdefault(
        name, f"{decision} decision (-Q harvest) + {activity} activity (-Q default,bench)"
    )
    return name


# ── statistics ───────────────────────────────────────────────────────────────────────────────
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> float:
    return seconds * 1000.0


def summary(values_s: list[float]) -> dict[str, float]:
    """Median / p95 / min / max / mean of a list of seconds, in milliseconds."""
    if not values_s:
        return {"n": 0}
    return {
        "n": len(values_s),
        "median_ms": ms(statistics.median(values_s)),
        "p95_ms": ms(pct(values_s, 95)),
        "min_ms": ms(min(values_s)),
        "max_ms": ms(max(values_s)),
        "mean_ms": ms(statistics.fmean(values_s)),
    }


def ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or b == 0 or (isinstance(a, float) and math.isnan(a)):
        return float("nan")
    return a / b


def spread(ratios: list[float]) -> dict[str, float]:
    """Median and min–max of per-repeat ratios (each repeat interleaves the systems compared)."""
    values = [r for r in ratios if not math.isnan(r)]
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_call(fn: Callable[[], Any], min_time: float = 0.3, repeats: int = 5) -> float:
    """Seconds per call of ``fn``: the median over ``repeats`` batches, each >= ``min_time``."""
    fn()
    number, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time / repeats:
            break
        number *= 2
    samples = [elapsed / number]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def log(message: str) -> None:
    print(message, flush=True)


# ── services ─────────────────────────────────────────────────────────────────────────────────
def fresh_database(name: str) -> None:
    import sqlalchemy as sa

    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": name}
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()


def pg_database_stats(name: str = HARVEST_DB) -> dict[str, int]:
    """``pg_stat_database`` counters of one database (read from the ``postgres`` database, so
    the read is not counted in them), and the cluster-wide ``pg_stat_wal`` counters (``wal_*``;
    other databases' writes land in those too). A backend flushes its counters when it exits,
    or when idle at most every ~10 s (Postgres 15), so read these once the backends are gone."""
    import sqlalchemy as sa

    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            row = dict(
                conn.execute(
                    sa.text(
                        "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
                        "FROM pg_stat_database WHERE datname = :d"
                    ),
                    {"d": name},
                )
                .mappings()
                .first()
                or {}
            )
            try:
                row.update(
                    conn.execute(sa.text("SELECT wal_records, wal_bytes, wal_sync FROM pg_stat_wal"))
                    .mappings()
                    .first()
                    or {}
                )
            except sa.exc.DBAPIError:  # pg_stat_wal is Postgres 14+
                pass
    finally:
        admin.dispose()
    return {k: int(v) for k, v in row.items()}


def pg_statement_calls(name: str = HARVEST_DB) -> tuple[int | None, str]:
    """Total ``pg_stat_statements`` calls in one database (BEGIN/COMMIT included when
    ``track_utility`` is on), or None and why not: the extension needs
    ``shared_preload_libraries``, which the harness never changes."""
    import sqlalchemy as sa

    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            calls = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                )
            ).scalar()
        return int(calls or 0), "ok"
    except Exception as exc:  # noqa: BLE001 - optional: reported, skipped
        return None, str(exc).splitlines()[0][:200]
    finally:
        engine.dispose()


def harvest_client() -> Any:
    from benchmarks.app import harvest

    return harvest


class Worker:
    """One Celery worker subprocess running benchmarks.app (threads pool unless ``--pool
    prefork``). ``-P threads``: the worker is this one process (no pool children), so
    ``proc.pid`` is the process to measure (the memory scenario assumes it)."""

    def __init__(self, queues: str, concurrency: int, log: Path, metrics_dir: str | None = None) -> None:
        self.queues, self.concurrency, self.log = queues, concurrency, log
        self.metrics_dir = metrics_dir
        self.node = f"bench-{uuid.uuid4().hex[:6]}@{os.uname().nodename}"
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        if self.metrics_dir:  # every process (prefork children too) writes its counters there
            env["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchmarks.app",
            "worker",
            "-Q",
            self.queues,
            "-n",
            self.node,
            "-P",
            os.environ.get("HARVEST_BENCH_POOL", "threads"),  # --pool
            "-c",
            str(self.concurrency),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
        ]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout: float = 60) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"benchmark worker exited at start: see {self.log}")
            if " ready." in self.log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"benchmark worker not ready after {timeout}s: see {self.log}")

    def start(self, timeout: float = 60) -> None:
        self.launch()
        self.wait_ready(timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


class Cluster:
    """The worker processes of one topology, started together and stopped together (use it as
    a context manager). Logs: ``benchmarks/results/worker-<tag>-<role><i>.log``. Every worker
    process, prefork children included, writes its Prometheus samples to one fresh
    ``PROMETHEUS_MULTIPROC_DIR`` of the cluster's, which ``replays`` reads."""

    def __init__(self, topology: str, concurrency: int, tag: str) -> None:
        self.topology = topology
        self.roles = [role for role, _ in TOPOLOGIES[topology]]
        self.metrics_dir = tempfile.mkdtemp(prefix=f"harvest-bench-metrics-{tag}-")
        self.workers = [
            Worker(queues, concurrency, RESULTS / f"worker-{tag}-{role}{i}.log", self.metrics_dir)
            for i, (role, queues) in enumerate(TOPOLOGIES[topology])
        ]

    def __enter__(self) -> Cluster:
        try:
            for w in self.workers:
                w.launch()
            for w in self.workers:
                w.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def replays(self) -> dict[str, float]:
        """``harvest_decision_replays_total`` by ``replay`` (warm, cold), summed over every
        worker process of the cluster and every prefork child, alive or exited."""
        return read_replays(self.metrics_dir)

    def by_role(self, role: str) -> list[Worker]:
        return [w for w, r in zip(self.workers, self.roles, strict=True) if r == role]

    def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """``bench_stats`` of every worker, by node name (remote control, one reply each)."""
        from benchmarks.app import app

        replies = app.control.broadcast(
            "bench_stats",
            reply=True,
            timeout=timeout,
            destination=[w.node for w in self.workers],
            limit=len(self.workers),
        )
        merged: dict[str, dict[str, Any]] = {}
        for reply in replies or []:
            merged.update(reply)
        missing = [w.node for w in self.workers if w.node not in merged]
        if missing:
            raise RuntimeError(f"no bench_stats reply from {missing}")
        return merged

    def counters(self) -> dict[str, int]:
        """The probe counters summed over the cluster's workers."""
        total: dict[str, int] = {}
        for stats in self.stats().values():
            for key, value in stats["counters"].items():
                total[key] = total.get(key, 0) + value
        return total


def read_replays(metrics_dir: str) -> dict[str, float]:
    """The replay counter's samples in one ``PROMETHEUS_MULTIPROC_DIR`` (read from its files,
    as the workers' own exposition aggregates them)."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=metrics_dir)
    out = {"warm": 0.0, "cold": 0.0}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "harvest_decision_replays_total":
                replay = sample.labels.get("replay", "")
                out[replay] = out.get(replay, 0.0) + sample.value
    return out


def hit_rate(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Warm and cold replays between two readings, and ``warm / (warm + cold)``."""
    warm = after.get("warm", 0.0) - before.get("warm", 0.0)
    cold = after.get("cold", 0.0) - before.get("cold", 0.0)
    return {"warm": warm, "cold": cold, "hit_rate": warm / (warm + cold) if warm + cold else float("nan")}


# ── closed-loop load: C client threads, each running jobs back to back ───────────────────────
def closed_loop(job: Callable[[], Any], inflight: int, total: int) -> dict[str, Any]:
    """Run ``total`` jobs with ``inflight`` client threads; wall seconds, or the first error."""
    counter = iter(range(total))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop() -> None:
        while not errors:
            with lock:
                if next(counter, None) is None:
                    return
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - reported after the threads join
                errors.append(exc)
                return

    threads = [threading.Thread(target=loop) for _ in range(inflight)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        return {"error": f"{type(errors[0]).__name__}: {errors[0]}"}
    return {"inflight": inflight, "jobs": total, "wall_s": wall}


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
