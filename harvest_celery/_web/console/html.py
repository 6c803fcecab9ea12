"""The console's HTML shell and the helpers every page shares.

Every user-controlled string (run ids, workflow, activity and signal names, errors, tracebacks,
payload snippets) goes through ``e`` (``html.escape``, quotes included) before it reaches the
page; links carry ids percent-encoded (``run_href``). Pages load only the package's own
``/console/static`` files, under a Content-Security-Policy that allows no other origin and no
inline script; they may not be framed (clickjacking).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse

from harvest_celery._web.auth import CSRF_FIELD, Auth, Session

STATIC = "/console/static"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATUS_CLASS = {
    "RUNNING": "running",
    "COMPLETED": "completed",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "TERMINATED": "terminated",
    "CONTINUED_AS_NEW": "continued",
    "TIMED_OUT": "timed-out",
    "CANCELLING": "cancelling",
}


def e(value: Any) -> str:
    """``value`` as HTML text (``None`` is empty)."""
    return html.escape("" if value is None else str(value), quote=True)


def run_href(run_id: str, suffix: str = "") -> str:
    return f"/console/runs/{quote(run_id, safe='')}{suffix}"


def when(at: datetime | None) -> str:
    if at is None:
        return "-"
    return at.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if at.utcoffset() is not None else "")


def snippet(value: Any, limit: int = 400) -> str:
    """Compact JSON of a payload, cut at ``limit`` characters (the caller escapes it)."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def badge(status: str) -> str:
    key = status.split(" ")[0]
    return (
        f'<span class="badge st-{STATUS_CLASS.get(key, "other")}" data-status="{e(key)}">{e(status)}</span>'
    )


@dataclass
class Page:
    """What a page needs of its request: the auth, the session (None: a bearer caller, who gets
    no forms) and the request itself."""

    request: Request
    auth: Auth
    session: Session | None

    @property
    def csrf(self) -> str:
        return self.auth.csrf_token(self.session)

    def form(self, action: str, inner: str, *, cls: str = "", method: str = "post", form_id: str = "") -> str:
        """A form posting to ``action`` with the session's CSRF token."""
        ident = f' id="{e(form_id)}"' if form_id else ""
        hidden = (
            f'<input type="hidden" name="{CSRF_FIELD}" value="{e(self.csrf)}">' if method == "post" else ""
        )
        return f'<form method="{method}" action="{e(action)}" class="{e(cls)}"{ident}>{hidden}{inner}</form>'

    def respond(
        self, title: str, body: str, *, status: int = 200, live: str = "", version: str = ""
    ) -> HTMLResponse:
        response = HTMLResponse(
            document(self, title, body, live=live, version=version),
            status_code=status,
            headers=SECURITY_HEADERS,
        )
        if self.session is not None and self.session.new:
            self.auth.set_cookie(response, self.request, self.session)
        return response


def _nav(page: Page) -> str:
    sign_out = ""
    if page.auth.enabled and page.session is not None:
        sign_out = page.form(
            "/console/logout", '<button type="submit" class="link">Sign out</button>', cls="signout"
        )
    return (
        '<nav class="top"><a class="brand" href="/console">harvest</a>'
        '<a href="/console">Runs</a><a href="/console/schedules">Schedules</a><a href="/console/limits">Limits</a><a href="/docs">API docs</a>'
        f'<span class="spacer"></span>{sign_out}</nav>'
    )


def document(page: Page | None, title: str, body: str, *, live: str = "", version: str = "") -> str:
    """A whole console page. ``live``: the state URL the page polls while the run is open,
    ``version``: the state it was rendered at (a change reloads the page)."""
    live_attr = f' data-live="{e(live)}" data-version="{e(version)}"' if live else ""
    nav = _nav(page) if page is not None else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{STATIC}/console.css">'
        f'<link rel="stylesheet" href="{STATIC}/graph.css">'
        f"<title>{e(title)} · harvest console</title></head>"
        f"<body{live_attr}>{nav}<main>{body}</main>"
        f'<script src="{STATIC}/console.js"></script></body></html>'
    )


def error_body(status: int, message: str, back: str = "/console") -> str:
    return (
        f'<section class="error-page"><h1>{status}</h1><p id="error" class="err">{e(message)}</p>'
        f'<p><a href="{e(back)}">Back</a></p></section>'
    )


def table(headers: list[str], rows: list[str], *, cls: str = "", empty: str = "none") -> str:
    if not rows:
        return f'<p class="empty">{e(empty)}</p>'
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return f'<table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
