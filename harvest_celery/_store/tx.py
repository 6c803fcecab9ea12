"""One transaction (``Tx``): the run-row lock, history reads, appends and the decision cycle.

Every change to a run happens under ``Tx.lock(execution_id)`` (``SELECT … FOR UPDATE`` on the
execution row), so appends to one history are serialised; the ``(execution_id, seq)`` key makes a
forked history impossible even if a caller forgot the lock. What the transaction asks to send
(``dispatches``) and to count (``metrics``) is acted on by the caller only after it commits.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from harvest_celery._core import events as ev
from harvest_celery._core.commands import Decision, ScheduleActivity
from harvest_celery._core.lifecycle import CONTINUED_AS_NEW, TERMINAL_STATUSES
from harvest_celery._core.names import TaskStatus
from harvest_celery._core.registry import Registry
from harvest_celery._errors import ExecutionNotFound
from harvest_celery._payloads.fields import EXECUTION_PAYLOAD_COLUMNS
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._store import admission, handoff, limits, pgwrite, prepared
from harvest_celery._store.dialect import Dialect
from harvest_celery._store.pgwrite import outcome_unknown as _outcome_unknown
from harvest_celery._store.records import (
    CompletionGuard,
    Dispatch,
    EagerClaim,
    RunRow,
    Timings,
    aware,
    utcnow,
)
from harvest_celery._store.schema import (
    activity_tasks,
    attempt_errors,
    child_notices,
    events,
    executions,
    timers,
)
from harvest_celery._store.staging import (
    Blob,
    EagerTake,
    RunWrite,
    Staged,
    activity_dispatch,
    closes_limited,
    deferred,
    error_row,
    one_statement_refusal,
    stage_decision,
    stage_events,
    task_row,
    timer_row,
)

__all__ = ["RawEvent", "RunWrite", "Staged", "Tx", "timer_row"]
log = logging.getLogger("harvest_celery")

RawEvent = tuple[int, dict[str, Any], datetime]
UNKNOWN: Any = object()  # an adopted dispatch whose input must be read back from its event
_SETTLING = ("closed_at", "result", "error")  # run columns whose change a waiter wants to see


def _closes(values: dict[str, Any]) -> bool:
    """Does a run update close the run (or settle its post-cancel branch)? Its waiters are
    woken on commit."""
    return values.get("status") in TERMINAL_STATUSES or any(k in values for k in _SETTLING)


# the rows a closing run abandons: dispatched, waiting for a retry, or held back by a limit
UNSTARTED = (TaskStatus.SCHEDULED.value, TaskStatus.RETRY_WAIT.value, TaskStatus.WAITING.value)


# the run row as a lock reads it by default: every column but the payload ones
_RUN_ROW = [c for c in executions.c if c.name not in EXECUTION_PAYLOAD_COLUMNS]


class Tx:
    """One transaction. Methods named for what they do to a run."""

    def __init__(self, conn: Connection, dialect: Dialect, payloads: Payloads | None = None) -> None:
        self.conn = conn
        self.dialect = dialect
        self.payloads = payloads or Payloads()
        self.dispatches: list[Dispatch] = []
        self.metrics: list[tuple[str, dict[str, str]]] = []
        # counters incremented by an amount once this commits (seconds throttled by a rate limit)
        self.amounts: list[tuple[str, dict[str, str], float]] = []
        # children whose close wrote a notice: applied to their parents once this commits
        self.closed_children: list[str] = []
        self.touched: set[tuple[str, str]] = set()  # limits to settle before commit
        self.freed: dict[tuple[str, str], int] = {}  # slots freed, by limit (``free_slot``)
        self.autocommit = False  # each statement commits (``Store.transaction(one_statement=)``)
        # limits settled in a transaction of their own once this commits (``handoff.write``)
        self.settle_after: set[tuple[str, str]] = set()
        self.admissions: set[tuple[str, str]] = set()  # workflow admissions to settle, too
        # admissions a one-trip close deferred: settled by a transaction of their own
        self.unsettled: set[tuple[str, str]] = set()
        # a limited activity the deciding thread runs if its settle releases it (``EagerTake``)
        self.eager_take: EagerTake | None = None
        # tracing (on only): the spans of what this transaction did, and the runs it closed
        # (their run spans), emitted once it commits (``Runtime._after_commit``)
        self.spans: list[Any] = []
        self.closed_runs: list[str] = []
        self.reports: list[Any] = []  # error reports (Sentry's), sent once this commits
        # set by a caller whose starts each begin a trace (a schedule's ticks, tracing on): the
        # traceparent a start made in this transaction stores (``starts.start``)
        self.trace_start: Callable[[str, str], str] | None = None

    # ── limits (``_store.limits``) ───────────────────────────────────────────────────────────
    def touch_limit(self, name: str, digest: str | None) -> None:
        """A slot of this limit may be free, or a row now waits under it: settle before commit."""
        if digest is not None:
            self.touched.add((name, digest))

    def free_slot(self, name: str, digest: str | None) -> None:
        """A row of this limit left ``scheduled``/``running``: its slot goes to the next waiting
        row (``limits.hand_off``), else to the settle's recount."""
        if digest is not None:
            self.freed[(name, digest)] = self.freed.get((name, digest), 0) + 1
            self.touched.add((name, digest))

    def settle_limits(self, now: datetime | None = None) -> None:
        """Settle every touched limit, in one order (name, key digest): called just before commit,
        after every run row this transaction locks."""
        moment = now or utcnow()
        while self.touched or self.admissions:
            work = sorted(
                [(n, d, False) for n, d in self.touched] + [(n, d, True) for n, d in self.admissions]
            )
            self.touched, self.admissions = set(), set()
            for name, digest, runs in work:
                (admission.settle if runs else limits.settle)(self, name, digest, moment)

    def touch_admission(self, name: str, digest: str | None) -> None:
        """A slot of this workflow's limit may be free, or a run now waits for one
        (``_store.admission``): settle before commit."""
        if digest is not None:
            self.admissions.add((name, digest))

    def decide_admitted(self, execution_id: str, queue: str, now: datetime) -> None:
        """An admitted run's first decision request (its row was updated by the admission)."""
        self._decide(execution_id, queue, now)

    def _wait_in_line(self, rows: Sequence[dict[str, Any]], registry: Registry) -> None:
        """New limited rows: their wait order, their limit's row (declared values on first use)."""
        for task in rows:
            if task.get("limit_digest") is not None:
                name = task["activity_name"]
                task["wait_seq"] = limits.wait_in_line(self, name, registry.activity(name).limits)
                self.touch_limit(name, task["limit_digest"])

    # ── rows and history ─────────────────────────────────────────────────────────────────────
    def lock(self, execution_id: str, *, skip_locked: bool = False, payloads: bool = False) -> RunRow | None:
        """``SELECT … FOR UPDATE`` of the run row. Its payload columns (``input``, ``result``,
        ``limit_key``) are read only with ``payloads=True`` (erasure, fork, purge): otherwise they are
        ``NOT_LOADED``. A canvas run's input is its whole graph, and every completion and
        decision locks the row, so reading it each time made a decision O(nodes)."""
        columns = executions.c if payloads else _RUN_ROW
        q = self.dialect.lock(
            sa.select(*columns).where(executions.c.id == execution_id), skip_locked=skip_locked
        )
        row = self.conn.execute(q).first()
        return RunRow.from_mapping(row._mapping) if row is not None else None

    def lock_existing(self, execution_id: str, *, payloads: bool = False) -> RunRow:
        row = self.lock(execution_id, payloads=payloads)
        if row is None:
            raise ExecutionNotFound(execution_id)
        return row

    def update_run(self, execution_id: str, **values: Any) -> int:
        updated = int(
            self.conn.execute(
                executions.update().where(executions.c.id == execution_id).values(**values)
            ).rowcount
        )
        self._notify_if_closed(execution_id, values)
        return updated

    def _notify_if_closed(self, execution_id: str, values: dict[str, Any]) -> None:
        if _closes(values):
            self.dialect.notify(self.conn, execution_id)
        if values.get("status") in TERMINAL_STATUSES:
            self.closed_runs.append(execution_id)
            self.write_child_notice(execution_id, values.get("closed_at") or utcnow())

    def write_child_notice(self, execution_id: str, now: datetime) -> None:
        """A closing child's notice to its parent (``_store.links``), in the child's own
        transaction: it never touches the parent's row (lock order: parent first). None for a
        run without a parent, or one that continued as new (its chain goes on)."""
        found = self.conn.execute(
            sa.select(
                executions.c.parent_id,
                executions.c.status,
                executions.c.result,
                executions.c.error,
                executions.c.workflow_type,
                executions.c.limit_digest,
            ).where(executions.c.id == execution_id)
        ).first()
        if found is not None:  # a closing limited run frees its slot: the next is admitted
            self.touch_admission(found.workflow_type, found.limit_digest)
        if found is None or found.parent_id is None or found.status == CONTINUED_AS_NEW:
            return
        self.conn.execute(
            self.dialect.insert_ignore(child_notices).values(
                parent_id=found.parent_id,
                child_id=execution_id,
                status=found.status,
                result=found.result,
                error=found.error,
                created_at=now,
            )
        )
        self.closed_children.append(execution_id)

    def raw_history(self, execution_id: str, since: int = 0) -> list[RawEvent]:
        """Stored events, payload fields as written (possibly encoded or offloaded)."""
        q = (
            sa.select(events.c.seq, events.c.data, events.c.recorded_at)
            .where((events.c.execution_id == execution_id) & (events.c.seq >= since))
            .order_by(events.c.seq)
        )
        return [(r.seq, r.data, aware(r.recorded_at)) for r in self.conn.execute(q)]  # type: ignore[misc]

    def history(self, execution_id: str, since: int = 0) -> list[ev.HistoryEvent]:
        """Decoded history for a decision, from position ``since`` (strict: replay cannot run on
        opaque payloads)."""
        return [
            ev.HistoryEvent(seq, ev.event_from_data(self.payloads.decode_event(data)), at)
            for seq, data, at in self.raw_history(execution_id, since)
        ]

    def append(
        self,
        row: RunRow,
        new_events: Sequence[ev.Event],
        now: datetime,
        *,
        decide_on: str | None = None,
        **values: Any,
    ) -> int:
        """Append events at the run's next positions (the row must be locked) and update the row
        with ``values`` — one statement on Postgres. ``decide_on``: also request a decision on
        that queue unless one is pending. Returns the seq of the first event."""
        payloads, blobs = deferred(self.payloads)
        write = RunWrite(row.id)
        first = stage_events(write, row, new_events, now, payloads, row.id)
        write.values.update(values)
        # a run waiting for admission is appended to and decides nothing (``_store.admission``)
        deciding = decide_on is not None and row.decision_requested_at is None and not row.waiting
        if deciding:
            write.values["decision_requested_at"] = now
        self._put_blobs(blobs)
        self._written_or_undone(blobs, lambda: self.write(write))
        if deciding:
            self._decide(row.id, row.decide_on(decide_on), now)  # type: ignore[arg-type]
        return first

    def write(self, w: RunWrite) -> None:
        """Everything one operation writes to a run: its new events, task rows and timers and the
        run-row update. Postgres: ONE statement (the inserts are data-modifying CTEs of the
        UPDATE); SQLite: one statement each (``Dialect.write_run``)."""
        inserts = w.inserts()
        if not inserts and not w.values:
            return
        self.dialect.write_run(self.conn, w.execution_id, inserts, w.values)
        if w.abandon is not None:
            self.abandon_open_tasks(w.execution_id, *w.abandon)
        self._notify_if_closed(w.execution_id, w.values)

    # ── blobs before the statement that references them ──────────────────────────────────────
    def _put_blobs(self, blobs: Sequence[Blob]) -> None:
        """A staging's blobs, written before its statement: no reader sees a missing blob."""
        done: list[Blob] = []
        try:
            for key, data in blobs:
                self.payloads.store.put(key, data)
                done.append((key, data))
        except BaseException:
            self._delete_blobs(done)
            raise

    def _delete_blobs(self, blobs: Sequence[Blob]) -> None:
        """A refused or failed statement's blobs: referenced by no row. Best effort — one left
        behind is under the run's prefix, deleted when the run is erased or purged."""
        for key, _data in blobs:
            try:
                self.payloads.store.delete(key)
            except Exception as exc:  # noqa: BLE001 - logged; erasure by prefix finds it
                log.warning(
                    "blob %s of a write that did not happen could not be deleted (%s: %s); "
                    "it is deleted when its run is erased or purged",
                    key,
                    type(exc).__name__,
                    exc,
                    # a run line's field (_runtime.logs): a blob key starts with its run's prefix
                    extra={"execution_id": key.split("/", 1)[0]},
                )

    def _written_or_undone(self, blobs: Sequence[Blob], statement: Any) -> Any:
        try:
            return statement()
        except BaseException:
            self._delete_blobs(blobs)
            raise

    def write_staged(self, staged: Staged, registry: Registry) -> None:
        """Write a staged decision: its blobs, then its statement; then what it asks for (its
        messages and counts, acted on after commit) is handed to this transaction."""
        self._wait_in_line(staged.write.tasks, registry)
        self._put_blobs(staged.blobs)
        self._written_or_undone(staged.blobs, lambda: self.write(staged.write))
        if staged.taking is not None:  # written: its settle may claim it for this thread
            self.eager_take = staged.taking
        self._take(staged)

    def _take(self, staged: Staged) -> None:
        if staged.wake:
            self.dialect.notify(self.conn, staged.write.execution_id)
        self.dispatches.extend(staged.dispatches)
        self.metrics.extend(staged.metrics)

    def _decide(self, execution_id: str, queue: str, now: datetime) -> None:
        self.dispatches.append(Dispatch(Dispatch.DECIDE, execution_id, queue, requested_at=now.timestamp()))

    def request_decision(self, execution_id: str, now: datetime, queue: str, *, force: bool = False) -> None:
        """Ask for a decision unless one is already requested and not yet taken. The run row's
        ``decision_requested_at`` is the durable record: the sweeper re-sends a lost request."""
        # a run waiting for admission never has a decision requested (``_store.admission``)
        cond = (executions.c.id == execution_id) & executions.c.admitted_at.is_not(None)
        if not force:
            cond = cond & executions.c.decision_requested_at.is_(None)
        found = self.conn.execute(
            executions.update()
            .where(cond)
            .values(decision_requested_at=now)
            .returning(executions.c.sticky_queue, executions.c.decision_queue)
        ).first()
        if found is not None:
            self._decide(execution_id, found.sticky_queue or found.decision_queue or queue, now)

    def abandon_open_tasks(self, execution_id: str, now: datetime, why: str) -> None:
        """Rows that have not started never will (no event: their body never ran), those a limit
        holds back (``waiting``) included; timers stop. A scheduled one frees its slot."""
        t = activity_tasks.c
        cancelled = self.conn.execute(
            activity_tasks.update()
            .where((t.execution_id == execution_id) & t.status.in_(UNSTARTED))
            .values(status=TaskStatus.CANCELLED.value, finished_at=now, last_error=why)
            .returning(t.activity_name, t.limit_digest)
        ).all()
        for name, digest in set(cancelled):  # a retry's wait under a limit: a recount, harmless
            self.touch_limit(name, digest)
        self.conn.execute(timers.update().where(timers.c.execution_id == execution_id).values(fired=True))

    # ── the decision cycle ───────────────────────────────────────────────────────────────────
    def take_decision_request(self, execution_id: str) -> RunRow | None:
        """Lock the run for a decision. None if there is nothing to decide (unknown, terminal
        with no cancel to follow up, paused or erased); a stale request flag is cleared."""
        row = self.lock(execution_id)
        if row is None:
            return None
        if not row.decidable:
            # nothing to decide (a paused run is resumed later with a fresh request)
            if row.decision_requested_at is not None:
                self.update_run(execution_id, decision_requested_at=None)
            return None
        return row  # apply_decision clears the request flag in its own update

    def apply_decision(
        self,
        row: RunRow,
        history: Sequence[ev.Event],
        decision: Decision,
        registry: Registry,
        now: datetime,
        timings: Timings,
        workflow_label: str,
        *,
        leading: Sequence[ev.Event] = (),
        sticky: str | None = None,
        eager: EagerClaim | None = None,
    ) -> list[ev.HistoryEvent]:
        """Write one decision (``staging.stage_decision``). ``leading``: events recorded just
        before it in the same write (the completion a worker decides on), so completion and
        decision are one statement. ``eager``: claim one of its new activities for the deciding
        thread in the same write. Returns the events its commands wrote (a warm replay absorbs
        them once committed; an eager claim's ``ActivityStarted`` reaches it with that claim)."""
        staged = stage_decision(
            row,
            history,
            decision,
            registry,
            now,
            timings,
            workflow_label,
            self.payloads,
            leading=leading,
            sticky=sticky,
            eager=eager,
        )
        self.write_staged(staged, registry)
        return [] if staged.nd else staged.written()

    def apply_guarded_decision(
        self,
        row: RunRow,
        history: Sequence[ev.Event],
        decision: Decision,
        registry: Registry,
        now: datetime,
        timings: Timings,
        workflow_label: str,
        guard: CompletionGuard,
        *,
        leading: Sequence[ev.Event],
        sticky: str | None,
        eager: EagerClaim | None,
    ) -> tuple[list[ev.HistoryEvent] | None, str]:
        """A completion and the decision on it in ONE statement, written only if the run and
        task row are still what ``row`` and ``guard`` say (``pgwrite.guarded``); a limited slot
        handed on in the same trip (``handoff``). The events written and ``""``, or None and why
        not (``FALLBACK_REASONS``: ``nd``, ``closing_with_work``, ``limited``, ``guard``...)."""
        if decision.nd is not None:
            return None, "nd"
        staged = stage_decision(
            row,
            history,
            decision,
            registry,
            now,
            timings,
            workflow_label,
            self.payloads,
            leading=leading,
            sticky=sticky,
            eager=eager,
        )
        w = staged.write
        together = self.dialect.trip_commits_together(self.conn.dialect.driver)
        freeing = guard.limited if together else None  # a slot handed on in the write's trip
        refused = (
            "limited"
            if guard.limited != freeing
            else one_statement_refusal(w, row, registry, together, freeing)
        )
        if refused:
            return None, refused
        handoff.in_line_rows(self, w.tasks, registry)  # a next step under the same limit
        sql = pgwrite.guarded(
            row, w.inserts(), w.values, guard, now, closing=w.abandon, notify=_closes(w.values)
        )
        if sql is None:
            return None, "unsupported_shape"
        sent = functools.partial(handoff.write, self, sql, staged.taking) if freeing else None
        if not self._send_guarded(
            sql, staged.blobs, now, settle=closes_limited(w, row, registry), hand_off=sent
        ):
            return None, "guard"
        if w.values.get("status") in TERMINAL_STATUSES:
            self.closed_runs.append(w.execution_id)
        self._take(staged)
        return staged.written(), ""

    def _send_guarded(
        self,
        sql: tuple[str, dict[str, Any]],
        blobs: Sequence[Blob],
        now: datetime,
        *,
        settle: bool,
        hand_off: Callable[[datetime], bool] | None,
    ) -> bool:
        """A guarded write, its blobs first: was it written? ``settle``: it closes a limited
        workflow's run, so its key's settle goes in the same trip (``admission``); ``hand_off``:
        the slot its attempt held is handed on in the same trip (``handoff.write``)."""
        self._put_blobs(blobs)
        try:
            if settle:
                written = admission.close_in_one_trip(self, sql, now)
            elif hand_off is not None:
                written = hand_off(now)
            else:
                written = prepared.execute(self.conn, [sql[0]], sql[1]).rowcount == 1
        except BaseException as exc:
            if not _outcome_unknown(exc):  # it failed: nothing references its blobs
                self._delete_blobs(blobs)
            raise
        if not written:
            self._delete_blobs(blobs)
        return written

    def insert_timer(self, execution_id: str, timer_id: str, fire_at: str) -> None:
        self.conn.execute(timers.insert().values(**timer_row(execution_id, timer_id, fire_at)))

    def insert_task(
        self,
        execution_id: str,
        command: ScheduleActivity,
        event_seq: int,
        registry: Registry,
        now: datetime,
        *,
        held: bool = False,
    ) -> None:
        """A new task row, and its first message (sent after commit). ``held``: the run waits
        for admission (a reset's re-dispatch), so the row is *held*: WAITING under no limit (no
        ``limit_digest``: no limit's settle releases it), no message; its run's admission
        releases it (``limits.release_held``)."""
        row = task_row(execution_id, command, event_seq, registry, now, self.payloads, execution_id)
        self._wait_in_line([row], registry)
        if held:
            row.update(status=TaskStatus.WAITING.value, limit_digest=None)
        self.conn.execute(activity_tasks.insert().values(**row))
        if row["limit_digest"] is None and not held:  # a limited one is sent when its settle releases it
            self.dispatches.append(activity_dispatch(execution_id, command, registry))

    def dispatch_activity(
        self,
        execution_id: str,
        activity_id: str,
        name: str,
        queue: str,
        attempt: int,
        adopted: bool,
        deadline: float | None,
        input: Any = UNKNOWN,
        call_convention: str | None = None,
        priority: int = 0,
    ) -> None:
        if adopted and input is UNKNOWN:
            # an existing task keeps its signature: its input is its argument (or its whole call,
            # under ``call_convention``)
            input = self.scheduled_input(execution_id, activity_id)
        self.dispatches.append(
            Dispatch(
                Dispatch.ACTIVITY,
                execution_id,
                queue,
                activity_id,
                name,
                attempt,
                adopted,
                input if adopted else None,
                deadline,
                call_convention=call_convention if adopted else None,
                priority=priority,
            )
        )

    def record_error(
        self,
        execution_id: str,
        activity_id: str,
        attempt: int,
        error_type: str,
        message: str,
        traceback: str,
        now: datetime,
    ) -> None:
        row = error_row(
            self.payloads, execution_id, activity_id, attempt, error_type, message, traceback, now
        )
        self.conn.execute(self.dialect.insert_ignore(attempt_errors).values(**row))

    def recorded_at(self, execution_id: str, seq: int) -> datetime | None:
        """When the run's event at ``seq`` was recorded (None: no such event)."""
        found = self.conn.execute(
            sa.select(events.c.recorded_at).where(
                (events.c.execution_id == execution_id) & (events.c.seq == seq)
            )
        ).scalar()
        return aware(found) if found is not None else None

    def scheduled_input(self, execution_id: str, activity_id: str) -> Any:
        data = self.conn.execute(
            sa.select(events.c.data)
            .select_from(
                activity_tasks.join(
                    events,
                    (events.c.execution_id == activity_tasks.c.execution_id)
                    & (events.c.seq == activity_tasks.c.event_seq),
                )
            )
            .where(
                (activity_tasks.c.execution_id == execution_id)
                & (activity_tasks.c.activity_id == activity_id)
            )
        ).scalar_one()
        return self.payloads.decode_event(data).get("input")
