"""Starting a run: the id-reuse rules, the one ``INSERT … ON CONFLICT DO NOTHING`` that keeps
concurrent starts of one id from ever colliding, and the announcement of a start made inside an
application's own transaction.

A start first inserts the run row, skipping it if the id exists. Postgres makes a second inserter
of the same id wait for the first transaction and then skip, so eighty concurrent starts of one
id give one run and seventy-nine answers read from it, never a unique violation. Only once the
row is known to be new is the input encoded (so an offloaded blob is never written over another
run's) and ``WorkflowStarted`` appended.

An existing id is then judged by the caller's ``id_reuse`` policy (``ID_REUSE``):

* ``"idempotent"`` (the default): the same workflow with the same input is the same start, and
  answers the existing run; a different input raises ``ExecutionAlreadyExists(conflict="input")``.
  Inputs are compared by their digest (``_payloads.digest``), stored at start before any codec,
  so the rule holds for encrypted, offloaded and erased runs;
* ``"use_existing"``: any existing run of that workflow is the answer, whatever its input (first
  start wins; ``signal_with_start`` uses it, its input only matters when it creates the run);
* ``"reject"``: an existing id always raises ``ExecutionAlreadyExists(conflict="exists")``.

An id taken by another workflow always raises ``ExecutionAlreadyExists(conflict="workflow")``.

A start written on an application's connection cannot send its decision request (nothing may be
sent before the application commits). It is *announced* instead: ``pg_notify`` on
``harvest_runs_started``, which Postgres delivers only if that transaction commits. Whoever hears
it first — a decision worker's sweeper listening on the channel, or the application's own
after-commit hook — *claims* it (``take_started``: an UPDATE that only one claimant can win) and
sends the one decision message. If nobody does, the run's ``decision_requested_at`` is the durable
record and the sweeper re-requests it after ``Timings.redispatch_after``.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from harvest_celery._core import events as ev
from harvest_celery._core.deadlines import Timeouts
from harvest_celery._core.lifecycle import RUNNING
from harvest_celery._errors import ExecutionAlreadyExists, PayloadCodecError, PayloadStoreError
from harvest_celery._payloads.digest import input_digest
from harvest_celery._payloads.erasure import is_erased
from harvest_celery._store import admission, sql
from harvest_celery._store.predicates import operator_live
from harvest_celery._store.records import Dispatch, RunRow, aware
from harvest_celery._store.schema import events, executions
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")

ID_REUSE = ("idempotent", "use_existing", "reject")
STARTS_CHANNEL = sql.STARTS_CHANNEL


def check_policy(id_reuse: str) -> str:
    if id_reuse not in ID_REUSE:
        raise ValueError(f"id_reuse must be one of {', '.join(ID_REUSE)}, not {id_reuse!r}")
    return id_reuse


def new_run_values(
    execution_id: str, workflow_type: str, digest: str, now: datetime, decision_queue: str
) -> dict[str, Any]:
    """The run row of a new start, before its input is encoded; ``decision_queue`` is where
    every later decision request of the run goes (``RunRow.decide_on``)."""
    return {
        "decision_queue": decision_queue,
        "id": execution_id,
        "workflow_type": workflow_type,
        "status": RUNNING,
        "input": None,
        "input_digest": digest,
        "next_seq": 0,
        "created_at": now,
        "updated_at": now,
        "nd_block_count": 0,
    }


def start(
    tx: Tx,
    execution_id: str,
    workflow_type: str,
    input: Any,
    now: datetime,
    decision_queue: str,
    *,
    id_reuse: str = "idempotent",
    announce: bool = False,
    scheduled_for: datetime | None = None,
    timeouts: Timeouts | None = None,
    traceparent: str | None = None,
    admission: dict[str, Any] | None = None,
) -> bool:
    """Create a run with its ``WorkflowStarted`` and request its first decision. False if the id
    exists and ``id_reuse`` accepts it (nothing written); ``ExecutionAlreadyExists`` if not.
    ``announce``: the transaction is the application's, so the request is also announced (see
    the module docstring). ``scheduled_for``: a schedule's tick, recorded in ``WorkflowStarted``.
    ``timeouts``: its deadlines, from ``now``; a repeated start compares workflow and input
    only, so the first start's deadlines stand. ``traceparent``: the run span's context
    (tracing on), written by the insert itself and never compared: the first start's stands.
    ``admission``: its admission columns (``admission.Prepared``): a limited run is written
    waiting; its key is settled only in harvest's own transaction, never an application's."""
    check_policy(id_reuse)
    digest = input_digest(execution_id, input)
    values = new_run_values(execution_id, workflow_type, digest, now, decision_queue)
    values.update(admission or {})
    values.update((timeouts or Timeouts()).deadlines(now))
    if traceparent is not None or tx.trace_start is not None:  # tx.trace_start: a schedule's tick
        values["traceparent"] = traceparent or tx.trace_start(execution_id, workflow_type)  # type: ignore[misc]
    insert = tx.dialect.insert_ignore(executions).values(**values).returning(*executions.c)
    for _ in range(3):  # the existing row may vanish between the two statements (purged): again
        inserted = tx.conn.execute(insert).first()
        if inserted is not None:
            break
        found = tx.conn.execute(
            sa.select(executions.c.workflow_type, executions.c.status, executions.c.input_digest).where(
                executions.c.id == execution_id
            )
        ).first()
        if found is not None:
            check_reuse(
                execution_id,
                found[0],
                found[1],
                found[2],
                workflow_type,
                digest,
                id_reuse,
                lambda: _legacy_digest(tx, execution_id),
            )
            return False
    else:
        raise ExecutionAlreadyExists(execution_id, "?", "exists")
    _started(tx, RunRow.from_mapping(inserted._mapping), input, now, decision_queue, announce, scheduled_for)
    return True


def _started(
    tx: Tx, row: RunRow, input: Any, now: datetime, queue: str, announce: bool, tick: datetime | None
) -> None:
    """A new run's ``WorkflowStarted`` and first decision request (none while it waits for
    admission: its key is settled before commit, in harvest's own transaction only)."""
    encoded = tx.payloads.encode_value(input, f"{row.id}/input")
    at = tick.isoformat() if tick is not None else None
    started = ev.WorkflowStarted(row.workflow_type, input, scheduled_for=at, priority=row.priority)
    tx.append(row, [started], now, decide_on=queue, input=encoded)
    if row.waiting and not announce:
        tx.touch_admission(row.workflow_type, row.limit_digest)
    if announce:
        tx.dialect.announce_start(tx.conn, start_notice(row.id, now, queue))


