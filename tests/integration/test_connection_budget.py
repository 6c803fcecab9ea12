"""Running out of connections degrades to slower, never to a stall: two real workers log in as a
role the fixture creates (and drops) with a ``CONNECTION LIMIT`` below what their pools would
open. A burst of runs all complete, each step recorded and run once, and no worker process ever
held more connections than its pool settings allow (sampled from ``pg_stat_activity``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from .conftest import ADMIN_URL, DATABASE_URL, METRICS_PORTS, SUITE_POOLS, WORKER_QUEUES, Worker
from .conftest import effects as recorded

pytestmark = pytest.mark.integration

ROLE = f"harvest_budget_s{os.environ.get('HARVEST_TEST_SLOT') or '0'}"


def refused(workers: list[Worker], since: list[int]) -> int:
    """How often the workers' pools said they waited for a slot (at most once a minute each),
    in what they logged since ``since`` (the files outlive sessions)."""
    return sum(
        w.log.read_bytes()[start:].decode(errors="replace").count("has no connection slot left")
        for w, start in zip(workers, since, strict=True)
    )


# below the 2 x (4 + 3 + 1) = 16 the two workers' pools would open; at least what they keep idle
# (2 + 1 + the listener each), or a process that needs one more waits for its peer's idle ones
LIMIT = 7
PER_PROCESS = sum(int(v) for v in SUITE_POOLS.values()) + 1  # its two pools and its listener
RUNS = 32


@pytest.fixture(scope="module")
def role(harvest: Any) -> Iterator[str]:
    admin = sa.create_engine(DATABASE_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP ROLE IF EXISTS {ROLE}")
        conn.exec_driver_sql(f"CREATE ROLE {ROLE} LOGIN CONNECTION LIMIT {LIMIT}")
        conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA public TO {ROLE}")
        conn.exec_driver_sql(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {ROLE}")
        conn.exec_driver_sql(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {ROLE}")
    try:
        yield ROLE
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{ROLE}'"
            )
            conn.exec_driver_sql(f"DROP OWNED BY {ROLE}")
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {ROLE}")
        admin.dispose()


class Sampler:
    """The role's connections per worker (``application_name``), sampled every 50 ms."""

    def __init__(self) -> None:
        self.engine = sa.create_engine(ADMIN_URL, poolclass=sa.pool.NullPool)
        self.peaks: dict[str, int] = {}
        self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = sa.text(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE usename = :role GROUP BY 1"
        )
        with self.engine.connect() as conn:
            while not self._stop.wait(0.05):
                rows = conn.execute(query, {"role": ROLE}).all()
                conn.rollback()
                for name, count in rows:
                    self.peaks[name] = max(self.peaks.get(name, 0), int(count))
                self.total = max(self.total, sum(int(c) for _, c in rows))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.engine.dispose()


def test_a_burst_completes_inside_a_connection_limit(harvest, role, redis_client, tag):
    url = DATABASE_URL.replace("postgres@", f"{role}@")
    started = [
        Worker(
            f"budget-{name}",
            queues,
            {
                "HARVEST_TEST_DATABASE_URL": f"{url}?application_name=budget-{name}",
                "HARVEST_METRICS_PORT": str(METRICS_PORTS[name]),
            },
            extra_args=["-c", "8"],  # 8 threads each: more than the limit lets them connect
        )
        for name, queues in WORKER_QUEUES.items()
    ]
    since = [w.log.stat().st_size if w.log.exists() else 0 for w in started]
    with Sampler() as sampler:
        try:
            for worker in started:
                worker.start()
            runs = [
                harvest.start_workflow("three_steps", {"tag": f"{tag}-{i}"}, execution_id=f"budget-{tag}-{i}")
                for i in range(RUNS)
            ]
            results = [harvest.result(run_id, timeout=120) for run_id in runs]
        finally:
            for worker in started:
                worker.stop()
    assert results == [f"done:{tag}-{i}" for i in range(RUNS)]
    for i, run_id in enumerate(runs):
        kinds = [h.describe() for h in harvest.history(run_id)]
        assert kinds.count("WorkflowCompleted") == 1
        assert [k for k in kinds if k.startswith("ActivityCompleted")] == [
            "ActivityCompleted(1)",
            "ActivityCompleted(2)",
            "ActivityCompleted(3)",
        ]
        ran = [e["name"] for e in recorded(redis_client, f"{tag}-{i}")]
        assert ran == ["step_one", "step_two", "step_three"]  # each body once
    assert sampler.total <= LIMIT  # Postgres held the role to its limit
    assert sampler.total == LIMIT  # ...and the workers asked for more: they did run short
    assert refused(started, since) > 0, "no connection was refused: the test did not exhaust anything"
    assert sampler.peaks, "the workers were never seen connected"
    assert set(sampler.peaks) <= {"budget-w1", "budget-w2"}
    assert all(peak <= PER_PROCESS for peak in sampler.peaks.values()), sampler.peaks
