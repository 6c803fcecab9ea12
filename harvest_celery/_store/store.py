"""Persistence behind one seam: ``Store`` owns the SQLAlchemy engine (one per process, rebuilt
after fork), opens transactions (``Tx``) and serves the reads that need no lock. All SQL lives in
this package; nothing here knows Celery (what to send is a ``Dispatch`` record)."""

from __future__ import annotations

import builtins
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import (
    CANCELLING,
    CONTINUED_AS_NEW,
    RUNNING,
    TERMINAL_STATUSES,
    TERMINATED,
    WAITING,
)
from harvest_celery._core.limits import slot_text
from harvest_celery._core.names import TaskStatus
from harvest_celery._errors import ExecutionNotFound
from harvest_celery._payloads.fields import EXECUTION_PAYLOAD_COLUMNS
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._payloads.stores import listable, run_prefix
from harvest_celery._store import admission, limits, links, outcomes, redaction, runs, sql, updates
from harvest_celery._store.blobs import PostgresPayloadStore
from harvest_celery._store.dialect import Dialect, Pools, dialect_for
from harvest_celery._store.listener import Listener, PollingListener, listener_of
from harvest_celery._store.records import (
    AttemptError,
    CancelBranch,
    Execution,
    RunOutcome,
    RunSnapshot,
    Timings,
    aware,
    utcnow,
)
from harvest_celery._store.schema import activity_tasks, attempt_errors, events, executions
from harvest_celery._store.schema import limits as limits_table
from harvest_celery._store.tx import RawEvent, Tx

log = logging.getLogger("harvest_celery")
redaction.install()  # no value a Postgres error quotes reaches harvest's logs
T = TypeVar("T")
R = TypeVar("R", Execution, RunOutcome)
__all__ = ["Execution", "Store", "Timings", "is_transient", "utcnow"]  # the records callers of the store use

# Columns a list reads: never the payload columns (a 200 MB input must not be loaded to list it).
_LIST_COLUMNS = [c for c in executions.c if c.name not in EXECUTION_PAYLOAD_COLUMNS]


