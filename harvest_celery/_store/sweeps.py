"""What the sweeper finds due, in SQL: retries, expired leases, timers, deadlines (and the end of
a timeout's grace period), lost messages (a task row still ``scheduled`` long after its message
went out, a decision request never taken), nd-block backoff, and outbox rows an older build left
unsent."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import RUNNING, timeout_requested, unwind_begun
from harvest_celery._core.names import TaskStatus
from harvest_celery._store import limits, links, runs
from harvest_celery._store.predicates import operator_live
from harvest_celery._store.records import RelayedMessage, TaskRow, Timings, aware
from harvest_celery._store.schema import activity_tasks, executions, outbox, timers
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")

Kinds = Sequence[str] | None  # the workflow types a sweeper answers for (None: every run)


def _of(column: Any, kinds: Kinds) -> Any:
    """Rows of runs of these workflow types: a sweeper sweeps what its app knows, so two apps
    sharing one database never send each other's work through their own queues."""
    if kinds is None:
        return sa.true()
    return column.in_(sa.select(executions.c.id).where(executions.c.workflow_type.in_(list(kinds))))


def due_retries(tx: Tx, now: datetime, limit: int = 100, kinds: Kinds = None) -> list[tuple[str, str]]:
    q = (
        sa.select(activity_tasks.c.execution_id, activity_tasks.c.activity_id)
        .where(
            (activity_tasks.c.status == TaskStatus.RETRY_WAIT.value)
            & (activity_tasks.c.due_at <= now)
            & _of(activity_tasks.c.execution_id, kinds)
        )
        .limit(limit)
    )
    return [(r[0], r[1]) for r in tx.conn.execute(q)]


def expired_leases(
    tx: Tx, now: datetime, limit: int = 100, kinds: Kinds = None
) -> list[tuple[str, str, int]]:
    q = (
        sa.select(activity_tasks.c.execution_id, activity_tasks.c.activity_id, activity_tasks.c.attempt)
        .where(
            (activity_tasks.c.status == TaskStatus.RUNNING.value)
            & (activity_tasks.c.lease_expires_at <= now)
            & _of(activity_tasks.c.execution_id, kinds)
        )
        .limit(limit)
    )
    return [(r[0], r[1], r[2]) for r in tx.conn.execute(q)]


def due_timers(tx: Tx, now: datetime, limit: int = 100, kinds: Kinds = None) -> list[tuple[str, str]]:
    q = (
        sa.select(timers.c.execution_id, timers.c.timer_id)
        .where((timers.c.fired.is_(False)) & (timers.c.fire_at <= now) & _of(timers.c.execution_id, kinds))
        .limit(limit)
    )
    return [(r[0], r[1]) for r in tx.conn.execute(q)]


def fire_timer(tx: Tx, execution_id: str, timer_id: str, now: datetime, decision_queue: str) -> None:
    row = tx.lock(execution_id)
    if row is None:
        return
    updated = tx.conn.execute(
        timers.update()
        .where(
            (timers.c.execution_id == execution_id)
            & (timers.c.timer_id == timer_id)
            & (timers.c.fired.is_(False))
        )
        .values(fired=True)
    )
    if updated.rowcount and operator_live.holds(row):
        tx.append(row, [ev.TimerFired(timer_id)], now, decide_on=decision_queue)


# ── deadlines (docs/concepts.md, "Deadlines"): never a timer, never a terminate ─────────────
DEADLINE = "deadline"  # a deadline expired: append the timeout request
GRACE = "grace"  # a timeout's grace period ended: seal, unless an unwind has begun


def due_deadlines(tx: Tx, now: datetime, limit: int = 100, kinds: Kinds = None) -> list[tuple[str, str]]:
    """``(execution_id, DEADLINE | GRACE)`` of the running runs whose deadline expired (no timeout
    request yet) or whose timeout grace period ended (not sealed, not found overrun already)."""
    c = executions.c
    due = (c.timed_out_at.is_(None)) & ((c.execution_deadline_at <= now) | (c.run_deadline_at <= now))
    grace = (
        c.timed_out_at.is_not(None)
        & c.cancelled_at.is_(None)
        & c.timeout_overrun_at.is_(None)
        & (c.timeout_grace_at <= now)
    )
    q = (
        sa.select(c.id, sa.case((due, DEADLINE), else_=GRACE))
        .where(
            (c.status == RUNNING)
            & (due | grace)
            & (sa.true() if kinds is None else c.workflow_type.in_(list(kinds)))
        )
        .limit(limit)
    )
    return [(r[0], r[1]) for r in tx.conn.execute(q)]


