"""What a release costs behind a backlog (docs/flow-control.md, "What a limit costs"): the
statement every settle, hand-off and waker runs to take the next waiting row of a limit and key
(compensations first, then priority, then FIFO; ``FOR UPDATE SKIP LOCKED``), timed in Postgres
with N rows waiting for one key, through the wait-order index (migration 0020) and through the
index it replaced ((name, digest, status), the key's whole backlog read and sorted), side by
side in one run:

    python -m benchmarks.backlog [--sizes 100,1000,10000,20000] [--repeats 200]

A fresh database (``harvest_backlog``), migrated; one limit key with N waiting rows plus 50,000
completed rows of the same limit (its history), ANALYZEd. Each timing is the median
``EXPLAIN (ANALYZE)`` execution time of the select, inside a transaction rolled back after
each. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import re
import statistics
from typing import Any

import sqlalchemy as sa

from benchmarks.common import PG_ADMIN_URL, fresh_database, log

DB = "harvest_backlog"
NEXT = """SELECT execution_id, activity_id FROM harvest_activity_tasks
WHERE activity_name = 'charge' AND limit_digest = 'd' AND status = 'waiting'
ORDER BY compensation DESC, priority DESC, wait_seq LIMIT 1 FOR UPDATE SKIP LOCKED"""
OLD_INDEX = "CREATE INDEX ix_harvest_activity_tasks_waiting ON harvest_activity_tasks (activity_name, limit_digest, status)"
NEW_INDEX = "ix_harvest_activity_tasks_wait_order"
HISTORY = 50_000


def _fill(conn: Any, first: int, last: int, status: str) -> None:
    conn.exec_driver_sql(
        f"""INSERT INTO harvest_executions (id, workflow_type, status, next_seq, created_at, updated_at)
        SELECT '{status[0]}' || i, 'wf', 'RUNNING', 1, now(), now() FROM generate_series({first}, {last}) i"""
    )
    conn.exec_driver_sql(
        f"""INSERT INTO harvest_activity_tasks (execution_id, activity_id, activity_name, queue, status,
            attempt, event_seq, priority, limit_digest, wait_seq, compensation)
        SELECT '{status[0]}' || i, '1', 'charge', 'q', '{status}', 1, 1, 0, 'd', i, false
        FROM generate_series({first}, {last}) i"""
    )


def _release_ms(conn: Any, repeats: int) -> tuple[float, str]:
    """Inside the caller's transaction: each try in a savepoint rolled back (its row lock gone)."""
    times, plan = [], ""
    for _ in range(repeats):
        with conn.begin_nested() as tried:
            rows = [r[0] for r in conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF) {NEXT}").all()]
            tried.rollback()
        times.append(float(re.search(r"Execution Time: ([\d.]+)", rows[-1]).group(1)))  # type: ignore[union-attr]
        plan = next((m.group(1) for r in rows if (m := re.search(r"Scan (?:using|on) (\w+)", r))), "")
    return statistics.median(times), plan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100,1000,10000,20000", help="waiting rows, comma-separated")
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    fresh_database(DB)
    from harvest_celery import Harvest

    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{DB}"
    Harvest(url).migrate()
    engine = sa.create_engine(url)
    log(f"release of the next waiting row, median of {args.repeats} (ms), {HISTORY:,} completed rows beside")
    log(f"{'waiting':>8} {'wait-order index':>17} {'(name, digest, status)':>23}  ratio")
    try:
        with engine.connect() as conn:
            with conn.begin():
                _fill(conn, 1, HISTORY, "completed")
            have = 0
            for n in sizes:
                with conn.begin():
                    _fill(conn, have + 1, n, "waiting")
                    have = n
                    conn.exec_driver_sql("ANALYZE harvest_activity_tasks")
                with conn.begin():
                    new, new_plan = _release_ms(conn, args.repeats)
                with conn.begin() as swapped:  # the old index in place of the new, then undone
                    conn.exec_driver_sql(OLD_INDEX)
                    conn.exec_driver_sql(f"DROP INDEX {NEW_INDEX}")
                    old, old_plan = _release_ms(conn, args.repeats)
                    swapped.rollback()
                log(
                    f"{n:>8} {new:>17.3f} {old:>23.3f}  {old / new:5.0f}×  (read through {new_plan} | {old_plan})"
                )
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
