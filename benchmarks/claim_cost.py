"""What one claim transaction costs, alone (docs/performance.md, "Activity limits: the claim
a freed slot costs"): the CPU a claim takes in this process and in Postgres, through harvest's
own path (``Runtime.claim``'s ``tasks.claim`` in ``Store.transaction(one_statement=True)``:
``sql.CLAIM``, prepared after its second use, in autocommit, its commit included):

    flock /tmp/harvest-bench.lock python -m benchmarks.claim_cost [--claims 3000]

A fresh database (``harvest_claimcost``), migrated; ``--claims`` live runs, each with one
scheduled task row and its ``ActivityScheduled`` event; then every row is claimed once, one
after another from one thread. CPU is read from ``/proc`` for every Postgres process (so the
WAL writer and the checkpointer count; ``profile_limits.cpu_by_command``) and from ``time.process_time()`` for this one. Run it
on an otherwise idle machine, under the benchmark lock.

Why it exists: under a concurrency limit with rows waiting, a freed slot goes to the row that
has waited longest, another run's step. The issue's lock order says a release writes no
history into another run, so that step's ``ActivityStarted`` is written by a claim
transaction of its own, which an unlimited step (its next activity claimed inside its own
completion's write) never pays. This measures that transaction's price, to set beside an
unlimited step's CPU from ``benchmarks.profile_limits``. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import time

import sqlalchemy as sa

from benchmarks.common import PG_ADMIN_URL, fresh_database, log
from benchmarks.profile_limits import cpu_by_command

DB = "harvest_claimcost"


def _fill(conn: sa.Connection, n: int) -> None:
    scheduled = json.dumps(
        {"type": "ActivityScheduled", "activity_id": "1", "activity_name": "step", "input": 1}
    )
    conn.exec_driver_sql(
        f"""INSERT INTO harvest_executions (id, workflow_type, status, next_seq, created_at, updated_at)
        SELECT 'r' || i, 'wf', 'RUNNING', 2, now(), now() FROM generate_series(1, {n}) i"""
    )
    conn.exec_driver_sql(
        f"""INSERT INTO harvest_events (execution_id, seq, type, data, recorded_at)
        SELECT 'r' || i, 1, 'ActivityScheduled', CAST(%(d)s AS JSONB), now() FROM generate_series(1, {n}) i""",
        {"d": scheduled},
    )
    conn.exec_driver_sql(
        f"""INSERT INTO harvest_activity_tasks (execution_id, activity_id, activity_name, queue, status,
            attempt, event_seq, priority, compensation, dispatched_at)
        SELECT 'r' || i, '1', 'step', 'bench', 'scheduled', 1, 1, 0, false, now()
        FROM generate_series(1, {n}) i"""
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claims", type=int, default=3000)
    args = p.parse_args(argv)
    fresh_database(DB)
    from harvest_celery import Harvest
    from harvest_celery._runtime.runtime import worker_id
    from harvest_celery._store import tasks
    from harvest_celery._store.records import utcnow

    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{DB}"
    harvest = Harvest(url)
    harvest.migrate()
    store, timings = harvest.store, harvest.runtime.settings.timings
    with store.engine.begin() as conn:
        _fill(conn, args.claims)
        conn.exec_driver_sql("ANALYZE")
    me = worker_id()

    def claim(run: str) -> bool:
        found, _tx = store.transaction(
            lambda tx: tasks.claim(tx, run, "1", 1, me, utcnow(), timings), one_statement=True
        )
        return found is not None

    try:
        claim("r1")  # the pool's connection, and the statement seen once (prepared on its next use)
        runs = [f"r{i}" for i in range(2, args.claims + 1)]
        pg0, py0, wall0 = cpu_by_command()["postgres"], time.process_time(), time.perf_counter()
        taken = sum(claim(run) for run in runs)
        pg1, py1, wall1 = cpu_by_command()["postgres"], time.process_time(), time.perf_counter()
    finally:
        store.dispose()
    n = len(runs)
    log(f"{taken}/{n} claims, one after another, each its own transaction (commit included):")
    pg, py = 1000 * (pg1 - pg0) / n, 1000 * (py1 - py0) / n
    log(f"   CPU per claim: Postgres {pg:.3f} ms, this process {py:.3f} ms, in all {pg + py:.3f} ms")
    log(f"   wall per claim: {1000 * (wall1 - wall0) / n:.3f} ms")
    return 0 if taken == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
