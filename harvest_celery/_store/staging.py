"""Staging a decision: everything one decision writes and asks for, as a value (``Staged``).

Pure: staging reads nothing and writes nothing — no row, no blob, no message, no count. It
returns its events, task rows, timers, dispatches, metrics, eager claim and blob writes; the
transaction writes it (``Tx.write_staged``, ``Tx.apply_guarded_decision``): its blobs first, so
no reader ever sees a reference to a missing blob, then its one statement. Only once that
statement has written are its dispatches and metrics handed to the transaction, to be sent and
counted after commit; a refused or failed statement deletes the blobs it put (best effort; an
autocommit statement whose commit is unknown — its connection went — keeps them).

A decision's blobs are put at ``{run}/{staging}/{seq}/{field}``: the run's prefix (erasure and
purge delete everything under it, ``ListablePayloadStore``) and a part unique to this staging,
so a statement refused by its guard never overwrote a blob another decision's row references.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

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
from harvest_celery._payloads.digest import limit_digest
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._payloads.stores import DeferredPuts
from harvest_celery._store import predicates
from harvest_celery._store.records import Claim, Dispatch, EagerClaim, RunRow, Timings
from harvest_celery._store.schema import activity_tasks, attempt_errors, events, timers

Metric = tuple[str, dict[str, str]]
Blob = tuple[str, bytes]


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
        tables = (
            (events, self.events),
            (activity_tasks, self.tasks),
            (timers, self.timers),
            (attempt_errors, self.errors),
        )
        return [(table, rows) for table, rows in tables if rows]


@dataclass
class Staged:
    """One staged decision (``stage_decision``): what it writes and what it asks for once
    written. ``blobs``: the payload-store puts to make before its statement; ``dispatches`` and
    ``metrics``: to send and count after the commit of the statement that wrote it;
    ``claimed``: the eager claim taken in this write (its dispatch is among ``dispatches``)."""

    write: RunWrite
    status: str  # the run's status once written
    first: int  # the seq of the decision's first own event
    new_events: list[ev.Event]
    now: datetime
    dispatches: list[Dispatch] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)
    claimed: Claim | None = None
    # a limited activity this thread would run: claimed at its settle only if it takes its
    # slot (and token) there, in this transaction (``EagerTake``); else it waits as any other
    taking: EagerTake | None = None
    wake: bool = False  # a post-cancel decision may settle the cancel branch, an update end: wake waiters
    nd: bool = False

    def written(self) -> list[ev.HistoryEvent]:
        """The events its commands wrote (a warm replay absorbs them once committed)."""
        return [ev.HistoryEvent(self.first + i, e, self.now) for i, e in enumerate(self.new_events)]


@dataclass(frozen=True)
class EagerTake:
    """A limited activity of a decision, wanted by the deciding thread (``EagerClaim``): its row
    is written ``waiting`` like any limited row. If the settle of its limit, before this
    transaction commits, releases it — its slot free, its token (under a rate) free, and
    nothing of equal or higher rank (compensations, priority, FIFO) waiting ahead — it is
    claimed there for this thread (``limits.take_eagerly``): ``running`` under ``lease_expires_at``,
    its ``ActivityStarted`` appended, ``claim`` given that event's seq. Else it stays waiting and
    is released later as any other (no message now)."""

    dispatch: Dispatch
    claim: Claim  # ``started_seq`` is set when taken
    lease_expires_at: datetime

    @property
    def key(self) -> tuple[str, str]:
        return (self.claim.execution_id, self.claim.activity_id)


def deferred(payloads: Payloads) -> tuple[Payloads, list[Blob]]:
    """``payloads`` with its store's puts recorded instead of made (the list they go to)."""
    if payloads.offload_threshold is None:
        return payloads, []
    puts = DeferredPuts(payloads.store)
    return payloads.with_store(puts), puts.puts


def stage_events(
    write: RunWrite, row: RunRow, new_events: Sequence[ev.Event], now: datetime, payloads: Payloads, key: str
) -> int:
    """Add ``new_events`` to ``write`` after what it already holds; returns the first seq. Their
    blobs go under ``{key}/{seq}``."""
    first = row.next_seq + len(write.events)
    for i, e in enumerate(new_events):
        write.events.append(
            {
                "execution_id": row.id,
                "seq": first + i,
                "type": e.type,
                "data": payloads.encode_event(e.to_data(), f"{key}/{first + i}"),
                "recorded_at": now,
            }
        )
    if write.events:
        write.values.update(next_seq=row.next_seq + len(write.events), updated_at=now)
    return first


