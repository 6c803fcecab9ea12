"""Names that are recorded in history or read back from it, defined once: marker prefixes, the
error type of a lost or overrun attempt, task-row statuses (run statuses are in ``lifecycle``).
Never repeat these as bare literals."""

from __future__ import annotations

from enum import Enum

# ── observability and versioning markers (``MarkerRecorded.name``) ───────────────────────────
SAGA_COMPENSATED = "saga_compensated"  # saga_compensated:{seq}: an unwind began (counted once)
SAGA_COMPENSATION_FAILED = "saga_compensation_failed"  # ...:{seq}: that unwind had errors
SAGA_MARKERS = (SAGA_COMPENSATED, SAGA_COMPENSATION_FAILED)
PATCH = "patch"  # patch:{id}: ctx.patched(id) took the new branch


def marker(prefix: str, key: object) -> str:
    """``prefix:key``, the recorded name of a numbered or keyed marker."""
    return f"{prefix}:{key}"


def is_marker(name: str, prefix: str) -> bool:
    return name.startswith(prefix + ":")


def is_saga_marker(name: str) -> bool:
    return any(is_marker(name, prefix) for prefix in SAGA_MARKERS)


# ── error types recorded in ActivityFailed.error_type / WorkflowFailed.error_type ───────────
START_TO_CLOSE_TIMEOUT = "StartToCloseTimeout"  # the lease expired or start_to_close overran
CANCELLED_ERROR = "Cancelled"  # a workflow that raised Cancelled: the clean exit of a cancel branch


# ── activity task rows (``activity_tasks.status``) ───────────────────────────────────────────
class TaskStatus(str, Enum):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # held back by a limit (docs/flow-control.md): no message staged; only a release moves it on
    WAITING = "waiting"


# ── how an adopted task is called with its recorded input (``ActivityScheduled.call_convention``,
# ``activity_tasks.call_convention``): a closed set that later features extend. None (absent):
# the input is the task's one positional argument.
class CallConvention(str, Enum):
    ARGS_KWARGS = "args_kwargs"  # the input is {"args": [...], "kwargs": {...}}: body(*args, **kwargs)
    # a compensation: the input is the envelope {dag_compensate, input, output}
    ENVELOPE_OUTPUT = "envelope_output"  # body(envelope["output"]): the undo gets the result
    ENVELOPE = "envelope"  # body(envelope): the opt-in for the whole envelope
    # a chunk or starmap node: {"items": [[args...], ...]}: [body(*item) for item in items], in
    # order, inside one attempt
    PER_ITEM = "per_item"


CALL_CONVENTIONS = tuple(c.value for c in CallConvention)


# Every stored task-row status, in one order (the schema's CHECK constraint; see RUN_STATUSES).
TASK_STATUSES = tuple(s.value for s in TaskStatus)
