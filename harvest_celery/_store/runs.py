"""Operator actions on runs, behind the store seam: the fork mechanism (DAG retry-from-node,
reset), terminate, pause/resume, PII erasure and retention. Each function works inside one
``Tx`` (one transaction, the run row locked first)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from harvest_celery._core import events as ev
from harvest_celery._core.commands import ScheduleActivity
from harvest_celery._core.lifecycle import RUNNING, TERMINAL_STATUSES, TERMINATED
from harvest_celery._core.registry import Registry
from harvest_celery._errors import ExecutionAlreadyExists, InvalidState
from harvest_celery._payloads.pipeline import (
    ERASED,
    EXECUTION_PAYLOAD_COLUMNS,
    PAYLOAD_FIELDS,
    is_erased,
    references,
)
from harvest_celery._store.schema import activity_tasks, events, executions, outbox, timers

ERASED_TEXT = "[erased]"

if TYPE_CHECKING:
    from harvest_celery._store.store import Tx

# ── the fork mechanism (retry-from-node, reset) and operator actions ─────────────────────
def _seal_for_fork(tx: Tx, source_id: str, new_id: str, now: datetime, *, once: bool = False) -> Any:
    """Lock the source and recheck erasure under that lock, before a single event is copied:
    an erasure either committed before the lock (refused here) or queues behind it."""
    from harvest_celery._dag.retry import erased_refusal

    row = tx.lock_existing(source_id)
    m = row._mapping
    if m["erased_at"] is not None or is_erased(m["input"]):
        raise erased_refusal(source_id)
    if once and m["forked_to"] is not None:
        from harvest_celery._dag.retry import RetryRefused

        # a double click or a client retrying its request must not fork twice
        raise RetryRefused(source_id, "retried", f"run {source_id} was already retried as "
                                                 f"{m['forked_to']}; retry that run instead")
    if tx.lock(new_id) is not None:
        raise ExecutionAlreadyExists(new_id, tx.lock(new_id)._mapping["workflow_type"])
    tx.conn.execute(executions.update().where(executions.c.id == source_id)
                      .values(forked_to=new_id, updated_at=now))
    return row

def _create_run(tx: Tx, new_id: str, workflow_type: str, input: Any, forked_from: str,
                now: datetime) -> Any:
    tx.conn.execute(executions.insert().values(
        id=new_id, workflow_type=workflow_type, status=RUNNING,
        input=tx.payloads.encode_value(input, f"{new_id}/input"), next_seq=0,
        created_at=now, updated_at=now, nd_block_count=0, forked_from=forked_from))
    return tx.lock_existing(new_id)

def fork_dag_run(tx: Tx, source_id: str, new_id: str, conf: Any, carried: dict[str, Any],
                 now: datetime, decision_queue: str) -> None:
    """A new run of the same DAG carrying over the succeeded nodes' recorded input/output."""
    source = _seal_for_fork(tx, source_id, new_id, now, once=True)
    workflow_type = source._mapping["workflow_type"]
    row = _create_run(tx, new_id, workflow_type, conf, source_id, now)
    tx.append(row, [ev.WorkflowStarted(workflow_type, conf, carried or None, source_id)], now,
                decide_on=decision_queue)

def reset(tx: Tx, source_id: str, new_id: str, to_seq: int, registry: Registry, now: datetime,
          decision_queue: str) -> None:
    """A new run whose history is the source's first ``to_seq`` events; a live source is
    terminated. Open activities and timers of the copied prefix are scheduled again."""
    source = _seal_for_fork(tx, source_id, new_id, now)
    m = source._mapping
    history = tx.history(source_id)
    if not 1 <= to_seq <= len(history):
        raise ValueError(f"reset point must be between 1 and {len(history)} (the history length)")
    prefix = [h.event for h in history[:to_seq]]
    if any(isinstance(e, (ev.WorkflowCancelled, *ev.TERMINAL_EVENTS)) for e in prefix):
        raise ValueError("a reset point must come before the run was cancelled or finished")
    if m["status"] == RUNNING:
        terminate(tx, source_id, f"reset to event {to_seq} as {new_id}", now)
    first = prefix[0]
    assert isinstance(first, ev.WorkflowStarted)
    row = _create_run(tx, new_id, m["workflow_type"], first.input, source_id, now)
    prefix[0] = dataclasses.replace(first, forked_from=source_id)
    tx.append(row, prefix, now)
    done = {e.activity_id for e in prefix if isinstance(e, (ev.ActivityCompleted, ev.ActivityFailed))}
    fired = {e.timer_id for e in prefix if isinstance(e, ev.TimerFired)}
    for seq, event in enumerate(prefix):
        if isinstance(event, ev.ActivityScheduled) and event.activity_id not in done:
            tx._insert_task(new_id, ScheduleActivity(event.activity_id, event.activity_name,
                                                       event.input, event.queue, event.compensation),
                              seq, registry, now)
        elif isinstance(event, ev.TimerStarted) and event.timer_id not in fired:
            tx.conn.execute(timers.insert().values(
                execution_id=new_id, timer_id=event.timer_id,
                fire_at=datetime.fromisoformat(event.fire_at), fired=False))
    tx.request_decision(new_id, now, decision_queue)

def terminate(tx: Tx, execution_id: str, reason: str, now: datetime) -> None:
    """Seal without the post-cancel decision: TERMINATED, unstarted work never runs."""
    row = tx.lock_existing(execution_id)
    status = row._mapping["status"]
    if status != RUNNING:
        raise InvalidState(execution_id, status, "terminate")
    tx.append(row, [ev.WorkflowFailed("Terminated", reason or "terminated by an operator")], now,
              status=TERMINATED, closed_at=now, nd_retry_at=None, decision_requested_at=None,
              paused_at=None, error={"type": "Terminated", "message": reason})
    tx.abandon_open_tasks(execution_id, now, f"workflow terminated: {reason}")


