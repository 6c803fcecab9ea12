"""One transaction (``Tx``): the run-row lock, history reads, appends and the decision cycle.

Every change to a run happens under ``Tx.lock(execution_id)`` (``SELECT … FOR UPDATE`` on the
execution row), so appends to one history are serialised; the ``(execution_id, seq)`` key makes a
forked history impossible even if a caller forgot the lock. What the transaction asks to send
(``dispatches``) and to count (``metrics``) is acted on by the caller only after it commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from harvest_celery._core import events as ev
from harvest_celery._core.commands import Decision, Failed, ScheduleActivity, StartTimer
from harvest_celery._core.lifecycle import (
    TERMINAL_STATUSES,
    cancel_branch_failure,
    decision_events,
    status_for_outcome,
)
from harvest_celery._core.names import TaskStatus
from harvest_celery._core.registry import Registry
from harvest_celery._errors import ExecutionNotFound
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._store import pgwrite
from harvest_celery._store.dialect import Dialect
from harvest_celery._store.predicates import eager_claim
from harvest_celery._store.records import (
    Claim,
    CompletionGuard,
    Dispatch,
    EagerClaim,
    RunRow,
    Timings,
    aware,
)
from harvest_celery._store.schema import activity_tasks, attempt_errors, events, executions, timers

RawEvent = tuple[int, dict[str, Any], datetime]
UNKNOWN: Any = object()
_SETTLING = ("closed_at", "result", "error")  # run columns whose change a waiter wants to see  # an adopted dispatch whose input must be read back from its event


@dataclass
class RunWrite:
    """What one operation writes to one run, gathered so Postgres gets it in one statement."""

    execution_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    timers: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    # the run closes: its unstarted task rows are abandoned (after the inserts) with this reason
    abandon: tuple[datetime, str] | None = None

    def inserts(self) -> list[tuple[sa.Table, list[dict[str, Any]]]]:
        """The tables this write inserts into, with their rows (empty ones left out)."""
        tables = ((events, self.events), (activity_tasks, self.tasks), (timers, self.timers),
                  (attempt_errors, self.errors))
        return [(table, rows) for table, rows in tables if rows]


@dataclass
class Staged:
    """A decision gathered for writing (``Tx.stage_decision``)."""

    write: RunWrite
    status: str  # the run's status once written
    first: int  # the seq of the decision's first own event
    new_events: list[ev.Event]
    now: datetime


def _closes(values: dict[str, Any]) -> bool:
    """Does a run update close the run (or settle its post-cancel branch)? Its waiters are
    woken on commit."""
    return values.get("status") in TERMINAL_STATUSES or any(k in values for k in _SETTLING)


def timer_row(execution_id: str, timer_id: str, fire_at: str) -> dict[str, Any]:
    return {"execution_id": execution_id, "timer_id": timer_id,
            "fire_at": datetime.fromisoformat(fire_at), "fired": False}


class Tx:
    """One transaction. Methods named for what they do to a run."""

    def __init__(self, conn: Connection, dialect: Dialect, payloads: Payloads | None = None) -> None:
        self.conn = conn
        self.dialect = dialect
        self.payloads = payloads or Payloads()
        self.dispatches: list[Dispatch] = []
        self.metrics: list[tuple[str, dict[str, str]]] = []

    # ── rows and history ─────────────────────────────────────────────────────────────────────
    def lock(self, execution_id: str, *, skip_locked: bool = False) -> RunRow | None:
        q = self.dialect.lock(sa.select(executions).where(executions.c.id == execution_id),
                              skip_locked=skip_locked)
        row = self.conn.execute(q).first()
        return RunRow.from_mapping(row._mapping) if row is not None else None

    def lock_existing(self, execution_id: str) -> RunRow:
        row = self.lock(execution_id)
        if row is None:
            raise ExecutionNotFound(execution_id)
        return row

    def update_run(self, execution_id: str, **values: Any) -> int:
        updated = int(self.conn.execute(executions.update().where(executions.c.id == execution_id)
                                        .values(**values)).rowcount)
        self._notify_if_closed(execution_id, values)
        return updated

    def _notify_if_closed(self, execution_id: str, values: dict[str, Any]) -> None:
        if _closes(values):
            self.dialect.notify(self.conn, execution_id)

    def raw_history(self, execution_id: str, since: int = 0) -> list[RawEvent]:
        """Stored events, payload fields as written (possibly encoded or offloaded)."""
        q = (sa.select(events.c.seq, events.c.data, events.c.recorded_at)
             .where((events.c.execution_id == execution_id) & (events.c.seq >= since))
             .order_by(events.c.seq))
        return [(r.seq, r.data, aware(r.recorded_at)) for r in self.conn.execute(q)]  # type: ignore[misc]

    def history(self, execution_id: str, since: int = 0) -> list[ev.HistoryEvent]:
        """Decoded history for a decision, from position ``since`` (strict: replay cannot run on
        opaque payloads)."""
        return [ev.HistoryEvent(seq, ev.event_from_data(self.payloads.decode_event(data)), at)
                for seq, data, at in self.raw_history(execution_id, since)]

    def append(self, row: RunRow, new_events: Sequence[ev.Event], now: datetime, *,
               decide_on: str | None = None, **values: Any) -> int:
        """Append events at the run's next positions (the row must be locked) and update the row
        with ``values`` — one statement on Postgres. ``decide_on``: also request a decision on
        that queue unless one is pending. Returns the seq of the first event."""
        write = RunWrite(row.id)
        first = self.stage_events(write, row, new_events, now)
        write.values.update(values)
        if decide_on is not None and row.decision_requested_at is None:
            write.values["decision_requested_at"] = now
            self._decide(row.id, row.decide_on(decide_on), now)
        self.write(write)
        return first

    def stage_events(self, write: RunWrite, row: RunRow, new_events: Sequence[ev.Event],
                     now: datetime) -> int:
        """Add ``new_events`` to ``write`` after what it already holds; returns the first seq."""
        first = row.next_seq + len(write.events)
        for i, e in enumerate(new_events):
            write.events.append({"execution_id": row.id, "seq": first + i, "type": e.type,
                                 "data": self.payloads.encode_event(e.to_data(), f"{row.id}/{first + i}"),
                                 "recorded_at": now})
        if write.events:
            write.values.update(next_seq=row.next_seq + len(write.events), updated_at=now)
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

    def _decide(self, execution_id: str, queue: str, now: datetime) -> None:
        self.dispatches.append(Dispatch(Dispatch.DECIDE, execution_id, queue,
                                        requested_at=now.timestamp()))

    def request_decision(self, execution_id: str, now: datetime, queue: str, *,
                         force: bool = False) -> None:
        """Ask for a decision unless one is already requested and not yet taken. The run row's
        ``decision_requested_at`` is the durable record: the sweeper re-sends a lost request."""
        cond = executions.c.id == execution_id
        if not force:
            cond = cond & executions.c.decision_requested_at.is_(None)
        found = self.conn.execute(executions.update().where(cond).values(decision_requested_at=now)
                                  .returning(executions.c.sticky_queue)).first()
        if found is not None:
            self._decide(execution_id, found.sticky_queue or queue, now)

    def abandon_open_tasks(self, execution_id: str, now: datetime, why: str) -> None:
        """Rows that have not started never will (no event: their body never ran); timers stop."""
        self.conn.execute(activity_tasks.update().where(
            (activity_tasks.c.execution_id == execution_id)
            & activity_tasks.c.status.in_((TaskStatus.SCHEDULED.value, TaskStatus.RETRY_WAIT.value)))
            .values(status=TaskStatus.CANCELLED.value, finished_at=now, last_error=why))
        self.conn.execute(timers.update().where(timers.c.execution_id == execution_id)
                          .values(fired=True))

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

    def apply_decision(self, row: RunRow, history: Sequence[ev.Event], decision: Decision,
                       registry: Registry, now: datetime, timings: Timings, workflow_label: str, *,
                       leading: Sequence[ev.Event] = (),
                       sticky: str | None = None,
                       eager: EagerClaim | None = None) -> list[ev.HistoryEvent]:
        """Write one decision. ``leading``: events recorded just before it in the same write
        (the completion a worker decides on), so completion and decision are one statement.
        ``eager``: claim one of its new activities for the deciding thread in the same write.
        Returns the events its commands wrote (a warm replay absorbs them once committed; an
        eager claim's ``ActivityStarted`` reaches it with that claim)."""
        staged = self.stage_decision(row, history, decision, registry, now, timings,
                                     workflow_label, leading, sticky, eager)
        self.write(staged.write)
        return self._decided(row, decision, staged, workflow_label)

    def apply_guarded_decision(self, row: RunRow, history: Sequence[ev.Event], decision: Decision,
                               registry: Registry, now: datetime, timings: Timings,
                               workflow_label: str, guard: CompletionGuard, *,
                               leading: Sequence[ev.Event], sticky: str | None,
                               eager: EagerClaim | None) -> list[ev.HistoryEvent] | None:
        """A completion and the decision taken on it in ONE statement, written only if the run
        and the task row are still exactly what ``row`` and ``guard`` say (``pgwrite.guarded``);
        else nothing is written and None is returned. Not for an nd-block, nor for a decision
        that closes the run while scheduling work (its abandon could not see the new rows)."""
        if decision.nd is not None:
            return None
        staged = self.stage_decision(row, history, decision, registry, now, timings,
                                     workflow_label, leading, sticky, eager)
        w = staged.write
        if w.abandon is not None and (w.tasks or w.timers):
            return None
        sql = pgwrite.guarded(row, w.inserts(), w.values, guard, now, closing=w.abandon,
                              notify=_closes(w.values))
        if sql is None or self.conn.exec_driver_sql(*sql).rowcount != 1:
            return None
        return self._decided(row, decision, staged, workflow_label)

    def stage_decision(self, row: RunRow, history: Sequence[ev.Event], decision: Decision,
                       registry: Registry, now: datetime, timings: Timings, workflow_label: str,
                       leading: Sequence[ev.Event], sticky: str | None,
                       eager: EagerClaim | None) -> Staged:
        """Everything one decision writes, gathered (its messages staged), nothing executed."""
        write = RunWrite(row.id)
        self.stage_events(write, row, leading, now)
        if sticky != row.sticky_queue:
            write.values["sticky_queue"] = sticky  # the process that will hold its warm replay
        if decision.nd is not None:
            self._nd_block(write, row, decision.nd, now, timings, workflow_label)
            return Staged(write, row.status, row.next_seq + len(write.events), [], now)
        new_events = decision_events(decision, history)
        status = status_for_outcome(decision, row.status, row.cancel_requested_at is not None)
        first = self.stage_events(write, row, new_events, now)
        write.values.update(self._decision_values(row, status, new_events, now))
        outcome = decision.outcome
        if isinstance(outcome, Failed) and any(isinstance(e, ev.WorkflowFailed) for e in new_events):
            # the workflow code's own traceback, beside the run (the history keeps type + message)
            write.errors.append(self.error_row(row.id, "", 0, outcome.error_type, outcome.message,
                                               outcome.traceback, now))
        if status != row.status and status in TERMINAL_STATUSES:
            write.abandon = (now, "the workflow finished without awaiting it")
        scheduled = len(self.dispatches)
        for i, command in enumerate(decision.commands):
            if isinstance(command, ScheduleActivity):
                write.tasks.append(self.task_row(row.id, command, first + i, registry, now))
            elif isinstance(command, StartTimer):
                write.timers.append(timer_row(row.id, command.timer_id, command.fire_at))
        if eager is not None and eager_claim.holds(row, closes=write.abandon is not None):
            self._claim_eagerly(write, row, decision, scheduled, eager, now)
        return Staged(write, status, first, new_events, now)

    def _decided(self, row: RunRow, decision: Decision, staged: Staged,
                 workflow_label: str) -> list[ev.HistoryEvent]:
        """After a decision's write: its wake-up, its counts, the events its commands wrote."""
        if decision.nd is not None:
            return []
        status = staged.status
        if row.cancelled_at is not None:
            # a post-cancel decision may settle the cancel branch: wake result() waiters
            self.dialect.notify(self.conn, row.id)
        for metric in decision.metrics:
            self.metrics.append((metric, {"workflow": workflow_label}))
        if status != row.status and status in TERMINAL_STATUSES:
            ended = status.lower()  # completed · failed · cancelled (a cooperative cancel)
            self.metrics.append(("workflow_terminal", {"workflow": workflow_label, "outcome": ended}))
        if (row.cancelled_at is not None or row.cancel_requested_at is not None) and \
                cancel_branch_failure(status, True, staged.write.values.get("error")):
            self.metrics.append(("cancel_branch_failed", {"workflow": workflow_label}))
        return [ev.HistoryEvent(staged.first + i, e, staged.now) for i, e in enumerate(staged.new_events)]

    def _claim_eagerly(self, write: RunWrite, row: RunRow, decision: Decision, scheduled: int,
                       eager: EagerClaim, now: datetime) -> None:
        """Claim the first activity of this decision that ``eager`` wants (``EagerClaim``)."""
        inputs = {c.activity_id: c.input for c in decision.commands if isinstance(c, ScheduleActivity)}
        for i in range(scheduled, len(self.dispatches)):
            d = self.dispatches[i]
            if d.kind != Dispatch.ACTIVITY or d.adopted or not eager.wants(d):
                continue
            task = next(t for t in write.tasks if t["activity_id"] == d.activity_id)
            lease = (task["start_to_close"] or eager.lease) + 5  # as the claim statement's
            task.update(status=TaskStatus.RUNNING.value, worker_id=eager.worker_id, started_at=now,
                        lease_expires_at=now + timedelta(seconds=lease))
            seq = self.stage_events(write, row, [ev.ActivityStarted(d.activity_id, d.attempt,
                                                                    eager.worker_id)], now)
            self.dispatches[i] = replace(d, claimed=Claim(
                row.id, d.activity_id, d.activity_name, d.attempt, inputs[d.activity_id],
                task["start_to_close"], eager.worker_id, seq, now))
            return

    def _nd_block(self, write: RunWrite, row: RunRow, nd: dict[str, Any], now: datetime,
                  timings: Timings, workflow_label: str) -> None:
        """nd-blocked: still RUNNING, nothing of the decision appended, retried with backoff."""
        count = row.nd_block_count + 1
        delay = min(timings.nd_retry_initial * 2 ** min(count - 1, 16), timings.nd_retry_max)
        write.values.update(nd_blocked_at=row.nd_blocked_at or now,
                        nd_block_reason=f"expected {nd['expected']}, got {nd['actual']}",
                        nd_block_count=count, nd_details=nd, nd_retry_at=now + timedelta(seconds=delay),
                        updated_at=now, decision_requested_at=None)
        self.metrics.append(("nd_blocked", {"workflow": workflow_label}))

    def _decision_values(self, row: RunRow, status: str, new_events: Sequence[ev.Event],
                         now: datetime) -> dict[str, Any]:
        """The run-row columns a decision changes: one UPDATE per decision, folded into the append."""
        values: dict[str, Any] = {}
        if row.decision_requested_at is not None:
            values["decision_requested_at"] = None
        if status != row.status:
            values["status"] = status
        if row.nd_blocked_at is not None or row.nd_retry_at is not None:
            values.update(nd_blocked_at=None, nd_block_reason=None, nd_details=None, nd_retry_at=None,
                          nd_block_count=0)
        for done in new_events:
            if isinstance(done, ev.WorkflowCompleted):
                values["result"] = self.payloads.encode_value(done.result, f"{row.id}/result")
            elif isinstance(done, ev.WorkflowFailed):
                values["error"] = {"type": done.error_type, "message": done.message}
        if status != row.status and status in TERMINAL_STATUSES:
            values["closed_at"] = now
        return values

    def insert_timer(self, execution_id: str, timer_id: str, fire_at: str) -> None:
        self.conn.execute(timers.insert().values(**timer_row(execution_id, timer_id, fire_at)))

    def insert_task(self, execution_id: str, command: ScheduleActivity, event_seq: int,
                    registry: Registry, now: datetime) -> None:
        self.conn.execute(activity_tasks.insert().values(
            **self.task_row(execution_id, command, event_seq, registry, now)))

    def task_row(self, execution_id: str, command: ScheduleActivity, event_seq: int,
                 registry: Registry, now: datetime) -> dict[str, Any]:
        """The task row of a new dispatch — the durable record of it (the sweeper re-sends it if
        its message is lost) — and its first message, sent after commit."""
        definition = registry.activity(command.activity_name)
        deadline = command.start_to_close or definition.start_to_close
        self.dispatch_activity(execution_id, command.activity_id, command.activity_name,
                               command.queue, 1, definition.adopted, deadline, command.input)
        return {"execution_id": execution_id, "activity_id": command.activity_id,
                "activity_name": command.activity_name, "queue": command.queue,
                "status": TaskStatus.SCHEDULED.value, "attempt": 1,
                "retry": (command.retry or definition.retry).to_data(), "start_to_close": deadline,
                "event_seq": event_seq, "dispatched_at": now, "compensation": command.compensation,
                "adopted": definition.adopted,
                # every row of one write has the same columns (one cached statement shape)
                "worker_id": None, "started_at": None, "lease_expires_at": None}

    def dispatch_activity(self, execution_id: str, activity_id: str, name: str, queue: str,
                          attempt: int, adopted: bool, deadline: float | None,
                          input: Any = UNKNOWN) -> None:
        if adopted and input is UNKNOWN:
            # an existing task keeps its signature: its input is its argument
            input = self.scheduled_input(execution_id, activity_id)
        self.dispatches.append(Dispatch(Dispatch.ACTIVITY, execution_id, queue, activity_id, name,
                                        attempt, adopted, input if adopted else None, deadline))

    def error_row(self, execution_id: str, activity_id: str, attempt: int, error_type: str,
                  message: str, traceback: str, now: datetime) -> dict[str, Any]:
        """A failed attempt's record (activity "" attempt 0: the workflow's own failure); its
        message and traceback are a payload: encoded by the codec, offloaded, erased."""
        detail = self.payloads.encode_value({"message": message, "traceback": traceback},
                                            f"{execution_id}/error/{activity_id or 'workflow'}/{attempt}")
        return {"execution_id": execution_id, "activity_id": activity_id, "attempt": attempt,
                "error_type": error_type, "detail": detail, "recorded_at": now}

    def record_error(self, execution_id: str, activity_id: str, attempt: int, error_type: str,
                     message: str, traceback: str, now: datetime) -> None:
        row = self.error_row(execution_id, activity_id, attempt, error_type, message, traceback, now)
        self.conn.execute(self.dialect.insert_ignore(attempt_errors).values(**row))

    def scheduled_input(self, execution_id: str, activity_id: str) -> Any:
        data = self.conn.execute(sa.select(events.c.data).select_from(
            activity_tasks.join(events, (events.c.execution_id == activity_tasks.c.execution_id)
                                & (events.c.seq == activity_tasks.c.event_seq))).where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id))).scalar_one()
        return self.payloads.decode_event(data).get("input")
