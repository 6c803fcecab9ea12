"""One transaction (``Tx``): the run-row lock, history reads, appends and the decision cycle.

Every change to a run happens under ``Tx.lock(execution_id)`` (``SELECT … FOR UPDATE`` on the
execution row), so appends to one history are serialised; the ``(execution_id, seq)`` key makes a
forked history impossible even if a caller forgot the lock. What the transaction asks to send
(``dispatches``) and to count (``metrics``) is acted on by the caller only after it commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from harvest_celery._core import events as ev
from harvest_celery._core.commands import Decision, ScheduleActivity, StartTimer
from harvest_celery._core.lifecycle import TERMINAL_STATUSES, decision_events, status_for_outcome
from harvest_celery._core.names import TaskStatus
from harvest_celery._core.registry import Registry
from harvest_celery._errors import ExecutionNotFound
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._store.dialect import Dialect
from harvest_celery._store.records import Dispatch, RunRow, Timings, aware
from harvest_celery._store.schema import activity_tasks, events, executions, timers

RawEvent = tuple[int, dict[str, Any], datetime]


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
        return int(self.conn.execute(executions.update().where(executions.c.id == execution_id)
                                     .values(**values)).rowcount)

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
        """Append events at the run's next positions (the row must be locked) in one multi-row
        INSERT, and update the row with ``values`` in one statement. ``decide_on``: also request a
        decision on that queue unless one is pending. Returns the seq of the first event."""
        first = row.next_seq
        if new_events:
            self.conn.execute(events.insert(), [
                {"execution_id": row.id, "seq": first + i, "type": e.type,
                 "data": self.payloads.encode_event(e.to_data(), f"{row.id}/{first + i}"),
                 "recorded_at": now}
                for i, e in enumerate(new_events)
            ])
            values.update(next_seq=first + len(new_events), updated_at=now)
        if decide_on is not None and row.decision_requested_at is None:
            values["decision_requested_at"] = now
            self._decide(row.id, decide_on, now)
        if values:
            self.update_run(row.id, **values)
        return first

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
        if self.conn.execute(executions.update().where(cond).values(decision_requested_at=now)).rowcount:
            self._decide(execution_id, queue, now)

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
                       registry: Registry, now: datetime, timings: Timings, workflow_label: str) -> None:
        if decision.nd is not None:
            self._nd_block(row, decision.nd, now, timings, workflow_label)
            return
        new_events = decision_events(decision, history)
        status = status_for_outcome(decision, row.status)
        values = self._decision_values(row, status, new_events, now)
        first = self.append(row, new_events, now, **values)
        for i, command in enumerate(decision.commands):
            if isinstance(command, ScheduleActivity):
                self.insert_task(row.id, command, first + i, registry, now)
            elif isinstance(command, StartTimer):
                self.insert_timer(row.id, command.timer_id, command.fire_at)
        for metric in decision.metrics:
            self.metrics.append((metric, {"workflow": workflow_label}))
        if status != row.status and status in TERMINAL_STATUSES:
            outcome = "completed" if status == "COMPLETED" else "failed"
            self.metrics.append(("workflow_terminal", {"workflow": workflow_label, "outcome": outcome}))

    def _nd_block(self, row: RunRow, nd: dict[str, Any], now: datetime, timings: Timings,
                  workflow_label: str) -> None:
        """nd-blocked: still RUNNING, nothing appended, retried with backoff."""
        count = row.nd_block_count + 1
        delay = min(timings.nd_retry_initial * 2 ** min(count - 1, 16), timings.nd_retry_max)
        self.update_run(row.id, nd_blocked_at=row.nd_blocked_at or now,
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
            self.abandon_open_tasks(row.id, now, "the workflow finished without awaiting it")
        return values

    def insert_timer(self, execution_id: str, timer_id: str, fire_at: str) -> None:
        self.conn.execute(timers.insert().values(
            execution_id=execution_id, timer_id=timer_id, fire_at=datetime.fromisoformat(fire_at),
            fired=False))

    def insert_task(self, execution_id: str, command: ScheduleActivity, event_seq: int,
                    registry: Registry, now: datetime) -> None:
        """The task row is the durable record of the dispatch (the sweeper re-sends it if its
        message is lost); its first message goes out after commit."""
        definition = registry.activity(command.activity_name)
        deadline = command.start_to_close or definition.start_to_close
        self.conn.execute(activity_tasks.insert().values(
            execution_id=execution_id, activity_id=command.activity_id,
            activity_name=command.activity_name, queue=command.queue,
            status=TaskStatus.SCHEDULED.value, attempt=1,
            retry=(command.retry or definition.retry).to_data(), start_to_close=deadline,
            event_seq=event_seq, dispatched_at=now, compensation=command.compensation,
            adopted=definition.adopted))
        self.dispatch_activity(execution_id, command.activity_id, command.activity_name,
                               command.queue, 1, definition.adopted, deadline, command.input)

    def dispatch_activity(self, execution_id: str, activity_id: str, name: str, queue: str,
                          attempt: int, adopted: bool, deadline: float | None,
                          input: Any = None) -> None:
        if adopted and input is None:
            # an existing task keeps its signature: its input is its argument
            input = self.scheduled_input(execution_id, activity_id)
        self.dispatches.append(Dispatch(Dispatch.ACTIVITY, execution_id, queue, activity_id, name,
                                        attempt, adopted, input if adopted else None, deadline))

    def scheduled_input(self, execution_id: str, activity_id: str) -> Any:
        data = self.conn.execute(sa.select(events.c.data).select_from(
            activity_tasks.join(events, (events.c.execution_id == activity_tasks.c.execution_id)
                                & (events.c.seq == activity_tasks.c.event_seq))).where(
            (activity_tasks.c.execution_id == execution_id)
            & (activity_tasks.c.activity_id == activity_id))).scalar_one()
        return self.payloads.decode_event(data).get("input")
