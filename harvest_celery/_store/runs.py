"""Every mutation of a run as a whole, in SQL: start, signal, **cancel** (the seal), the cooperative
cancellation request, terminate, pause/resume, the fork mechanism (DAG retry-from-node, reset), PII
**erasure** and retention. Each works inside one ``Tx`` (one transaction, the run row locked first)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from harvest_celery._core import children as kids
from harvest_celery._core import events as ev
from harvest_celery._core.commands import ScheduleActivity
from harvest_celery._core.lifecycle import RUNNING, TERMINAL_STATUSES, TERMINATED, status_after_cancel
from harvest_celery._core.names import TaskStatus
from harvest_celery._core.registry import Registry
from harvest_celery._dag.folds import OPEN, fold_dispatches
from harvest_celery._dag.retry import erased_refusal
from harvest_celery._errors import (
    ExecutionAlreadyExists,
    ExecutionNotFound,
    ForksHoldCopies,
    InvalidState,
    RetryRefused,
)
from harvest_celery._payloads.digest import input_digest
from harvest_celery._payloads.erasure import (
    ERASED,
    ERASED_TEXT,
    erase_error,
    erase_event,
    is_erased,
    references,
)
from harvest_celery._payloads.fields import EXECUTION_PAYLOAD_COLUMNS, PAYLOAD_FIELDS, TASK_PAYLOAD_COLUMNS
from harvest_celery._store import admission, links, starts
from harvest_celery._store.predicates import operator_live
from harvest_celery._store.records import RunRow, aware, outbox_execution_id
from harvest_celery._store.schema import (
    activity_tasks,
    attempt_errors,
    events,
    executions,
    outbox,
    timers,
    workflow_updates,
)
from harvest_celery._store.tx import Tx


# ── start (``starts``: id reuse, concurrent starts, starts in an app's transaction), signal,
# cancel ──────────────────────────────────────────────────────────────────────────────────────
def _lock_current(tx: Tx, execution_id: str) -> RunRow:
    """The run an operator action addressed to ``execution_id`` acts on: along a continue-as-new
    chain, its current run (``links.lock_current``)."""
    row = links.lock_current(tx, execution_id)
    if row is None:
        raise ExecutionNotFound(execution_id)
    return row


def signal(tx: Tx, execution_id: str, name: str, payload: Any, now: datetime, decision_queue: str) -> None:
    row = _lock_current(tx, execution_id)
    if not operator_live.holds(row):
        raise InvalidState(execution_id, row.status, "signal")
    tx.append(row, [ev.SignalReceived(name, payload)], now, decide_on=decision_queue)


def cancel(
    tx: Tx, execution_id: str, reason: str, now: datetime, decision_queue: str, *, timed_out: bool = False
) -> str:
    """Seal the run: append WorkflowCancelled, set CANCELLED (FAILED mid-unwind; TIMED_OUT for
    ``timed_out``, a deadline's grace end), fail every open task row that has not started (no
    event), request the post-cancel decision; open children get their parent-close policy."""
    row = _lock_current(tx, execution_id)
    if not operator_live.holds(row):
        raise InvalidState(execution_id, row.status, "cancel")
    history = [h.event for h in tx.history(row.id)]
    tx.append(row, [ev.WorkflowCancelled(reason)], now)
    new_status = status_after_cancel(history, timed_out)
    tx.update_run(
        row.id,
        status=new_status,
        cancelled_at=now,
        cancel_reason=reason,
        closed_at=now,
        updated_at=now,
        nd_retry_at=None,
        paused_at=None,
    )
    tx.abandon_open_tasks(row.id, now, f"workflow cancelled: {reason}")
    tx.request_decision(row.id, now, decision_queue, force=True)
    close_children(tx, history, f"parent {row.id} cancelled: {reason}", now, decision_queue)
    return new_status


def request_cancellation(tx: Tx, execution_id: str, reason: str, now: datetime, decision_queue: str) -> bool:
    """Cooperative cancel: append ``WorkflowCancelRequested`` and request a decision, without
    sealing — the run stays RUNNING (shown CANCELLING) and may still schedule durable work.
    Passed on to its open children, except compensating ones (an undo in progress is not asked
    to stop). False if a request is already open (idempotent: no second event)."""
    row = _lock_current(tx, execution_id)
    if not operator_live.holds(row):
        raise InvalidState(execution_id, row.status, "request the cancellation of")
    if row.waiting:  # waiting for admission: no code to cooperate with, so a cancel closes it
        return bool(cancel(tx, row.id, reason, now, decision_queue))
    if row.cancel_requested_at is not None:
        return False
    tx.append(
        row,
        [ev.WorkflowCancelRequested(reason)],
        now,
        decide_on=decision_queue,
        cancel_requested_at=now,
        cancel_reason=reason,
    )
    for child in links.open_children([h.event for h in tx.history(row.id)]):
        if not child.compensation:  # parent locked first, then its children in id order
            _pass_on(
                tx, child.child_id, lambda cid: request_cancellation(tx, cid, reason, now, decision_queue)
            )
    return True


def close_children(
    tx: Tx, history: Sequence[ev.Event], reason: str, now: datetime, decision_queue: str
) -> None:
    """A parent's close (or seal) applies each open child's parent-close policy, in id order,
    under the parent's lock: terminate it, ask it to cancel, or leave it running."""
    for child in links.open_children(history):
        if child.policy == kids.TERMINATE:
            _pass_on(tx, child.child_id, lambda cid: terminate(tx, cid, reason, now, decision_queue))
        elif child.policy == kids.REQUEST_CANCEL:
            _pass_on(
                tx, child.child_id, lambda cid: request_cancellation(tx, cid, reason, now, decision_queue)
            )


