"""The operator HTTP API (FastAPI) over one ``Harvest``: ``create_app(harvest)``.

Run it with ``harvest api`` (uvicorn) or mount the app in your own ASGI server. Every endpoint is
a thin edge over the client: inputs are validated here (pydantic models, ids, storable JSON)
before anything touches the database, so a rejected request writes nothing.

Errors are JSON ``{"error": <class name>, "detail": <message>}``: unknown workflow/execution →
404, an id reused for another workflow or an operation the run's status forbids → 409 (a refused
DAG retry adds ``"reason"``: compensated · erased · running · completed), a bad payload, id or
node → 400, a stored payload the server cannot decode (an offloaded payload whose store is not
configured, a codec key it does not hold) → 503, a request that does not match the schema → 422
(``"ValidationError"``, with pydantic's error list as ``detail``), a missing or wrong bearer token
on a mutating endpoint → 401.
"""

from __future__ import annotations

import math
import os
import secrets
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from harvest_celery._client import Harvest
from harvest_celery._core import events as ev
from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._core.jsonvalues import storable_text as _storable_text
from harvest_celery._dag.graph import build_run_graph
from harvest_celery._dag.retry import RetryRefused
from harvest_celery._errors import (
    ExecutionAlreadyExists,
    ExecutionNotFound,
    HarvestError,
    InvalidState,
    RegistrationError,
)
from harvest_celery._payloads.codec import PayloadCodecError
from harvest_celery._payloads.stores import PayloadStoreError
from harvest_celery._runtime.metrics import exposition
from harvest_celery._store.store import Execution
from harvest_celery._web.pages import register_pages

TOKEN_ENV = "HARVEST_API_TOKEN"
MAX_ID_LENGTH = 200
MAX_NAME_LENGTH = 200

# the run statuses of _lifecycle and the node statuses of _rungraph (a unit test pins both)
Status = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TERMINATED"]
NodeStatus = Literal["succeeded", "failed", "timed_out", "cancelled", "running", "pending", "skipped"]


# ── models ───────────────────────────────────────────────────────────────────────────────────
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    error: str = Field(description="the error's class name, e.g. ExecutionNotFound")
    detail: Any = Field(description="a message, or pydantic's error list for a ValidationError")


class RetryRefusedBody(ErrorBody):
    reason: Literal["compensated", "erased", "running", "completed"] | None = Field(
        default=None, description="why a DAG retry was refused (RetryRefused only)")


class StartWorkflowRequest(_Model):
    workflow: str = Field(description="a registered workflow or DAG name")
    input: Any = Field(default=None, description="the run's JSON input")
    execution_id: str | None = Field(default=None, description="idempotency key; a fresh id if omitted")


class StartWorkflowResponse(BaseModel):
    execution_id: str


class SignalRequest(_Model):
    payload: Any = None


class CancelRequest(_Model):
    reason: str = Field(default="", max_length=1000)


class CancelResponse(BaseModel):
    execution_id: str
    status: Status


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
    from_node: str | None = Field(default=None, description="the node to re-run from; default: the first failed node")
    new_execution_id: str | None = Field(default=None, description="the new run's id; a fresh id if omitted")


class RetryResponse(BaseModel):
    run_id: str | None = Field(description="the new run; null for a dry run")
    source_run_id: str
    retry_from: str
    carried: list[str] = Field(description="succeeded nodes carried over, not re-run")
    rerun: list[str] = Field(description="nodes the new run runs, in level order")
    dry_run: bool


class EraseResponse(BaseModel):
    execution_id: str
    events: int = Field(description="events whose payload fields were tombstoned by this call")
    fields: int = Field(description="payload fields tombstoned by this call")
    blobs: int = Field(description="offloaded blobs deleted")


class PurgeRequest(_Model):
    older_than_days: float = Field(ge=0, le=36500, allow_inf_nan=False,
                                   description="delete terminal runs closed more than this many days ago")
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
    status: Status
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


class WorkflowDescription(WorkflowSummary):
    cancel_reason: str | None
    nd_details: NdDetails | None
    result: Any = None
    error: Any = None


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


class RunGraphNode(BaseModel):
    node_name: str
    status: NodeStatus
    depends_on: list[str]
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    error_type: str | None
    error: str | None


