"""Commands: what one decision asks the world to do. Produced by the pure engine, applied by the
store in the decision's transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harvest_celery._core.retry import RetryPolicy


@dataclass(frozen=True)
class ScheduleActivity:
    activity_id: str
    activity_name: str
    input: Any
    queue: str  # resolved: call queue → activity default_queue → "default"
    compensation: bool = False
    # a DAG node's own .retry(...) / .start_to_close(...) overrides (never a compensator's)
    retry: RetryPolicy | None = None
    start_to_close: float | None = None
    # how an adopted task is called with ``input`` (``names.CallConvention``); None: as its one
    # argument
    call_convention: str | None = None
    # a canvas node's id (``ActivityScheduled.node``); None: keyed by activity name
    node: str | None = None
    # Flow control (docs/flow-control.md): kept on the task row, never part of event matching.
    priority: int = 0
    limit_key: str | None = None  # the activity's limit_key(input), computed once, here


@dataclass(frozen=True)
class RecordMarker:
    name: str
    details: Any = None
    # Counter to increment once this marker is committed (saga observability); None for plain markers.
    metric: str | None = None


@dataclass(frozen=True)
class StartTimer:
    timer_id: str
    seconds: float
    fire_at: str


@dataclass(frozen=True)
class StartChildWorkflow:
    """Start a child run in the parent's write (``ChildWorkflowScheduled`` + its answer)."""

    child_id: str
    workflow_type: str
    input: Any
    queue: str  # the child's decision queue; "" → the parent's
    policy: str  # the parent-close policy: terminate · request_cancel · abandon
    compensation: bool = False
    # the id was given by the workflow (``id=``): one that exists is refused, never reused
    user_id: bool = False
    # its admission, decided at the parent's decision (``_core.admission``): its start priority
    # (the parent's unless given) and, for a limited child workflow, its declared concurrency
    # and the key its ``limit_key`` gave (None: one global limit). Never recorded in an event.
    priority: int = 0
    concurrency: int | None = None
    limit_key: str | None = None


@dataclass(frozen=True)
class CompleteUpdate:
    """An update handler ended (``UpdateCompleted``): its JSON ``result``, or its error."""

    update_id: str
    result: Any = None
    error_type: str = ""
    message: str = ""


Command = ScheduleActivity | RecordMarker | StartTimer | StartChildWorkflow | CompleteUpdate


@dataclass(frozen=True)
class Completed:
    result: Any


@dataclass(frozen=True)
class Failed:
    error_type: str
    message: str
    # where the workflow code raised (file and line); kept beside the run, not in its history
    traceback: str = field(default="", compare=False)
    # KeyboardInterrupt or SystemExit: the workflow's own, or a shutdown signal that arrived
    # mid-decision — the runtime tells them apart (a shutdown must not seal the run FAILED)
    interrupt: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class ContinuedAsNew:
    """``ctx.continue_as_new``: the run ends CONTINUED_AS_NEW and ``next_id`` starts with
    ``input``; ``signals`` are the (name, payload) the replay never consumed, in history order."""

    next_id: str
    input: Any
    signals: tuple[tuple[str, Any], ...] = ()


Outcome = Completed | Failed | ContinuedAsNew


@dataclass(frozen=True)
class Decision:
    """The output of one decision: new commands, the run's outcome if it finished, and the
    non-determinism details if replay diverged (in which case nothing may be appended)."""

    commands: list[Command] = field(default_factory=list)
    outcome: Outcome | None = None
    nd: dict[str, Any] | None = None

    @property
    def metrics(self) -> list[str]:
        return [c.metric for c in self.commands if isinstance(c, RecordMarker) and c.metric]
