"""Who may use the operator API and its console: the bearer token, the console's signed session
cookie, and the CSRF token that every console mutation carries.

With a token (``HARVEST_API_TOKEN`` or ``create_app(token=...)``) every endpoint but ``/healthz``
needs one of:

* ``Authorization: Bearer <token>`` (scripts, the CLI, other services): nothing else is asked,
  since a browser never sends that header across sites;
* the console's session cookie, set by signing in with the token at ``/console/login``: a
  ``harvest_session`` cookie, ``HttpOnly``, ``SameSite=Strict`` (``Secure`` over HTTPS), signed
  with HMAC-SHA256 under a key derived from the token (rotating the token ends every session),
  valid for ``SESSION_SECONDS``. A mutation made with the cookie must also carry the session's
  CSRF token: the ``csrf_token`` field of a console form, or the ``X-CSRF-Token`` header of a
  script (the API docs page sends it).

Without a token (tests, ``harvest api --insecure-no-auth`` on loopback) every caller is let in,
but a console session is still issued (under a per-process random key) so that console forms
carry a CSRF token, and a mutation of the JSON API sent as a form (``x-www-form-urlencoded``,
``multipart/form-data``, ``text/plain``: the only bodies a cross-site ``<form>`` can send) is
refused. ``hardening.CrossSiteGuard`` refuses a mutation from a foreign ``Origin`` in every mode.

No server state: a session is ``<issued>.<nonce>.<mac>``; its CSRF token is an HMAC of the
nonce.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from harvest_celery._web.errors import ApiError

SESSION_COOKIE = "harvest_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
SESSION_SECONDS = 12 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# the bodies a cross-site HTML form can send without a CORS preflight
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")
LOGIN_PATH = "/console/login"

# module-level: FastAPI resolves the (postponed) annotations of the dependencies here
_BEARER = HTTPBearer(auto_error=False, description="the API token (HARVEST_API_TOKEN)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


class LoginRequired(Exception):
    """A console page asked for without a session: answered with a redirect to the sign-in page."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


@dataclass(frozen=True)
class Session:
    """A verified console session. ``new``: issued by this request (open mode), to be set."""

    value: str
    nonce: str
    new: bool = False


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def is_form_post(request: Request) -> bool:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return content_type in FORM_TYPES


def safe_next(path: str | None) -> str:
    """A local path to go back to after signing in; anything else (another host, ``//x``,
    a scheme) becomes the console's front page."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/console"
    return path


class Auth:
    """The token (None: open mode), the session key and the dependencies built on them."""

    def __init__(self, token: str | None, *, session_seconds: int = SESSION_SECONDS) -> None:
        self.token = token or None
        self.session_seconds = session_seconds
        if self.token is None:
            self._key = secrets.token_bytes(32)  # open mode: sessions live as long as the process
        else:
            self._key = hmac.new(_text(self.token), b"harvest-console-session-v1", hashlib.sha256).digest()

    @property
    def enabled(self) -> bool:
        return self.token is not None

    # ── the token ────────────────────────────────────────────────────────────────────────────
    def token_matches(self, candidate: str | None) -> bool:
        if self.token is None or candidate is None:
            return False
        return secrets.compare_digest(_text(candidate), _text(self.token))

    def bearer_ok(self, request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(value.strip())

    # ── sessions ─────────────────────────────────────────────────────────────────────────────
    def _mac(self, label: str) -> str:
        return hmac.new(self._key, label.encode(), hashlib.sha256).hexdigest()

    def new_session(self) -> Session:
        issued, nonce = str(int(time.time())), secrets.token_urlsafe(18)
        value = f"{issued}.{nonce}.{self._mac(f'session|{issued}|{nonce}')}"
        return Session(value, nonce, new=True)

    def session(self, request: Request) -> Session | None:
        """The request's session, if its cookie is well signed and not expired."""
        value = request.cookies.get(SESSION_COOKIE, "")
        parts = value.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return None
        issued, nonce, mac = parts
        if not hmac.compare_digest(_text(mac), _text(self._mac(f"session|{issued}|{nonce}"))):
            return None
        age = time.time() - int(issued)
        if age > self.session_seconds or age < -60:
            return None
        return Session(value, nonce)

    def csrf_token(self, session: Session | None) -> str:
        return "" if session is None else self._mac(f"csrf|{session.nonce}")

    def csrf_ok(self, session: Session | None, candidate: str | None) -> bool:
        if session is None or not candidate:
            return False
        return hmac.compare_digest(_text(candidate), _text(self.csrf_token(session)))

    def set_cookie(self, response: Response, request: Request, session: Session) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            session.value,
            max_age=self.session_seconds,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def clear_cookie(self, response: Response, request: Request) -> None:
        response.delete_cookie(
            SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
        )

    # ── dependencies ─────────────────────────────────────────────────────────────────────────
    def _unauthorized(self) -> ApiError:
        return ApiError(
            401,
            "Unauthorized",
            "a valid 'Authorization: Bearer <token>' header (or a console session) is required",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def check_api(self, request: Request) -> None:
        """The rule of every API endpoint (see the module docstring); raises ``ApiError``."""
        mutation = request.method not in SAFE_METHODS
        if self.token is None:
            if mutation and is_form_post(request):
                raise ApiError(
                    403,
                    "CsrfRefused",
                    "a mutation sent as an HTML form could be a "
                    "cross-site request: send JSON (application/json) or no body",
                )
            return
        if self.bearer_ok(request):
            return
        session = self.session(request)
        if session is None:
            raise self._unauthorized()
        if mutation and not self.csrf_ok(session, request.headers.get(CSRF_HEADER)):
            raise ApiError(
                403,
                "CsrfRefused",
                f"a mutation made with the console session needs the {CSRF_HEADER} header of that session",
            )

    def api_dependency(self) -> Any:
        """``Depends(...)`` for the API routers: with a token it declares the bearer scheme in
        OpenAPI; without one it declares nothing."""
        if self.token is None:

            def open_access(request: Request) -> None:
                self.check_api(request)

            return Depends(open_access)

        def token_access(request: Request, _credentials: Credentials) -> None:
            self.check_api(request)

        return Depends(token_access)

    def page_session(self, request: Request) -> Session | None:
        """The session of a console page: open mode issues one when there is none (the page
        sets it); with a token, a page needs a session (else ``LoginRequired``) or the bearer
        header (then no session, so no form can be posted)."""
        session = self.session(request)
        if session is not None:
            return session
        if self.token is None:
            return self.new_session()
        if self.bearer_ok(request):
            return None
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)

    def page_dependency(self) -> Any:
        """``Depends(...)`` for an HTML page that has no form (the DAG page, the docs page)."""

        def page_access(request: Request) -> None:
            self.page_session(request)

        return Depends(page_access)


def login_redirect(request: Request, exc: LoginRequired) -> Response:
    """303 to the sign-in page, coming back to the page asked for."""
    return Response(
        status_code=303, headers={"Location": f"{LOGIN_PATH}?next={quote(exc.next_path, safe='')}"}
    )


__all__ = [
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "Auth",
    "LoginRequired",
    "Session",
    "login_redirect",
    "safe_next",
]