def pause(tx: Tx, execution_id: str, now: datetime) -> None:
    """Decisions wait while paused. The pause takes the row lock, so a decision in flight
    commits first and one that starts after it sees the pause and discards its commands."""
    row = tx.lock_existing(execution_id)
    if row._mapping["status"] != RUNNING:
        raise InvalidState(execution_id, row._mapping["status"], "pause")
    tx.conn.execute(executions.update().where(executions.c.id == execution_id)
                      .values(paused_at=row._mapping["paused_at"] or now, updated_at=now))

def resume(tx: Tx, execution_id: str, now: datetime, decision_queue: str) -> None:
    row = tx.lock_existing(execution_id)
    if row._mapping["paused_at"] is None:
        raise InvalidState(execution_id, "not paused", "resume")
    tx.conn.execute(executions.update().where(executions.c.id == execution_id)
                      .values(paused_at=None, updated_at=now))
    tx.request_decision(execution_id, now, decision_queue, force=True)

# ── erasure and retention ───────────────────────────────────────────────────────────────
def erase(tx: Tx, execution_id: str, now: datetime) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Tombstone every payload field of a terminal run, the execution row's input first, under
    the row lock; never remove or reorder an event. Idempotent. Returns counts and the blob
    references to delete once this commits."""
    row = tx.lock_existing(execution_id)
    m = row._mapping
    if m["status"] not in TERMINAL_STATUSES:
        raise InvalidState(execution_id, m["status"], "erase the payloads of")
    if m["paused_at"] is not None and m["erased_at"] is None:
        raise InvalidState(execution_id, "paused", "erase the payloads of (resume it first)")
    if m["cancelled_at"] is not None and m["erased_at"] is None:
        running = tx.conn.execute(sa.select(sa.func.count()).select_from(activity_tasks).where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.status == "running"))).scalar_one()
        if running or m["decision_requested_at"] is not None:
            raise InvalidState(execution_id, "cancelled with work still finishing",
                               "erase the payloads of (retry once it settles)")
    refs: list[tuple[str, str]] = []
    values: dict[str, Any] = {"erased_at": m["erased_at"] or now, "updated_at": now}
    fields = 0
    for column in EXECUTION_PAYLOAD_COLUMNS:
        value = m[column]
        if value is not None and not is_erased(value):
            refs += references(value)
            values[column] = ERASED
            fields += 1
    # Error messages are not payload fields (the run graph shows them), but exception text often
    # quotes the input: erasure scrubs them too, keeping the error type. We chose the safe side.
    error = m["error"]
    if isinstance(error, dict) and error.get("message") not in (None, ERASED_TEXT):
        values["error"] = {**error, "message": ERASED_TEXT}
    tx.conn.execute(executions.update().where(executions.c.id == execution_id).values(**values))
    tx.conn.execute(activity_tasks.update().where(
        (activity_tasks.c.execution_id == execution_id) & activity_tasks.c.last_error.is_not(None))
        .values(last_error=ERASED_TEXT))
    # unsent messages of an adopted task carry its input as their argument
    tx.conn.execute(outbox.delete().where(outbox.c.task_id.like(f"{execution_id}:%")))
    touched = 0
    for seq, data, _at in tx.raw_history(execution_id):
        changed = dict(data)
        for name in PAYLOAD_FIELDS.get(data.get("type", ""), ()):
            value = data.get(name)
            if value is not None and not is_erased(value):
                refs += references(value)
                changed[name] = ERASED
                fields += 1
        if data.get("type") in ("ActivityFailed", "WorkflowFailed") and data.get("message") != ERASED_TEXT:
            changed["message"] = ERASED_TEXT
        if changed != data:
            touched += 1
            tx.conn.execute(events.update().where(
                (events.c.execution_id == execution_id) & (events.c.seq == seq)).values(data=changed))
    return {"execution_id": execution_id, "events": touched, "fields": fields,
            "blobs": len(refs)}, refs

def purgeable(tx: Tx, cutoff: datetime, limit: int) -> list[str]:
    q = tx._for_update(sa.select(executions.c.id).where(
        executions.c.status.in_(sorted(TERMINAL_STATUSES)) & (executions.c.closed_at < cutoff))
        .order_by(executions.c.closed_at).limit(limit))
    return [r[0] for r in tx.conn.execute(q).fetchall()]

def delete_runs(tx: Tx, ids: Sequence[str]) -> tuple[int, list[tuple[str, str]]]:
    """Delete whole runs (history, task rows, timers). Returns events removed and the blob
    references to delete after commit."""
    refs: list[tuple[str, str]] = []
    removed = 0
    for execution_id in ids:
        row = tx.lock(execution_id)
        if row is None:
            continue
        for column in EXECUTION_PAYLOAD_COLUMNS:
            refs += references(row._mapping[column])
        for _seq, data, _at in tx.raw_history(execution_id):
            removed += 1
            for name in PAYLOAD_FIELDS.get(data.get("type", ""), ()):
                refs += references(data.get(name))
    for table in (events, activity_tasks, timers):
        tx.conn.execute(table.delete().where(table.c.execution_id.in_(list(ids))))
    tx.conn.execute(executions.delete().where(executions.c.id.in_(list(ids))))
    return removed, refs
