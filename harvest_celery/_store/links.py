"""Runs that start runs: child workflows and continue-as-new chains, the store side
(docs/concepts.md, "Child workflows").

Lock order is parent first, always: a child is created, terminated or asked to cancel by code
holding its parent's lock; code holding a child's lock never locks or updates its parent. So a
child's close only writes a notice (``harvest_child_notices``) in its own transaction, and the
notice is applied to the parent in a transaction of its own (``apply_notice``): right after the
child's commit, or by the sweeper. Along a chain, the earlier run is locked first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from harvest_celery._core import events as ev
from harvest_celery._core.commands import ContinuedAsNew, Decision, StartChildWorkflow
from harvest_celery._core.lifecycle import CONTINUED_AS_NEW, TERMINAL_STATUSES
from harvest_celery._payloads.digest import input_digest, limit_digest
from harvest_celery._store import admission
from harvest_celery._store.records import RunRow, aware
from harvest_celery._store.schema import child_notices, events, executions
from harvest_celery._store.starts import inherited_traceparent, new_run_values
from harvest_celery._store.tx import Tx

MAX_CHAIN_HOPS = 1_000_000  # a chain is walked link by link; a cycle would be a corrupt database


def after_decision(
    tx: Tx, row: RunRow, decision: Decision, history: Sequence[ev.Event], now: datetime, queue: str
) -> RunRow | None:
    """In the parent's transaction, after its decision is written (its row locked): create the
    children it started and append their answers; create the next link of a continued run.
    Returns the run row as it now is when this decision closed the run (else None)."""
    if decision.nd is not None:
        return None
    answers: list[ev.Event] = []
    for command in decision.commands:
        if isinstance(command, StartChildWorkflow):
            answers.append(_start_child(tx, row.id, command, now, queue))
    fresh = tx.lock_existing(row.id) if answers or decision.outcome is not None else None
    if answers and fresh is not None:
        refused = any(isinstance(a, ev.ChildWorkflowStartRefused) for a in answers)
        tx.append(fresh, answers, now, decide_on=queue if refused else None)
        fresh = tx.lock_existing(row.id)
    if fresh is None or row.status in TERMINAL_STATUSES or fresh.status not in TERMINAL_STATUSES:
        return None
    if isinstance(decision.outcome, ContinuedAsNew) and fresh.status == CONTINUED_AS_NEW:
        _continue(tx, row, history, decision.outcome, now, queue)
    return fresh


def _start_child(tx: Tx, parent_id: str, command: StartChildWorkflow, now: datetime, queue: str) -> ev.Event:
    """The child's row, ``WorkflowStarted`` and decision request, in the parent's transaction.
    An id that names a run already is refused (recorded, never asked again)."""
    values = new_run_values(
        command.child_id,
        command.workflow_type,
        input_digest(command.child_id, command.input),
        now,
        command.queue or queue,
    )
    # a traced parent's child runs in its trace, its run span under the parent's
    traced = inherited_traceparent(tx, parent_id)
    admitting = _admission_of(command)  # decided at the parent's decision, before any write
    admitting.declare(tx, command.workflow_type)
    inserted = tx.conn.execute(
        tx.dialect.insert_ignore(executions)
        .values(
            **values,
            parent_id=parent_id,
            traceparent=traced,
            **admitting.columns(tx.dialect, tx.payloads, command.child_id),
        )
        .returning(*executions.c)
    ).first()
    if inserted is None:
        existing = tx.conn.execute(
            sa.select(executions.c.workflow_type).where(executions.c.id == command.child_id)
        ).scalar()
        return ev.ChildWorkflowStartRefused(command.child_id, str(existing or ""))
    child = RunRow.from_mapping(inserted._mapping)
    encoded = tx.payloads.encode_value(command.input, f"{command.child_id}/input")
    started = ev.WorkflowStarted(
        command.workflow_type, command.input, parent_id=parent_id, priority=command.priority
    )
    # a child past its limit is written waiting: no decision is requested (``Tx.append``), and
    # this transaction's settle admits it if a slot is free (lock order: parent, child, limit)
    tx.append(child, [started], now, decide_on=command.queue or queue, input=encoded)
    if child.waiting:
        tx.touch_admission(child.workflow_type, child.limit_digest)
    return ev.ChildWorkflowStarted(command.child_id)


def _admission_of(command: StartChildWorkflow) -> admission.Prepared:
    """A child's admission as its parent's decision decided it (``_core.children``): its
    priority, and for a limited workflow its key and the key's salted digest."""
    if command.concurrency is None:
        return admission.Prepared(command.priority)
    digest = limit_digest(command.workflow_type, command.limit_key)
    return admission.Prepared(command.priority, True, command.limit_key, digest, command.concurrency)