def check_reuse(
    execution_id: str,
    existing_type: str,
    status: str,
    existing_digest: str | None,
    workflow_type: str,
    digest: str,
    id_reuse: str,
    legacy_digest: Callable[[], str | None],
) -> None:
    """Judge a start of an id that exists (module docstring); returns if it may answer it.
    ``legacy_digest``: the digest of a run started before digests were stored, from its decoded
    input (None when that can no longer be read: erased, or its key or store is gone)."""
    if existing_type != workflow_type:
        raise ExecutionAlreadyExists(
            execution_id, existing_type, "workflow", requested=workflow_type, status=status
        )
    if id_reuse == "reject":
        raise ExecutionAlreadyExists(execution_id, existing_type, "exists", status=status)
    if id_reuse == "use_existing":
        return
    stored = existing_digest if existing_digest is not None else legacy_digest()
    if stored is not None and stored != digest:
        raise ExecutionAlreadyExists(execution_id, existing_type, "input", status=status)


def legacy_digest_of(execution_id: str, stored_input: Any, decode: Callable[[Any], Any]) -> str | None:
    if stored_input is None:  # the input was null (encoding keeps null as null)
        return input_digest(execution_id, None)
    if is_erased(stored_input):
        return None
    try:
        return input_digest(execution_id, decode(stored_input))
    except (PayloadStoreError, PayloadCodecError) as exc:
        log.warning(
            "cannot compare the input of a second start of %s with the first (%s): "
            "answered with the existing run",
            execution_id,
            exc,
            extra={"execution_id": execution_id},  # a run line's field (_runtime.logs)
        )
        return None


def _legacy_digest(tx: Tx, execution_id: str) -> str | None:
    stored = tx.conn.execute(sa.select(executions.c.input).where(executions.c.id == execution_id)).scalar()
    return legacy_digest_of(execution_id, stored, tx.payloads.decode_value)


def trace_context(tx: Tx, execution_id: str) -> Any:
    """What tracing reads of a run (its stored traceparent, workflow, status, times and
    parent), or None for an unknown id."""
    c = executions.c
    return tx.conn.execute(
        sa.select(
            c.traceparent,
            c.workflow_type,
            c.status,
            c.created_at,
            c.closed_at,
            c.parent_id,
            c.continued_from,
            c.forked_from,
        ).where(c.id == execution_id)
    ).first()


