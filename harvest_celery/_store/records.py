"""Typed rows out of the store: what callers above the seam see instead of SQLAlchemy rows, and
the dispatch records a transaction asks to send once it commits (neutral: the message protocol
that turns them into Celery messages lives in ``_runtime.messages``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from harvest_celery._core.events import HistoryEvent
from harvest_celery._core.lifecycle import RUNNING, cancel_branch_failure, display_status
from harvest_celery._core.names import CANCELLED_ERROR
from harvest_celery._store import predicates


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything here is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


class _NotLoaded:
    """A payload column the lock did not read (``Tx.lock(payloads=False)``)."""

    def __repr__(self) -> str:
        return "NOT_LOADED"


NOT_LOADED: Any = _NotLoaded()


@dataclass(frozen=True)
class RunRow:
    """The execution row as a locked transaction sees it (payload columns still encoded)."""

    id: str
    workflow_type: str
    status: str
    next_seq: int
    input: Any
    result: Any
    error: Any
    decision_requested_at: datetime | None
    cancelled_at: datetime | None
    paused_at: datetime | None
    erased_at: datetime | None
    nd_blocked_at: datetime | None
    nd_retry_at: datetime | None
    nd_block_count: int
    forked_to: str | None
    sticky_queue: str | None = None  # where its warm replay lives (a worker's own queue)
    cancel_requested_at: datetime | None = None  # an open cooperative cancellation request
    decision_queue: str | None = None  # the starting app's decision queue (NULL before 0013)
    timed_out_at: datetime | None = None  # a deadline's timeout request was recorded
    # workflow admission (``_store.admission``): None while the run waits for a slot of its
    # workflow's limit (derived WAITING); a row read without the column counts as admitted
    admitted_at: datetime | None = predicates.ADMITTED
    limit_digest: str | None = None  # its harvest_limits row's key digest; None: not limited
    priority: int = 0  # its start priority, the default of its activities'
    limit_key: Any = None  # its admission key, encoded (a payload: erasure tombstones it)
    # tracing's stored context (not state: written once at start), already in the locked row's
    # columns: a decision's span needs no read of its own (``_runtime.tracing``)
    traceparent: str | None = None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | Any) -> RunRow:
        return cls(
            m["id"],
            m["workflow_type"],
            m["status"],
            int(m["next_seq"]),
            m.get("input", NOT_LOADED),
            m.get("result", NOT_LOADED),
            m["error"],
            m["decision_requested_at"],
            m["cancelled_at"],
            m["paused_at"],
            m["erased_at"],
            m["nd_blocked_at"],
            m["nd_retry_at"],
            m["nd_block_count"] or 0,
            m["forked_to"],
            m.get("sticky_queue"),
            m.get("cancel_requested_at"),
            m.get("decision_queue"),
            m.get("timed_out_at"),
            m.get("admitted_at", predicates.ADMITTED),
            m.get("limit_digest"),
            int(m.get("priority") or 0),
            m.get("limit_key", NOT_LOADED),
            m.get("traceparent"),
        )

    @classmethod
    def assumed(
        cls, execution_id: str, workflow_type: str, next_seq: int, sticky_queue: str | None
    ) -> RunRow:
        """The run row a one-statement completion assumes: exactly what ``predicates.fast_path``
        checks (its run terms' values), the rest empty."""
        return cls(
            id=execution_id,
            workflow_type=workflow_type,
            input=None,
            result=None,
            error=None,
            nd_block_count=0,
            forked_to=None,
            **predicates.fast_path.assumed(next_seq=next_seq, sticky_queue=sticky_queue),
        )

    def decide_on(self, queue: str) -> str:
        """Where this run's decision requests go: the worker holding its warm replay, if any,
        else the starting app's decision queue, else (a run from before 0013) ``queue``."""
        return self.sticky_queue or self.decision_queue or queue

    @property
    def accepts_results(self) -> bool:
        """``predicates.accepts_results``: live or cancelled, not erased."""
        return predicates.accepts_results.holds(self)

    @property
    def decidable(self) -> bool:
        """``predicates.decidable``: that, admitted, and not paused."""
        return predicates.decidable.holds(self)

    @property
    def waiting(self) -> bool:
        """Waiting for admission: a decision is never requested or taken (derived WAITING)."""
        return self.admitted_at is None


@dataclass(frozen=True)
class TaskRow:
    """One activity task row: the durable record of a dispatch and its current attempt."""

    execution_id: str
    activity_id: str
    activity_name: str
    queue: str
    status: str
    attempt: int
    retry: Any
    start_to_close: float | None
    event_seq: int
    adopted: bool
    dispatched_at: datetime | None
    call_convention: str | None = None
    limit_digest: str | None = None  # its harvest_limits row's key digest; None: not limited
    compensation: bool = False  # dispatched by an unwind
    priority: int = 0  # 0..9, 9 first (``execute_activity(priority=)``)

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | Any) -> TaskRow:
        return cls(
            m["execution_id"],
            m["activity_id"],
            m["activity_name"],
            m["queue"],
            m["status"],
            int(m["attempt"]),
            m["retry"],
            m["start_to_close"],
            int(m["event_seq"]),
            bool(m["adopted"]),
            aware(m["dispatched_at"]),
            m.get("call_convention"),
            m.get("limit_digest"),
            bool(m.get("compensation") or False),
            int(m.get("priority") or 0),
        )


