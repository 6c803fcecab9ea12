"""Messages to a live run: deliver a signal, cancel (seal) the run, or request its cooperative
cancellation."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._web.deps import ExecutionIdPath, Guard, HarvestDep, check_id, check_name
from harvest_celery._web.models import (
    CancelRequest,
    CancelResponse,
    RequestCancelResponse,
    SignalRequest,
    SignalResponse,
)


def signal(
    harvest: HarvestDep,
    execution_id: ExecutionIdPath,
    name: Annotated[str, Path(description="the signal name")],
    body: SignalRequest | None = None,
) -> dict[str, Any]:
    """Deliver a signal to a live run."""
    check_id(execution_id)
    check_name(name, "a signal name")
    payload = body.payload if body is not None else None
    check_storable(payload, f"payload of signal {name!r}")
    harvest.signal(execution_id, name, payload)
    return {"execution_id": execution_id, "signal": name}


def cancel(
    harvest: HarvestDep, execution_id: ExecutionIdPath, body: CancelRequest | None = None
) -> dict[str, Any]:
    """Seal a live run (never compensates by itself): CANCELLED, or FAILED mid-unwind."""
    check_id(execution_id)
    reason = body.reason if body is not None else ""
    check_storable(reason, "the cancel reason")
    status = harvest.cancel_workflow_execution(execution_id, reason=reason)
    return {"execution_id": execution_id, "status": status}


def request_cancel(
    harvest: HarvestDep, execution_id: ExecutionIdPath, body: CancelRequest | None = None
) -> dict[str, Any]:
    """Cooperative cancel (opt-in, beyond the spec): record a cancellation request without
    sealing. The run stays live, shown CANCELLING; ``ctx.is_cancelled()`` turns true at the
    request, so its cancel branch can run durable compensations; it ends CANCELLED when the
    workflow raises ``Cancelled``. Idempotent (``requested: false`` the second time); 409 for
    a run that is not running."""
    check_id(execution_id)
    reason = body.reason if body is not None else ""
    check_storable(reason, "the cancel reason")
    requested = harvest.request_cancellation(execution_id, reason=reason)
    return {
        "execution_id": execution_id,
        "requested": requested,
        "display_status": harvest.describe(execution_id).display_status,
    }


def router(guard: Guard) -> APIRouter:
    """``POST /workflows/{id}/signals/{name}``, ``POST /workflows/{id}/cancel`` and
    ``POST /workflows/{id}/request-cancel`` (mutating)."""
    r = APIRouter()
    r.add_api_route(
        "/workflows/{execution_id}/signals/{name}",
        signal,
        methods=["POST"],
        response_model=SignalResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(),
        tags=["workflows"],
    )
    r.add_api_route(
        "/workflows/{execution_id}/cancel",
        cancel,
        methods=["POST"],
        response_model=CancelResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(),
        tags=["workflows"],
    )
    r.add_api_route(
        "/workflows/{execution_id}/request-cancel",
        request_cancel,
        methods=["POST"],
        response_model=RequestCancelResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(),
        tags=["workflows"],
    )
    return r