def _continue(
    tx: Tx, row: RunRow, history: Sequence[ev.Event], outcome: ContinuedAsNew, now: datetime, queue: str
) -> None:
    """The next link, in the same transaction: linked both ways, inheriting the parent, its
    first events the carried signals."""
    first = history[0]
    assert isinstance(first, ev.WorkflowStarted)
    parent_id = first.parent_id
    values = new_run_values(
        outcome.next_id,
        row.workflow_type,
        input_digest(outcome.next_id, outcome.input),
        now,
        row.decision_queue or queue,  # the chain keeps its app's queue
    )
    inserted = tx.conn.execute(
        executions.insert()
        .values(
            **values,
            **_carried_deadlines(tx, row.id, now),
            parent_id=parent_id,
            continued_from=row.id,
            traceparent=inherited_traceparent(tx, row.id),  # the chain keeps its trace
            **admission.inherited_values(tx, row.id, outcome.next_id),  # and its admission slot
        )
        .returning(*executions.c)
    ).first()
    assert inserted is not None
    link = RunRow.from_mapping(inserted._mapping)
    started = ev.WorkflowStarted(
        row.workflow_type,
        outcome.input,
        parent_id=parent_id,
        continued_from=row.id,
        chain_id=first.chain_id or row.id,
        link=first.link + 1,
        priority=first.priority,  # the chain keeps its start priority
    )
    carried = [ev.SignalReceived(name, payload) for name, payload in outcome.signals]
    encoded = tx.payloads.encode_value(outcome.input, f"{outcome.next_id}/input")
    tx.append(link, [started, *carried], now, decide_on=queue, input=encoded)
    tx.update_run(row.id, continued_to=outcome.next_id)


def _carried_deadlines(tx: Tx, run_id: str, now: datetime) -> dict[str, datetime | None]:
    """The next link's deadlines: the execution deadline spans the chain (carried as it is);
    the run timeout applies to each run (the same span again, from now)."""
    found = tx.conn.execute(
        sa.select(
            executions.c.execution_deadline_at, executions.c.run_deadline_at, executions.c.created_at
        ).where(executions.c.id == run_id)
    ).first()
    if found is None:
        return {}
    execution_deadline, run_deadline, created = (aware(v) for v in found)
    span = run_deadline - created if run_deadline is not None and created is not None else None
    return {"execution_deadline_at": execution_deadline, "run_deadline_at": now + span if span else None}


def open_children(history: Sequence[ev.Event]) -> list[ev.ChildWorkflowScheduled]:
    """Children started and not yet closed, in id order (the lock order)."""
    started = {e.child_id for e in history if isinstance(e, ev.ChildWorkflowStarted)}
    closed = {e.child_id for e in history if isinstance(e, ev.ChildWorkflowClosed)}
    found = {
        e.child_id: e
        for e in history
        if isinstance(e, ev.ChildWorkflowScheduled) and e.child_id in started - closed
    }
    return [found[k] for k in sorted(found)]


# ── routing along a chain ────────────────────────────────────────────────────────────────────
def lock_current(tx: Tx, execution_id: str) -> RunRow | None:
    """Lock the addressed run, then, while it is CONTINUED_AS_NEW, its ``continued_to``: the
    chain's current run (earlier links locked first)."""
    row = tx.lock(execution_id)
    for _ in range(MAX_CHAIN_HOPS):
        if row is None or row.status != CONTINUED_AS_NEW:
            return row
        following = continued_to(tx, row.id)
        if following is None:
            return row
        row = tx.lock(following)
    return row