def stage_decision(
    row: RunRow,
    history: Sequence[ev.Event],
    decision: Decision,
    registry: Registry,
    now: datetime,
    timings: Timings,
    workflow_label: str,
    payloads: Payloads,
    *,
    leading: Sequence[ev.Event] = (),
    sticky: str | None = None,
    eager: EagerClaim | None = None,
) -> Staged:
    """Everything one decision writes and asks for, gathered; nothing executed, sent or put.
    ``leading``: events recorded just before it in the same write (the completion a worker
    decides on). ``eager``: claim one of its new activities for the deciding thread."""
    payloads, blobs = deferred(payloads)
    key = f"{row.id}/{secrets.token_hex(6)}" if payloads.offload_threshold is not None else row.id
    write = RunWrite(row.id)
    stage_events(write, row, leading, now, payloads, key)
    if sticky != row.sticky_queue:
        write.values["sticky_queue"] = sticky  # the process that will hold its warm replay
    if decision.nd is not None:
        metrics = [_nd_block(write, row, decision.nd, now, timings, workflow_label)]
        return Staged(
            write,
            row.status,
            row.next_seq + len(write.events),
            [],
            now,
            metrics=metrics,
            blobs=blobs,
            nd=True,
        )
    new_events = decision_events(decision, history)
    status = status_for_outcome(
        decision, row.status, row.cancel_requested_at is not None, row.timed_out_at is not None
    )
    first = stage_events(write, row, new_events, now, payloads, key)
    _stage_outcome(write, row, decision, status, new_events, now, payloads, key)
    staged = Staged(
        write,
        status,
        first,
        new_events,
        now,
        blobs=blobs,
        metrics=_decision_metrics(row, decision, status, write, workflow_label),
        # a post-cancel decision may settle the cancel branch; an update's end is awaited by its
        # caller (Harvest.update): wake the waiters either way
        wake=row.cancelled_at is not None or any(isinstance(e, ev.UpdateCompleted) for e in new_events),
    )
    _stage_commands(staged, row, decision, registry, payloads, key)
    if eager is not None and predicates.eager_claim.holds(row, closes=write.abandon is not None):
        _claim_eagerly(staged, row, decision, eager, payloads, key)
    return staged


def _stage_outcome(
    write: RunWrite,
    row: RunRow,
    decision: Decision,
    status: str,
    new_events: Sequence[ev.Event],
    now: datetime,
    payloads: Payloads,
    key: str,
) -> None:
    """The run-row columns it changes, its error record, and the abandon of a closing run."""
    write.values.update(_decision_values(row, status, new_events, now, payloads, key))
    outcome = decision.outcome
    if isinstance(outcome, Failed) and any(isinstance(e, ev.WorkflowFailed) for e in new_events):
        # the workflow code's own traceback, beside the run (the history keeps type + message)
        write.errors.append(
            error_row(
                payloads, row.id, "", 0, outcome.error_type, outcome.message, outcome.traceback, now, key
            )
        )
    if status != row.status and status in TERMINAL_STATUSES:
        write.abandon = (now, "the workflow finished without awaiting it")


def _stage_commands(
    staged: Staged, row: RunRow, decision: Decision, registry: Registry, payloads: Payloads, key: str
) -> None:
    """The task rows and first messages of its new activities, the rows of its new timers."""
    write = staged.write
    for i, command in enumerate(decision.commands):
        if isinstance(command, ScheduleActivity):
            write.tasks.append(
                task_row(row.id, command, staged.first + i, registry, staged.now, payloads, key)
            )
            if not registry.activity(command.activity_name).limits.limited:
                # a limited one is sent once a settle gives it its slot (``EagerTake``: or run
                # here, claimed at that settle)
                staged.dispatches.append(activity_dispatch(row.id, command, registry))
        elif isinstance(command, StartTimer):
            write.timers.append(timer_row(row.id, command.timer_id, command.fire_at))


def _decision_metrics(
    row: RunRow, decision: Decision, status: str, write: RunWrite, workflow_label: str
) -> list[Metric]:
    """What a written decision counts (after its commit)."""
    metrics: list[Metric] = [(metric, {"workflow": workflow_label}) for metric in decision.metrics]
    if status != row.status and status in TERMINAL_STATUSES:
        ended = status.lower()  # completed · failed · cancelled (a cooperative cancel) · timed_out
        metrics.append(("workflow_terminal", {"workflow": workflow_label, "outcome": ended}))
    if (row.cancelled_at is not None or row.cancel_requested_at is not None) and cancel_branch_failure(
        status, True, write.values.get("error")
    ):
        metrics.append(("cancel_branch_failed", {"workflow": workflow_label}))
    return metrics