class RunGraph(BaseModel):
    run_id: str
    dag_name: str
    state: Status
    started_at: datetime
    finished_at: datetime | None
    nodes: list[RunGraphNode]


class Health(BaseModel):
    status: Literal["ok"]


# ── errors ───────────────────────────────────────────────────────────────────────────────────
class ApiError(Exception):
    """An API-level refusal that has no ``HarvestError`` of its own (401, a run of another DAG)."""

    def __init__(self, status_code: int, error: str, detail: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status_code, self.error, self.detail, self.headers = status_code, error, detail, headers


def status_for(exc: BaseException) -> int:
    """404 unknown, 409 conflict, 503 an undecodable stored payload, 400 anything else."""
    if isinstance(exc, (ExecutionNotFound, RegistrationError)):
        return 404
    if isinstance(exc, (ExecutionAlreadyExists, InvalidState, RetryRefused)):
        return 409
    if isinstance(exc, (PayloadStoreError, PayloadCodecError)):
        return 503  # the server cannot decode a stored payload: its configuration, not the request
    return 400  # PayloadNotSerializable, PayloadTooLarge, UnknownNode and every other client error


def _error(status_code: int, error: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status_code, headers=headers)


def _json_safe(value: Any) -> Any:
    """A pydantic error list echoes the input: a non-finite float (``1e400``, ``NaN``) in it would
    make the 422 itself unrenderable, so it is echoed as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {400: "a malformed id or payload", 401: "a missing or wrong bearer token",
            404: "unknown workflow, DAG or execution", 409: "the run's state forbids it",
            422: "the request does not match the schema",
            503: "a stored payload cannot be decoded here (e.g. its payload store is not configured)"}
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


# ── validation at the edge ───────────────────────────────────────────────────────────────────
def check_id(value: str, what: str = "an execution id") -> str:
    """Non-empty, at most 200 characters, storable; ``ValueError`` (→ 400) otherwise."""
    if not value.strip() or len(value) > MAX_ID_LENGTH or not _storable_text(value):
        raise ValueError(f"{what} is a non-empty string of at most {MAX_ID_LENGTH} characters "
                         "with no NUL character")
    return value


def check_name(value: str, what: str) -> str:
    if not value.strip() or len(value) > MAX_NAME_LENGTH or not _storable_text(value):
        raise ValueError(f"{what} is a non-empty string of at most {MAX_NAME_LENGTH} characters "
                         "with no NUL character")
    return value


# ── views ────────────────────────────────────────────────────────────────────────────────────
def _summary(x: Execution) -> dict[str, Any]:
    return {
        "execution_id": x.id, "workflow_type": x.workflow_type, "status": x.status,
        "created_at": x.created_at, "updated_at": x.updated_at, "closed_at": x.closed_at,
        "cancelled_at": x.cancelled_at, "history_length": x.history_length,
        "nd_blocked": x.nd_blocked, "nd_blocked_at": x.nd_blocked_at,
        "nd_block_reason": x.nd_block_reason, "nd_block_count": x.nd_block_count,
        "paused_at": x.paused_at, "erased_at": x.erased_at, "forked_from": x.forked_from,
        "forked_to": x.forked_to,
    }


def _description(x: Execution) -> dict[str, Any]:
    return {**_summary(x), "cancel_reason": x.cancel_reason, "nd_details": x.nd_details,
            "result": x.result, "error": x.error}


def _pause_state(x: Execution) -> dict[str, Any]:
    return {"execution_id": x.id, "status": x.status, "paused_at": x.paused_at}


def _history_item(item: ev.HistoryEvent) -> dict[str, Any]:
    data = item.event.to_data()
    data.pop("type", None)
    data.pop("v", None)
    return {"seq": item.seq, "type": item.event.type, "recorded_at": item.recorded_at, "data": data}


# ── the app ──────────────────────────────────────────────────────────────────────────────────
ExecutionIdPath = Annotated[str, Path(description="the execution id")]
# module-level: FastAPI resolves the (postponed) annotations of the endpoint functions here
_BEARER = HTTPBearer(auto_error=False, description="the API token (HARVEST_API_TOKEN)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


def create_app(harvest: Harvest, *, token: str | None = None) -> FastAPI:
    """The operator API over ``harvest``. Mutating endpoints need ``Authorization: Bearer
    <token>`` when a token is given (or ``HARVEST_API_TOKEN`` is set)."""
    token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
    app = FastAPI(title="harvest-celery operator API", version="1.0.0",
                  description="Start, signal, cancel and inspect durable workflows and DAG runs.")

    def authorized(credentials: Credentials) -> None:
        assert token is not None
        if credentials is None or not secrets.compare_digest(
                credentials.credentials.encode("utf-8", "surrogateescape"),
                token.encode("utf-8", "surrogateescape")):
            raise ApiError(401, "Unauthorized", "a valid 'Authorization: Bearer <token>' header is required",
                           headers={"WWW-Authenticate": "Bearer"})

    mutating: list[Any] = [Depends(authorized)] if token else []
    mutating_errors = (400, 401, 404, 409, 422) if token else (400, 404, 409, 422)

    @app.exception_handler(HarvestError)
    def _harvest_error(_request: Request, exc: HarvestError) -> JSONResponse:
        if isinstance(exc, RetryRefused):
            return JSONResponse({"error": type(exc).__name__, "detail": str(exc), "reason": exc.reason},
                                status_code=status_for(exc))
        return _error(status_for(exc), type(exc).__name__, str(exc))

    @app.exception_handler(ValueError)
    def _value_error(_request: Request, exc: ValueError) -> JSONResponse:
        return _error(400, "ValueError", str(exc))

    @app.exception_handler(ApiError)
    def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status_code, exc.error, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "ValidationError", _json_safe(jsonable_encoder(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {404: "NotFound", 405: "MethodNotAllowed"}
        return _error(exc.status_code, names.get(exc.status_code, "HTTPError"), exc.detail,
                      getattr(exc, "headers", None))

    # ── workflows ────────────────────────────────────────────────────────────────────────────
    @app.post("/workflows", status_code=201, response_model=StartWorkflowResponse,
              dependencies=mutating, responses=_responses(*mutating_errors), tags=["workflows"])
    def start_workflow(body: StartWorkflowRequest) -> dict[str, Any]:
        """Start a run (idempotent on ``execution_id``)."""
        check_name(body.workflow, "a workflow name")
        if body.execution_id is not None:
            check_id(body.execution_id)
        check_storable(body.input, f"input of workflow {body.workflow!r}")
        run_id = harvest.start_workflow(body.workflow, body.input, execution_id=body.execution_id)
        return {"execution_id": run_id}

    @app.get("/workflows", response_model=WorkflowList, responses=_responses(400, 422), tags=["workflows"])
    def list_workflows(
        status: Annotated[Status | None, Query(description="only runs in this status")] = None,
        workflow: Annotated[str | None, Query(max_length=MAX_NAME_LENGTH, description="only runs of this workflow")] = None,
        nd_blocked: Annotated[bool | None, Query(description="only runs blocked (true) or not blocked (false) on a replay divergence")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    ) -> dict[str, Any]:
        """Runs, newest first."""
        if workflow is not None:
            check_name(workflow, "a workflow name")
        rows = harvest.list(status=status, workflow=workflow, nd_blocked=nd_blocked, limit=limit,
                            offset=offset)
        return {"workflows": [_summary(x) for x in rows], "limit": limit, "offset": offset}

    @app.get("/workflows/{execution_id}", response_model=WorkflowDescription,
             responses=_responses(400, 404, 422), tags=["workflows"])
    def describe(execution_id: ExecutionIdPath) -> dict[str, Any]:
        """Status, timestamps, result or error, and the nd-blocked fields of one run."""
        return _description(harvest.describe(check_id(execution_id)))

    @app.get("/workflows/{execution_id}/history", response_model=HistoryResponse,
             responses=_responses(400, 404, 422), tags=["workflows"])
    def history(execution_id: ExecutionIdPath) -> dict[str, Any]:
        """The run's recorded events, in order."""
        harvest.describe(check_id(execution_id))
        events = harvest.history(execution_id, strict=False)  # a read-only view degrades
        return {"execution_id": execution_id, "events": [_history_item(h) for h in events]}

    @app.post("/workflows/{execution_id}/signals/{name}", response_model=SignalResponse,
              dependencies=mutating, responses=_responses(*mutating_errors), tags=["workflows"])
    def signal(execution_id: ExecutionIdPath, name: Annotated[str, Path(description="the signal name")],
               body: SignalRequest | None = None) -> dict[str, Any]:
        """Deliver a signal to a live run."""
        check_id(execution_id)
        check_name(name, "a signal name")
        payload = body.payload if body is not None else None
        check_storable(payload, f"payload of signal {name!r}")
        harvest.signal(execution_id, name, payload)
        return {"execution_id": execution_id, "signal": name}

    @app.post("/workflows/{execution_id}/cancel", response_model=CancelResponse,
              dependencies=mutating, responses=_responses(*mutating_errors), tags=["workflows"])
    def cancel(execution_id: ExecutionIdPath, body: CancelRequest | None = None) -> dict[str, Any]:
        """Seal a live run (never compensates by itself): CANCELLED, or FAILED mid-unwind."""
        check_id(execution_id)
        reason = body.reason if body is not None else ""
        check_storable(reason, "the cancel reason")
        status = harvest.cancel_workflow_execution(execution_id, reason=reason)
        return {"execution_id": execution_id, "status": status}

    @app.post("/workflows/{execution_id}/terminate", response_model=TerminateResponse,
              dependencies=mutating, responses=_responses(*mutating_errors), tags=["workflows"])
    def terminate(execution_id: ExecutionIdPath, body: TerminateRequest | None = None) -> dict[str, Any]:
        """Seal a live run at once, TERMINATED, without the post-cancel decision (no workflow code
        runs; unstarted activities never run)."""
        check_id(execution_id)
        reason = body.reason if body is not None else ""
        check_storable(reason, "the terminate reason")
        harvest.terminate(execution_id, reason=reason)
        return {"execution_id": execution_id, "status": harvest.describe(execution_id).status}

    @app.post("/workflows/{execution_id}/pause", response_model=PauseResponse,
              dependencies=mutating, responses=_responses(*mutating_errors), tags=["workflows"])
    def pause(execution_id: ExecutionIdPath) -> dict[str, Any]:
        """Hold a live run's decisions until resumed (activities already running finish; signals
        are still recorded). Pausing a paused run keeps its first ``paused_at``."""
        harvest.pause(check_id(execution_id))
        return _pause_state(harvest.describe(execution_id))

    @app.post("/workflows/{execution_id}/resume", response_model=PauseResponse,
              dependencies=mutating, responses=_responses(*mutating_errors), tags=["workflows"])
    def resume(execution_id: ExecutionIdPath) -> dict[str, Any]:
        """Release a paused run: its next decision is taken at once (409 if it is not paused)."""
        harvest.resume(check_id(execution_id))
        return _pause_state(harvest.describe(execution_id))

    @app.post("/workflows/{execution_id}/reset", status_code=201, response_model=ForkResponse,
              dependencies=mutating, responses=_responses(*mutating_errors, 503), tags=["workflows"])
    def reset(execution_id: ExecutionIdPath, body: ResetRequest) -> dict[str, Any]:
        """Fork a new run from the source's first ``to_seq`` events (a live source is terminated).
        409 for an erased source or a new id that exists; 400 for a reset point past the history
        or after the run was cancelled or finished."""
        check_id(execution_id)
        if body.new_execution_id is not None:
            check_id(body.new_execution_id, "the new execution id")
        new_id = harvest.reset(execution_id, body.to_seq, new_execution_id=body.new_execution_id)
        return {"run_id": new_id, "forked_from": execution_id}

    @app.post("/workflows/{execution_id}/erase-payloads", response_model=EraseResponse,
              dependencies=mutating, responses=_responses(*mutating_errors), tags=["workflows"])
    def erase_payloads(execution_id: ExecutionIdPath) -> dict[str, Any]:
        """PII erasure of a terminal run: every payload field is tombstoned, offloaded blobs are
        deleted; names, statuses and timings stay. Idempotent (a second call counts zero); 409 for
        a run that is not terminal."""
        return harvest.erase_payloads(check_id(execution_id))

    # ── DAG runs ─────────────────────────────────────────────────────────────────────────────
    def dag_definition(name: str) -> Any:
        check_name(name, "a DAG name")
        definition = harvest.registry.workflows.get(name)
        if definition is None or definition.kind != "dag":
            raise ApiError(404, "UnknownDag", f"no DAG named {name!r} is registered")
        return definition

    def dag_run(name: str, execution_id: str) -> Execution:
        execution = harvest.describe(execution_id)
        if execution.workflow_type != name:
            raise ApiError(404, "ExecutionNotFound", f"execution {execution_id!r} is not a run of DAG {name!r}")
        return execution

    @app.get("/dags/{name}/runs/{execution_id}", response_model=RunGraph,
             responses=_responses(400, 404, 422), tags=["dags"])
    def run_graph(name: Annotated[str, Path(description="the DAG name")],
                  execution_id: ExecutionIdPath) -> dict[str, Any]:
        """The run's forward nodes with status, timings, attempts and a truncated error.
        Compensators are not nodes: read the history to see an unwind."""
        definition = dag_definition(name)
        check_id(execution_id)
        execution = dag_run(name, execution_id)
        # decoded before the compensation filter reads inputs; a read-only view degrades
        return build_run_graph(definition.extra, execution, harvest.history(execution_id, strict=False))

    retry_responses: dict[int | str, dict[str, Any]] = {
        **_responses(*mutating_errors, 503),
        200: {"model": RetryResponse, "description": "a dry run: the plan, nothing forked"},
        409: {"model": RetryRefusedBody,
              "description": "the source run is running, completed, compensated or erased"},
        400: {"model": ErrorBody, "description": "a malformed id, or a node the DAG does not declare"},
        503: {"model": ErrorBody,
              "description": "an offloaded payload needs a payload store that is not configured "
                             "(the guard fails closed)"},
    }

    @app.post("/dags/{name}/runs/{execution_id}/retry", status_code=201, response_model=RetryResponse,
              dependencies=mutating, responses=retry_responses, tags=["dags"])
    def retry(name: Annotated[str, Path(description="the DAG name")], execution_id: ExecutionIdPath,
              response: Response,
              dry_run: Annotated[bool, Query(description="answer with the plan without forking")] = False,
              body: RetryRequest | None = None) -> dict[str, Any]:
        """Retry a failed DAG run from a node (default: its first failed node): a new run carries
        over the succeeded nodes and re-runs that node and everything downstream. Refused (409)
        for a run still running or completed, one that executed its compensation unwind, or one
        whose payloads were erased."""
        dag_definition(name)
        check_id(execution_id)
        from_node = body.from_node if body is not None else None
        new_id = body.new_execution_id if body is not None else None
        if from_node is not None:
            check_name(from_node, "a node name")
        if new_id is not None:
            check_id(new_id, "the new execution id")
        dag_run(name, execution_id)
        answer = harvest.retry_dag_run(name, execution_id, from_node, dry_run=dry_run,
                                       new_execution_id=new_id)
        if dry_run:
            response.status_code = 200
        return answer

    # ── administration ───────────────────────────────────────────────────────────────────────
    @app.post("/admin/purge", response_model=PurgeResponse, dependencies=mutating,
              responses=_responses(*mutating_errors), tags=["operations"])
    def purge(body: PurgeRequest) -> dict[str, Any]:
        """Retention: delete terminal runs closed more than ``older_than_days`` ago (history, task
        rows, timers, offloaded blobs), in batches; never a live run."""
        return harvest.purge(body.older_than_days, body.batch)

    # ── operations ───────────────────────────────────────────────────────────────────────────
    @app.get("/metrics", response_class=Response, tags=["operations"],
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition"}})
    def metrics() -> Response:
        """Prometheus counters of this process (aggregated under PROMETHEUS_MULTIPROC_DIR)."""
        body, content_type = exposition()
        return Response(body, media_type=content_type)

    @app.get("/healthz", response_model=Health, tags=["operations"],
             responses={503: {"model": ErrorBody, "description": "the database does not answer"}})
    def healthz() -> Any:
        """The database answers a trivial query."""
        try:
            harvest.store.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
            return _error(503, "DatabaseUnavailable", f"{type(exc).__name__}: {exc}".splitlines()[0])
        return {"status": "ok"}

    register_pages(app, harvest)  # the DAG run page, /ui/dags/{name}/runs/{id}
    return app