def is_transient(exc: BaseException) -> bool:
    """A database error that a later attempt may not meet: the server is down, restarting or
    unreachable, or the connection was lost — not a constraint or a bad statement."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))


class Store:
    def __init__(
        self,
        database_url: str,
        *,
        echo: bool = False,
        payloads: Payloads | None = None,
        pools: Pools | None = None,
        listen_url: str | None = None,
    ) -> None:
        self.database_url = database_url
        self.dialect: Dialect = dialect_for(database_url)
        self._echo = echo
        self.pools = pools or Pools()  # Postgres: the two pools' sizes (SQLite: unused)
        self.payloads = payloads or Payloads()
        bind = getattr(self.payloads.store, "bind", None)
        if isinstance(self.payloads.store, PostgresPayloadStore):  # its pool follows the settings
            self.payloads.store.bind(database_url, self.pools)
        elif bind is not None:
            bind(database_url)
        self._engine: Engine | None = None
        self._autocommit: tuple[Engine, Engine] | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self._call_convention = False  # the schema has migration 0008 (has_call_convention)
        # one LISTEN connection per process, shared by every waiter (None: SQLite, poll); on
        # listen_url when given, none when the URL is pooled without one (_store.listener)
        self.listener: Listener | PollingListener | None = (
            listener_of(database_url, listen_url, self.pools.pooled) if self.dialect.row_locks else None
        )

    @property
    def engine(self) -> Engine:
        # Never use an engine inherited across fork (Celery prefork): its sockets are shared.
        if self._engine is None or self._pid != os.getpid():
            with self._lock:
                if self._engine is None or self._pid != os.getpid():
                    if self._engine is not None:
                        self._engine.dispose(close=False)
                    self._engine = self.dialect.create_engine(self.database_url, self._echo, pools=self.pools)
                    self._pid = os.getpid()
        return self._engine

    def has_call_convention(self) -> bool:
        """Is the schema at least migration 0008 (``activity_tasks.call_convention``)? Asked
        before a durable task call writes anything; once true, never asked again."""
        if not self._call_convention:
            columns = sa.inspect(self.engine).get_columns(activity_tasks.name)
            self._call_convention = any(c["name"] == "call_convention" for c in columns)
        return self._call_convention

    @property
    def is_sqlite(self) -> bool:
        return not self.dialect.row_locks

    def dispose(self) -> None:
        if self._autocommit is not None:
            self._autocommit[1].dispose()
            self._autocommit = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @contextmanager
    def begin(self) -> Iterator[Tx]:
        with self.engine.begin() as conn:
            tx = Tx(conn, self.dialect, self.payloads)
            yield tx
            tx.settle_limits()  # before the commit: the limits it touched, in one order

    def transaction(self, work: Callable[[Tx], T], *, one_statement: bool = False) -> tuple[T, Tx]:
        """``work(tx)`` in one transaction, committed; returns its result and the committed
        ``Tx`` (its dispatches and metrics are the caller's to act on).

        ``one_statement``: ``work`` issues a single statement on Postgres (the claim), which is
        atomic by itself, so it runs in autocommit: one round trip, no BEGIN, no COMMIT.

        There is no pool ping per checkout: a pooled connection that died while idle fails the
        first statement, and the whole transaction is run once more on a fresh connection — only
        when the failure came before COMMIT was sent, so nothing can be applied twice."""
        autocommit = self.dialect.autocommits(one_statement)
        for attempt in (1, 2):
            committing = False
            try:
                with self._connect(autocommit) as conn:
                    trans = conn.begin()
                    tx = Tx(conn, self.dialect, self.payloads)
                    tx.autocommit = autocommit
                    try:
                        result = work(tx)
                        tx.settle_limits()  # before the commit: the limits it touched, in one order
                    except BaseException:
                        trans.rollback()
                        raise
                    committing = not autocommit
                    trans.commit()
                if tx.settle_after:
                    self._settle_after(tx)
                return result, tx
            except sa.exc.DBAPIError as exc:
                if attempt == 2 or committing or not exc.connection_invalidated:
                    raise
                log.warning("database connection was lost before commit; retrying the transaction once")
        raise AssertionError("unreachable")

    def _settle_after(self, tx: Tx) -> None:
        """Settle, in a transaction of its own, the limits a committed one-trip write freed a slot
        of without handing it on; its messages join ``tx``'s. A failure is logged: the sweeper
        settles every limit with waiting rows each pass."""
        touched, tx.settle_after = tx.settle_after, set()
        try:
            try:  # each limit's settle as one simple query in autocommit: the lock held only by it
                _, later = self.transaction(lambda t: t.touched.update(touched), one_statement=True)
            except limits.NeedsTransaction:  # a rate in force: its steps under one transaction
                _, later = self.transaction(lambda t: t.touched.update(touched))
        except Exception as exc:  # noqa: BLE001 - the write committed; the sweeper is the backstop
            log.warning(
                "settling %s after a one-trip completion failed (%s)", sorted(touched), type(exc).__name__
            )
            return
        tx.dispatches.extend(later.dispatches)
        tx.metrics.extend(later.metrics)
        tx.amounts.extend(later.amounts)

    def _connect(self, autocommit: bool) -> Connection:
        if autocommit:
            return self.autocommit_engine.connect()
        return self.engine.connect()

    @property
    def autocommit_engine(self) -> Engine:
        """A second small pool whose connections stay in autocommit (one-statement operations):
        no isolation-level switch on every checkout and return."""
        engine = self.engine  # rebuilt after fork: so is this one
        if self._autocommit is None or self._autocommit[0] is not engine:
            if self._autocommit is not None:
                self._autocommit[1].dispose(close=False)
            self._autocommit = (
                engine,
                self.dialect.create_engine(self.database_url, self._echo, autocommit=True, pools=self.pools),
            )
        return self._autocommit[1]

    def ping(self) -> None:
        """A trivial query: raises if the database does not answer."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql(sql.PING)

    # ── reads that need no lock ──────────────────────────────────────────────────────────────
    def get(self, execution_id: str) -> Execution:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(executions).where(executions.c.id == execution_id)).first()
        if row is None:
            raise ExecutionNotFound(execution_id)
        return self._decoded_run(Execution.from_mapping(row._mapping))

    def outcome(self, execution_id: str) -> RunOutcome:
        """A run's status, seal and (once closed) result and error, in one read (``_store.outcomes``)."""
        with self.engine.connect() as conn:
            row = outcomes.outcome(conn, execution_id)
        if row is None:
            raise ExecutionNotFound(execution_id)
        stored = RunOutcome(
            row.id, row.status, row.result, row.error, aware(row.cancelled_at), row.cancel_reason
        )
        return self._decoded_run(stored) if row.status in TERMINAL_STATUSES else stored

    def _decoded_run(self, run: R) -> R:
        """``run`` with its payload columns decoded; a read-only view degrades, never fails."""
        decoded = {}
        for column in EXECUTION_PAYLOAD_COLUMNS:
            if not hasattr(run, column):
                continue  # a payload the view does not show (the admission key)
            try:
                decoded[column] = self.payloads.decode_value(getattr(run, column))
            except Exception as exc:  # noqa: BLE001 - any store or codec failure: degrade
                log.warning(
                    "execution %s: %s stays encoded: %s",
                    run.id,
                    column,
                    exc,
                    extra={"execution_id": run.id},  # a run line's field (_runtime.logs)
                )
        return dataclasses.replace(run, **decoded) if decoded else run

    def admission(self, execution_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """A waiting run's place and its key's slot holders (``_store.admission``); (None, [])
        for a run that is not waiting."""
        with self.engine.connect() as conn:
            place = admission.waiting_position(conn, execution_id)
            if place is None:
                return None, []
            holders = admission.holders(conn, place["workflow"], place.pop("digest"))
        return place, [dict(h._mapping) for h in holders]

    def admission_gauges(self) -> list[dict[str, Any]]:
        """Per limited workflow: ``{"name", "waiting", "in_use"}`` (the scrape-time gauges)."""
        with self.engine.connect() as conn:
            return [{"name": n, "waiting": w, "in_use": u} for n, w, u in admission.gauges(conn)]

    def children(self, execution_id: str) -> tuple[dict[str, str], ...]:
        """The runs ``execution_id`` started as children: id, workflow and status, by id."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(executions.c.id, executions.c.workflow_type, executions.c.status)
                .where(executions.c.parent_id == execution_id)
                .order_by(executions.c.id)
            )
            return tuple({"id": r.id, "workflow": r.workflow_type, "status": r.status} for r in rows)

    def continued_to(self, execution_id: str) -> str | None:
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(executions.c.continued_to).where(executions.c.id == execution_id)
            ).scalar()
        return str(found) if found is not None else None

    def status(self, execution_id: str) -> str:
        """The run's status alone (no payload column is read)."""
        with self.engine.connect() as conn:
            status = conn.execute(
                sa.select(executions.c.status).where(executions.c.id == execution_id)
            ).scalar()
        if status is None:
            raise ExecutionNotFound(execution_id)
        return str(status)

    def update_outcome(self, execution_id: str, update_id: str) -> tuple[str, ev.UpdateCompleted | None]:
        """The run's status and the ``UpdateCompleted`` of ``update_id`` if it was recorded (its
        result decoded), read together (``Harvest.update``'s wait)."""
        with self.engine.connect() as conn:
            status = conn.execute(
                sa.select(executions.c.status).where(executions.c.id == execution_id)
            ).scalar()
            raw = updates.completions(conn, execution_id)
        if status is None:
            raise ExecutionNotFound(execution_id)
        for seq, data, at in raw:
            if isinstance(data, dict) and data.get("update_id") == update_id:
                found = self._decoded((int(seq), data, at), True, execution_id).event
                return str(status), found if isinstance(found, ev.UpdateCompleted) else None
        return str(status), None

    def cancelled(self, execution_id: str) -> bool:
        """Was the run sealed by a cancel, asked to cancel, or terminated (or is it gone)? One
        read of the run row: what an activity polls (``activity_context().is_cancelled()``)."""
        q = sa.select(executions.c.status, executions.c.cancelled_at, executions.c.cancel_requested_at).where(
            executions.c.id == execution_id
        )
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return (
            row is None
            or row.cancelled_at is not None
            or row.cancel_requested_at is not None
            or row.status == TERMINATED
        )

    def history(self, execution_id: str, *, strict: bool = True) -> list[ev.HistoryEvent]:
        """The history, decoded. Blobs are inflated after the connection is released. ``strict``
        raises on a payload that cannot be decoded; otherwise it is logged and left raw (for
        read-only views)."""
        with self.engine.connect() as conn:
            raw = Tx(conn, self.dialect, self.payloads).raw_history(execution_id)
        return [self._decoded(r, strict, execution_id) for r in raw]

    def snapshot(self, execution_id: str) -> RunSnapshot:
        """The current run of ``execution_id``'s chain (the addressed run, or while it is
        CONTINUED_AS_NEW its ``continued_to``, link by link, as a signal is routed): its row's
        identity and state and its history, read in one read-only transaction (one snapshot on
        Postgres: they agree, and nothing can be written). The history is decoded strictly with
        this store's payloads, blobs inflated after the connection is released; an erased run's
        is not read (its payloads are tombstones)."""
        columns = (executions.c.id, executions.c.workflow_type, executions.c.status)
        q = sa.select(*columns, executions.c.erased_at, executions.c.continued_to)
        with self.engine.begin() as conn:
            self.dialect.read_only(conn)
            row = conn.execute(q.where(executions.c.id == execution_id)).first()
            for _ in range(links.MAX_CHAIN_HOPS):
                if row is None or row.status != CONTINUED_AS_NEW or row.continued_to is None:
                    break
                row = conn.execute(q.where(executions.c.id == row.continued_to)).first()
            raw: builtins.list[RawEvent] = []
            if row is not None and row.erased_at is None:
                raw = Tx(conn, self.dialect, self.payloads).raw_history(row.id)
        if row is None:
            raise ExecutionNotFound(execution_id)
        history = [self._decoded(r, True, row.id) for r in raw]
        return RunSnapshot(row.id, row.workflow_type, row.status, aware(row.erased_at), history)

    def _decoded(self, raw: RawEvent, strict: bool, execution_id: str) -> ev.HistoryEvent:
        seq, data, recorded_at = raw
        try:
            data = self.payloads.decode_event(data)
        except Exception as exc:  # noqa: BLE001 - any store or codec failure
            if strict:
                raise  # the pipeline raises every decode failure as a HarvestError (503)
            log.warning(
                "event %s of %s stays encoded: %s",
                seq,
                execution_id,
                exc,
                extra={"execution_id": execution_id},  # a run line's field (_runtime.logs)
            )
        return ev.HistoryEvent(seq, ev.event_from_data(data), recorded_at)

    def list(
        self,
        *,
        status: str | None = None,
        workflow_type: str | None = None,
        nd_blocked: bool | None = None,
        limit: int = 100,
        offset: int = 0,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> builtins.list[Execution]:
        """Runs, newest first. Reads no payload column: ``input`` and ``result`` are None.
        ``status="CANCELLING"`` selects live runs with an open cancellation request,
        ``status="WAITING"`` live runs waiting for admission;
        ``created_after``/``created_before`` bound the creation time (inclusive/exclusive)."""
        q = sa.select(*_LIST_COLUMNS).order_by(executions.c.created_at.desc(), executions.c.id)
        if created_after is not None:
            q = q.where(executions.c.created_at >= created_after)
        if created_before is not None:
            q = q.where(executions.c.created_at < created_before)
        if status == CANCELLING:  # derived: live, with an open cancellation request
            q = q.where((executions.c.status == RUNNING) & executions.c.cancel_requested_at.is_not(None))
        elif status == WAITING:  # derived: live, waiting for admission
            q = q.where((executions.c.status == RUNNING) & executions.c.admitted_at.is_(None))
        elif status:
            q = q.where(executions.c.status == status)
        if workflow_type:
            q = q.where(executions.c.workflow_type == workflow_type)
        if nd_blocked is True:
            q = q.where(executions.c.nd_blocked_at.is_not(None))
        elif nd_blocked is False:
            q = q.where(executions.c.nd_blocked_at.is_(None))
        with self.engine.connect() as conn:
            rows = conn.execute(q.limit(limit).offset(offset)).fetchall()
        return [Execution.from_mapping({**r._mapping, "input": None, "result": None}) for r in rows]

    def activity_rows(self, execution_id: str) -> builtins.list[dict[str, Any]]:
        q = sa.select(activity_tasks).where(activity_tasks.c.execution_id == execution_id)
        with self.engine.connect() as conn:
            rows = conn.execute(q.order_by(activity_tasks.c.event_seq)).fetchall()
        return [dict(r._mapping) for r in rows]

    def held_activities(self, execution_id: str) -> dict[str, str]:
        """Activity id → "waiting for a slot of <name> (n/m in use)" for each of the run's rows a
        limit holds back (the console's run view; no key is shown)."""
        rows = [r for r in self.activity_rows(execution_id) if r["status"] == TaskStatus.WAITING.value]
        usage = self.limit_usage({(r["activity_name"], r["limit_digest"] or "") for r in rows})
        texts = {}
        for r in rows:
            if r["limit_digest"] is None:  # held: a reset's row, sent when its run is admitted
                texts[r["activity_id"]] = "held until the run is admitted"
                continue
            in_use, concurrency = usage[(r["activity_name"], r["limit_digest"] or "")]
            texts[r["activity_id"]] = slot_text(
                {"activity": r["activity_name"], "in_use": in_use, "concurrency": concurrency}
            )
        return texts

    def limit_usage(
        self, limits: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, int | None]]:
        """``(name, key digest) → (in_use, concurrency)``: the slots taken under each limit and
        its concurrency in force (the override, else the declared value; None: none)."""
        if not limits:
            return {}
        names = sorted({name for name, _ in limits})
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(limits_table).where(limits_table.c.name.in_(names))).all()
        own = {r.name: r for r in rows if r.key_digest == ""}
        used = {(r.name, r.key_digest): int(r.in_use) for r in rows}
        found: dict[tuple[str, str], tuple[int, int | None]] = {}
        for name, digest in limits:
            head = own.get(name)
            concurrency = None
            if head is not None:
                concurrency = (
                    head.override_concurrency
                    if head.override_concurrency is not None
                    else head.declared_concurrency
                )
            found[(name, digest)] = (used.get((name, digest), 0), concurrency)
        return found

    def attempt_errors(self, execution_id: str) -> builtins.list[AttemptError]:
        """Every recorded failed attempt of the run (and the workflow's own failure, activity
        ""), oldest first, decoded; a detail that cannot be decoded stays raw (a read-only view)."""
        q = (
            sa.select(attempt_errors)
            .where(attempt_errors.c.execution_id == execution_id)
            # the workflow's own error ("" activity) after an attempt's at the same instant:
            # a failure decided on inline is recorded at its cause's time
            .order_by(
                attempt_errors.c.recorded_at,
                sa.case((attempt_errors.c.activity_id == "", 1), else_=0),
                attempt_errors.c.activity_id,
                attempt_errors.c.attempt,
            )
        )
        with self.engine.connect() as conn:
            rows = conn.execute(q).fetchall()
        out = []
        for r in rows:
            detail = r.detail
            try:
                detail = self.payloads.decode_value(detail)
            except Exception as exc:  # noqa: BLE001 - a read-only view degrades
                log.warning(
                    "attempt error %s/%s/%s stays encoded: %s",
                    execution_id,
                    r.activity_id,
                    r.attempt,
                    exc,
                    extra={"execution_id": execution_id, "activity_id": r.activity_id, "attempt": r.attempt},
                )
            detail = detail if isinstance(detail, dict) else {}
            out.append(
                AttemptError(
                    r.activity_id,
                    r.attempt,
                    r.error_type,
                    str(detail.get("message", "")),
                    str(detail.get("traceback", "")),
                    aware(r.recorded_at),  # type: ignore[arg-type]
                )
            )
        return out

    # ── erasure and retention (blobs deleted once the transaction commits) ─────────────────
    def erase(self, execution_id: str, *, with_forks: bool = False) -> dict[str, Any]:
        """PII erasure of one terminal run, or of its whole fork family (see ``runs.erase``):
        after the commit, every blob its rows reference and, with a store that lists
        (``ListablePayloadStore``), every blob under each erased run's prefix."""
        with self.begin() as tx:
            counts, refs = runs.erase(tx, execution_id, utcnow(), with_forks=with_forks)
        counts["blobs"] = self._delete_blobs(refs, [execution_id, *counts.get("forks", [])])
        return counts

    def purge(self, older_than_days: float, batch: int = 500) -> dict[str, int]:
        """Delete terminal runs closed more than ``older_than_days`` ago, in bounded batches;
        never a live one. Their blobs go as an erasure's do."""
        cutoff: datetime = utcnow() - timedelta(days=older_than_days)
        totals = {"runs": 0, "events": 0, "blobs": 0}
        while True:
            with self.begin() as tx:
                ids = runs.purgeable(tx, cutoff, batch)
                removed, refs = runs.delete_runs(tx, ids) if ids else (0, [])
            totals["blobs"] += self._delete_blobs(refs, ids)
            totals["runs"] += len(ids)
            totals["events"] += removed
            if len(ids) < batch:
                return totals

    def _delete_blobs(self, refs: Sequence[tuple[str, str]], run_ids: Sequence[str]) -> int:
        """Delete the referenced blobs, and every blob under the runs' prefixes when the store
        lists (an orphan of a write that never happened is referenced by no row). Returns how
        many distinct blobs were deleted."""
        store = self.payloads.store
        keys: set[str] = set()
        for store_id, key in refs:
            if store is not None and store.store_id == store_id:
                keys.add(key)
            else:
                log.warning(
                    "blob %s lives in payload store %r, which is not configured: not deleted", key, store_id
                )
        if store is not None and listable(store):
            for run_id in run_ids:
                keys.update(store.list(run_prefix(run_id)))
        for key in sorted(keys):
            store.delete(key)
        return len(keys)

    def cancel_branch(self, execution_id: str) -> CancelBranch | None:
        """The post-cancel branch of a sealed run (None: the run was never sealed by a cancel),
        from the run row, its running task rows and its terminal event — no history load."""
        with self.engine.connect() as conn:
            found, branch = outcomes.cancel_branch(conn, execution_id)
        if not found:
            raise ExecutionNotFound(execution_id)
        return branch

    def timeout_request(self, execution_id: str) -> ev.WorkflowTimeoutRequested | None:
        """The run's first ``WorkflowTimeoutRequested`` (which deadline, and its reason), if any."""
        q = (
            sa.select(events.c.data)
            .where(
                (events.c.execution_id == execution_id) & (events.c.type == ev.WorkflowTimeoutRequested.type)
            )
            .order_by(events.c.seq)
            .limit(1)
        )
        with self.engine.connect() as conn:
            data = conn.execute(q).scalar()
        if data is None:
            return None
        found = ev.event_from_data(self.payloads.decode_event(data))
        return found if isinstance(found, ev.WorkflowTimeoutRequested) else None

    def decision_request(self, execution_id: str) -> tuple[str, datetime | None, datetime]:
        """The run's status, when its pending decision request was made (None: none pending; the
        sweeper moves it forward when it re-sends the request) and when the run last changed —
        as stored (naive on SQLite), no payload column read. For ``Harvest.stuck``."""
        q = sa.select(executions.c.status, executions.c.decision_requested_at, executions.c.updated_at).where(
            executions.c.id == execution_id
        )
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        if row is None:
            raise ExecutionNotFound(execution_id)
        return str(row.status), row.decision_requested_at, row.updated_at
