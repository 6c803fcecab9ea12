"""Messages to a live run: deliver a signal, and cancel (seal) the run."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._web.deps import ExecutionIdPath, Guard, HarvestDep, check_id, check_name
from harvest_celery._web.models import CancelRequest, CancelResponse, SignalRequest, SignalResponse


def signal(harvest: HarvestDep, execution_id: ExecutionIdPath,
           name: Annotated[str, Path(description="the signal name")],
           body: SignalRequest | None = None) -> dict[str, Any]:
    """Deliver a signal to a live run."""
    check_id(execution_id)
    check_name(name, "a signal name")
    payload = body.payload if body is not None else None
    check_storable(payload, f"payload of signal {name!r}")
    harvest.signal(execution_id, name, payload)
    return {"execution_id": execution_id, "signal": name}


def cancel(harvest: HarvestDep, execution_id: ExecutionIdPath,
           body: CancelRequest | None = None) -> dict[str, Any]:
    """Seal a live run (never compensates by itself): CANCELLED, or FAILED mid-unwind."""
    check_id(execution_id)
    reason = body.reason if body is not None else ""
    check_storable(reason, "the cancel reason")
    status = harvest.cancel_workflow_execution(execution_id, reason=reason)
    return {"execution_id": execution_id, "status": status}


def router(guard: Guard) -> APIRouter:
    """``POST /workflows/{id}/signals/{name}`` and ``POST /workflows/{id}/cancel`` (mutating)."""
    r = APIRouter()
    r.add_api_route("/workflows/{execution_id}/signals/{name}", signal, methods=["POST"],
                    response_model=SignalResponse, dependencies=guard.dependencies,
                    responses=guard.responses(), tags=["workflows"])
    r.add_api_route("/workflows/{execution_id}/cancel", cancel, methods=["POST"],
                    response_model=CancelResponse, dependencies=guard.dependencies,
                    responses=guard.responses(), tags=["workflows"])
    return r