def expire_deadline(
    tx: Tx, execution_id: str, now: datetime, grace: float, decision_queue: str
) -> str | None:
    """Under the run's lock, on a running run whose deadline expired: append
    ``WorkflowTimeoutRequested``, open a cancellation request if none is open (so claims,
    ``activity_context().is_cancelled()`` and CANCELLING behave as after
    ``request_cancellation``), set ``timed_out_at`` and ``timeout_grace_at``. Returns which
    timeout expired (None: nothing was due any more)."""
    row = tx.lock(execution_id)
    if row is None or not operator_live.holds(row) or row.timed_out_at is not None:
        return None
    c = executions.c
    found = tx.conn.execute(
        sa.select(c.execution_deadline_at, c.run_deadline_at, c.created_at).where(c.id == execution_id)
    ).one()
    execution_deadline, run_deadline, created = (aware(v) for v in found)
    if execution_deadline is not None and execution_deadline <= now:
        timeout, deadline = "execution", execution_deadline
        root = links.chain_root(tx, execution_id)
        if root != execution_id:
            created = aware(tx.conn.execute(sa.select(c.created_at).where(c.id == root)).scalar())
    elif run_deadline is not None and run_deadline <= now:
        timeout, deadline = "run", run_deadline
    else:
        return None
    span = (deadline - created).total_seconds() if created is not None else 0.0  # type: ignore[operator]
    reason = f"{timeout}_timeout of {span:g}s expired"
    if row.waiting:  # it timed out waiting for admission: closed without running its code
        tx.append(row, [ev.WorkflowTimeoutRequested(timeout, reason)], now, timed_out_at=now)
        runs.cancel(tx, row.id, reason, now, decision_queue, timed_out=True)
        return timeout
    opened = (
        {} if row.cancel_requested_at is not None else {"cancel_requested_at": now, "cancel_reason": reason}
    )
    tx.append(
        row,
        [ev.WorkflowTimeoutRequested(timeout, reason)],
        now,
        decide_on=decision_queue,
        timed_out_at=now,
        timeout_grace_at=now + timedelta(seconds=grace),
        **opened,
    )
    return timeout


def end_grace(tx: Tx, execution_id: str, now: datetime, decision_queue: str) -> str | None:
    """Under the run's lock, on a running run whose timeout grace period ended: with no unwind
    begun, seal it through ``runs.cancel`` (bodies running now have their results recorded and
    the post-cancel decision runs; TIMED_OUT). Mid-unwind: never terminated, never sealed — it
    is marked overrun (``timeout_overrun_at``, a WARNING) and left to end. Returns "sealed",
    "overrun" or None (nothing to do)."""
    row = tx.lock(execution_id)
    if row is None or not operator_live.holds(row) or row.cancelled_at is not None:
        return None
    history = [h.event for h in tx.history(row.id)]
    request = timeout_requested(history)
    if row.timed_out_at is None or request is None:
        return None
    if unwind_begun(history):
        tx.update_run(row.id, timeout_overrun_at=now, updated_at=now)
        log.warning(
            "run %s: the grace period after its %s timeout ended mid-unwind; it is left running "
            "until its workflow ends (timeout_overrun; an operator may cancel or terminate it)",
            row.id,
            request.timeout,
        )
        return "overrun"
    reason = f"{request.reason} (the grace period ended)"
    runs.cancel(tx, row.id, reason, now, decision_queue, timed_out=True)
    return "sealed"