@dataclass(frozen=True)
class Dispatch:
    """Work a committed transaction asks to send: a decision request, or an activity attempt.

    ``input`` is set only for adopted tasks (an existing Celery task receives its input as its
    argument, or as its whole call under ``call_convention``); engine-native activities carry
    ids only. ``deadline`` is the attempt's start_to_close (a DAG node's override included)."""

    kind: str  # "decide" | "activity"
    execution_id: str
    queue: str
    activity_id: str = ""
    activity_name: str = ""
    attempt: int = 0
    adopted: bool = False
    input: Any = None
    deadline: float | None = None
    requested_at: float = 0.0  # a decision request's time, part of its message id
    # an eager attempt claimed in the very write that scheduled it (``EagerClaim``): no message
    # is sent for it; the worker thread that took the decision runs it next
    claimed: Claim | None = None
    call_convention: str | None = None  # an adopted task's (``names.CallConvention``)
    # the task row's priority (0..9, 9 first): the message's own only when the dispatcher maps
    # it (``Harvest(message_priority=True)``, ``_runtime.celery.message_priority``)
    priority: int = 0

    DECIDE = "decide"
    ACTIVITY = "activity"


@dataclass(frozen=True)
class RelayedMessage:
    """An outbox row written by an older build: relayed as stored."""

    id: int
    task_name: str
    queue: str
    args: list[Any]
    task_id: str
    headers: dict[str, Any] | None = None


def outbox_execution_id(args: Any, headers: Any) -> str | None:
    """The run of an outbox row as older builds wrote it (no ``execution_id`` column then): an
    adopted task's ids are in its ``harvest`` header, its argument being the input; a
    decision's and an engine-native activity's first argument is the execution id. Never
    parsed from the task id: ``a:1:1`` may be run ``a``'s or, before ids refused ':', run
    ``a:1``'s. Migration 0006 backfills with a frozen copy of this."""
    ref = headers.get("harvest") if isinstance(headers, dict) else None
    if isinstance(ref, dict) and isinstance(ref.get("execution_id"), str):
        return str(ref["execution_id"])
    if isinstance(args, list) and args and isinstance(args[0], str):
        return args[0]
    return None


def timeout_kind(timed_out_at: datetime | None, execution_deadline_at: datetime | None) -> str | None:
    """Which deadline the sweeper found expired: the execution deadline when it was due by then
    (it is checked first), else the run deadline."""
    if timed_out_at is None:
        return None
    if execution_deadline_at is not None and aware(execution_deadline_at) <= aware(timed_out_at):  # type: ignore[operator]
        return "execution"
    return "run"


