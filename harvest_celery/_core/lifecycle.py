"""How decisions and operator actions change a run — pure rules shared by the store (which applies
them in SQL) and the in-memory ``testing.Simulator``."""

from __future__ import annotations

from collections.abc import Sequence

from harvest_celery._core import events as ev
from harvest_celery._core.commands import (
    Completed,
    CompleteUpdate,
    ContinuedAsNew,
    Decision,
    Failed,
    RecordMarker,
    ScheduleActivity,
    StartChildWorkflow,
    StartTimer,
)
from harvest_celery._core.names import CANCELLED_ERROR, SAGA_COMPENSATED, is_marker

RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TERMINATED = "TERMINATED"
# ended by ``ctx.continue_as_new``: its chain goes on in the run named by ``continued_to``
CONTINUED_AS_NEW = "CONTINUED_AS_NEW"
# a deadline expired (``execution_timeout``/``run_timeout``) and the run did not complete anyway:
# it raised ``Cancelled`` or another error after the timeout request, or was sealed at grace end
TIMED_OUT = "TIMED_OUT"
TERMINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED, TERMINATED, CONTINUED_AS_NEW, TIMED_OUT})
# Every stored run status (``harvest_executions.status``), in one order: the schema's CHECK
# constraint, the SQL and the predicates (``_store.predicates``) take them from here. A new
# status is added here and by a migration altering that constraint (``0007`` is the model).
RUN_STATUSES = (RUNNING, COMPLETED, FAILED, CANCELLED, TERMINATED, CONTINUED_AS_NEW, TIMED_OUT)
# Derived, never stored: a RUNNING run with an open cooperative cancellation request. Claims,
# completions and a later seal cancel treat it exactly as RUNNING.
CANCELLING = "CANCELLING"
# Derived, never stored: a RUNNING run of a limited workflow not yet admitted (``admitted_at``
# NULL, docs/flow-control.md). No decision is requested or taken for it.
WAITING = "WAITING"


def decision_events(decision: Decision, history: Sequence[ev.Event]) -> list[ev.Event]:
    """Events a (non-divergent) decision appends, in command order, then its outcome.

    After a cancel the workflow's own outcome is still appended (unmatched), once.
    """
    out: list[ev.Event] = []
    for command in decision.commands:
        if isinstance(command, ScheduleActivity):
            out.append(
                ev.ActivityScheduled(
                    command.activity_id,
                    command.activity_name,
                    command.input,
                    command.queue,
                    command.compensation,
                    command.call_convention,
                    command.node,
                )
            )
        elif isinstance(command, RecordMarker):
            out.append(ev.MarkerRecorded(command.name, command.details))
        elif isinstance(command, StartTimer):
            out.append(ev.TimerStarted(command.timer_id, command.seconds, command.fire_at))
        elif isinstance(command, StartChildWorkflow):
            out.append(
                ev.ChildWorkflowScheduled(
                    command.child_id,
                    command.workflow_type,
                    command.input,
                    command.queue,
                    command.policy,
                    command.compensation,
                )
            )
        elif isinstance(command, CompleteUpdate):
            out.append(
                ev.UpdateCompleted(command.update_id, command.result, command.error_type, command.message)
            )
    outcome = decision.outcome
    if outcome is not None and not has_outcome(history):
        if isinstance(outcome, Completed):
            out.append(ev.WorkflowCompleted(outcome.result))
        elif isinstance(outcome, Failed):
            out.append(ev.WorkflowFailed(outcome.error_type, outcome.message))
        elif isinstance(outcome, ContinuedAsNew):
            out.append(ev.WorkflowContinuedAsNew(outcome.next_id, outcome.input))
    return out


def has_outcome(history: Sequence[ev.Event]) -> bool:
    return any(isinstance(e, ev.TERMINAL_EVENTS) for e in history)