def chain_root_traceparent(tx: Tx, execution_id: str) -> str | None:
    """The stored context of the first run of a continue-as-new chain still stored (one
    recursive query back along ``continued_from``)."""
    c = executions.c
    chain = sa.select(c.id, c.continued_from, c.traceparent).where(c.id == execution_id).cte(recursive=True)
    earlier = executions.alias("earlier")
    chain = chain.union_all(
        sa.select(earlier.c.id, earlier.c.continued_from, earlier.c.traceparent).where(
            earlier.c.id == chain.c.continued_from
        )
    )
    rows = tx.conn.execute(sa.select(chain.c.id, chain.c.continued_from, chain.c.traceparent)).all()
    ids = {r.id for r in rows}
    first = next((r for r in rows if r.continued_from not in ids), None)
    return first.traceparent if first is not None else None


WAIT_EVENTS = ("TimerStarted", "TimerFired", "SignalReceived")


class WaitEvent(NamedTuple):
    type: str
    timer_id: str | None
    seconds: float | None
    name: str | None
    recorded_at: datetime | None


def wait_events(tx: Tx, execution_id: str, limit: int) -> list[WaitEvent]:
    """A run's timer and signal events, in order (the first ``limit``): their type, timer id,
    seconds, signal name and time, never a payload field (tracing's run span events)."""
    data = events.c.data
    kind = data["type"].as_string()
    rows = tx.conn.execute(
        sa.select(
            kind.label("type"),
            data["timer_id"].as_string().label("timer_id"),
            data["seconds"].as_float().label("seconds"),
            data["name"].as_string().label("name"),
            events.c.recorded_at,
        )
        .where((events.c.execution_id == execution_id) & kind.in_(WAIT_EVENTS))
        .order_by(events.c.seq)
        .limit(limit)
    ).all()
    return [WaitEvent(r.type, r.timer_id, r.seconds, r.name, aware(r.recorded_at)) for r in rows]


def inherited_traceparent(tx: Tx, source_id: str, *, new_trace: bool = False) -> str | None:
    """A child's (or continued run's) stored trace context: its source's trace and flags, a span
    id of its own (its run span's); ``new_trace``: a trace of its own too (a fork's). None when
    the source is not traced. Plain text: the store knows no tracer."""
    source = tx.conn.execute(sa.select(executions.c.traceparent).where(executions.c.id == source_id)).scalar()
    parts = (source or "").split("-")
    if len(parts) != 4:
        return None
    trace_id = f"{secrets.randbits(128) | 1:032x}" if new_trace else parts[1]
    return f"{parts[0]}-{trace_id}-{secrets.randbits(64) | 1:016x}-{parts[3]}"


def forked_traceparent(tx: Tx, source_id: str) -> str | None:
    """A fork's stored context: a new trace, its run span linked to its source's at close."""
    return inherited_traceparent(tx, source_id, new_trace=True)


# ── the announcement and its claim ───────────────────────────────────────────────────────────
def start_notice(execution_id: str, requested_at: datetime, decision_queue: str) -> str:
    """The payload of ``NOTIFY harvest_runs_started``: the run, the exact request time written
    (what a claim matches) and the decision queue it is for (a worker claims only its own)."""
    return json.dumps(
        {"id": execution_id, "at": requested_at.isoformat(), "q": decision_queue}, separators=(",", ":")
    )


def parse_notice(text: str) -> tuple[str, datetime, str] | None:
    try:
        data = json.loads(text)
        return str(data["id"]), datetime.fromisoformat(data["at"]), str(data["q"])
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring a malformed %s notification: %r", STARTS_CHANNEL, text[:200])
        return None


def take_started(
    tx: Tx, started: Sequence[tuple[str, datetime]], now: datetime, decision_queue: str, *, admit: bool = True
) -> int:
    """Claim announced starts: a run whose decision request is still the one its start wrote
    gets a fresh request time (the sweeper's lost-message clock restarts) and one decision
    dispatch. Two claimants of one start race on that row; only the first matches. Returns how
    many were claimed. ``admit``: the unclaimed ones that wait for admission have their keys
    settled before this transaction commits (never in autocommit: the settle takes locks)."""
    claimed = 0
    unclaimed: list[str] = []
    for execution_id, requested_at in started:
        updated = tx.conn.execute(
            executions.update()
            .where(
                (executions.c.id == execution_id)
                & (executions.c.decision_requested_at == requested_at)
                & operator_live.core(executions)
                & executions.c.admitted_at.is_not(None)
            )
            .values(decision_requested_at=now)
        ).rowcount
        # a run waiting for admission matches nothing here (no request was written): its
        # claimant admits it in a transaction of its own (``admission.admit_started``)
        if updated:
            tx.dispatches.append(
                Dispatch(Dispatch.DECIDE, execution_id, decision_queue, requested_at=now.timestamp())
            )
            claimed += 1
        else:
            unclaimed.append(execution_id)
    if admit and unclaimed:
        admission.admit_started(tx, unclaimed)
    return claimed
