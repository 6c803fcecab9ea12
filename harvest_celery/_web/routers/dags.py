"""DAG runs: the run graph of a DAG run, and the retry of a failed one from a node."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from harvest_celery._client import Harvest
from harvest_celery._dag.canvas_run import run_definition
from harvest_celery._dag.graph import build_run_graph
from harvest_celery._store.store import Execution
from harvest_celery._web.deps import ExecutionIdPath, Guard, HarvestDep, check_id, check_name
from harvest_celery._web.errors import ApiError, error_responses
from harvest_celery._web.models import ErrorBody, RetryRefusedBody, RetryRequest, RetryResponse, RunGraph

DagNamePath = Annotated[str, Path(description="the DAG name")]


def _dag_definition(harvest: Harvest, name: str) -> Any:
    check_name(name, "a DAG name")
    definition = harvest.registry.workflows.get(name)
    if definition is None or definition.kind not in ("dag", "canvas"):
        raise ApiError(404, "UnknownDag", f"no DAG named {name!r} is registered")
    return definition


def _dag_run(harvest: Harvest, name: str, execution_id: str) -> Execution:
    execution = harvest.describe(execution_id)
    if execution.workflow_type != name:
        raise ApiError(404, "ExecutionNotFound", f"execution {execution_id!r} is not a run of DAG {name!r}")
    return execution


def run_graph(harvest: HarvestDep, name: DagNamePath, execution_id: ExecutionIdPath) -> dict[str, Any]:
    """The run's forward nodes with status, timings, attempts and a truncated error.
    Compensators are not nodes: read the history to see an unwind."""
    definition = _dag_definition(harvest, name)
    check_id(execution_id)
    execution = _dag_run(harvest, name, execution_id)
    # decoded before the compensation filter reads inputs; a read-only view degrades
    history = harvest.history(execution_id, strict=False)
    dag, note = run_definition(definition, history)  # a canvas run's: from its stored graph
    assert dag is not None
    return build_run_graph(dag, execution, history, note)


def retry(
    harvest: HarvestDep,
    name: DagNamePath,
    execution_id: ExecutionIdPath,
    response: Response,
    dry_run: Annotated[bool, Query(description="answer with the plan without forking")] = False,
    body: RetryRequest | None = None,
) -> dict[str, Any]:
    """Retry a failed DAG run from a node (default: its first failed node): a new run carries
    over the succeeded nodes and re-runs that node and everything downstream. Refused (409)
    for a run still running or completed, one that executed its compensation unwind, or one
    whose payloads were erased."""
    _dag_definition(harvest, name)
    check_id(execution_id)
    from_node = body.from_node if body is not None else None
    new_id = body.new_execution_id if body is not None else None
    if from_node is not None:
        check_name(from_node, "a node name")
    if new_id is not None:
        check_id(new_id, "the new execution id")
    _dag_run(harvest, name, execution_id)
    answer = harvest.retry_dag_run(name, execution_id, from_node, dry_run=dry_run, new_execution_id=new_id)
    if dry_run:
        response.status_code = 200
    return answer


def _retry_responses(guard: Guard) -> dict[int | str, dict[str, Any]]:
    return {
        **guard.responses(503),
        200: {"model": RetryResponse, "description": "a dry run: the plan, nothing forked"},
        409: {
            "model": RetryRefusedBody,
            "description": "the source run is running, completed, compensated or erased",
        },
        400: {"model": ErrorBody, "description": "a malformed id, or a node the DAG does not declare"},
        503: {
            "model": ErrorBody,
            "description": "an offloaded payload needs a payload store that is not configured "
            "(the guard fails closed)",
        },
    }


def router(guard: Guard) -> APIRouter:
    """``GET /dags/{name}/runs/{id}`` and ``POST /dags/{name}/runs/{id}/retry`` (mutating)."""
    r = APIRouter()
    r.add_api_route(
        "/dags/{name}/runs/{execution_id}",
        run_graph,
        methods=["GET"],
        response_model=RunGraph,
        response_model_exclude_unset=True,  # a canvas node's task and note: absent on a @dag
        responses=error_responses(400, 404, 422),
        tags=["dags"],
    )
    r.add_api_route(
        "/dags/{name}/runs/{execution_id}/retry",
        retry,
        methods=["POST"],
        status_code=201,
        response_model=RetryResponse,
        dependencies=guard.dependencies,
        responses=_retry_responses(guard),
        tags=["dags"],
    )
    return r