def status_for_outcome(
    decision: Decision, current: str, cancel_requested: bool = False, timed_out: bool = False
) -> str:
    """A live run takes its outcome's status; a sealed (cancelled) run keeps the status the cancel
    gave it. After a cooperative cancellation request, a workflow that raises ``Cancelled`` ends
    CANCELLED (one that completes anyway ends COMPLETED; any other error FAILED). After a
    deadline's timeout request (``timed_out``: ``timed_out_at`` is set) any error ends TIMED_OUT
    (a ``Cancelled`` is its clean exit; another error a failed cancel branch)."""
    outcome = decision.outcome
    if current != RUNNING or outcome is None:
        return current
    if isinstance(outcome, Completed):
        return COMPLETED
    if isinstance(outcome, ContinuedAsNew):
        return CONTINUED_AS_NEW
    if timed_out:
        return TIMED_OUT
    return CANCELLED if cancel_requested and outcome.error_type == CANCELLED_ERROR else FAILED


def cancel_requested(history: Sequence[ev.Event]) -> bool:
    """A cooperative cancellation request (an operator's or a deadline's) is recorded."""
    return any(isinstance(e, ev.CANCEL_REQUESTS) for e in history)


def timeout_requested(history: Sequence[ev.Event]) -> ev.WorkflowTimeoutRequested | None:
    """The deadline's timeout request recorded, if any (the first)."""
    return next((e for e in history if isinstance(e, ev.WorkflowTimeoutRequested)), None)


def unwind_begun(history: Sequence[ev.Event]) -> bool:
    """An unwind has begun: a saga marker or a compensation dispatch (an activity or a child)
    is recorded."""
    for e in history:
        if isinstance(e, ev.MarkerRecorded) and is_marker(e.name, SAGA_COMPENSATED):
            return True
        if isinstance(e, (ev.ActivityScheduled, ev.ChildWorkflowScheduled)) and e.compensation:
            return True  # a compensating child counts as a compensation dispatch
    return False


def status_after_cancel(history: Sequence[ev.Event], timed_out: bool = False) -> str:
    """CANCELLED at once; FAILED when the cancel lands mid-unwind (the remaining compensators
    never run, and the dangling state needs reconciliation). The seal of a deadline's grace
    period end (``timed_out``; never mid-unwind) gives TIMED_OUT."""
    if timed_out:
        return TIMED_OUT
    return FAILED if unwind_begun(history) else CANCELLED


def open_activity_ids(history: Sequence[ev.Event]) -> list[str]:
    """Activities scheduled with no final result yet, in dispatch order."""
    done = {e.activity_id for e in history if isinstance(e, (ev.ActivityCompleted, ev.ActivityFailed))}
    return [
        e.activity_id for e in history if isinstance(e, ev.ActivityScheduled) and e.activity_id not in done
    ]


def cancel_branch_failure(status: str, cancelled: bool, error: object) -> str | None:
    """``"<type>: <message>"`` of a cancelled run whose cancel branch failed (``cancelled``: sealed
    by a cancel or asked to cancel) — it ended with an error other than ``Cancelled`` (its clean
    exit) or an operator's terminate — else None. The dangling state operators must see."""
    if not cancelled or status not in (CANCELLED, FAILED, TIMED_OUT) or not isinstance(error, dict):
        return None
    if error.get("type") in (CANCELLED_ERROR, "Terminated"):
        return None
    return f"{error.get('type', 'Error')}: {error.get('message', '')}"


def display_status(
    status: str, cancelled: bool, cancel_requested: bool, error: object, waiting: bool = False
) -> str:
    """The status as operators read it: ``WAITING`` while a live run waits for admission,
    ``CANCELLING`` while a cooperative cancellation request (or a deadline's timeout request) is
    open, ``CANCELLED (cancel branch failed: …)`` or ``TIMED_OUT (cancel branch failed: …)``
    when a cancel branch failed; else the stored status."""
    if status == RUNNING and waiting:
        return WAITING
    if status == RUNNING and cancel_requested:
        return CANCELLING
    failure = cancel_branch_failure(status, cancelled or cancel_requested, error)
    return f"{status} (cancel branch failed: {failure})" if failure else status
