"""The servers under the workers: a Redis restart with messages in flight, a Postgres restart,
a Postgres outage, and a completion whose commit is lost to a Postgres restart."""

from __future__ import annotations

import os
import time

import pytest

from .harness import FULL, RUNS

pytestmark = pytest.mark.faults

# CI shortens the outage (HARVEST_FAULTS_OUTAGE seconds); the full run holds it 20 s. Either
# way it outlasts the CI lease (3 s + 5 s), so a body's outcome is retried past its lease.
OUTAGE = float(os.environ.get("HARVEST_FAULTS_OUTAGE", "20" if FULL else "10"))
LOST_COMMIT_DOWN = float(os.environ.get("HARVEST_FAULTS_LOST_COMMIT_DOWN", "3"))
REDIS_RESTARTS = int(os.environ.get("HARVEST_FAULTS_REDIS_RESTARTS", "3"))


def test_redis_restart_with_messages_in_flight(faults):
    """Half the runs hang mid-body (their messages unacked in the activity worker, which has no
    free thread), the other half have messages waiting in Redis; Redis is shut down without
    saving — every message is gone — and started again, several times. The workers must
    reconnect (no exit), and the sweeper re-sends what was lost."""
    recoveries = []
    for _ in range(REDIS_RESTARTS):
        runs = faults.start(n=2 * RUNS, plan="mid@2", plan_on=RUNS)
        faults.wait_hung(runs[:RUNS])
        time.sleep(0.5)  # the rest are dispatched and waiting in Redis
        faults.servers.redis.restart(down_for=1.0)
        t0 = time.monotonic()
        faults.release(runs[:RUNS])
        time.sleep(3)
        dead = [w.name for w in faults.workers.values() if not w.alive()]
        assert not dead, f"workers exited on a Redis restart: {dead}"
        recoveries.append(faults.wait_finished(runs, since=t0))
    recovery = None if None in recoveries else max(recoveries)  # type: ignore[type-var]
    faults.assert_clean(f"Redis restarted x{REDIS_RESTARTS} with messages in flight", recovery)


def test_postgres_restart(faults):
    """Postgres crashes (immediate stop: every connection cut mid-transaction) and comes back
    at once, while some bodies run and the rest of the runs move."""
    runs = faults.start(n=2 * RUNS, plan="mid@2", plan_on=RUNS)
    faults.wait_hung(runs[:RUNS])
    faults.servers.pg.restart()
    t0 = time.monotonic()
    faults.release(runs[:RUNS])
    faults.assert_clean("Postgres restart (crash)", faults.wait_finished(since=t0))


def test_postgres_outage(faults):
    """Postgres is down for OUTAGE seconds; the bodies that were running finish during the
    outage, so their outcomes wait for the database (retried past their lease)."""
    runs = faults.start(n=2 * RUNS, plan="mid@2", plan_on=RUNS)
    faults.wait_hung(runs[:RUNS])
    faults.servers.pg.stop()
    faults.release(runs[:RUNS])
    time.sleep(OUTAGE)
    faults.servers.pg.start()
    t0 = time.monotonic()
    faults.assert_clean(f"Postgres outage of {OUTAGE:.0f} s", faults.wait_finished(since=t0))


def test_a_completion_whose_commit_is_lost(faults):
    """Step 3 (no retries: ``max_attempts=1``) completes; Postgres goes down while its
    completion's transaction is open and stays down for LOST_COMMIT_DOWN seconds, so the
    completion and its fallback (the completion alone) both fail. The outcome must be retried
    and recorded — not left to the lease as a StartToCloseTimeout that fails the step with its
    effect done and never compensated (issue 14, item 3)."""
    runs = faults.start(plan="commit@3", once=True)
    faults.wait_hung(runs)
    faults.servers.pg.stop()
    faults.release(runs)
    time.sleep(LOST_COMMIT_DOWN)
    faults.servers.pg.start()
    t0 = time.monotonic()
    faults.assert_clean("completion commit lost to a Postgres outage", faults.wait_finished(since=t0))
    for run in runs:
        results = [
            (t, d.get("attempt"))
            for t, d in faults.history(run)
            if t in ("ActivityCompleted", "ActivityFailed") and d.get("activity_id") == "3"
        ]
        assert results == [("ActivityCompleted", 1)], (run, results)
