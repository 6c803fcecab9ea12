"""Updates: send a validated change to a live run and answer with the value its handler
returns (``ctx.set_update_handler``). Answered by this API process, which must register the
run's workflow (docs/concepts.md, "Updates")."""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path

from harvest_celery._client_updates import check_update_id
from harvest_celery._core.validators import update_arg
from harvest_celery._errors import PayloadNotSerializable
from harvest_celery._web.deps import ExecutionIdPath, Guard, HarvestDep, check_id, check_name
from harvest_celery._web.errors import ApiError
from harvest_celery._web.models import UpdateRequest, UpdateResponse

MAX_TIMEOUT = 300.0  # an HTTP request holds a server thread while it waits


def update(
    harvest: HarvestDep,
    execution_id: ExecutionIdPath,
    name: Annotated[str, Path(description="the update name")],
    body: UpdateRequest | None = None,
) -> dict[str, Any]:
    """Validate and accept update ``name`` (its validator runs on the run's stored history under
    its lock), then wait for its handler's value. 404 for an unknown run, workflow or update
    name; 409 ``InvalidState`` for a run that is not running or is sealed, paused, erased or
    nd-blocked; 400 ``UpdateRejected`` (the validator raised: nothing was written),
    ``UpdateFailed`` (the handler raised, or the run closed first) or a bad id or timeout; 422
    for an argument that is not JSON; 504 ``UpdateTimeout`` when the handler has not finished
    within ``timeout`` (the update stays accepted: repeat with the same ``update_id``)."""
    check_id(execution_id)
    check_name(name, "an update name")
    request = body if body is not None else UpdateRequest()
    update_id = check_update_id(request.update_id) if request.update_id is not None else uuid.uuid4().hex
    if not (math.isfinite(request.timeout) and 0 < request.timeout <= MAX_TIMEOUT):
        raise ValueError(f"an update timeout is a number of seconds in (0, {MAX_TIMEOUT:g}]")
    try:
        arg = update_arg(name, request.arg)
    except PayloadNotSerializable as exc:  # the body parsed, but its argument is no JSON value
        raise ApiError(422, type(exc).__name__, str(exc)) from None
    try:
        result = harvest.update(execution_id, name, arg, update_id=update_id, timeout=request.timeout)
    except TimeoutError as exc:
        raise ApiError(504, "UpdateTimeout", str(exc)) from None
    return {"execution_id": execution_id, "update": name, "update_id": update_id, "result": result}


def router(guard: Guard) -> APIRouter:
    """``POST /workflows/{id}/updates/{name}``."""
    r = APIRouter()
    r.add_api_route(
        "/workflows/{execution_id}/updates/{name}",
        update,
        methods=["POST"],
        response_model=UpdateResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(504),
        tags=["workflows"],
    )
    return r