def _pass_on(tx: Tx, child_id: str, action: Any) -> None:
    """An action on a child that may have closed meanwhile (its notice not yet applied)."""
    current = links.lock_current(tx, child_id)
    if current is not None and operator_live.holds(current):
        action(current.id)


# ── the fork mechanism (retry-from-node, reset) and operator actions ─────────────────────
def _seal_for_fork(tx: Tx, source_id: str, new_id: str, now: datetime, *, once: bool = False) -> RunRow:
    """Lock the source and recheck erasure under that lock, before a single event is copied:
    an erasure either committed before the lock (refused here) or queues behind it."""
    row = tx.lock_existing(source_id, payloads=True)  # erasure is read from its input
    m = row
    if m.erased_at is not None or is_erased(m.input):
        raise erased_refusal(source_id)
    if once and m.forked_to is not None:
        # a double click or a client retrying its request must not fork twice
        raise RetryRefused(
            source_id,
            "retried",
            f"run {source_id} was already retried as {m.forked_to}; retry that run instead",
        )
    existing = tx.lock(new_id)
    if existing is not None:
        raise ExecutionAlreadyExists(new_id, existing.workflow_type)
    tx.conn.execute(
        executions.update().where(executions.c.id == source_id).values(forked_to=new_id, updated_at=now)
    )
    return row


def _insert_run(
    tx: Tx, execution_id: str, workflow_type: str, input: Any, now: datetime, forked_from: str | None = None
) -> RunRow:
    tx.conn.execute(
        executions.insert().values(
            id=execution_id,
            workflow_type=workflow_type,
            status=RUNNING,
            input=tx.payloads.encode_value(input, f"{execution_id}/input"),
            next_seq=0,
            input_digest=None if is_erased(input) else input_digest(execution_id, input),
            created_at=now,
            updated_at=now,
            nd_block_count=0,
            forked_from=forked_from,
            traceparent=starts.forked_traceparent(tx, forked_from) if forked_from is not None else None,
            decision_queue=sa.select(executions.c.decision_queue)  # where its source decided
            .where(executions.c.id == forked_from)
            .scalar_subquery(),
            **(admission.copied_values(tx, forked_from, execution_id) if forked_from else {}),
        )
    )
    return tx.lock_existing(execution_id)


def fork_dag_run(
    tx: Tx,
    source_id: str,
    new_id: str,
    conf: Any,
    carried: dict[str, Any],
    now: datetime,
    decision_queue: str,
) -> None:
    """A new run of the same DAG carrying over the succeeded nodes' recorded input/output."""
    source = _seal_for_fork(tx, source_id, new_id, now, once=True)
    workflow_type = source.workflow_type
    row = _insert_run(tx, new_id, workflow_type, conf, now, source_id)
    started = ev.WorkflowStarted(workflow_type, conf, carried or None, source_id)
    tx.append(row, [started], now, decide_on=decision_queue)


