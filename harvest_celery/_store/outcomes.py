"""The reads behind ``Harvest.result``: a run's outcome, and the branch a cancel sealed it into.

``outcome`` is what a waiter reads on each look (before it waits, and on each wake-up): one
statement gives the status, whether a cancel sealed the run, and its stored result and error
(still encoded). A run that closed without a seal is answered from that row alone; only a sealed
run needs ``cancel_branch``, which reads its running task rows and its terminal event too — no
history load in either.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from harvest_celery._core import events as ev
from harvest_celery._core.names import TaskStatus
from harvest_celery._store.records import CancelBranch, cancel_branch_of
from harvest_celery._store.schema import activity_tasks, events, executions


def outcome(conn: Connection, execution_id: str) -> Row | None:
    c = executions.c
    q = sa.select(c.id, c.status, c.result, c.error, c.cancelled_at, c.cancel_reason)
    return conn.execute(q.where(c.id == execution_id)).first()


def cancel_branch(conn: Connection, execution_id: str) -> tuple[bool, CancelBranch | None]:
    """(whether the run exists, its post-cancel branch: None if no cancel sealed it)."""
    running = (
        sa.select(sa.func.count())
        .select_from(activity_tasks)
        .where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.status == TaskStatus.RUNNING.value)
        )
        .scalar_subquery()
    )
    terminal = (
        sa.select(events.c.type)
        .where(
            (events.c.execution_id == execution_id)
            & events.c.type.in_([ev.WorkflowCompleted.type, ev.WorkflowFailed.type])
        )
        .order_by(events.c.seq)
        .limit(1)
        .scalar_subquery()
    )
    q = sa.select(
        executions.c.cancelled_at,
        executions.c.cancel_reason,
        executions.c.error,
        executions.c.decision_requested_at,
        running.label("running"),
        terminal.label("terminal"),
    ).where(executions.c.id == execution_id)
    row = conn.execute(q).first()
    if row is None:
        return False, None
    if row.cancelled_at is None:
        return True, None
    settled = row.decision_requested_at is None and not row.running
    return True, cancel_branch_of(row.cancel_reason or "", settled, row.terminal, row.error)