def _claim_eagerly(
    staged: Staged, row: RunRow, decision: Decision, eager: EagerClaim, payloads: Payloads, key: str
) -> None:
    """Claim the first activity of this decision that ``eager`` wants (``EagerClaim``): its
    task row is written ``running`` and its ``ActivityStarted`` follows the decision's events.
    With none among its unlimited ones, the first limited one it wants is staged to be taken
    at its limit's settle (``EagerTake``): run eagerly only if its slot is had in this write."""
    write, now = staged.write, staged.now
    inputs = {c.activity_id: c.input for c in decision.commands if isinstance(c, ScheduleActivity)}
    for i, d in enumerate(staged.dispatches):
        if d.kind != Dispatch.ACTIVITY or d.adopted or not eager.wants(d):
            continue
        task = next(t for t in write.tasks if t["activity_id"] == d.activity_id)
        lease = (task["start_to_close"] or eager.lease) + 5  # as the claim statement's
        task.update(
            status=TaskStatus.RUNNING.value,
            worker_id=eager.worker_id,
            started_at=now,
            lease_expires_at=now + timedelta(seconds=lease),
        )
        started = ev.ActivityStarted(d.activity_id, d.attempt, eager.worker_id)
        seq = stage_events(write, row, [started], now, payloads, key)
        staged.claimed = _claim(row, d, task, inputs[d.activity_id], eager, now, seq)
        staged.dispatches[i] = replace(d, claimed=staged.claimed)
        return
    for task in write.tasks:
        if task["limit_digest"] is None or task["adopted"]:
            continue
        d = _limited_dispatch(row.id, task)
        if not eager.wants(d):
            continue
        lease = (task["start_to_close"] or eager.lease) + 5
        claim = _claim(row, d, task, inputs[d.activity_id], eager, now, None)
        staged.taking = EagerTake(d, claim, now + timedelta(seconds=lease))
        return


def _limited_dispatch(execution_id: str, task: dict[str, Any]) -> Dispatch:
    """The message a limited row would be released with (``limits._dispatch``'s)."""
    return Dispatch(
        Dispatch.ACTIVITY,
        execution_id,
        task["queue"],
        task["activity_id"],
        task["activity_name"],
        task["attempt"],
        False,
        None,
        task["start_to_close"],
        priority=task["priority"],
    )


def _claim(
    row: RunRow,
    d: Dispatch,
    task: dict[str, Any],
    input: Any,
    eager: EagerClaim,
    now: datetime,
    seq: int | None,
) -> Claim:
    return Claim(
        row.id,
        d.activity_id,
        d.activity_name,
        d.attempt,
        input,
        task["start_to_close"],
        eager.worker_id,
        seq,
        now,
        queue=d.queue,
        scheduled_at=now,  # scheduled in this very write
        compensation=bool(task["compensation"]),
    )


def _nd_block(
    write: RunWrite, row: RunRow, nd: dict[str, Any], now: datetime, timings: Timings, workflow_label: str
) -> Metric:
    """nd-blocked: still RUNNING, nothing of the decision appended, retried with backoff."""
    count = row.nd_block_count + 1
    delay = min(timings.nd_retry_initial * 2 ** min(count - 1, 16), timings.nd_retry_max)
    write.values.update(
        nd_blocked_at=row.nd_blocked_at or now,
        nd_block_reason=f"expected {nd['expected']}, got {nd['actual']}",
        nd_block_count=count,
        nd_details=nd,
        nd_retry_at=now + timedelta(seconds=delay),
        updated_at=now,
        decision_requested_at=None,
    )
    return ("nd_blocked", {"workflow": workflow_label})


def _decision_values(
    row: RunRow, status: str, new_events: Sequence[ev.Event], now: datetime, payloads: Payloads, key: str
) -> dict[str, Any]:
    """The run-row columns a decision changes: one UPDATE per decision, folded into the append."""
    values: dict[str, Any] = {}
    if row.decision_requested_at is not None:
        values["decision_requested_at"] = None
    if status != row.status:
        values["status"] = status
    if row.nd_blocked_at is not None or row.nd_retry_at is not None:
        values.update(
            nd_blocked_at=None, nd_block_reason=None, nd_details=None, nd_retry_at=None, nd_block_count=0
        )
    for done in new_events:
        if isinstance(done, ev.WorkflowCompleted):
            values["result"] = payloads.encode_value(done.result, f"{key}/result")
        elif isinstance(done, ev.WorkflowFailed):
            values["error"] = {"type": done.error_type, "message": done.message}
    if status != row.status and status in TERMINAL_STATUSES:
        values["closed_at"] = now
    return values


