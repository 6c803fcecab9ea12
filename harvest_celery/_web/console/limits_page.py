"""The console's limits page: ``GET /console/limits`` lists each limited activity with its use
(slots in use against the limit in force, rows waiting, how many keys hold a row) and its
declared and override values, an override with the time it was set (docs/flow-control.md).
Read-only: overrides are set with ``harvest limits`` or the HTTP API. A key is payload (a
merchant or customer id), and the limit rows keep only its salted digest: the page shows how
many keys there are, never a key. Not in the OpenAPI document."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from harvest_celery._client import Harvest
from harvest_celery._web.auth import Auth
from harvest_celery._web.console.html import Page, e, table

PAGE = "/console/limits"
HEADERS = ["activity", "in use", "waiting", "keys", "concurrency", "rate limit", "override set"]


def _value(declared: Any, override: Any) -> str:
    """The value in force, and where it comes from: ``1 (override; declared 3)``."""
    if override is not None:
        was = "none" if declared is None else declared
        return f'<span class="override">{e(override)}</span> <span class="muted">(override; declared {e(was)})</span>'
    return "—" if declared is None else f"{e(declared)} <span class=muted>(declared)</span>"


def _row(entry: dict[str, Any]) -> str:
    concurrency = entry["override_concurrency"]
    if concurrency is None:
        concurrency = entry["declared_concurrency"]
    of = "" if concurrency is None else f" / {concurrency}"
    set_at = entry["override_set_at"]
    shown = "" if set_at is None else (set_at.isoformat() if hasattr(set_at, "isoformat") else str(set_at))
    return (
        f'<tr data-limit="{e(entry["name"])}"><td>{e(entry["name"])}</td>'
        f'<td class="in-use">{e(entry["in_use"])}{e(of)}</td><td class="waiting">{e(entry["waiting"])}</td>'
        f'<td class="keys">{e(entry["keys"])}</td>'
        f'<td class="concurrency">{_value(entry["declared_concurrency"], entry["override_concurrency"])}</td>'
        f'<td class="rate">{_value(entry.get("declared_rate_limit"), entry.get("override_rate_limit"))}</td>'
        f'<td class="set-at">{e(shown)}</td></tr>'
    )


class LimitsConsole:
    def __init__(self, harvest: Harvest, auth: Auth) -> None:
        self.harvest, self.auth = harvest, auth

    def page(self, request: Request) -> Response:
        page = Page(request, self.auth, self.auth.page_session(request))
        rows = [_row(entry) for entry in sorted(self.harvest.limits(), key=lambda x: x["name"])]
        body = (
            "<h1>Limits</h1><p class=muted>Use is read from Postgres. Set or clear an override with "
            "<code>harvest limits set|clear</code> or <code>PUT /limits/{name}</code>; a deploy never "
            "touches one.</p>"
            f"{table(HEADERS, rows, cls='limits', empty='no limited activity has dispatched yet')}"
        )
        return page.respond("Limits", body)

    def router(self) -> APIRouter:
        r = APIRouter(include_in_schema=False)
        r.add_api_route(PAGE, self.page, methods=["GET"])
        return r