def last_link_status(tx: Tx, execution_id: str) -> str | None:
    """The status of the last run of the chain ``execution_id`` begins or belongs to (its own
    if it continued into nothing); None if a run on the way is gone (purged). Reads, locks
    nothing."""
    current: str | None = execution_id
    for _ in range(MAX_CHAIN_HOPS):
        row = tx.conn.execute(
            sa.select(executions.c.status, executions.c.continued_to).where(executions.c.id == current)
        ).first()
        if row is None:
            return None
        if row.status != CONTINUED_AS_NEW or row.continued_to is None:
            return str(row.status)
        current = str(row.continued_to)
    return None


def continued_to(tx: Tx, execution_id: str) -> str | None:
    found = tx.conn.execute(
        sa.select(executions.c.continued_to).where(executions.c.id == execution_id)
    ).scalar()
    return str(found) if found is not None else None


def chain_root(tx: Tx, execution_id: str) -> str:
    """The first id of the chain ``execution_id`` belongs to (itself if it continues nothing)."""
    current = execution_id
    for _ in range(MAX_CHAIN_HOPS):
        previous = tx.conn.execute(
            sa.select(executions.c.continued_from).where(executions.c.id == current)
        ).scalar()
        if previous is None:
            return current
        current = str(previous)
    return current


# ── a child's close: the notice (``Tx.write_child_notice``), applied by the parent ──────────
def notices_of(tx: Tx, child_ids: Sequence[str]) -> list[tuple[str, str]]:
    rows = tx.conn.execute(
        sa.select(child_notices.c.parent_id, child_notices.c.child_id).where(
            child_notices.c.child_id.in_(sorted(set(child_ids)))
        )
    )
    return [(r.parent_id, r.child_id) for r in rows]


def stale_notices(tx: Tx, now: datetime, older_than: float, limit: int = 100) -> list[tuple[str, str]]:
    """Notices nobody applied after the child's commit (the closing process died): the sweeper's."""
    rows = tx.conn.execute(
        sa.select(child_notices.c.parent_id, child_notices.c.child_id)
        .where(child_notices.c.created_at <= now - timedelta(seconds=older_than))
        .order_by(child_notices.c.created_at)
        .limit(limit)
    )
    return [(r.parent_id, r.child_id) for r in rows]


def apply_notice(tx: Tx, parent_id: str, child_id: str, now: datetime, queue: str) -> bool:
    """In the parent's own transaction, its lock first: append ``ChildWorkflowClosed`` once per
    child id and request a decision; the notice is deleted either way. True if appended."""
    parent = tx.lock(parent_id)
    taken = tx.conn.execute(
        sa.delete(child_notices)
        .where((child_notices.c.parent_id == parent_id) & (child_notices.c.child_id == child_id))
        .returning(child_notices.c.status, child_notices.c.result, child_notices.c.error)
    ).first()
    if taken is None or parent is None or not parent.accepts_results:
        return False
    root = chain_root(tx, child_id)  # the parent knows a chain by its first id
    if root in _closed_children(tx, parent_id):
        return False
    error: dict[str, Any] = taken.error or {}
    result = tx.payloads.decode_value(taken.result) if taken.result is not None else None
    closed = ev.ChildWorkflowClosed(
        root, taken.status, result, str(error.get("type", "")), str(error.get("message", ""))
    )
    tx.append(parent, [closed], now, decide_on=queue)
    return True


def _closed_children(tx: Tx, parent_id: str) -> set[str]:
    rows = tx.conn.execute(
        sa.select(events.c.data).where(
            (events.c.execution_id == parent_id) & (events.c.type == ev.ChildWorkflowClosed.type)
        )
    )
    return {str(r.data.get("child_id")) for r in rows}
