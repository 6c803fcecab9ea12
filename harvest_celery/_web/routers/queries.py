"""Queries: ask a run's query handler (``ctx.set_query_handler``) for its state. A read that
writes nothing, answered by this API process, which must register the run's workflow
(docs/concepts.md, "Queries")."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from harvest_celery._core.queries import query_arg
from harvest_celery._errors import PayloadNotSerializable
from harvest_celery._web.deps import ExecutionIdPath, Guard, HarvestDep, check_id, check_name
from harvest_celery._web.errors import ApiError
from harvest_celery._web.models import QueryRequest, QueryResponse


def query(
    harvest: HarvestDep,
    execution_id: ExecutionIdPath,
    name: Annotated[str, Path(description="the query name")],
    body: QueryRequest | None = None,
) -> dict[str, Any]:
    """Answer ``handler(arg)`` of the query handler the run registered as ``name``, from its
    stored history replayed in this process; nothing is written. Live, paused and closed runs
    answer; 409 for an erased run, 404 for an unknown run, workflow or query name (the body
    lists the registered ones), 400 ``QueryFailed`` (the handler raised or issued a ``ctx``
    command, or the replay diverged), 422 for an argument that is not JSON."""
    check_id(execution_id)
    check_name(name, "a query name")
    try:
        arg = query_arg(name, body.arg if body is not None else None)
    except PayloadNotSerializable as exc:  # the body parsed, but its argument is no JSON value
        raise ApiError(422, type(exc).__name__, str(exc)) from None
    return {"execution_id": execution_id, "query": name, "result": harvest.query(execution_id, name, arg)}


def router(guard: Guard) -> APIRouter:
    """``POST /workflows/{id}/queries/{name}`` (a POST for its body; it changes nothing)."""
    r = APIRouter()
    r.add_api_route(
        "/workflows/{execution_id}/queries/{name}",
        query,
        methods=["POST"],
        response_model=QueryResponse,
        dependencies=guard.dependencies,
        responses=guard.responses(),
        tags=["workflows"],
    )
    return r