def reset(
    tx: Tx, source_id: str, new_id: str, to_seq: int, registry: Registry, now: datetime, decision_queue: str
) -> None:
    """A new run whose history is the source's first ``to_seq`` events; a live source is
    terminated. Open activities and timers of the copied prefix are scheduled again."""
    source = _seal_for_fork(tx, source_id, new_id, now)
    m = source
    history = tx.history(source_id)
    if not 1 <= to_seq <= len(history):
        raise ValueError(f"reset point must be between 1 and {len(history)} (the history length)")
    prefix = [h.event for h in history[:to_seq]]
    if any(isinstance(e, (ev.WorkflowCancelled, *ev.TERMINAL_EVENTS)) for e in prefix):
        raise ValueError("a reset point must come before the run was cancelled or finished")
    if operator_live.holds(m):  # a live source is terminated (as terminate checks)
        terminate(tx, source_id, f"reset to event {to_seq} as {new_id}", now, decision_queue)
    first = prefix[0]
    assert isinstance(first, ev.WorkflowStarted)
    row = _insert_run(tx, new_id, m.workflow_type, first.input, now, source_id)
    # a fork is a run of its own: no parent, and a chain of its own if it continues as new
    prefix[0] = dataclasses.replace(
        first, forked_from=source_id, parent_id=None, continued_from=None, chain_id=None, link=0
    )
    tx.append(row, prefix, now)
    requested = [e for e in prefix if isinstance(e, ev.CANCEL_REQUESTS)]
    if requested:  # the copied request (an operator's, or a deadline's) is open on the new run too
        timed = now if any(isinstance(e, ev.WorkflowTimeoutRequested) for e in requested) else None
        tx.update_run(new_id, cancel_requested_at=now, cancel_reason=requested[0].reason, timed_out_at=timed)
    flow = _flow_of(tx, source_id)
    for dispatch in fold_dispatches(history[:to_seq]).dispatches:  # the open ones run again
        if dispatch.outcome == OPEN:
            s = dispatch.scheduled
            priority, key = flow.get(s.activity_id, (0, None))  # copied, never recomputed
            command = ScheduleActivity(
                s.activity_id,
                s.activity_name,
                s.input,
                s.queue,
                s.compensation,
                call_convention=s.call_convention,  # re-dispatched as recorded: called and keyed alike
                node=s.node,
                priority=priority,
                limit_key=key,
            )
            # a new run that waits for admission holds them: sent only once it is admitted
            tx.insert_task(new_id, command, dispatch.seq, registry, now, held=row.waiting)
    fired = {e.timer_id for e in prefix if isinstance(e, ev.TimerFired)}
    for event in prefix:
        if isinstance(event, ev.TimerStarted) and event.timer_id not in fired:
            tx.insert_timer(new_id, event.timer_id, event.fire_at)
    tx.request_decision(new_id, now, decision_queue)


def _flow_of(tx: Tx, execution_id: str) -> dict[str, tuple[int, str | None]]:
    """Each task row's priority and limit key (decoded), by activity id: what a fork copies."""
    rows = tx.conn.execute(
        sa.select(activity_tasks.c.activity_id, activity_tasks.c.priority, activity_tasks.c.limit_key).where(
            activity_tasks.c.execution_id == execution_id
        )
    ).all()
    return {
        r.activity_id: (
            int(r.priority),
            None if r.limit_key is None else tx.payloads.decode_value(r.limit_key),
        )
        for r in rows
    }


def terminate(tx: Tx, execution_id: str, reason: str, now: datetime, decision_queue: str) -> None:
    """Seal without the post-cancel decision: TERMINATED, unstarted work never runs; its open
    children get their parent-close policy."""
    row = _lock_current(tx, execution_id)
    if not operator_live.holds(row):
        raise InvalidState(execution_id, row.status, "terminate")
    tx.append(
        row,
        [ev.WorkflowFailed("Terminated", reason or "terminated by an operator")],
        now,
        status=TERMINATED,
        closed_at=now,
        nd_retry_at=None,
        decision_requested_at=None,
        paused_at=None,
        error={"type": "Terminated", "message": reason},
    )
    tx.abandon_open_tasks(row.id, now, f"workflow terminated: {reason}")
    history = [h.event for h in tx.history(row.id)]
    close_children(tx, history, f"parent {row.id} terminated: {reason}", now, decision_queue)


