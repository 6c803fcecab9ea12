"""Runs: start a workflow or DAG run, list runs, describe one, and read its recorded history."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from harvest_celery._client import Harvest
from harvest_celery._core import events as ev
from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._store.store import Execution
from harvest_celery._web.deps import (
    MAX_NAME_LENGTH,
    ExecutionIdPath,
    Guard,
    HarvestDep,
    check_id,
    check_name,
)
from harvest_celery._web.errors import error_responses
from harvest_celery._web.models import (
    AttemptErrors,
    HistoryResponse,
    StartWorkflowRequest,
    StartWorkflowResponse,
    StatusFilter,
    WorkflowDescription,
    WorkflowList,
)


# ── views ────────────────────────────────────────────────────────────────────────────────────
def _summary(x: Execution) -> dict[str, Any]:
    return {
        "execution_id": x.id,
        "workflow_type": x.workflow_type,
        "status": x.status,
        "display_status": x.display_status,
        "cancel_requested_at": x.cancel_requested_at,
        "cancel_branch_error": x.cancel_branch_error,
        "created_at": x.created_at,
        "updated_at": x.updated_at,
        "closed_at": x.closed_at,
        "cancelled_at": x.cancelled_at,
        "history_length": x.history_length,
        "nd_blocked": x.nd_blocked,
        "nd_blocked_at": x.nd_blocked_at,
        "nd_block_reason": x.nd_block_reason,
        "nd_block_count": x.nd_block_count,
        "paused_at": x.paused_at,
        "erased_at": x.erased_at,
        "forked_from": x.forked_from,
        "forked_to": x.forked_to,
        "parent_id": x.parent_id,
        "continued_from": x.continued_from,
        "continued_to": x.continued_to,
        "execution_deadline_at": x.execution_deadline_at,
        "run_deadline_at": x.run_deadline_at,
        "timed_out_at": x.timed_out_at,
        "timeout": x.timeout,
        "timeout_grace_at": x.timeout_grace_at,
        "timeout_overrun": x.timeout_overrun,
    }


def _description(x: Execution) -> dict[str, Any]:
    return {
        **_summary(x),
        "cancel_reason": x.cancel_reason,
        "children": list(x.children),
        "nd_details": x.nd_details,
        "result": x.result,
        "error": x.error,
        "admission": x.admission,
    }


def _branch(harvest: Harvest, x: Execution) -> dict[str, Any] | None:
    branch = harvest.store.cancel_branch(x.id) if x.cancelled_at is not None else None
    if branch is None:
        return None
    return {"outcome": branch.outcome, "settled": branch.settled, "error": branch.error}


def _history_item(item: ev.HistoryEvent) -> dict[str, Any]:
    data = item.event.to_data()
    data.pop("type", None)
    data.pop("v", None)
    return {"seq": item.seq, "type": item.event.type, "recorded_at": item.recorded_at, "data": data}


# ── endpoints ────────────────────────────────────────────────────────────────────────────────
def start_workflow(harvest: HarvestDep, body: StartWorkflowRequest) -> dict[str, Any]:
    """Start a run (idempotent on ``execution_id`` unless ``id_reuse`` says otherwise)."""
    check_name(body.workflow, "a workflow name")
    if body.execution_id is not None:
        check_id(body.execution_id)
    check_storable(body.input, f"input of workflow {body.workflow!r}")
    run_id = harvest.start_workflow(
        body.workflow,
        body.input,
        execution_id=body.execution_id,
        id_reuse=body.id_reuse,
        execution_timeout=body.execution_timeout,
        run_timeout=body.run_timeout,
        priority=body.priority,
    )
    return {"execution_id": run_id}


def list_workflows(
    harvest: HarvestDep,
    status: Annotated[
        StatusFilter | None,
        Query(
            description="only runs in this status (CANCELLING: live with an open cancel request; "
            "WAITING: live, waiting for admission)"
        ),
    ] = None,
    workflow: Annotated[
        str | None, Query(max_length=MAX_NAME_LENGTH, description="only runs of this workflow")
    ] = None,
    nd_blocked: Annotated[
        bool | None,
        Query(description="only runs blocked (true) or not blocked (false) on a replay divergence"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> dict[str, Any]:
    """Runs, newest first."""
    if workflow is not None:
        check_name(workflow, "a workflow name")
    rows = harvest.list(status=status, workflow=workflow, nd_blocked=nd_blocked, limit=limit, offset=offset)
    return {"workflows": [_summary(x) for x in rows], "limit": limit, "offset": offset}


def describe(harvest: HarvestDep, execution_id: ExecutionIdPath) -> dict[str, Any]:
    """Status, timestamps, result or error, and the nd-blocked fields of one run."""
    # ``waiting``: Harvest.stuck (asks the workers, cached; null when they cannot be asked)
    x = harvest.describe(check_id(execution_id))
    return {**_description(x), "cancel_branch": _branch(harvest, x), "waiting": harvest.stuck(execution_id)}


def history(harvest: HarvestDep, execution_id: ExecutionIdPath) -> dict[str, Any]:
    """The run's recorded events, in order."""
    harvest.describe(check_id(execution_id))
    events = harvest.history(execution_id, strict=False)  # a read-only view degrades
    return {"execution_id": execution_id, "events": [_history_item(h) for h in events]}


def attempt_errors(harvest: HarvestDep, execution_id: ExecutionIdPath) -> dict[str, Any]:
    """Every failed attempt's error with its traceback, oldest first — not only the last one
    the history records (activity "" and attempt 0: the workflow's own failure)."""
    errors = harvest.attempt_errors(check_id(execution_id))
    return {"execution_id": execution_id, "errors": [e.to_dict() for e in errors]}


def router(guard: Guard) -> APIRouter:
    """``POST /workflows`` (mutating), ``GET /workflows``, ``GET /workflows/{id}`` and
    ``GET /workflows/{id}/history``."""
    r = APIRouter()
    r.add_api_route(
        "/workflows",
        start_workflow,
        methods=["POST"],
        status_code=201,
        response_model=StartWorkflowResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(),
        tags=["workflows"],
    )
    r.add_api_route(
        "/workflows",
        list_workflows,
        methods=["GET"],
        response_model=WorkflowList,
        responses=error_responses(400, 422),
        tags=["workflows"],
    )
    r.add_api_route(
        "/workflows/{execution_id}",
        describe,
        methods=["GET"],
        response_model=WorkflowDescription,
        responses=error_responses(400, 404, 422),
        tags=["workflows"],
    )
    r.add_api_route(
        "/workflows/{execution_id}/history",
        history,
        methods=["GET"],
        response_model=HistoryResponse,
        responses=error_responses(400, 404, 422),
        tags=["workflows"],
    )
    r.add_api_route(
        "/workflows/{execution_id}/errors",
        attempt_errors,
        methods=["GET"],
        response_model=AttemptErrors,
        responses=error_responses(400, 404, 422),
        tags=["workflows"],
    )
    return r
