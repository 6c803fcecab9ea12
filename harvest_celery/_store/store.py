"""Persistence behind one seam. All SQL lives here; nothing here knows Celery.

``Store.begin()`` opens one transaction as a ``Tx``. Every change to a run happens under
``Tx.lock(execution_id)`` (``SELECT … FOR UPDATE`` on the execution row), so appends to one history
are serialised and the ``(execution_id, seq)`` key makes a forked history impossible even if a
caller forgot the lock.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from harvest_celery._core import events as ev
from harvest_celery._core.commands import Decision, ScheduleActivity, StartTimer
from harvest_celery._core.lifecycle import (
    RUNNING,
    TERMINAL_STATUSES,
    decision_events,
    status_after_cancel,
    status_for_outcome,
)
from harvest_celery._core.names import START_TO_CLOSE_TIMEOUT
from harvest_celery._core.registry import Registry
from harvest_celery._errors import ExecutionAlreadyExists, ExecutionNotFound, HarvestError, InvalidState
from harvest_celery._payloads.pipeline import EXECUTION_PAYLOAD_COLUMNS, Payloads
from harvest_celery._store import runs as ops
from harvest_celery._store.schema import activity_tasks, events, executions, outbox, timers

DECIDE_TASK = "harvest.decide"
TIME_LIMIT_HEADER = "harvest_time_limit"
log = logging.getLogger("harvest_celery")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything here is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


@dataclass(frozen=True)
class OutboxMessage:
    """A Celery message to send after commit. Carries ids only (adopted tasks excepted)."""

    id: int
    task_name: str
    queue: str
    args: list[Any]
    task_id: str
    headers: dict[str, Any] | None = None


@dataclass(frozen=True)
class Execution:
    id: str
    workflow_type: str
    status: str
    input: Any
    result: Any
    error: Any
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    cancelled_at: datetime | None
    cancel_reason: str | None
    nd_blocked_at: datetime | None
    nd_block_reason: str | None
    nd_block_count: int
    nd_details: dict[str, Any] | None
    history_length: int
    erased_at: datetime | None = None
    paused_at: datetime | None = None
    forked_from: str | None = None
    forked_to: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> Execution:
        m = row._mapping
        return cls(
            id=m["id"], workflow_type=m["workflow_type"], status=m["status"], input=m["input"],
            result=m["result"], error=m["error"], created_at=_aware(m["created_at"]),  # type: ignore[arg-type]
            updated_at=_aware(m["updated_at"]), closed_at=_aware(m["closed_at"]),  # type: ignore[arg-type]
            cancelled_at=_aware(m["cancelled_at"]), cancel_reason=m["cancel_reason"],
            nd_blocked_at=_aware(m["nd_blocked_at"]), nd_block_reason=m["nd_block_reason"],
            nd_block_count=m["nd_block_count"] or 0, nd_details=m["nd_details"],
            history_length=m["next_seq"], erased_at=_aware(m["erased_at"]),
            paused_at=_aware(m["paused_at"]), forked_from=m["forked_from"], forked_to=m["forked_to"],
        )

    @property
    def nd_blocked(self) -> bool:
        return self.nd_blocked_at is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        out["nd_blocked"] = self.nd_blocked
        return out


@dataclass(frozen=True)
class Claim:
    """What a successful pre-run claim hands the worker."""

    execution_id: str
    activity_id: str
    activity_name: str
    attempt: int
    input: Any
    start_to_close: float | None


@dataclass(frozen=True)
class Timings:
    """Sweeper and lease settings."""

    # seconds a claim holds without start_to_close; renewed every third of it while the body
    # runs, so it bounds how long a vanished worker's activity waits to be retried
    default_lease: float = 60.0
    redispatch_after: float = 30.0  # re-send a scheduled row / decision request after this
    nd_retry_initial: float = 1.0
    nd_retry_max: float = 300.0


class Store:
    """Owns the SQLAlchemy engine (one per process: rebuilt after fork)."""

    def __init__(self, database_url: str, *, echo: bool = False, payloads: Payloads | None = None) -> None:
        self.database_url = database_url
        self._echo = echo
        self.payloads = payloads or Payloads()
        bind = getattr(self.payloads.store, "bind", None)
        if bind is not None:
            bind(database_url)
        self._engine: Engine | None = None
        self._pid = -1
        self._lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        # Never use an engine inherited across fork (Celery prefork): its sockets are shared.
        if self._engine is None or self._pid != os.getpid():
            with self._lock:
                if self._engine is None or self._pid != os.getpid():
                    if self._engine is not None:
                        self._engine.dispose(close=False)
                    self._engine = self._create_engine()
                    self._pid = os.getpid()
        return self._engine

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def _create_engine(self) -> Engine:
        if self.is_sqlite:
            engine = sa.create_engine(self.database_url, echo=self._echo,
                                      connect_args={"check_same_thread": False, "timeout": 30})

            @sa.event.listens_for(engine, "connect")
            def _fk_on(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.execute("PRAGMA foreign_keys=ON")
                dbapi_conn.execute("PRAGMA journal_mode=WAL")

            return engine
        return sa.create_engine(self.database_url, echo=self._echo, pool_pre_ping=True,
                                pool_size=5, max_overflow=10)

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @contextmanager
    def begin(self) -> Iterator[Tx]:
        with self.engine.begin() as conn:
            yield Tx(conn, self.is_sqlite, self.payloads)

    def ping(self) -> None:
        """A trivial query: raises if the database does not answer."""
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    # ── reads that need no lock ──────────────────────────────────────────────────────────────
    def get(self, execution_id: str) -> Execution:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(executions).where(executions.c.id == execution_id)).first()
        if row is None:
            raise ExecutionNotFound(execution_id)
        execution = Execution.from_row(row)
        decoded = {}
        for column in EXECUTION_PAYLOAD_COLUMNS:  # a read-only view: degrade, never fail
            try:
                decoded[column] = self.payloads.decode_value(getattr(execution, column))
            except HarvestError as exc:
                log.warning("execution %s: %s stays encoded: %s", execution_id, column, exc)
        return dataclasses.replace(execution, **decoded) if decoded else execution

    def history(self, execution_id: str, *, strict: bool = True) -> list[ev.HistoryEvent]:
        """The history, decoded. Blobs are inflated after the connection is released. ``strict``
        raises on a payload that cannot be decoded; otherwise it is logged and left raw (for
        read-only views)."""
        with self.engine.connect() as conn:
            raw = Tx(conn, self.is_sqlite, self.payloads).raw_history(execution_id)
        return [self._decoded(r, strict) for r in raw]

    def _decoded(self, raw: tuple[int, dict[str, Any], datetime], strict: bool) -> ev.HistoryEvent:
        seq, data, recorded_at = raw
        try:
            data = self.payloads.decode_event(data)
        except HarvestError as exc:
            if strict:
                raise
            log.warning("event %s stays encoded: %s", seq, exc)
        return ev.HistoryEvent(seq, ev.event_from_data(data), recorded_at)

    def list(self, *, status: str | None = None, workflow_type: str | None = None,
             nd_blocked: bool | None = None, limit: int = 100, offset: int = 0) -> builtins.list[Execution]:
        q = sa.select(executions).order_by(executions.c.created_at.desc(), executions.c.id)
        if status:
            q = q.where(executions.c.status == status)
        if workflow_type:
            q = q.where(executions.c.workflow_type == workflow_type)
        if nd_blocked is True:
            q = q.where(executions.c.nd_blocked_at.is_not(None))
        elif nd_blocked is False:
            q = q.where(executions.c.nd_blocked_at.is_(None))
        with self.engine.connect() as conn:
            rows = conn.execute(q.limit(limit).offset(offset)).fetchall()
        return [Execution.from_row(r) for r in rows]

    def activity_rows(self, execution_id: str) -> builtins.list[dict[str, Any]]:
        q = sa.select(activity_tasks).where(activity_tasks.c.execution_id == execution_id)
        with self.engine.connect() as conn:
            rows = conn.execute(q.order_by(activity_tasks.c.event_seq)).fetchall()
        return [dict(r._mapping) for r in rows]

    def erase(self, execution_id: str) -> dict[str, Any]:
        """PII erasure of one terminal run (see ``_store_ops.erase``); deletes its offloaded
        blobs once the tombstones commit."""
        with self.begin() as tx:
            counts, refs = ops.erase(tx, execution_id, utcnow())
        self._delete_blobs(refs)
        return counts

    def purge(self, older_than_days: float, batch: int = 500) -> dict[str, int]:
        """Delete terminal runs closed more than ``older_than_days`` ago, in bounded batches;
        never a live run."""
        cutoff = utcnow() - timedelta(days=older_than_days)
        totals = {"runs": 0, "events": 0, "blobs": 0}
        while True:
            with self.begin() as tx:
                ids = ops.purgeable(tx, cutoff, batch)
                removed, refs = ops.delete_runs(tx, ids) if ids else (0, [])
            self._delete_blobs(refs)
            totals["runs"] += len(ids)
            totals["events"] += removed
            totals["blobs"] += len(refs)
            if len(ids) < batch:
                return totals

    def _delete_blobs(self, refs: Sequence[tuple[str, str]]) -> None:
        store = self.payloads.store
        for store_id, key in refs:
            if store is not None and store.store_id == store_id:
                store.delete(key)
            else:
                log.warning("blob %s lives in payload store %r, which is not configured: not deleted",
                            key, store_id)

    def delete_outbox(self, ids: Sequence[int]) -> None:
        if ids:
            with self.engine.begin() as conn:
                conn.execute(outbox.delete().where(outbox.c.id.in_(list(ids))))


class Tx:
    """One transaction. Methods named for what they do to a run."""

    def __init__(self, conn: Connection, sqlite: bool, payloads: Payloads | None = None) -> None:
        self.conn = conn
        self.sqlite = sqlite
        self.payloads = payloads or Payloads()
        self.outbox: list[OutboxMessage] = []
        self.metrics: list[tuple[str, dict[str, str]]] = []

    # ── rows and history ─────────────────────────────────────────────────────────────────────
    def lock(self, execution_id: str, *, skip_locked: bool = False) -> Any:
        q = sa.select(executions).where(executions.c.id == execution_id)
        row = self.conn.execute(q.with_for_update(skip_locked=skip_locked)).first()
        return row

    def lock_existing(self, execution_id: str) -> Any:
        row = self.lock(execution_id)
        if row is None:
            raise ExecutionNotFound(execution_id)
        return row

    def raw_history(self, execution_id: str, since: int = 0) -> list[tuple[int, dict[str, Any], datetime]]:
        """Stored events, payload fields as written (possibly encoded or offloaded)."""
        q = (sa.select(events.c.seq, events.c.data, events.c.recorded_at)
             .where((events.c.execution_id == execution_id) & (events.c.seq >= since))
             .order_by(events.c.seq))
        return [(r.seq, r.data, _aware(r.recorded_at)) for r in self.conn.execute(q)]  # type: ignore[misc]

    def history(self, execution_id: str, since: int = 0) -> list[ev.HistoryEvent]:
        """Decoded history for a decision, from position ``since`` (strict: replay cannot run on
        opaque payloads)."""
        return [ev.HistoryEvent(seq, ev.event_from_data(self.payloads.decode_event(data)), at)
                for seq, data, at in self.raw_history(execution_id, since)]

    def append(self, row: Any, new_events: Sequence[ev.Event], now: datetime, *,
               decide_on: str | None = None, **values: Any) -> int:
        """Append events at the run's next positions (the row must be locked) and update the row
        with ``values`` in the same statement. ``decide_on``: also request a decision on that queue
        unless one is pending. Returns the seq of the first event."""
        first = row._mapping["next_seq"]
        execution_id = row._mapping["id"]
        if new_events:
            self.conn.execute(events.insert(), [
                {"execution_id": execution_id, "seq": first + i, "type": e.type,
                 "data": self.payloads.encode_event(e.to_data(), f"{execution_id}/{first + i}"),
                 "recorded_at": now}
                for i, e in enumerate(new_events)
            ])
            values.update(next_seq=first + len(new_events), updated_at=now)
        if decide_on is not None and row._mapping["decision_requested_at"] is None:
            values["decision_requested_at"] = now
            self._send(DECIDE_TASK, decide_on, [execution_id], f"decide:{execution_id}:{now.timestamp()}", now)
        if values:
            self.conn.execute(executions.update().where(executions.c.id == execution_id).values(**values))
        return int(first)

    def _send(self, task_name: str, queue: str, args: list[Any], task_id: str, now: datetime,
              headers: dict[str, Any] | None = None) -> None:
        result = self.conn.execute(outbox.insert().values(
            task_name=task_name, queue=queue, args=args, task_id=task_id, created_at=now,
            headers=headers))
        key = result.inserted_primary_key
        assert key is not None
        self.outbox.append(OutboxMessage(int(key[0]), task_name, queue, args,
                                         task_id, headers))

    def request_decision(self, execution_id: str, now: datetime, queue: str, *,
                         force: bool = False) -> None:
        """Ask for a decision unless one is already requested and not yet taken."""
        cond = executions.c.id == execution_id
        if not force:
            cond = cond & executions.c.decision_requested_at.is_(None)
        updated = self.conn.execute(executions.update().where(cond).values(decision_requested_at=now))
        if updated.rowcount:
            self._send(DECIDE_TASK, queue, [execution_id], f"decide:{execution_id}:{now.timestamp()}", now)

    # ── starting ─────────────────────────────────────────────────────────────────────────────
    def start(self, execution_id: str, workflow_type: str, input: Any, now: datetime,
              decision_queue: str) -> bool:
        """Create a run with its WorkflowStarted. False if it already exists (idempotent)."""
        row = self.lock(execution_id)
        if row is not None:
            if row._mapping["workflow_type"] != workflow_type:
                raise ExecutionAlreadyExists(execution_id, row._mapping["workflow_type"])
            return False
        self.conn.execute(executions.insert().values(
            id=execution_id, workflow_type=workflow_type, status=RUNNING,
            input=self.payloads.encode_value(input, f"{execution_id}/input"), next_seq=0,
            created_at=now, updated_at=now, nd_block_count=0))
        row = self.lock_existing(execution_id)
        self.append(row, [ev.WorkflowStarted(workflow_type, input)], now, decide_on=decision_queue)
        return True

    def signal(self, execution_id: str, name: str, payload: Any, now: datetime, decision_queue: str) -> None:
        row = self.lock_existing(execution_id)
        status = row._mapping["status"]
        if status != RUNNING:
            raise InvalidState(execution_id, status, "signal")
        self.append(row, [ev.SignalReceived(name, payload)], now, decide_on=decision_queue)

    # ── the decision cycle ───────────────────────────────────────────────────────────────────
    def take_decision_request(self, execution_id: str) -> Any:
        """Lock the run for a decision and clear its request flag. None if there is nothing to
        decide (unknown, or terminal with no cancel to follow up)."""
        row = self.lock(execution_id)
        if row is None:
            return None
        m = row._mapping
        if ((m["status"] != RUNNING and m["cancelled_at"] is None) or m["paused_at"] is not None
                or m["erased_at"] is not None):
            # nothing to decide (a paused run is resumed later with a fresh request)
            if m["decision_requested_at"] is not None:
                self.conn.execute(executions.update().where(executions.c.id == execution_id)
                                  .values(decision_requested_at=None))
            return None
        return row  # apply_decision clears the request flag in its own update

    def apply_decision(self, row: Any, history: Sequence[ev.Event], decision: Decision,
                       registry: Registry, now: datetime, timings: Timings, workflow_label: str) -> None:
        m = row._mapping
        execution_id = m["id"]
        if decision.nd is not None:
            # nd-blocked: still RUNNING, nothing appended, retried with backoff.
            count = (m["nd_block_count"] or 0) + 1
            delay = min(timings.nd_retry_initial * 2 ** min(count - 1, 16), timings.nd_retry_max)
            self.conn.execute(executions.update().where(executions.c.id == execution_id).values(
                nd_blocked_at=m["nd_blocked_at"] or now,
                nd_block_reason=f"expected {decision.nd['expected']}, got {decision.nd['actual']}",
                nd_block_count=count, nd_details=decision.nd, nd_retry_at=now + timedelta(seconds=delay),
                updated_at=now, decision_requested_at=None))
            return
        new_events = decision_events(decision, history)
        status = status_for_outcome(decision, m["status"])
        # one UPDATE of the run row per decision, folded into the append
        values: dict[str, Any] = {}
        if m["decision_requested_at"] is not None:
            values["decision_requested_at"] = None
        if status != m["status"]:
            values["status"] = status
        if m["nd_blocked_at"] is not None or m["nd_retry_at"] is not None:
            values.update(nd_blocked_at=None, nd_block_reason=None, nd_details=None, nd_retry_at=None,
                          nd_block_count=0)
        outcome_events = [e for e in new_events if isinstance(e, ev.TERMINAL_EVENTS)]
        if outcome_events:
            done = outcome_events[0]
            if isinstance(done, ev.WorkflowCompleted):
                values["result"] = self.payloads.encode_value(done.result, f"{execution_id}/result")
            elif isinstance(done, ev.WorkflowFailed):
                values["error"] = {"type": done.error_type, "message": done.message}
        if status != m["status"] and status in TERMINAL_STATUSES:
            values["closed_at"] = now
            self.abandon_open_tasks(execution_id, now, "the workflow finished without awaiting it")
        first = self.append(row, new_events, now, **values)
        seq = {id(c): first + i for i, c in enumerate(decision.commands)}
        for command in decision.commands:
            if isinstance(command, ScheduleActivity):
                self._insert_task(execution_id, command, seq[id(command)], registry, now)
            elif isinstance(command, StartTimer):
                self.conn.execute(timers.insert().values(
                    execution_id=execution_id, timer_id=command.timer_id,
                    fire_at=datetime.fromisoformat(command.fire_at), fired=False))
        for metric in decision.metrics:
            self.metrics.append((metric, {"workflow": workflow_label}))
        if status != m["status"] and status in TERMINAL_STATUSES:
            outcome = "completed" if status == "COMPLETED" else "failed"
            self.metrics.append(("workflow_terminal", {"workflow": workflow_label, "outcome": outcome}))

    def _insert_task(self, execution_id: str, command: ScheduleActivity, event_seq: int,
                     registry: Registry, now: datetime) -> None:
        definition = registry.activity(command.activity_name)
        self.conn.execute(activity_tasks.insert().values(
            execution_id=execution_id, activity_id=command.activity_id,
            activity_name=command.activity_name, queue=command.queue, status="scheduled", attempt=1,
            retry=(command.retry or definition.retry).to_data(),
            start_to_close=command.start_to_close or definition.start_to_close,
            event_seq=event_seq, dispatched_at=now, compensation=command.compensation,
            adopted=definition.adopted))
        self._dispatch_activity(execution_id, command.activity_id, command.activity_name,
                                command.queue, 1, now, definition.adopted, command.input,
                                command.start_to_close or definition.start_to_close)

    def _dispatch_activity(self, execution_id: str, activity_id: str, name: str, queue: str,
                           attempt: int, now: datetime, adopted: bool, input: Any = None,
                           start_to_close: float | None = None) -> None:
        ref = {"execution_id": execution_id, "activity_id": activity_id, "attempt": attempt}
        task_id = f"{execution_id}:{activity_id}:{attempt}"
        # the row's deadline (a DAG node's override included) becomes the message's Celery time
        # limit, so a prefork worker stops the body when its lease runs out
        headers: dict[str, Any] | None = {TIME_LIMIT_HEADER: start_to_close} if start_to_close else None
        if adopted:
            # An existing task keeps its signature: the input is its argument (it transits the
            # broker), and the ids travel in a header.
            if input is None:
                input = self._scheduled_input(execution_id, activity_id)
            self._send(name, queue, [input], task_id, now, headers={"harvest": ref, **(headers or {})})
        else:
            self._send(name, queue, [execution_id, activity_id, attempt], task_id, now, headers=headers)

    def _scheduled_input(self, execution_id: str, activity_id: str) -> Any:
        seq = self.conn.execute(sa.select(activity_tasks.c.event_seq).where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id))).scalar_one()
        data = self.conn.execute(sa.select(events.c.data).where(
            (events.c.execution_id == execution_id) & (events.c.seq == seq))).scalar_one()
        return self.payloads.decode_event(data).get("input")

    # ── the activity side ────────────────────────────────────────────────────────────────────
    def claim(self, execution_id: str, activity_id: str, attempt: int, worker_id: str,
              now: datetime, timings: Timings) -> Claim | None:
        """The pre-run claim: mark the row running and append ActivityStarted, or refuse.

        Refused for a re-sent or redelivered message (row not ``scheduled`` or another attempt),
        a row a cancel failed, or an unknown row. A refused claim means the body must not run.
        """
        row = self.lock(execution_id)
        if row is None or not self._can_append_result(row):
            return None  # erased, or finished: nothing more runs for it
        task = self.conn.execute(sa.select(activity_tasks).where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id)).with_for_update()).first()
        if task is None:
            return None
        t = task._mapping
        if t["status"] != "scheduled" or t["attempt"] != attempt:
            return None
        lease = t["start_to_close"] or timings.default_lease
        self.conn.execute(activity_tasks.update().where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id)).values(
            status="running", worker_id=worker_id, started_at=now,
            lease_expires_at=now + timedelta(seconds=lease + 5)))
        self.append(row, [ev.ActivityStarted(activity_id, attempt, worker_id)], now)
        data = self.conn.execute(sa.select(events.c.data).where(
            (events.c.execution_id == execution_id) & (events.c.seq == t["event_seq"]))).scalar_one()
        return Claim(execution_id, activity_id, t["activity_name"], attempt,
                     self.payloads.decode_event(data).get("input"), t["start_to_close"])

    def _running_task(self, execution_id: str, activity_id: str) -> tuple[Any, Any] | None:
        row = self.lock(execution_id)
        if row is None:
            return None
        task = self.conn.execute(sa.select(activity_tasks).where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id)).with_for_update()).first()
        if task is None or task._mapping["status"] in ("completed", "failed"):
            return None  # a duplicate completion: already recorded once
        return row, task

    def _can_append_result(self, row: Any) -> bool:
        """A live run records results; so does a cancelled one (a body that was running when the
        cancel landed did its side effect, and the history must say so)."""
        m = row._mapping
        if m["erased_at"] is not None:
            return False  # nothing is appended to a run once it is erased
        return bool(m["status"] == RUNNING or m["cancelled_at"] is not None)

    def complete_activity(self, execution_id: str, activity_id: str, attempt: int, output: Any,
                          now: datetime, decision_queue: str) -> bool:
        found = self._running_task(execution_id, activity_id)
        if found is None:
            return False
        row, _task = found
        self._finish_task(execution_id, activity_id, "completed", now, None)
        if self._can_append_result(row):
            self.append(row, [ev.ActivityCompleted(activity_id, output, attempt)], now,
                        decide_on=decision_queue)
        return True

    def fail_activity(self, execution_id: str, activity_id: str, attempt: int, error_type: str,
                      message: str, now: datetime, decision_queue: str) -> str:
        """Record a failed attempt: schedule a retry (no event) or fail for good. Returns
        ``"retry"``, ``"failed"`` or ``"ignored"``."""
        from harvest_celery._core.retry import RetryPolicy

        found = self._running_task(execution_id, activity_id)
        if found is None:
            return "ignored"
        row, task = found
        t = task._mapping
        if t["attempt"] != attempt or t["status"] != "running":
            # a stale attempt (a newer one owns the row), or a row a cancel already failed: a
            # cancel never fails an await, so nothing may be recorded for it
            return "ignored"
        policy = RetryPolicy.from_data(t["retry"])
        if policy.should_retry(attempt, error_type) and row._mapping["status"] == RUNNING:
            self.conn.execute(activity_tasks.update().where(
                (activity_tasks.c.execution_id == execution_id)
                & (activity_tasks.c.activity_id == activity_id)).values(
                status="retry_wait", due_at=now + timedelta(seconds=policy.delay_after(attempt)),
                last_error=f"{error_type}: {message}", worker_id=None, lease_expires_at=None))
            return "retry"
        self._finish_task(execution_id, activity_id, "failed", now, f"{error_type}: {message}")
        if self._can_append_result(row):
            self.append(row, [ev.ActivityFailed(activity_id, error_type, message, attempt)], now,
                        decide_on=decision_queue)
        return "failed"

    def _finish_task(self, execution_id: str, activity_id: str, status: str, now: datetime,
                     error: str | None) -> None:
        values: dict[str, Any] = {"status": status, "finished_at": now, "lease_expires_at": None}
        if error is not None:
            values["last_error"] = error
        self.conn.execute(activity_tasks.update().where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id)).values(**values))

    # ── operator actions ─────────────────────────────────────────────────────────────────────
    def cancel(self, execution_id: str, reason: str, now: datetime, decision_queue: str) -> str:
        """Seal the run: append WorkflowCancelled, set CANCELLED (FAILED mid-unwind), fail every
        open task row that has not started — no event for those — and request the post-cancel
        decision. Returns the new status."""
        row = self.lock_existing(execution_id)
        status = row._mapping["status"]
        if status != RUNNING:
            raise InvalidState(execution_id, status, "cancel")
        history = [h.event for h in self.history(execution_id)]
        self.append(row, [ev.WorkflowCancelled(reason)], now)
        new_status = status_after_cancel(history)
        self.conn.execute(executions.update().where(executions.c.id == execution_id).values(
            status=new_status, cancelled_at=now, cancel_reason=reason, closed_at=now, updated_at=now,
            nd_retry_at=None, paused_at=None))
        self.abandon_open_tasks(execution_id, now, f"workflow cancelled: {reason}")
        self.request_decision(execution_id, now, decision_queue, force=True)
        return new_status

    def abandon_open_tasks(self, execution_id: str, now: datetime, why: str) -> None:
        """Rows that have not started never will (no event: their body never ran); timers stop."""
        self.conn.execute(activity_tasks.update().where(
            (activity_tasks.c.execution_id == execution_id)
            & activity_tasks.c.status.in_(("scheduled", "retry_wait"))).values(
            status="cancelled", finished_at=now, last_error=why))
        self.conn.execute(timers.update().where(timers.c.execution_id == execution_id)
                          .values(fired=True))

    # ── the sweeper ──────────────────────────────────────────────────────────────────────────
    def _for_update(self, q: Any) -> Any:
        return q if self.sqlite else q.with_for_update(skip_locked=True)

    def due_retries(self, now: datetime, limit: int = 100) -> list[tuple[str, str]]:
        q = sa.select(activity_tasks.c.execution_id, activity_tasks.c.activity_id).where(
            (activity_tasks.c.status == "retry_wait") & (activity_tasks.c.due_at <= now)).limit(limit)
        return [(r[0], r[1]) for r in self.conn.execute(q)]

    def expired_leases(self, now: datetime, limit: int = 100) -> list[tuple[str, str, int]]:
        q = sa.select(activity_tasks.c.execution_id, activity_tasks.c.activity_id,
                      activity_tasks.c.attempt).where(
            (activity_tasks.c.status == "running") & (activity_tasks.c.lease_expires_at <= now)).limit(limit)
        return [(r[0], r[1], r[2]) for r in self.conn.execute(q)]

    def renew_lease(self, execution_id: str, activity_id: str, attempt: int, until: datetime) -> None:
        self.conn.execute(activity_tasks.update().where(
            (activity_tasks.c.execution_id == execution_id) & (activity_tasks.c.activity_id == activity_id)
            & (activity_tasks.c.attempt == attempt) & (activity_tasks.c.status == "running"))
            .values(lease_expires_at=until))

    def expire_lease(self, execution_id: str, activity_id: str, attempt: int, now: datetime,
                     decision_queue: str) -> None:
        """A lease found expired: rechecked under the lock (the attempt may have finished or
        renewed meanwhile), then recorded as a failed attempt, retried per policy."""
        self.lock(execution_id)
        lease = self.conn.execute(sa.select(activity_tasks.c.lease_expires_at).where(
            (activity_tasks.c.execution_id == execution_id) & (activity_tasks.c.activity_id == activity_id)
            & (activity_tasks.c.status == "running") & (activity_tasks.c.attempt == attempt))).scalar()
        if lease is not None and _aware(lease) <= now:  # type: ignore[operator]
            self.fail_activity(execution_id, activity_id, attempt, START_TO_CLOSE_TIMEOUT,
                               "no result before the lease expired (worker lost or too slow)",
                               now, decision_queue)

    def redispatch_next_attempt(self, execution_id: str, activity_id: str, now: datetime) -> None:
        """A due retry: the next attempt, with a fresh message."""
        self.lock(execution_id)
        task = self.conn.execute(sa.select(activity_tasks).where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id)).with_for_update()).first()
        if task is None or task._mapping["status"] != "retry_wait":
            return
        t = task._mapping
        attempt = t["attempt"] + 1
        self.conn.execute(activity_tasks.update().where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id)).values(
            status="scheduled", attempt=attempt, due_at=None, dispatched_at=now))
        self._dispatch_activity(execution_id, activity_id, t["activity_name"], t["queue"], attempt,
                                now, t["adopted"], start_to_close=t["start_to_close"])

    def stale_scheduled(self, now: datetime, timings: Timings, limit: int = 100) -> None:
        """Re-send scheduled rows whose message seems lost (a Redis restart, a refused claim).
        Duplicates are harmless: the claim lets one through."""
        cutoff = now - timedelta(seconds=timings.redispatch_after)
        q = self._for_update(sa.select(activity_tasks).where(
            (activity_tasks.c.status == "scheduled") & (activity_tasks.c.dispatched_at < cutoff))
            .limit(limit))
        for task in self.conn.execute(q).fetchall():
            t = task._mapping
            # back off: the next re-send waits as long again as this row has waited so far (a
            # backed-up queue must not be flooded with duplicates), at most an hour
            waited = min(now - _aware(t["dispatched_at"]), timedelta(hours=1))  # type: ignore[operator]
            self.conn.execute(activity_tasks.update().where(
                (activity_tasks.c.execution_id == t["execution_id"])
                & (activity_tasks.c.activity_id == t["activity_id"])).values(dispatched_at=now + waited))
            self._dispatch_activity(t["execution_id"], t["activity_id"], t["activity_name"], t["queue"],
                                    t["attempt"], now, t["adopted"], start_to_close=t["start_to_close"])

    def due_timers(self, now: datetime, limit: int = 100) -> list[tuple[str, str]]:
        q = sa.select(timers.c.execution_id, timers.c.timer_id).where(
            (timers.c.fired.is_(False)) & (timers.c.fire_at <= now)).limit(limit)
        return [(r[0], r[1]) for r in self.conn.execute(q)]

    def fire_timer(self, execution_id: str, timer_id: str, now: datetime, decision_queue: str) -> None:
        row = self.lock(execution_id)
        if row is None:
            return
        updated = self.conn.execute(timers.update().where(
            (timers.c.execution_id == execution_id) & (timers.c.timer_id == timer_id)
            & (timers.c.fired.is_(False))).values(fired=True))
        if updated.rowcount and row._mapping["status"] == RUNNING:
            self.append(row, [ev.TimerFired(timer_id)], now, decide_on=decision_queue)

    def stale_decisions(self, now: datetime, timings: Timings, decision_queue: str, limit: int = 100) -> None:
        """Re-request decisions whose message seems lost, and retry nd-blocked runs whose backoff
        is due."""
        cutoff = now - timedelta(seconds=timings.redispatch_after)
        q = self._for_update(sa.select(executions.c.id).where(
            (executions.c.decision_requested_at < cutoff)
             | ((executions.c.nd_retry_at <= now) & (executions.c.status == RUNNING))).limit(limit))
        for (execution_id,) in self.conn.execute(q).fetchall():
            self.conn.execute(executions.update().where(executions.c.id == execution_id)
                              .values(nd_retry_at=None))
            self.request_decision(execution_id, now, decision_queue, force=True)

    def stale_outbox(self, now: datetime, older_than: float, limit: int = 500) -> list[OutboxMessage]:
        cutoff = now - timedelta(seconds=older_than)
        q = self._for_update(sa.select(outbox).where(outbox.c.created_at < cutoff)
                             .order_by(outbox.c.id).limit(limit))
        return [OutboxMessage(r.id, r.task_name, r.queue, r.args, r.task_id, r.headers)
                for r in self.conn.execute(q).fetchall()]