def pause(tx: Tx, execution_id: str, now: datetime) -> None:
    """Decisions wait while paused. The pause takes the row lock, so a decision in flight
    commits first and one that starts after it sees the pause and discards its commands."""
    row = tx.lock_existing(execution_id)
    if not operator_live.holds(row):
        raise InvalidState(execution_id, row.status, "pause")
    tx.conn.execute(
        executions.update()
        .where(executions.c.id == execution_id)
        .values(paused_at=row.paused_at or now, updated_at=now)
    )


def resume(tx: Tx, execution_id: str, now: datetime, decision_queue: str) -> None:
    row = tx.lock_existing(execution_id)
    if row.paused_at is None:
        raise InvalidState(execution_id, "not paused", "resume")
    tx.conn.execute(
        executions.update().where(executions.c.id == execution_id).values(paused_at=None, updated_at=now)
    )
    tx.request_decision(execution_id, now, decision_queue, force=True)


# ── erasure and retention ───────────────────────────────────────────────────────────────
def erase(
    tx: Tx, execution_id: str, now: datetime, *, with_forks: bool = False
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Tombstone every payload field of a terminal run, the execution row's input first, under
    the row lock; never remove or reorder an event. Idempotent. Returns counts and the blob
    references to delete once this commits.

    A fork (reset, DAG retry) holds copies of its source's payloads and its source of the
    fork's: while any other run of the fork family is not erased, the erasure is refused
    (``ForksHoldCopies``, naming them) unless ``with_forks``, which erases the whole family in
    this one transaction — every member checked erasable before anything is written."""
    family = _lock_family(tx, execution_id)
    rows = {r.id: r for r in family}
    others = sorted(r for r in rows if r != execution_id)
    _check_erasable(tx, rows[execution_id])  # its own state first: a live run is "RUNNING"
    if not with_forks:
        holding = [r for r in others if rows[r].erased_at is None]
        if holding:
            raise ForksHoldCopies(execution_id, holding)
        return _erase_one(tx, rows[execution_id], now)
    for run_id in others:  # all or nothing: refuse before the first write
        _check_erasable(tx, rows[run_id])
    counts, refs = _erase_one(tx, rows[execution_id], now)
    for run_id in others:
        more, blobs = _erase_one(tx, rows[run_id], now)
        refs += blobs
        for key in ("events", "fields", "blobs"):
            counts[key] += more[key]
    counts["forks"] = others
    return counts, refs


def fork_family(tx: Tx, execution_id: str) -> set[str]:
    """The runs that hold copies of each other's payloads, linked to ``execution_id``
    transitively, both ways, itself included: forks (reset, DAG retry), continue-as-new links
    and parents with their children. A purged member is simply absent."""
    return linked_runs(
        tx, execution_id, (executions.c.forked_from, executions.c.continued_from, executions.c.parent_id)
    )


def linked_runs(tx: Tx, execution_id: str, links_up: Sequence[Any]) -> set[str]:
    """``execution_id`` and every run reached from it along the ``links_up`` columns (each
    names one other run), in either direction."""
    found: set[str] = set()
    frontier = {execution_id}
    while frontier:
        wanted = sorted(frontier)
        rows = tx.conn.execute(
            sa.select(executions.c.id, *links_up).where(
                sa.or_(executions.c.id.in_(wanted), *(column.in_(wanted) for column in links_up))
            )
        ).all()
        found |= {r.id for r in rows if r.id in frontier}
        linked = {r.id for r in rows} | {v for r in rows for v in r[1:] if v is not None}
        frontier = linked - found - frontier
        found |= {r.id for r in rows}
    return found


def _lock_family(tx: Tx, execution_id: str) -> list[RunRow]:
    """Lock the run and its fork family in id order (two erasures of one family never
    deadlock), then look again: a fork committed before its source's lock was taken is locked
    too, and none can start once the source is locked (``_seal_for_fork`` takes that lock)."""
    locked: dict[str, RunRow] = {}
    gone: set[str] = set()
    family = fork_family(tx, execution_id) | {execution_id}
    while family - set(locked) - gone:
        for run_id in sorted(family - set(locked) - gone):
            lock = tx.lock_existing if run_id == execution_id else tx.lock
            row = lock(run_id, payloads=True)  # the payload columns are what it erases
            if row is None:
                gone.add(run_id)  # purged meanwhile
            else:
                locked[run_id] = row
        family = fork_family(tx, execution_id) | {execution_id}
    return list(locked.values())


def _check_erasable(tx: Tx, m: RunRow) -> None:
    execution_id = m.id
    if m.status not in TERMINAL_STATUSES:
        raise InvalidState(execution_id, m.status, "erase the payloads of")
    if m.paused_at is not None and m.erased_at is None:
        raise InvalidState(execution_id, "paused", "erase the payloads of (resume it first)")
    if m.erased_at is None and _holds_waiting(tx, execution_id):  # every close abandons them
        raise InvalidState(execution_id, "closed with work still waiting", "erase the payloads of")
    if m.cancelled_at is not None and m.erased_at is None:
        running = tx.conn.execute(
            sa.select(sa.func.count())
            .select_from(activity_tasks)
            .where(
                (activity_tasks.c.execution_id == execution_id)
                & (activity_tasks.c.status == TaskStatus.RUNNING.value)
            )
        ).scalar_one()
        if running or m.decision_requested_at is not None:
            raise InvalidState(
                execution_id,
                "cancelled with work still finishing",
                "erase the payloads of (retry once it settles)",
            )


def _holds_waiting(tx: Tx, execution_id: str) -> bool:
    """A row a limit holds back: a closed run never keeps one (no waiting row outlives it)."""
    found = tx.conn.execute(
        sa.select(activity_tasks.c.activity_id)
        .where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.status == TaskStatus.WAITING.value)
        )
        .limit(1)
    ).first()
    return found is not None


def _erase_one(tx: Tx, m: RunRow, now: datetime) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    _check_erasable(tx, m)
    execution_id = m.id
    refs: list[tuple[str, str]] = []
    values: dict[str, Any] = {"erased_at": m.erased_at or now, "updated_at": now}
    fields = 0
    for column in EXECUTION_PAYLOAD_COLUMNS:
        value = getattr(m, column)
        if value is not None and not is_erased(value):
            refs += references(value)
            values[column] = ERASED
            fields += 1
    # Error messages are not payload fields (the run graph shows them), but exception text often
    # quotes the input: erasure scrubs them too, keeping the error type. We chose the safe side.
    if erase_error(m.error) != m.error:
        values["error"] = erase_error(m.error)
    tx.conn.execute(executions.update().where(executions.c.id == execution_id).values(**values))
    tx.conn.execute(
        activity_tasks.update()
        .where((activity_tasks.c.execution_id == execution_id) & activity_tasks.c.last_error.is_not(None))
        .values(last_error=ERASED_TEXT)
    )
    _delete_outbox_rows(tx, [execution_id])
    refs += _erase_attempt_errors(tx, execution_id)
    keys, key_refs = _erase_task_payloads(tx, execution_id)
    fields += keys
    refs += key_refs
    touched = 0
    for seq, data, _at in tx.raw_history(execution_id):
        changed, blobs, erased = erase_event(data)
        refs += blobs
        fields += erased
        if changed != data:
            touched += 1
            tx.conn.execute(
                events.update()
                .where((events.c.execution_id == execution_id) & (events.c.seq == seq))
                .values(data=changed)
            )
    return {
        "execution_id": execution_id,
        "events": touched,
        "fields": fields,
        "blobs": len(refs),
        "forks": [],
    }, refs


def _erase_task_payloads(tx: Tx, execution_id: str) -> tuple[int, list[tuple[str, str]]]:
    """Tombstone the task rows' payload columns (an activity's limit key): (fields, blobs)."""
    fields = 0
    refs: list[tuple[str, str]] = []
    for column in TASK_PAYLOAD_COLUMNS:
        col = activity_tasks.c[column]
        rows = tx.conn.execute(
            sa.select(activity_tasks.c.activity_id, col).where(
                (activity_tasks.c.execution_id == execution_id) & col.is_not(None)
            )
        ).all()
        for activity_id, value in rows:
            if value is None or is_erased(value):
                continue
            refs += references(value)
            fields += 1
            tx.conn.execute(
                activity_tasks.update()
                .where(
                    (activity_tasks.c.execution_id == execution_id)
                    & (activity_tasks.c.activity_id == activity_id)
                )
                .values({column: ERASED})
            )
    return fields, refs


def _delete_outbox_rows(tx: Tx, ids: Sequence[str]) -> None:
    """Delete the runs' unsent outbox rows (an older build's: an adopted task's carry its input
    as their argument) by their ``execution_id`` — never by a task-id pattern, which matched
    other runs' rows. A row an older worker wrote during a rolling deploy has none yet: its run
    is read from its arguments and headers, as migration 0006's backfill did."""
    wanted = set(ids)
    tx.conn.execute(outbox.delete().where(outbox.c.execution_id.in_(sorted(wanted))))
    legacy = tx.conn.execute(
        sa.select(outbox.c.id, outbox.c.args, outbox.c.headers).where(outbox.c.execution_id.is_(None))
    ).all()
    mine = [r.id for r in legacy if outbox_execution_id(r.args, r.headers) in wanted]
    if mine:
        tx.conn.execute(outbox.delete().where(outbox.c.id.in_(mine)))


