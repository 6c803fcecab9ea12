"""The activity side of a run, in SQL: the pre-run claim, completions, failed attempts, retries
and leases. Every function works inside one ``Tx`` and locks the run row first."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from harvest_celery._core import events as ev
from harvest_celery._core.names import START_TO_CLOSE_TIMEOUT, TaskStatus
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._store import prepared, sql
from harvest_celery._store.predicates import accepts_results, operator_live
from harvest_celery._store.records import Claim, RunRow, TaskRow, Timings, aware
from harvest_celery._store.schema import activity_tasks
from harvest_celery._store.tx import Tx

FINISHED = (TaskStatus.COMPLETED.value, TaskStatus.FAILED.value)
RETRY = "retry"
FAILED = "failed"
IGNORED = "ignored"


def _where(execution_id: str, activity_id: str) -> Any:
    return (activity_tasks.c.execution_id == execution_id) & (activity_tasks.c.activity_id == activity_id)


def lock_task(tx: Tx, execution_id: str, activity_id: str) -> TaskRow | None:
    row = tx.conn.execute(
        tx.dialect.lock(sa.select(activity_tasks).where(_where(execution_id, activity_id)))
    ).first()
    return TaskRow.from_mapping(row._mapping) if row is not None else None


def _update(tx: Tx, execution_id: str, activity_id: str, **values: Any) -> None:
    tx.conn.execute(activity_tasks.update().where(_where(execution_id, activity_id)).values(**values))


def claim(
    tx: Tx, execution_id: str, activity_id: str, attempt: int, worker_id: str, now: datetime, timings: Timings
) -> Claim | None:
    """The pre-run claim: mark the row running and append ActivityStarted, or refuse.

    Refused for a re-sent or redelivered message (row not ``scheduled`` or another attempt),
    a row a cancel failed, a run that does not accept results (``predicates.accepts_results``:
    finished or erased), or an unknown row. A refused claim means the body must not run.
    Postgres: one statement (``sql.CLAIM``); SQLite: the same steps one by one."""
    return tx.dialect.one_statement(_claim_in_one, _claim_stepwise)(
        tx, execution_id, activity_id, attempt, worker_id, now, timings
    )


def _claim_in_one(
    tx: Tx, execution_id: str, activity_id: str, attempt: int, worker_id: str, now: datetime, timings: Timings
) -> Claim | None:
    data = ev.ActivityStarted(activity_id, attempt, worker_id).to_data()
    found = prepared.text(
        tx.conn,
        sql.CLAIM,
        {
            "execution_id": execution_id,
            "activity_id": activity_id,
            "attempt": attempt,
            "worker_id": worker_id,
            "now": now,
            "lease": timings.default_lease,
            "data": json.dumps(tx.payloads.encode_event(data, f"{execution_id}/started")),
        },
    ).first()
    if found is None:
        return None
    scheduled = tx.payloads.decode_event(found.scheduled)
    return Claim(
        execution_id,
        activity_id,
        found.activity_name,
        attempt,
        scheduled.get("input"),
        found.start_to_close,
        worker_id,
        found.started_seq,
        now,
        scheduled.get("call_convention"),
        found.queue,
        aware(found.scheduled_at),
        bool(scheduled.get("compensation")),
    )


def _claim_stepwise(
    tx: Tx, execution_id: str, activity_id: str, attempt: int, worker_id: str, now: datetime, timings: Timings
) -> Claim | None:
    row = tx.lock(execution_id)
    if row is None or not accepts_results.holds(row):
        return None
    task = lock_task(tx, execution_id, activity_id)
    if task is None or task.status != TaskStatus.SCHEDULED.value or task.attempt != attempt:
        return None
    lease = task.start_to_close or timings.default_lease
    _update(
        tx,
        execution_id,
        activity_id,
        status=TaskStatus.RUNNING.value,
        worker_id=worker_id,
        started_at=now,
        lease_expires_at=now + timedelta(seconds=lease + 5),
    )
    seq = tx.append(row, [ev.ActivityStarted(activity_id, attempt, worker_id)], now)
    return Claim(
        execution_id,
        activity_id,
        task.activity_name,
        attempt,
        tx.scheduled_input(execution_id, activity_id),
        task.start_to_close,
        worker_id,
        seq,
        now,
        task.call_convention,
        task.queue,
        tx.recorded_at(execution_id, task.event_seq),
        bool(task.compensation),
    )


def running_task(tx: Tx, execution_id: str, activity_id: str) -> tuple[RunRow, TaskRow] | None:
    """The run and the task row of an attempt that may record its outcome, both locked; None for
    a duplicate completion (already recorded once) or an unknown run."""
    row = tx.lock(execution_id)
    if row is None:
        return None
    task = lock_task(tx, execution_id, activity_id)
    if task is None or task.status in FINISHED:
        return None
    return row, task


def read_cold(
    tx: Tx, execution_id: str, before: int, since: int = 0
) -> tuple[RunRow | None, list[ev.HistoryEvent]]:
    """The run row, unlocked, and its decoded history from seq ``since`` to before seq
    ``before``, in one statement (``sql.COLD_READ``): what a cold one-statement completion
    replays, or the tail a replay kept here catches up over (``_runtime.cold``)."""
    params = {"execution_id": execution_id, "before": before, "since": since}
    rows = prepared.text(tx.conn, sql.COLD_READ, params).all()
    if not rows:
        return None, []
    history = []
    for r in rows:
        at = aware(r.ev_recorded_at)
        if r.ev_seq is not None and at is not None:
            history.append(
                ev.HistoryEvent(r.ev_seq, ev.event_from_data(tx.payloads.decode_event(r.ev_data)), at)
            )
    return RunRow.from_mapping(rows[0]._mapping), history


def accepts_completion(task: TaskRow, attempt: int, *, started_in_cancelled_run: bool = False) -> bool:
    """A completion of ``attempt`` is recorded while no later attempt has claimed the row: its
    own attempt still running, or a late one (its lease expired during a database outage) whose
    retry waits, is held back by a limit (``waiting``) or is dispatched but not yet claimed —
    that retry is then refused by its claim.

    A cancel abandons such a waiting retry (it never runs), not the attempt before it: that
    body was running when the cancel landed, and its side effect happened, so its late
    completion is recorded like any body's that outlives a cancel (``started_in_cancelled_run``:
    the run is cancelled and the history holds this attempt's ActivityStarted — the proof a
    body ran; a row a cancel abandoned before any attempt started never has it)."""
    return (
        (task.attempt == attempt and task.status in (TaskStatus.RUNNING.value, TaskStatus.RETRY_WAIT.value))
        or (
            task.attempt == attempt + 1
            and task.status in (TaskStatus.SCHEDULED.value, TaskStatus.WAITING.value)
        )
        or (
            started_in_cancelled_run
            and task.status == TaskStatus.CANCELLED.value
            and task.attempt in (attempt, attempt + 1)
        )
    )


def _attempt_started(tx: Tx, execution_id: str, activity_id: str, attempt: int) -> bool:
    """The history holds ActivityStarted for this attempt (SQLite; Postgres asks in ``sql.FINISH``)."""
    for _seq, data, _at in tx.raw_history(execution_id):
        if (
            data.get("type") == "ActivityStarted"
            and data.get("activity_id") == activity_id
            and data.get("attempt") == attempt
        ):
            return True
    return False


def finish_completed(
    tx: Tx, execution_id: str, activity_id: str, attempt: int, now: datetime
) -> RunRow | None:
    """Lock the run and mark the task row completed: the run row (locked), or None when the
    completion is not accepted (``accepts_completion``: a duplicate, a later attempt owns the
    row, a cancel abandoned it) or the run is unknown. Postgres: one statement (``sql.FINISH``)."""
    return tx.dialect.one_statement(_finish_in_one, _finish_stepwise)(
        tx, execution_id, activity_id, attempt, now
    )


def _finish_in_one(tx: Tx, execution_id: str, activity_id: str, attempt: int, now: datetime) -> RunRow | None:
    found = tx.conn.execute(
        sql.FINISH, {"execution_id": execution_id, "activity_id": activity_id, "attempt": attempt, "now": now}
    ).first()
    if found is None or not found.finished:
        return None
    if found.task_held:  # its slot is free
        tx.free_slot(found.task_name, found.task_limit)
    else:
        tx.touch_limit(found.task_name, found.task_limit)
    return RunRow.from_mapping(found._mapping)


def _finish_stepwise(
    tx: Tx, execution_id: str, activity_id: str, attempt: int, now: datetime
) -> RunRow | None:
    located = running_task(tx, execution_id, activity_id)
    if located is None:
        return None
    row, task = located
    started = (
        row.cancelled_at is not None
        and task.status == TaskStatus.CANCELLED.value
        and _attempt_started(tx, execution_id, activity_id, attempt)
    )
    if not accepts_completion(task, attempt, started_in_cancelled_run=started):
        return None
    _finish(tx, execution_id, activity_id, TaskStatus.COMPLETED.value, now, None)
    if task.status in (TaskStatus.SCHEDULED.value, TaskStatus.RUNNING.value):  # its slot is free
        tx.free_slot(task.activity_name, task.limit_digest)
    else:
        tx.touch_limit(task.activity_name, task.limit_digest)
    return located[0]


def fail(
    tx: Tx,
    execution_id: str,
    activity_id: str,
    attempt: int,
    error_type: str,
    message: str,
    now: datetime,
    decision_queue: str,
    traceback: str = "",
) -> str:
    """Record a failed attempt: schedule a retry (no event) or fail for good (``ActivityFailed``
    and a decision request). Returns ``"retry"``, ``"failed"`` or ``"ignored"``."""
    verdict, row, failed = fail_attempt(
        tx, execution_id, activity_id, attempt, error_type, message, now, traceback
    )
    if row is not None and failed is not None:
        tx.append(row, [failed], now, decide_on=decision_queue)
    return verdict


def fail_attempt(
    tx: Tx,
    execution_id: str,
    activity_id: str,
    attempt: int,
    error_type: str,
    message: str,
    now: datetime,
    traceback: str = "",
) -> tuple[str, RunRow | None, ev.ActivityFailed | None]:
    """The task-row side of a failed attempt: a retry is scheduled (no event), or the row fails
    for good and the ``ActivityFailed`` to append is returned with the locked run row (None when
    the run records no more results). The caller appends it (``fail``) or decides on it."""
    found = running_task(tx, execution_id, activity_id)
    if found is None:
        return IGNORED, None, None
    row, task = found
    if task.attempt != attempt or task.status != TaskStatus.RUNNING.value:
        # a stale attempt (a newer one owns the row), or a row a cancel already failed: a
        # cancel never fails an await, so nothing may be recorded for it
        return IGNORED, None, None
    tx.metrics.append(("activity_attempt_failed", {"workflow": row.workflow_type, "queue": task.queue}))
    tx.free_slot(task.activity_name, task.limit_digest)  # a retry_wait or failed row holds no slot
    tx.record_error(execution_id, activity_id, attempt, error_type, message, traceback, now)
    policy = RetryPolicy.from_data(task.retry)
    if policy.should_retry(attempt, error_type) and operator_live.holds(row):
        _update(
            tx,
            execution_id,
            activity_id,
            status=TaskStatus.RETRY_WAIT.value,
            due_at=now + timedelta(seconds=policy.delay_after(attempt)),
            last_error=f"{error_type}: {message}",
            worker_id=None,
            lease_expires_at=None,
        )
        return RETRY, None, None
    _finish(tx, execution_id, activity_id, TaskStatus.FAILED.value, now, f"{error_type}: {message}")
    if not accepts_results.holds(row):
        return FAILED, None, None
    return FAILED, row, ev.ActivityFailed(activity_id, error_type, message, attempt)


def _finish(
    tx: Tx, execution_id: str, activity_id: str, status: str, now: datetime, error: str | None
) -> None:
    values: dict[str, Any] = {"status": status, "finished_at": now, "lease_expires_at": None}
    if error is not None:
        values["last_error"] = error
    _update(tx, execution_id, activity_id, **values)


# ── leases and retries (the sweeper's side) ──────────────────────────────────────────────────
def renew_lease(
    tx: Tx, execution_id: str, activity_id: str, attempt: int, now: datetime, until: datetime
) -> bool:
    """Push the lease of ``attempt`` out to ``until`` while it is still live; False when it was
    not renewed. A lease that has already expired is the sweeper's: a late heartbeat (a stalled
    thread, a database outage) must not revive it, or the sweeper's expiry and a renewal would
    race and a lost worker's row could stay 'running' past its expiry."""
    renewed = tx.conn.execute(
        activity_tasks.update()
        .where(
            _where(execution_id, activity_id)
            & (activity_tasks.c.attempt == attempt)
            & (activity_tasks.c.status == TaskStatus.RUNNING.value)
            & (activity_tasks.c.lease_expires_at > now)
        )
        .values(lease_expires_at=until)
    )
    return bool(renewed.rowcount)


