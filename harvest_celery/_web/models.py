"""The pydantic request and response models of the operator API, and the run/node status literals.

Every model here is part of the published OpenAPI document: a field, a default or a description
changed here changes the API. Request models forbid unknown fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harvest_celery._core.activities import Status as ActivityStatus

# the run statuses of _lifecycle and the node statuses of _rungraph (a unit test pins both)
Status = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TERMINATED", "CONTINUED_AS_NEW", "TIMED_OUT"]
# what a list may filter on: a stored status, or the derived CANCELLING (an open cancel request)
# or WAITING (a live run not yet admitted by its workflow's limit, docs/flow-control.md)
StatusFilter = Literal[
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TERMINATED",
    "CONTINUED_AS_NEW",
    "TIMED_OUT",
    "CANCELLING",
    "WAITING",
]
# outcomes of a sealed run's cancel branch (WorkflowCancelledError.OUTCOMES)
BranchOutcome = Literal["returned", "cancelled", "failed", "stopped", "pending"]
NodeStatus = ActivityStatus  # the core activity fold's words (``_core.activities.STATUSES``)
# what a start of an existing id does (_store.starts.ID_REUSE; a unit test pins them equal)
IdReuse = Literal["idempotent", "use_existing", "reject"]
# every reason a RetryRefused carries (a unit test pins them against the raisers)
RetryRefusalReason = Literal["compensated", "erased", "running", "completed", "retried", "canvas_version"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    error: str = Field(description="the error's class name, e.g. ExecutionNotFound")
    detail: Any = Field(description="a message, or pydantic's error list for a ValidationError")


class RetryRefusedBody(ErrorBody):
    reason: RetryRefusalReason | None = Field(
        default=None, description="why a DAG retry was refused (RetryRefused only)"
    )


class StartWorkflowRequest(_Model):
    workflow: str = Field(description="a registered workflow or DAG name")
    input: Any = Field(default=None, description="the run's JSON input")
    execution_id: str | None = Field(default=None, description="idempotency key; a fresh id if omitted")
    id_reuse: IdReuse = Field(
        default="idempotent",
        description="when execution_id names an existing run of this workflow: idempotent (the "
        "same input answers that run, another input is a 409), use_existing (that "
        "run, whatever its input) or reject (always a 409); another workflow's id is "
        "always a 409",
    )
    execution_timeout: float | None = Field(
        default=None,
        description="seconds: the deadline of the whole execution (it spans a continue-as-new "
        "chain); at it the run is asked to cancel (docs/concepts.md, Deadlines). Not positive: a 400",
    )
    run_timeout: float | None = Field(
        default=None, description="seconds: the deadline of each run of the chain. Not positive: a 400"
    )
    priority: int = Field(
        default=0,
        ge=0,
        le=9,
        strict=True,
        description="0 to 9, 9 first: orders runs waiting for admission to a limited workflow, and "
        "is the default priority of the run's activities (docs/flow-control.md)",
    )


class StartWorkflowResponse(BaseModel):
    execution_id: str


class SignalRequest(_Model):
    payload: Any = None


class CancelRequest(_Model):
    reason: str = Field(default="", max_length=1000)


class CancelResponse(BaseModel):
    execution_id: str
    status: Status


class RequestCancelResponse(BaseModel):
    execution_id: str
    requested: bool = Field(
        description="false if a cancellation request was already open (idempotent: nothing recorded)"
    )
    display_status: str = Field(
        description="the run's status as shown: CANCELLING while the "
        "request is open and the run has not finished"
    )


class TerminateRequest(_Model):
    reason: str = Field(default="", max_length=1000)


class TerminateResponse(BaseModel):
    execution_id: str
    status: Status


class PauseResponse(BaseModel):
    execution_id: str
    status: Status
    paused_at: datetime | None = Field(description="set while the run's decisions are held")


class ResetRequest(_Model):
    to_seq: int = Field(ge=1, le=2**31 - 1, description="how many leading events of the source to keep")
    new_execution_id: str | None = Field(default=None, description="the new run's id; a fresh id if omitted")


class ForkResponse(BaseModel):
    run_id: str = Field(description="the new run")
    forked_from: str = Field(description="the source run")


class RetryRequest(_Model):
    from_node: str | None = Field(
        default=None, description="the node to re-run from; default: the first failed node"
    )
    new_execution_id: str | None = Field(default=None, description="the new run's id; a fresh id if omitted")


class RetryResponse(BaseModel):
    run_id: str | None = Field(description="the new run; null for a dry run")
    source_run_id: str
    retry_from: str
    carried: list[str] = Field(description="succeeded nodes carried over, not re-run")
    rerun: list[str] = Field(description="nodes the new run runs, in level order")
    dry_run: bool


class EraseRequest(_Model):
    with_forks: bool = Field(
        default=False,
        description=(
            "also erase the run's fork family (the runs reset or retry forked from it or it from), "
            "which hold copies of its payloads; without it such an erasure is refused (409)"
        ),
    )


class EraseResponse(BaseModel):
    execution_id: str
    events: int = Field(description="events whose payload fields were tombstoned by this call")
    fields: int = Field(description="payload fields tombstoned by this call")
    blobs: int = Field(description="offloaded blobs deleted")
    forks: list[str] = Field(
        default_factory=list, description="the other runs of the fork family erased with it"
    )


class PurgeRequest(_Model):
    older_than_days: float = Field(
        ge=0,
        le=36500,
        allow_inf_nan=False,
        description="delete terminal runs closed more than this many days ago",
    )
    batch: int = Field(default=500, ge=1, le=10000, description="runs deleted per transaction")


class PurgeResponse(BaseModel):
    runs: int
    events: int
    blobs: int


class SignalResponse(BaseModel):
    execution_id: str
    signal: str


class NdDetails(BaseModel):
    expected: str | None = None
    actual: str | None = None
    event_index: int | None = None
    workflow_type: str | None = None


class WorkflowSummary(BaseModel):
    execution_id: str
    workflow_type: str
    status: Status = Field(description="the stored status (a CANCELLING run is stored RUNNING)")
    display_status: str = Field(
        description="the status as operators read it: WAITING while a live run waits for "
        "admission (its workflow's concurrency limit); CANCELLING while a cooperative cancellation "
        "request is open; 'CANCELLED (cancel branch failed: <error>)' (or FAILED …) when "
        "a cancelled run's cancel branch failed, leaving dangling state; else status"
    )
    cancel_requested_at: datetime | None = Field(
        default=None, description="when a cooperative cancellation was requested"
    )
    cancel_branch_error: str | None = Field(
        default=None, description="'<type>: <message>' when a cancelled run's cancel branch failed"
    )
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    cancelled_at: datetime | None
    history_length: int
    nd_blocked: bool
    nd_blocked_at: datetime | None
    nd_block_reason: str | None
    nd_block_count: int
    paused_at: datetime | None = Field(description="set while an operator holds the run's decisions")
    erased_at: datetime | None = Field(description="when the run's payloads were erased")
    forked_from: str | None = Field(description="the run this one was forked from (retry or reset)")
    forked_to: str | None = Field(description="the run forked from this one (retry or reset)")
    parent_id: str | None = Field(default=None, description="the run that started this one as a child")
    continued_from: str | None = Field(
        default=None, description="the previous run of its continue-as-new chain"
    )
    continued_to: str | None = Field(
        default=None, description="the next run of its continue-as-new chain (this one is CONTINUED_AS_NEW)"
    )
    execution_deadline_at: datetime | None = Field(
        default=None, description="the execution deadline (execution_timeout; it spans the chain)"
    )
    run_deadline_at: datetime | None = Field(default=None, description="this run's deadline (run_timeout)")
    timed_out_at: datetime | None = Field(
        default=None, description="when a deadline's timeout request was recorded"
    )
    timeout: Literal["execution", "run"] | None = Field(default=None, description="which deadline expired")
    timeout_grace_at: datetime | None = Field(
        default=None, description="when a timed-out run still open, with no unwind begun, is sealed"
    )
    timeout_overrun: bool = Field(
        default=False,
        description="the grace period ended mid-unwind: the run is left running until it ends",
    )


class ChildLink(BaseModel):
    id: str = Field(description="the child's run id")
    workflow: str
    status: Status


class SlotHolder(BaseModel):
    execution_id: str = Field(description="a run holding a slot of the waiting run's key")
    state: str = Field(description="why it is not moving: paused, nd-blocked: …, running, …")


class WaitingHint(BaseModel):
    kind: Literal["activity", "decision", "slot", "admission"] = Field(
        description="an open activity, a pending decision request, an activity a limit holds "
        "back (slot), or the run itself waiting for admission (admission); slot and admission "
        "are known from Postgres alone"
    )
    activity: str | None = Field(default=None, description="the activity's name (null for a decision)")
    queue: str = Field(default="", description="the queue it was sent to, which no live worker consumes")
    waiting_seconds: float = Field(description="how long it has waited")
    in_use: int | None = Field(default=None, description="slot, admission: the limit's slots in use")
    concurrency: int | None = Field(default=None, description="slot: the limit in force (null: a rate limit)")
    workflow: str | None = Field(default=None, description="admission: the limited workflow")
    position: int | None = Field(default=None, description="admission: 1 is admitted next")
    waiting_runs: int | None = Field(default=None, description="admission: runs waiting under the key")
    holders: list[SlotHolder] | None = Field(default=None, description="admission: the slot holders")
    text: str | None = Field(default=None, description="admission: the hint in words")


class AdmissionPlace(BaseModel):
    workflow: str
    position: int = Field(description="1 is admitted next")
    waiting: int = Field(description="runs waiting under the same key")
    in_use: int
    concurrency: int | None = Field(description="the limit in force")


class CancelBranchBody(BaseModel):
    outcome: BranchOutcome = Field(description="what the post-cancel decision of a sealed run did")
    settled: bool = Field(description="no decision pending and no body running")
    error: str | None = Field(default=None, description="'<type>: <message>' (cancelled, failed)")


class WorkflowDescription(WorkflowSummary):
    cancel_reason: str | None
    admission: AdmissionPlace | None = Field(
        default=None, description="a run waiting for admission (WAITING): its place (null otherwise)"
    )
    children: list[ChildLink] = Field(
        default_factory=list, description="the runs this one started as children"
    )
    cancel_branch: CancelBranchBody | None = Field(
        default=None, description="the cancel branch of a run sealed by a cancel (null otherwise)"
    )
    nd_details: NdDetails | None
    result: Any = None
    error: Any = None
    waiting: list[WaitingHint] | None = Field(
        default=None,
        description="what a running run waits on that no live worker consumes "
        "([] nothing; null when the workers cannot be asked, e.g. embedded mode)",
    )


class WorkflowList(BaseModel):
    workflows: list[WorkflowSummary]
    limit: int
    offset: int


class HistoryItem(BaseModel):
    seq: int
    type: str
    recorded_at: datetime
    data: dict[str, Any]


class HistoryResponse(BaseModel):
    execution_id: str
    events: list[HistoryItem]


class AttemptErrorItem(BaseModel):
    activity_id: str = Field(description='the activity; "" for the workflow\'s own failure')
    attempt: int = Field(description="the attempt (0 for the workflow's own failure)")
    error_type: str
    message: str
    traceback: str
    recorded_at: str


class AttemptErrors(BaseModel):
    execution_id: str
    errors: list[AttemptErrorItem]


class RunGraphNode(BaseModel):
    node_name: str
    status: NodeStatus
    depends_on: list[str]
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    error_type: str | None
    error: str | None
    # a canvas run's node (its node_name is the canvas path): the task it calls; absent otherwise
    task: str | None = None


class RunGraph(BaseModel):
    run_id: str
    dag_name: str
    state: Status
    started_at: datetime
    finished_at: datetime | None
    nodes: list[RunGraphNode]
    note: str | None = None  # a canvas run whose stored graph was erased; absent otherwise


class Health(BaseModel):
    status: Literal["ok"]


class QueryRequest(_Model):
    arg: Any = Field(default=None, description="the JSON argument handed to the query handler")


class QueryResponse(BaseModel):
    execution_id: str
    query: str
    result: Any = Field(description="what the run's query handler returned (JSON)")


class UpdateRequest(_Model):
    arg: Any = Field(default=None, description="the JSON argument handed to the validator and the handler")
    update_id: str | None = Field(
        default=None,
        description="makes the call idempotent: an id already accepted runs and writes nothing "
        "and waits for that update's outcome (default: a new id)",
    )
    timeout: float = Field(
        default=30.0,
        description="seconds to wait for the handler's value (0 < timeout <= 300; else 400)",
    )


class UpdateResponse(BaseModel):
    execution_id: str
    update: str
    update_id: str
    result: Any = Field(description="what the run's update handler returned (JSON)")