def stale_scheduled(tx: Tx, now: datetime, timings: Timings, limit: int = 100, kinds: Kinds = None) -> None:
    """Re-send scheduled rows whose message seems lost (a crash between commit and send, a Redis
    restart, a refused claim). Duplicates are harmless: the claim lets one through."""
    cutoff = now - timedelta(seconds=timings.redispatch_after)
    q = tx.dialect.lock(
        sa.select(activity_tasks)
        .where(
            (activity_tasks.c.status == TaskStatus.SCHEDULED.value)
            & (activity_tasks.c.dispatched_at < cutoff)
            & _of(activity_tasks.c.execution_id, kinds)
        )
        .limit(limit),
        skip_locked=True,
    )
    for found in tx.conn.execute(q).fetchall():
        t = TaskRow.from_mapping(found._mapping)
        # back off: the next re-send waits as long again as this row has waited so far (a
        # backed-up queue must not be flooded with duplicates), at most an hour
        # jittered (half to one and a half times), so rows that went stale together (a burst
        # refused by a full database) are not all re-sent at one instant again
        waited = min(now - t.dispatched_at, timedelta(hours=1)) * random.uniform(0.5, 1.5)  # type: ignore[operator]
        tx.conn.execute(
            activity_tasks.update()
            .where(
                (activity_tasks.c.execution_id == t.execution_id)
                & (activity_tasks.c.activity_id == t.activity_id)
            )
            .values(dispatched_at=now + waited)
        )
        tx.dispatch_activity(
            t.execution_id,
            t.activity_id,
            t.activity_name,
            t.queue,
            t.attempt,
            t.adopted,
            t.start_to_close,
            call_convention=t.call_convention,
            priority=t.priority,
        )


def stale_decisions(
    tx: Tx, now: datetime, timings: Timings, decision_queue: str, limit: int = 100, kinds: Kinds = None
) -> None:
    """Re-request decisions whose message seems lost, and retry nd-blocked runs whose backoff
    is due."""
    cutoff = now - timedelta(seconds=timings.redispatch_after)
    q = tx.dialect.lock(
        sa.select(executions.c.id, executions.c.decision_requested_at)
        .where(
            (
                (executions.c.decision_requested_at < cutoff)
                | ((executions.c.nd_retry_at <= now) & operator_live.core(executions))
            )
            & (sa.true() if kinds is None else executions.c.workflow_type.in_(list(kinds)))
        )
        .limit(limit),
        skip_locked=True,
    )
    for execution_id, requested_at in tx.conn.execute(q).fetchall():
        # the worker that held its warm replay did not take it (gone?): any decision worker may
        tx.update_run(execution_id, nd_retry_at=None, sticky_queue=None)
        tx.request_decision(execution_id, now, decision_queue, force=True)
        if requested_at is not None:  # the next re-send: backed off and jittered (resend_at)
            tx.update_run(execution_id, decision_requested_at=resend_at(now, requested_at))


def resend_at(now: datetime, requested_at: datetime) -> datetime:
    """When a re-sent decision request counts as sent, so that the next re-send comes
    ``redispatch_after`` plus a random share (0 to 1) of how long it has waited so far (at most
    an hour) later: requests that went stale together — a burst refused by a full database —
    spread out instead of colliding again at one instant, and a backed-up queue is not flooded."""
    waited = min(max(now - requested_at, timedelta(0)), timedelta(hours=1))
    return now + waited * random.random()


def stale_outbox(tx: Tx, now: datetime, older_than: float, limit: int = 500) -> list[RelayedMessage]:
    """Outbox rows an older build wrote and did not delete: relayed as stored."""
    cutoff = now - timedelta(seconds=older_than)
    q = tx.dialect.lock(
        sa.select(outbox).where(outbox.c.created_at < cutoff).order_by(outbox.c.id).limit(limit),
        skip_locked=True,
    )
    return [
        RelayedMessage(r.id, r.task_name, r.queue, r.args, r.task_id, r.headers)
        for r in tx.conn.execute(q).fetchall()
    ]


def delete_outbox(tx: Tx, ids: Sequence[int]) -> None:
    if ids:
        tx.conn.execute(outbox.delete().where(outbox.c.id.in_(list(ids))))


def settle_waiting(tx: Tx, now: datetime) -> None:
    """Settle every limit some row waits under (``_store.limits``): the backstop that releases
    what a freeing transaction committed but whose process died before sending, within one
    sweep interval. Settled before this transaction commits."""
    for name, digest in limits.waiting_limits(tx):
        tx.touch_limit(name, digest)
