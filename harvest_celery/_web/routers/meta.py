"""Process endpoints: ``/metrics`` (Prometheus) and ``/healthz`` (the database answers)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from harvest_celery._runtime.metrics import exposition
from harvest_celery._web.deps import HarvestDep
from harvest_celery._web.errors import error_response
from harvest_celery._web.models import ErrorBody, Health


def metrics() -> Response:
    """Prometheus counters of this process (aggregated under PROMETHEUS_MULTIPROC_DIR)."""
    body, content_type = exposition()
    return Response(body, media_type=content_type)


def healthz(harvest: HarvestDep) -> Any:
    """The database answers a trivial query."""
    try:
        harvest.store.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        return error_response(503, "DatabaseUnavailable", f"{type(exc).__name__}: {exc}".splitlines()[0])
    return {"status": "ok"}


def router() -> APIRouter:
    """``GET /metrics`` and ``GET /healthz`` (unauthenticated reads)."""
    r = APIRouter()
    r.add_api_route("/metrics", metrics, methods=["GET"], response_class=Response, tags=["operations"],
                    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                     "description": "Prometheus text exposition"}})
    r.add_api_route("/healthz", healthz, methods=["GET"], response_model=Health, tags=["operations"],
                    responses={503: {"model": ErrorBody, "description": "the database does not answer"}})
    return r