@dataclass(frozen=True)
class RunOutcome:
    """What ``Harvest.result`` reads on each look at a run (``Store.outcome``): its status, whether
    a cancel sealed it, and, once it is closed, its result and error (decoded)."""

    id: str
    status: str
    result: Any
    error: Any
    cancelled_at: datetime | None
    cancel_reason: str | None


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
    cancel_requested_at: datetime | None = None
    # child workflows and continue-as-new chains (docs/concepts.md, "Child workflows")
    parent_id: str | None = None
    continued_from: str | None = None
    continued_to: str | None = None
    children: tuple[dict[str, str], ...] = ()  # (id, workflow, status) of each child, by describe()
    # deadlines (docs/concepts.md, "Deadlines")
    execution_deadline_at: datetime | None = None
    run_deadline_at: datetime | None = None
    timed_out_at: datetime | None = None
    timeout_grace_at: datetime | None = None
    timeout_overrun_at: datetime | None = None
    # workflow admission (docs/flow-control.md): None while waiting; its start priority; and,
    # from describe(), a waiting run's place ({position, waiting, in_use, concurrency, workflow})
    admitted_at: datetime | None = None
    priority: int = 0
    admission: dict[str, Any] | None = None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | Any) -> Execution:
        return cls(
            id=m["id"],
            workflow_type=m["workflow_type"],
            status=m["status"],
            input=m["input"],
            result=m["result"],
            error=m["error"],
            created_at=aware(m["created_at"]),  # type: ignore[arg-type]
            updated_at=aware(m["updated_at"]),  # type: ignore[arg-type]
            closed_at=aware(m["closed_at"]),  # type: ignore[arg-type]
            cancelled_at=aware(m["cancelled_at"]),
            cancel_reason=m["cancel_reason"],
            nd_blocked_at=aware(m["nd_blocked_at"]),
            nd_block_reason=m["nd_block_reason"],
            nd_block_count=m["nd_block_count"] or 0,
            nd_details=m["nd_details"],
            history_length=m["next_seq"],
            erased_at=aware(m["erased_at"]),
            paused_at=aware(m["paused_at"]),
            forked_from=m["forked_from"],
            forked_to=m["forked_to"],
            parent_id=m.get("parent_id"),
            continued_from=m.get("continued_from"),
            continued_to=m.get("continued_to"),
            cancel_requested_at=aware(m.get("cancel_requested_at")),
            execution_deadline_at=aware(m.get("execution_deadline_at")),
            run_deadline_at=aware(m.get("run_deadline_at")),
            timed_out_at=aware(m.get("timed_out_at")),
            timeout_grace_at=aware(m.get("timeout_grace_at")),
            timeout_overrun_at=aware(m.get("timeout_overrun_at")),
            admitted_at=aware(m.get("admitted_at", predicates.ADMITTED)),
            priority=int(m.get("priority") or 0),
        )

    @property
    def waiting(self) -> bool:
        """Waiting for admission (the derived WAITING): RUNNING and not admitted."""
        return self.status == RUNNING and self.admitted_at is None

    @property
    def timeout(self) -> str | None:
        """Which deadline expired (``"execution"`` or ``"run"``), or None."""
        return timeout_kind(self.timed_out_at, self.execution_deadline_at)

    @property
    def timeout_overrun(self) -> bool:
        """The grace period after a timeout ended mid-unwind: the run was left running until
        its workflow ends (a WARNING was logged; an operator may still cancel or terminate)."""
        return self.timeout_overrun_at is not None

    @property
    def nd_blocked(self) -> bool:
        return self.nd_blocked_at is not None

    @property
    def cancelling(self) -> bool:
        """A cooperative cancellation request is open (the stored status stays RUNNING)."""
        return self.status == RUNNING and self.cancel_requested_at is not None

    @property
    def cancel_branch_error(self) -> str | None:
        """``"<type>: <message>"`` when the run was cancelled and its cancel branch failed."""
        return cancel_branch_failure(
            self.status, self.cancel_requested_at is not None or self.cancelled_at is not None, self.error
        )

    @property
    def display_status(self) -> str:
        """``WAITING``, ``CANCELLING``, ``CANCELLED (cancel branch failed: …)`` or the stored status."""
        return display_status(
            self.status,
            self.cancelled_at is not None,
            self.cancel_requested_at is not None,
            self.error,
            self.waiting,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        out["nd_blocked"] = self.nd_blocked
        out["timeout"] = self.timeout
        out["timeout_overrun"] = self.timeout_overrun
        out["display_status"] = self.display_status
        out["cancel_branch_error"] = self.cancel_branch_error
        out["waiting"] = self.waiting
        return out


@dataclass(frozen=True)
class RunSnapshot:
    """What a query reads of a run (``Store.snapshot``): the row's identity and state, and its
    decoded history, read together in one read-only transaction."""

    id: str
    workflow_type: str
    status: str
    erased_at: datetime | None
    history: list[HistoryEvent]


@dataclass(frozen=True)
class CancelBranch:
    """What the post-cancel decision of a sealed run did: ``settled`` once no decision is
    pending and no body is running; ``outcome`` returned · cancelled (raised ``Cancelled``) ·
    failed (``error``: ``"<type>: <message>"``) · stopped (no outcome: it waits on something that
    can no longer arrive) · pending (not settled yet)."""

    reason: str
    settled: bool
    outcome: str
    error: str | None = None


def cancel_branch_of(reason: str, settled: bool, terminal: str | None, error: Any) -> CancelBranch:
    """Classify a sealed run's branch from its terminal event type (None: none recorded) and
    its error column (set by a ``WorkflowFailed``)."""
    if not settled:
        return CancelBranch(reason, False, "pending")
    if terminal == "WorkflowCompleted":
        return CancelBranch(reason, True, "returned")
    if terminal == "WorkflowFailed":
        error = error if isinstance(error, dict) else {}
        text = f"{error.get('type', 'Error')}: {error.get('message', '')}"
        return CancelBranch(
            reason, True, "cancelled" if error.get("type") == CANCELLED_ERROR else "failed", text
        )
    return CancelBranch(reason, True, "stopped")


@dataclass(frozen=True)
class AttemptError:
    """One failed attempt, as recorded (activity_id "" and attempt 0: the workflow's own
    failure, with the workflow code's traceback)."""

    activity_id: str
    attempt: int
    error_type: str
    message: str
    traceback: str
    recorded_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "activity_id": self.activity_id,
            "attempt": self.attempt,
            "error_type": self.error_type,
            "message": self.message,
            "traceback": self.traceback,
            "recorded_at": self.recorded_at.isoformat(),
        }


