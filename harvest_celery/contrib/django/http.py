"""Answering ``HarvestError`` in Django views with the HTTP API's JSON body and status:
``error_response(exc)``, or ``HarvestErrorMiddleware`` in ``MIDDLEWARE`` to answer every
``HarvestError`` a view lets escape (404 unknown run, 409 already exists / wrong state, 400 a
bad id or payload, 503 an undecodable stored payload; docs/errors.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from harvest_celery._errors import HarvestError, error_body, http_status


def error_response(exc: HarvestError) -> JsonResponse:
    return JsonResponse(error_body(exc), status=http_status(exc))


class HarvestErrorMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> Any:
        if isinstance(exc, HarvestError):
            return error_response(exc)
        return None