def expire_lease(
    tx: Tx, execution_id: str, activity_id: str, attempt: int, now: datetime, decision_queue: str
) -> None:
    """A lease found expired: rechecked under the lock (the attempt may have finished or
    renewed meanwhile), then recorded as a failed attempt, retried per policy."""
    tx.lock(execution_id)
    lease = tx.conn.execute(
        sa.select(activity_tasks.c.lease_expires_at).where(
            _where(execution_id, activity_id)
            & (activity_tasks.c.status == TaskStatus.RUNNING.value)
            & (activity_tasks.c.attempt == attempt)
        )
    ).scalar()
    if lease is not None and aware(lease) <= now:  # type: ignore[operator]
        fail(
            tx,
            execution_id,
            activity_id,
            attempt,
            START_TO_CLOSE_TIMEOUT,
            "no result before the lease expired (worker lost or too slow)",
            now,
            decision_queue,
        )


def redispatch_next_attempt(tx: Tx, execution_id: str, activity_id: str, now: datetime) -> None:
    """A due retry: the next attempt, with a fresh message."""
    tx.lock(execution_id)
    task = lock_task(tx, execution_id, activity_id)
    if task is None or task.status != TaskStatus.RETRY_WAIT.value:
        return
    attempt = task.attempt + 1
    if task.limit_digest is not None:
        # a limited retry waits in line again, with its priority and first wait order: its
        # settle (before this commits) moves it on at once when a slot is free
        _update(
            tx,
            execution_id,
            activity_id,
            status=TaskStatus.WAITING.value,
            attempt=attempt,
            due_at=None,
            dispatched_at=now,  # back in line now (what a rate limit's throttled seconds count from)
        )
        tx.touch_limit(task.activity_name, task.limit_digest)
        return
    _update(
        tx,
        execution_id,
        activity_id,
        status=TaskStatus.SCHEDULED.value,
        attempt=attempt,
        due_at=None,
        dispatched_at=now,
    )
    tx.dispatch_activity(
        execution_id,
        activity_id,
        task.activity_name,
        task.queue,
        attempt,
        task.adopted,
        task.start_to_close,
        call_convention=task.call_convention,
        priority=task.priority,
    )
