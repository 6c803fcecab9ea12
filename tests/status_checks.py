"""Migration 0007 (the status CHECK constraints), for both dialects: the SQLite unit test and the
Postgres integration test call these with their own database URL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import sqlalchemy as sa

from harvest_celery._core.lifecycle import RUN_STATUSES
from harvest_celery._core.names import TASK_STATUSES
from harvest_celery._store.migrate import downgrade, upgrade

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
TABLES = {"harvest_executions": RUN_STATUSES, "harvest_activity_tasks": TASK_STATUSES}


def _checks(conn: sa.Connection) -> dict[str, list[str]]:
    inspector = sa.inspect(conn)
    return {
        table: [
            str(c["sqltext"])
            for c in inspector.get_check_constraints(table)
            if c["name"] == f"ck_{table}_status"
        ]
        for table in TABLES
    }


def assert_checked(url: str) -> None:
    """Both status columns carry a CHECK listing exactly the status constants."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            checks = _checks(conn)
        for table, statuses in TABLES.items():
            (text,) = checks[table]
            assert all(f"'{s}'" in text for s in statuses) and text.count("'") == 2 * len(statuses), text
    finally:
        engine.dispose()


def _run(conn: sa.Connection, run_id: str, status: str) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO harvest_executions (id, workflow_type, status, next_seq, created_at, updated_at, "
            "nd_block_count) VALUES (:id, 'W', :status, 1, :now, :now, 0)"
        ),
        {"id": run_id, "status": status, "now": NOW},
    )


def _task(conn: sa.Connection, run_id: str, status: str) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO harvest_activity_tasks (execution_id, activity_id, activity_name, queue, status, "
            "attempt, event_seq, compensation, adopted) "
            "VALUES (:id, 'a1', 'act', 'q', :status, 1, 1, false, false)"
        ),
        {"id": run_id, "status": status},
    )


def _state(conn: sa.Connection) -> tuple[object, ...]:
    version = conn.execute(sa.text("SELECT version_num FROM harvest_alembic_version")).scalar_one()
    runs = conn.execute(sa.text("SELECT id, status FROM harvest_executions ORDER BY id")).all()
    tasks = conn.execute(
        sa.text("SELECT execution_id, status FROM harvest_activity_tasks ORDER BY execution_id")
    ).all()
    return version, [tuple(r) for r in runs], [tuple(r) for r in tasks], _checks(conn)


def assert_stops_on_unknown_status(url: str) -> None:
    """Rows outside the set: 0007 stops with the values and their counts, and changes nothing;
    once they are corrected it applies, refuses an unknown status, and downgrades."""
    upgrade(url, "0006")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            _run(conn, "ok", "RUNNING")
            _run(conn, "p1", "PENDING")
            _run(conn, "p2", "PENDING")
            _run(conn, "w1", "WAITING")
            _task(conn, "ok", "running")
            _task(conn, "p1", "leased")
        with engine.connect() as conn:
            before = _state(conn)
        assert before[0] == "0006" and before[3] == {t: [] for t in TABLES}
        with pytest.raises(Exception, match="outside the known set") as refused:
            upgrade(url)
        message = str(refused.value)
        assert "harvest_executions.status: 'PENDING' (2 rows), 'WAITING' (1 row)" in message, message
        assert "harvest_activity_tasks.status: 'leased' (1 row)" in message, message
        assert "Nothing was changed" in message
        with engine.connect() as conn:
            assert _state(conn) == before
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE harvest_executions SET status = 'FAILED' WHERE status <> 'RUNNING'"))
            conn.execute(
                sa.text("UPDATE harvest_activity_tasks SET status = 'failed' WHERE status = 'leased'")
            )
        upgrade(url)
        assert_checked(url)
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            _run(conn, "bad", "PAUSED")
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            _task(conn, "w1", "leased")
        downgrade(url, "0006")
        with engine.connect() as conn:
            assert _checks(conn) == {t: [] for t in TABLES}
            assert len(_state(conn)[1]) == 4
    finally:
        engine.dispose()
