"""How the operator API answers errors: ``ApiError``, the ``HarvestError`` → HTTP status mapping,
the JSON exception handlers, and the error responses each endpoint publishes in OpenAPI.

Errors are JSON ``{"error": <class name>, "detail": <message>}``: unknown workflow/execution/query/
update → 404, an id reused for another workflow or an operation the run's status forbids → 409 (a refused
DAG retry adds ``"reason"``: compensated · erased · running · completed · retried), a bad
payload, id or node → 400, a stored payload the server cannot decode (an offloaded payload whose
store is not configured, a codec key it does not hold) → 503, a request that does not match the
schema → 422 (``"ValidationError"``, with pydantic's error list as ``detail``), a missing or
wrong bearer token on a mutating endpoint → 401, an accepted update whose handler has not
finished within its timeout → 504 (``"UpdateTimeout"``).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from harvest_celery._errors import HarvestError, error_body, http_status
from harvest_celery._web.models import ErrorBody


class ApiError(Exception):
    """An API-level refusal that has no ``HarvestError`` of its own (401, a run of another DAG)."""

    def __init__(
        self, status_code: int, error: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status_code, self.error, self.detail, self.headers = status_code, error, detail, headers


def status_for(exc: BaseException) -> int:
    """404 unknown, 409 conflict, 503 an undecodable stored payload, 400 anything else: the one
    mapping, ``harvest_celery._errors.http_status``, which the Django and Flask integrations
    answer with too."""
    return http_status(exc)


def error_response(
    status_code: int, error: str, detail: Any, headers: dict[str, str] | None = None
) -> JSONResponse:
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


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of these error statuses, each an ``ErrorBody``."""
    text = {
        400: "a malformed id or payload",
        401: "a missing or wrong bearer token",
        403: "a cross-site request, or a session mutation without its CSRF token",
        404: "unknown workflow, DAG, execution, schedule, query or update",
        409: "the run's state forbids it",
        413: "the request body is over the size limit",
        422: "the request does not match the schema, or its JSON nests over 100 deep",
        503: "a stored payload cannot be decoded here (e.g. its payload store is not configured)",
        504: "an accepted update's handler did not finish in time (repeat with its update_id)",
    }
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


# ── handlers ─────────────────────────────────────────────────────────────────────────────────
def _harvest_error(_request: Request, exc: HarvestError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=http_status(exc))


def _value_error(_request: Request, exc: ValueError) -> JSONResponse:
    return error_response(400, "ValueError", str(exc))


def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status_code, exc.error, exc.detail, exc.headers)


def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(422, "ValidationError", _json_safe(jsonable_encoder(exc.errors())))


def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    names = {404: "NotFound", 405: "MethodNotAllowed"}
    return error_response(
        exc.status_code, names.get(exc.status_code, "HTTPError"), exc.detail, getattr(exc, "headers", None)
    )


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` as a JSON ``ErrorBody`` (see the module docstring)."""
    app.exception_handler(HarvestError)(_harvest_error)
    app.exception_handler(ValueError)(_value_error)
    app.exception_handler(ApiError)(_api_error)
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(StarletteHTTPException)(_http_error)