@dataclass(frozen=True)
class Claim:
    """What a successful pre-run claim hands the worker."""

    execution_id: str
    activity_id: str
    activity_name: str
    attempt: int
    input: Any
    start_to_close: float | None
    # the ActivityStarted this claim appended (the completing worker's warm replay reads it back
    # from here instead of from the database)
    worker_id: str = ""
    started_seq: int | None = None
    started_at: datetime | None = None
    call_convention: str | None = None  # how an adopted body is called with ``input``
    queue: str = ""  # the task row's queue (metrics' label)
    # when its ActivityScheduled was recorded (the schedule-to-start metric)
    scheduled_at: datetime | None = None
    compensation: bool = False  # dispatched by an unwind (tracing names its span for it)


@dataclass(frozen=True)
class EagerClaim:
    """A worker thread that will run one activity of the decision it is writing, right after
    the commit (eager execution). That activity is claimed in the decision's own write: its new
    task row is written ``running`` under this worker's lease and its ``ActivityStarted`` is
    appended after the decision's events — the same guard as the claim statement, which a row
    scheduled by this very write passes by construction — so the attempt needs no claim
    statement and no commit of its own, and ``ActivityStarted`` still commits before the body.
    ``wants``: whether this thread runs that dispatch (the first one it wants is claimed)."""

    worker_id: str
    lease: float
    wants: Callable[[Dispatch], bool]


@dataclass(frozen=True)
class CompletionGuard:
    """The attempt a completion written in one statement with its decision closes
    (``Tx.apply_guarded_decision``). The statement writes only if that attempt still holds its
    task row and the run row is as the deciding warm replay assumes (the ``RunRow`` it is
    given: its next seq and sticky queue, live, no cancel, pause, erasure, nd-block or pending
    decision) — checked under the run's row lock by the statement itself; else nothing."""

    activity_id: str
    attempt: int
    # the attempt holds a slot of a concurrency limit (its name and key digest): the statement
    # hands that slot on (``sql.HAND_OFF_AFTER_WRITE``) in the same round trip
    limited: tuple[str, str] | None = None


@dataclass(frozen=True)
class Timings:
    """Sweeper and lease settings."""

    # seconds a claim holds without start_to_close; renewed every third of it while the body
    # runs, so it bounds how long a vanished worker's activity waits to be retried
    default_lease: float = 60.0
    # re-send a scheduled row / decision request whose message seems lost after this (the task
    # row and the run row's decision request are the durable records of every message)
    redispatch_after: float = 30.0
    nd_retry_initial: float = 1.0
    nd_retry_max: float = 300.0
    # a body's outcome (it ran: its side effect happened) is retried this long against a
    # database that does not answer, its lease renewed meanwhile, before it is given up
    outcome_retry_for: float = 300.0
    # after a deadline's timeout request, a run still open this long later, with no unwind
    # begun, is sealed (``runs.cancel``): TIMED_OUT (docs/operations.md, "Deadlines")
    timeout_grace: float = 60.0