def _erase_attempt_errors(tx: Tx, execution_id: str) -> list[tuple[str, str]]:
    """Tombstone every recorded attempt error's message and traceback (a payload: exception text
    quotes inputs); the error types stay. Returns the blobs to delete."""
    refs: list[tuple[str, str]] = []
    where = attempt_errors.c.execution_id == execution_id
    for (detail,) in tx.conn.execute(sa.select(attempt_errors.c.detail).where(where)):
        refs += references(detail)
    tx.conn.execute(attempt_errors.update().where(where).values(detail=ERASED))
    return refs


def purgeable(tx: Tx, cutoff: datetime, limit: int) -> list[str]:
    """Terminal runs closed before ``cutoff``. A continue-as-new chain, or a parent with its
    children, goes only as a whole, once every member is terminal and past the cutoff: purging
    an early link would break ``result(first_id)`` and routing."""
    q = tx.dialect.lock(
        sa.select(executions.c.id)
        .where(executions.c.status.in_(sorted(TERMINAL_STATUSES)) & (executions.c.closed_at < cutoff))
        .order_by(executions.c.closed_at)
        .limit(limit),
        skip_locked=True,
    )
    out: list[str] = []
    seen: set[str] = set()
    for (run_id,) in tx.conn.execute(q).fetchall():
        if run_id in seen:
            continue
        family = linked_runs(tx, run_id, (executions.c.continued_from, executions.c.parent_id))
        seen |= family
        members = tx.conn.execute(
            sa.select(executions.c.status, executions.c.closed_at).where(executions.c.id.in_(sorted(family)))
        ).all()
        if all(
            m.status in TERMINAL_STATUSES and (closed := aware(m.closed_at)) is not None and closed < cutoff
            for m in members
        ):
            out.extend(sorted(family))
    return out


def delete_runs(tx: Tx, ids: Sequence[str]) -> tuple[int, list[tuple[str, str]]]:
    """Delete whole runs (history, task rows, timers, updates). Returns events removed and the blob
    references to delete after commit."""
    refs: list[tuple[str, str]] = []
    removed = 0
    for execution_id in ids:
        row = tx.lock(execution_id, payloads=True)
        if row is None:
            continue
        for column in EXECUTION_PAYLOAD_COLUMNS:
            refs += references(getattr(row, column))
        for _seq, data, _at in tx.raw_history(execution_id):
            removed += 1
            for name in PAYLOAD_FIELDS.get(data.get("type", ""), ()):
                refs += references(data.get(name))
    for (detail,) in tx.conn.execute(
        sa.select(attempt_errors.c.detail).where(attempt_errors.c.execution_id.in_(list(ids)))
    ):
        refs += references(detail)
    for table in (events, activity_tasks, timers, attempt_errors, workflow_updates):
        tx.conn.execute(table.delete().where(table.c.execution_id.in_(list(ids))))
    _delete_outbox_rows(tx, ids)
    tx.conn.execute(executions.delete().where(executions.c.id.in_(list(ids))))
    return removed, refs
