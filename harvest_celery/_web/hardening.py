"""What the operator API refuses before an endpoint runs, and the errors no endpoint names.

* ``CrossSiteGuard``: a mutation (any method but GET, HEAD, OPTIONS) whose ``Origin`` is not
  the server's own, or that the browser marks ``Sec-Fetch-Site: cross-site``/``same-site``, is
  refused with 403 ``CrossSiteRequest``, whatever its credentials: a cross-site form post
  changes nothing.
* ``BodyGuard``: a request body over ``max_body_bytes`` (default ``DEFAULT_MAX_BODY``, 4 MiB;
  ``HARVEST_API_MAX_BODY_BYTES``) is refused with 413 ``RequestTooLarge``, on its
  ``Content-Length`` before anything is read, or as soon as a streamed (chunked) body passes
  the limit. A JSON body nested more than ``MAX_JSON_DEPTH`` (100) levels deep is refused with
  422 ``ValidationError`` before it is parsed for the endpoint (deeper nesting used to end in a
  ``RecursionError`` and a plain-text 500).
* ``install_failure_handlers``: a database that does not answer (a transient SQLAlchemy error,
  ``is_transient``) is 503 ``DatabaseUnavailable``; any other unexpected exception is 500
  ``InternalServerError`` with no internals in the body (the traceback goes to the log). The
  console's pages get the same statuses as HTML pages.

Every answer here is the JSON ``ErrorBody`` (``{"error", "detail"}``), never plain text.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import Headers

from harvest_celery._core.jsonvalues import MAX_JSON_DEPTH, nesting_exceeds
from harvest_celery._store.store import is_transient
from harvest_celery._web.errors import error_response
from harvest_celery._web.pages import render_error_page

log = logging.getLogger("harvest_celery.api")

MAX_BODY_ENV = "HARVEST_API_MAX_BODY_BYTES"
DEFAULT_MAX_BODY = 4 * 1024 * 1024
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


def max_body_from_env(default: int = DEFAULT_MAX_BODY) -> int:
    text = os.environ.get(MAX_BODY_ENV, "").strip()
    if not text:
        return default
    value = int(text)
    if value < 1024:
        raise ValueError(f"{MAX_BODY_ENV} is at least 1024 bytes, not {value}")
    return value


async def _answer(
    send: Send, status: int, error: str, detail: Any, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps({"error": error, "detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _same_origin(origin: str, host: str | None) -> bool:
    if not host or origin == "null":
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


class CrossSiteGuard:
    """Refuse a mutation that a browser says comes from another site (see the module)."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            headers = Headers(scope=scope)
            site = headers.get("sec-fetch-site")
            origin = headers.get("origin")
            if site in ("cross-site", "same-site") or (
                origin is not None and not _same_origin(origin, headers.get("host"))
            ):
                await _answer(
                    send, 403, "CrossSiteRequest", "a state-changing request from another site is refused"
                )
                return
        await self.app(scope, receive, send)


def _json_body(headers: Headers) -> bool:
    """FastAPI parses a body as JSON with no content type, or an ``application/*json`` one."""
    content_type = headers.get("content-type")
    if content_type is None:
        return True
    kind = content_type.split(";")[0].strip().lower()
    return kind.startswith("application/") and kind.endswith("json")


def json_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON text nests deeper than ``limit``. A text with at most ``limit`` opening
    brackets cannot (two C-speed counts: the usual case); a malformed text is left to the
    parser's own error."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    try:
        value = json.loads(raw)
    except RecursionError:
        return True
    except ValueError:
        return False
    return nesting_exceeds(value, limit)


class BodyGuard:
    """The request-size limit and the JSON depth limit (see the module)."""

    def __init__(self, app: Asgi, max_body_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> tuple[int, str, str]:
        return 413, "RequestTooLarge", f"the request body is over the limit of {self.max_body_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _answer(send, *self._too_large())
            return
        chunks, size, more = [], 0, True
        while more:  # the whole body, bounded by the limit (FastAPI would buffer it anyway)
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay(b"", message, receive), send)  # a disconnect
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _answer(send, *self._too_large())
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body and _json_body(headers) and json_too_deep(body):
            await _answer(
                send,
                422,
                "ValidationError",
                [
                    {
                        "type": "json_too_deep",
                        "loc": ["body"],
                        "msg": f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep",
                    }
                ],
            )
            return
        await self.app(scope, _replay(body, None, receive), send)


def _replay(body: bytes, first: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that hands the buffered body (or the message already read) once, then
    defers to the server's (a disconnect)."""
    pending: list[Message] = [
        first if first is not None else {"type": "http.request", "body": body, "more_body": False}
    ]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay


# ── errors no endpoint names ─────────────────────────────────────────────────────────────────
def _wants_html(request: Request) -> bool:
    path = request.url.path
    return (
        request.method == "GET"
        and (path.startswith("/console") or path.startswith("/ui/"))
        and not path.endswith(".json")
    )


def failure_response(request: Request, status: int, error: str, detail: str) -> Response:
    """The JSON error body; a console or DAG page gets the pages' HTML error page instead."""
    if _wants_html(request):
        return HTMLResponse(render_error_page(status, detail), status_code=status)
    return error_response(status, error, detail)


def _database_error(request: Request, exc: Exception) -> Response:
    if is_transient(exc):
        log.warning(
            "%s %s: the database does not answer: %s", request.method, request.url.path, type(exc).__name__
        )
        return failure_response(
            request, 503, "DatabaseUnavailable", "the database does not answer; retry later"
        )
    return _unexpected(request, exc)


def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return failure_response(
        request,
        500,
        "InternalServerError",
        "the server failed to answer this request; its log has the details",
    )


def install_failure_handlers(app: FastAPI) -> None:
    """503 for a database that does not answer, a JSON 500 for anything unexpected."""
    app.exception_handler(SQLAlchemyError)(_database_error)
    app.exception_handler(Exception)(_unexpected)


def install_guards(app: FastAPI, max_body_bytes: int) -> None:
    """The body limits, then (outermost) the cross-site refusal."""
    app.add_middleware(BodyGuard, max_body_bytes=max_body_bytes)  # type: ignore[arg-type]
    app.add_middleware(CrossSiteGuard)  # type: ignore[arg-type]
