"""The operator HTTP API (FastAPI) over one ``Harvest``: ``create_app(harvest)`` builds the app,
its bearer-token guard of mutating endpoints and its JSON error handlers, and includes the
routers of ``harvest_celery._web.routers`` and the DAG run page.

Run it with ``harvest api`` (uvicorn) or mount the app in your own ASGI server. Every endpoint is
a thin edge over the client: inputs are validated at the edge (pydantic models, ids, storable
JSON) before anything touches the database, so a rejected request writes nothing. The error
contract is described in ``harvest_celery._web.errors``.
"""

from __future__ import annotations

import os
import secrets
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from harvest_celery._client import Harvest
from harvest_celery._web.deps import Guard
from harvest_celery._web.errors import ApiError, install_error_handlers
from harvest_celery._web.pages import register_pages
from harvest_celery._web.routers import dags, meta, operator, runs, signals

TOKEN_ENV = "HARVEST_API_TOKEN"

# module-level: FastAPI resolves the (postponed) annotations of the auth dependency here
_BEARER = HTTPBearer(auto_error=False, description="the API token (HARVEST_API_TOKEN)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


def _guard(token: str | None) -> Guard:
    """Mutating endpoints need ``Authorization: Bearer <token>`` when there is a token (and then
    publish a 401); without one they are open."""
    if not token:
        return Guard(dependencies=[], errors=(400, 404, 409, 422))

    def authorized(credentials: Credentials) -> None:
        if credentials is None or not secrets.compare_digest(
                credentials.credentials.encode("utf-8", "surrogateescape"),
                token.encode("utf-8", "surrogateescape")):
            raise ApiError(401, "Unauthorized", "a valid 'Authorization: Bearer <token>' header is required",
                           headers={"WWW-Authenticate": "Bearer"})

    return Guard(dependencies=[Depends(authorized)], errors=(400, 401, 404, 409, 422))


def create_app(harvest: Harvest, *, token: str | None = None) -> FastAPI:
    """The operator API over ``harvest``. Mutating endpoints need ``Authorization: Bearer
    <token>`` when a token is given (or ``HARVEST_API_TOKEN`` is set)."""
    token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
    app = FastAPI(title="harvest-celery operator API", version="1.0.0",
                  description="Start, signal, cancel and inspect durable workflows and DAG runs.")
    app.state.harvest = harvest  # the routers' HarvestDep reads it
    install_error_handlers(app)
    guard = _guard(token)
    # this order is the order of the published OpenAPI paths
    for router in (runs.router(guard), signals.router(guard), operator.router(guard),
                   dags.router(guard), operator.admin_router(guard), meta.router()):
        app.include_router(router)
    register_pages(app, harvest)  # the DAG run page, /ui/dags/{name}/runs/{id}
    return app


__all__ = ["TOKEN_ENV", "create_app"]
