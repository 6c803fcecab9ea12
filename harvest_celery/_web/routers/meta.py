"""Process endpoints: ``/metrics`` (Prometheus) and ``/healthz`` (the database answers)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from harvest_celery._runtime.metrics import exposition
from harvest_celery._web.deps import HarvestDep
from harvest_celery._web.errors import error_response
from harvest_celery._web.models import ErrorBody, Health

log = logging.getLogger("harvest_celery.api")


def metrics() -> Response:
    """Prometheus counters of this process (aggregated under PROMETHEUS_MULTIPROC_DIR)."""
    body, content_type = exposition()
    return Response(body, media_type=content_type)


def healthz(harvest: HarvestDep) -> Any:
    """The database answers a trivial query. Open to all, so it names no host, port or driver
    error (the log has them)."""
    try:
        harvest.store.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        log.warning(
            "healthz: the database does not answer: %s", f"{type(exc).__name__}: {exc}".splitlines()[0]
        )
        return error_response(503, "DatabaseUnavailable", "the database does not answer")
    return {"status": "ok"}


def router(metrics_dependencies: Sequence[Any] = ()) -> APIRouter:
    """``GET /metrics`` (behind ``metrics_dependencies``: the app's auth) and ``GET /healthz``
    (open to all)."""
    r = APIRouter()
    r.add_api_route(
        "/metrics",
        metrics,
        methods=["GET"],
        response_class=Response,
        tags=["operations"],
        dependencies=list(metrics_dependencies),
        responses={
            200: {
                "content": {"text/plain": {"schema": {"type": "string"}}},
                "description": "Prometheus text exposition",
            }
        },
    )
    r.add_api_route(
        "/healthz",
        healthz,
        methods=["GET"],
        response_model=Health,
        tags=["operations"],
        responses={503: {"model": ErrorBody, "description": "the database does not answer"}},
    )
    return r
