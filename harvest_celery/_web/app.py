"""The operator HTTP API (FastAPI) over one ``Harvest``: ``create_app(harvest)`` builds the app,
its auth (``auth``: the bearer token, the console's session and CSRF token), its guards and
error handlers (``hardening``: the cross-site refusal, the request-size and JSON-depth limits,
503 for a database that does not answer, a JSON 500 for anything else), the routers of
``harvest_celery._web.routers``, the DAG run page and the web console (``console``).

Run it with ``harvest api`` (uvicorn) or mount the app in your own ASGI server. Every endpoint is
a thin edge over the client: inputs are validated at the edge (pydantic models, ids, storable
JSON) before anything touches the database, so a rejected request writes nothing. The error
contract is described in ``harvest_celery._web.errors`` and ``harvest_celery._web.hardening``.
"""

from __future__ import annotations

import ipaddress
import logging
import os

from fastapi import FastAPI

from harvest_celery._client import Harvest
from harvest_celery._web.auth import Auth
from harvest_celery._web.console import register_console
from harvest_celery._web.deps import Guard
from harvest_celery._web.errors import error_responses, install_error_handlers
from harvest_celery._web.hardening import install_failure_handlers, install_guards, max_body_from_env
from harvest_celery._web.pages import register_pages
from harvest_celery._web.routers import (
    dags,
    limits,
    meta,
    operator,
    queries,
    runs,
    schedules,
    signals,
    updates,
)

TOKEN_ENV = "HARVEST_API_TOKEN"
log = logging.getLogger("harvest_celery.api")


def _guard(auth: Auth) -> Guard:
    """Mutating endpoints publish 401 with a token, and 403 (a cross-site or CSRF refusal) and
    413 in every mode; the auth itself is a dependency of every router (``create_app``)."""
    errors = (400, 401, 403, 404, 409, 413, 422) if auth.enabled else (400, 403, 404, 409, 413, 422)
    return Guard(dependencies=[], errors=errors)


def create_app(harvest: Harvest, *, token: str | None = None, max_body_bytes: int | None = None) -> FastAPI:
    """The operator API and console over ``harvest``.

    With a token (``token``, else ``HARVEST_API_TOKEN``) every endpoint but ``/healthz`` needs
    ``Authorization: Bearer <token>`` or a console session (see ``harvest_celery._web.auth``).
    Without one, every caller is let in: for tests and ``harvest api --insecure-no-auth``, which
    binds to loopback only. ``max_body_bytes`` (else ``HARVEST_API_MAX_BODY_BYTES``, else 4 MiB)
    caps a request body (413)."""
    token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
    auth = Auth(token)
    if not auth.enabled:
        log.warning("the operator API has no token: every caller may read and change runs")
    app = FastAPI(
        title="harvest-celery operator API",
        version="1.0.0",
        description="Start, signal, cancel and inspect durable workflows and DAG runs.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )  # served by the console, with auth
    app.state.harvest = harvest  # the routers' HarvestDep reads it
    app.state.auth = auth
    install_error_handlers(app)
    install_failure_handlers(app)
    install_guards(app, max_body_bytes if max_body_bytes is not None else max_body_from_env())
    guard = _guard(auth)
    access = [auth.api_dependency()]
    denied = error_responses(401, 403) if auth.enabled else error_responses(403)
    # this order is the order of the published OpenAPI paths
    for router in (
        runs.router(guard),
        signals.router(guard),
        operator.router(guard),
        dags.router(guard),
        operator.admin_router(guard),
        schedules.router(guard),
        limits.router(guard),
        queries.router(guard),
        updates.router(guard),
    ):
        app.include_router(router, dependencies=access, responses=denied)
    app.include_router(meta.router(access))  # /metrics behind the auth; /healthz open
    register_pages(app, harvest, [auth.page_dependency()])  # the DAG run page
    register_console(app, harvest, auth)  # /console, /docs, /openapi.json
    return app


def serving_token(token: str | None, host: str, *, insecure: bool = False) -> str:
    """The token ``harvest api`` serves with: ``token`` if set; else, only with ``insecure``
    (``--insecure-no-auth``) and a loopback ``host``, ``""`` (no auth). ``ValueError`` otherwise,
    with the message the CLI prints."""
    if token:
        return token
    if not insecure:
        raise ValueError(
            "HARVEST_API_TOKEN is not set: the API would let anyone read and change "
            "runs. Set it (python -c 'import secrets; print(secrets.token_urlsafe(32))'), "
            "or pass --insecure-no-auth to serve without auth on 127.0.0.1 only"
        )
    try:
        loopback = host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(
            f"--insecure-no-auth binds to loopback only (127.0.0.1, ::1, localhost), "
            f"not {host!r}: set HARVEST_API_TOKEN to serve on another address"
        )
    log.warning("--insecure-no-auth: the API and its console accept any caller on %s", host)
    return ""


__all__ = ["TOKEN_ENV", "create_app", "serving_token"]
