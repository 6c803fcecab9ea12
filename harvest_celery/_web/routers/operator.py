"""Operator actions: terminate, pause, resume, reset (fork) a run, erase its payloads, and the
retention purge (the admin router).

The purge is a router of its own because ``create_app`` includes it after the DAG routes, where
it has always been in the published OpenAPI paths.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._store.store import Execution
from harvest_celery._web.deps import ExecutionIdPath, Guard, HarvestDep, check_id
from harvest_celery._web.models import (
    EraseRequest,
    EraseResponse,
    ForkResponse,
    PauseResponse,
    PurgeRequest,
    PurgeResponse,
    ResetRequest,
    TerminateRequest,
    TerminateResponse,
)


def _pause_state(x: Execution) -> dict[str, Any]:
    return {"execution_id": x.id, "status": x.status, "paused_at": x.paused_at}


def terminate(
    harvest: HarvestDep, execution_id: ExecutionIdPath, body: TerminateRequest | None = None
) -> dict[str, Any]:
    """Seal a live run at once, TERMINATED, without the post-cancel decision (no workflow code
    runs; unstarted activities never run)."""
    check_id(execution_id)
    reason = body.reason if body is not None else ""
    check_storable(reason, "the terminate reason")
    harvest.terminate(execution_id, reason=reason)
    return {"execution_id": execution_id, "status": harvest.describe(execution_id).status}


def pause(harvest: HarvestDep, execution_id: ExecutionIdPath) -> dict[str, Any]:
    """Hold a live run's decisions until resumed (activities already running finish; signals
    are still recorded). Pausing a paused run keeps its first ``paused_at``."""
    harvest.pause(check_id(execution_id))
    return _pause_state(harvest.describe(execution_id))


def resume(harvest: HarvestDep, execution_id: ExecutionIdPath) -> dict[str, Any]:
    """Release a paused run: its next decision is taken at once (409 if it is not paused)."""
    harvest.resume(check_id(execution_id))
    return _pause_state(harvest.describe(execution_id))


def reset(harvest: HarvestDep, execution_id: ExecutionIdPath, body: ResetRequest) -> dict[str, Any]:
    """Fork a new run from the source's first ``to_seq`` events (a live source is terminated).
    409 for an erased source or a new id that exists; 400 for a reset point past the history
    or after the run was cancelled or finished."""
    check_id(execution_id)
    if body.new_execution_id is not None:
        check_id(body.new_execution_id, "the new execution id")
    new_id = harvest.reset(execution_id, body.to_seq, new_execution_id=body.new_execution_id)
    return {"run_id": new_id, "forked_from": execution_id}


def erase_payloads(
    harvest: HarvestDep, execution_id: ExecutionIdPath, body: EraseRequest | None = None
) -> dict[str, Any]:
    """PII erasure of a terminal run: every payload field is tombstoned, offloaded blobs are
    deleted; names, statuses and timings stay. Idempotent (a second call counts zero); 409 for
    a run that is not terminal, and for a run whose forks (reset, retry) still hold copies of
    its payloads (``ForksHoldCopies``, naming them in ``forks``) unless the body asks
    ``{"with_forks": true}``, which erases the whole fork family at once."""
    with_forks = body.with_forks if body is not None else False
    return harvest.erase_payloads(check_id(execution_id), with_forks=with_forks)


def purge(harvest: HarvestDep, body: PurgeRequest) -> dict[str, Any]:
    """Retention: delete terminal runs closed more than ``older_than_days`` ago (history, task
    rows, timers, offloaded blobs), in batches; never a live run."""
    return harvest.purge(body.older_than_days, body.batch)


def router(guard: Guard) -> APIRouter:
    """``POST /workflows/{id}/`` terminate, pause, resume, reset and erase-payloads (mutating)."""
    r = APIRouter()
    for path, endpoint, response_model in (
        ("/workflows/{execution_id}/terminate", terminate, TerminateResponse),
        ("/workflows/{execution_id}/pause", pause, PauseResponse),
        ("/workflows/{execution_id}/resume", resume, PauseResponse),
    ):
        r.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            response_model=response_model,
            dependencies=guard.dependencies,
            responses=guard.responses(),
            tags=["workflows"],
        )
    r.add_api_route(
        "/workflows/{execution_id}/reset",
        reset,
        methods=["POST"],
        status_code=201,
        response_model=ForkResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(503),
        tags=["workflows"],
    )
    r.add_api_route(
        "/workflows/{execution_id}/erase-payloads",
        erase_payloads,
        methods=["POST"],
        response_model=EraseResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(),
        tags=["workflows"],
    )
    return r


def admin_router(guard: Guard) -> APIRouter:
    """``POST /admin/purge`` (mutating)."""
    r = APIRouter()
    r.add_api_route(
        "/admin/purge",
        purge,
        methods=["POST"],
        response_model=PurgeResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(),
        tags=["operations"],
    )
    return r