def timer_row(execution_id: str, timer_id: str, fire_at: str) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "timer_id": timer_id,
        "fire_at": datetime.fromisoformat(fire_at),
        "fired": False,
    }


def task_row(
    execution_id: str,
    command: ScheduleActivity,
    event_seq: int,
    registry: Registry,
    now: datetime,
    payloads: Payloads,
    key: str,
) -> dict[str, Any]:
    """The task row of a new dispatch: the durable record of it (the sweeper re-sends it if its
    message, ``activity_dispatch``, is lost). A limited activity's row carries its limit key
    (through the codec: a payload) and the key's digest, which names its ``harvest_limits`` row."""
    definition = registry.activity(command.activity_name)
    limit_key = command.limit_key
    limited = definition.limits.limited
    return {
        "execution_id": execution_id,
        "activity_id": command.activity_id,
        "activity_name": command.activity_name,
        "queue": command.queue,
        # a limited dispatch waits for its slot (settled before commit: ``_store.limits``)
        "status": TaskStatus.WAITING.value if limited else TaskStatus.SCHEDULED.value,
        "attempt": 1,
        "retry": (command.retry or definition.retry).to_data(),
        "start_to_close": command.start_to_close or definition.start_to_close,
        "event_seq": event_seq,
        "dispatched_at": now,
        "compensation": command.compensation,
        "adopted": definition.adopted,
        "call_convention": command.call_convention,
        "priority": command.priority,
        "limit_key": (
            None
            if limit_key is None
            else payloads.encode_value(limit_key, f"{key}/limit_key/{command.activity_id}")
        ),
        "limit_digest": limit_digest(command.activity_name, limit_key) if limited else None,
        "wait_seq": None,  # given by the writing transaction (a database sequence)
        # every row of one write has the same columns (one cached statement shape)
        "worker_id": None,
        "started_at": None,
        "lease_expires_at": None,
    }


def activity_dispatch(execution_id: str, command: ScheduleActivity, registry: Registry) -> Dispatch:
    """The first message of a new dispatch, sent after commit (an adopted task's carries its
    input: an existing task keeps its signature)."""
    definition = registry.activity(command.activity_name)
    deadline = command.start_to_close or definition.start_to_close
    return Dispatch(
        Dispatch.ACTIVITY,
        execution_id,
        command.queue,
        command.activity_id,
        command.activity_name,
        1,
        definition.adopted,
        command.input if definition.adopted else None,
        deadline,
        call_convention=command.call_convention,
        priority=command.priority,
    )


def error_row(
    payloads: Payloads,
    execution_id: str,
    activity_id: str,
    attempt: int,
    error_type: str,
    message: str,
    traceback: str,
    now: datetime,
    key: str | None = None,
) -> dict[str, Any]:
    """A failed attempt's record (activity "" attempt 0: the workflow's own failure); its
    message and traceback are a payload: encoded by the codec, offloaded, erased."""
    detail = payloads.encode_value(
        {"message": message, "traceback": traceback},
        f"{key or execution_id}/error/{activity_id or 'workflow'}/{attempt}",
    )
    return {
        "execution_id": execution_id,
        "activity_id": activity_id,
        "attempt": attempt,
        "error_type": error_type,
        "detail": detail,
        "recorded_at": now,
    }


def closes_limited(w: RunWrite, row: RunRow, registry: Registry) -> bool:
    """Does the write close a run of a workflow under admission (its slot is freed)?"""
    definition = registry.workflows.get(row.workflow_type)
    return w.values.get("status") in TERMINAL_STATUSES and bool(definition and definition.admission.limited)


def one_statement_refusal(
    w: RunWrite, row: RunRow, registry: Registry, together: bool, freeing: tuple[str, str] | None = None
) -> str:
    """Why a staged write cannot take the one-statement path (``""``: it can). ``together``: a
    trip's statements commit together (``Dialect.trip_commits_together``); ``freeing``: the limit
    and key of the slot the completed attempt held, handed on in the trip (``handoff``)."""
    if w.abandon is not None and (w.tasks or w.timers):
        return "closing_with_work"
    limited = [t for t in w.tasks if t["limit_digest"] is not None]
    if limited and (
        freeing is None
        or len(limited) > 1
        or (limited[0]["activity_name"], limited[0]["limit_digest"]) != freeing
    ):
        # only the next step under the same limit and key rides the completion's hand-off; any
        # other limited dispatch is settled in the lock order: the ordinary way
        return "limited"
    if closes_limited(w, row, registry) and (not together or freeing is not None):
        return "admission"  # its close frees a slot and admits the next: in the lock order
    return ""
