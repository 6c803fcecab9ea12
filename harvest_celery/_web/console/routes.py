"""The console's routes, registered on the operator API's app by ``register_console``.

``GET /console`` the runs list · ``GET /console/runs/{id}`` a run · ``GET
/console/runs/{id}/state.json`` what the run page polls while the run is open · ``GET
/console/runs/{id}/retry`` a DAG retry's dry run · ``POST /console/runs/{id}/{action}`` an
operator action (``actions``) · ``GET``/``POST /console/login`` and ``POST /console/logout`` ·
``GET /console/static/{file}`` the package's own CSS, scripts and Swagger UI · ``GET /docs``
and ``GET /openapi.json``. None is in the OpenAPI document.

Pages need a session (``Auth.page_session``: with a token, signing in; else one is issued) or
the bearer header; the sign-in page and the static files are the only ones open to all.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from harvest_celery._client import Harvest
from harvest_celery._core.lifecycle import TERMINAL_STATUSES
from harvest_celery._dag.canvas_run import run_definition
from harvest_celery._dag.graph import build_run_graph
from harvest_celery._errors import ExecutionNotFound, HarvestError, http_status
from harvest_celery._runtime import logs
from harvest_celery._web.auth import Auth, LoginRequired, login_redirect, safe_next
from harvest_celery._web.console.actions import ConsoleActions, form_fields, render_retry_preview
from harvest_celery._web.console.docs import DOCS_CSP, plain_docs, static_files, swagger_page
from harvest_celery._web.console.html import SECURITY_HEADERS, Page, document, e, error_body, run_href
from harvest_celery._web.console.limits_page import LimitsConsole
from harvest_celery._web.console.run_page import render_run_page
from harvest_celery._web.console.run_view import build_run_view
from harvest_celery._web.console.runs_page import RunFilters, render_runs_page
from harvest_celery._web.console.schedules_page import SchedulesConsole
from harvest_celery._web.deps import check_id
from harvest_celery._web.pages import compensation_states, render_graph

Form = Annotated[dict[str, str], Depends(form_fields)]
log = logging.getLogger("harvest_celery.api")


def _version(x: Any) -> str:
    """What the run page was drawn from: when it changes, an open page reloads."""
    return f"{x.status}|{x.history_length}|{x.paused_at}|{x.cancel_requested_at}|{x.nd_block_count}"


class Console:
    """The console of one app: its ``Harvest``, ``Auth`` and actions."""

    def __init__(self, app: FastAPI, harvest: Harvest, auth: Auth) -> None:
        self.app, self.harvest, self.auth = app, harvest, auth
        self.actions = ConsoleActions(harvest, auth)
        self.files = static_files()

    def page(self, request: Request) -> Page:
        return Page(request, self.auth, self.auth.page_session(request))

    # ── sign in ──────────────────────────────────────────────────────────────────────────────
    def login_form(self, request: Request, next: str = "/console", failed: bool = False) -> Response:
        if not self.auth.enabled:
            return RedirectResponse(safe_next(next), status_code=303)
        note = '<p class="err" id="login-error">That is not the token.</p>' if failed else ""
        body = (
            '<section class="login"><h1>Sign in</h1><p>Paste the API token '
            "(<code>HARVEST_API_TOKEN</code>).</p>"
            f'{note}<form method="post" action="/console/login" id="login">'
            f'<input type="hidden" name="next" value="{e(safe_next(next))}">'
            '<input type="password" name="token" id="token" required autocomplete="current-password" '
            'aria-label="API token"><button type="submit">Sign in</button></form></section>'
        )
        return HTMLResponse(
            document(None, "Sign in", body), status_code=401 if failed else 200, headers=SECURITY_HEADERS
        )

    def login(self, request: Request, form: Form) -> Response:
        if not self.auth.token_matches(form.get("token")):
            return self.login_form(request, form.get("next", "/console"), failed=True)
        response = RedirectResponse(safe_next(form.get("next")), status_code=303)
        self.auth.set_cookie(response, request, self.auth.new_session())
        return response

    def logout(self, request: Request, form: Form) -> Response:
        if not self.auth.csrf_ok(self.auth.session(request), form.get("csrf_token")):
            return HTMLResponse(
                document(None, "403", error_body(403, "not signed out: a wrong CSRF token")),
                status_code=403,
                headers=SECURITY_HEADERS,
            )
        response = RedirectResponse("/console/login", status_code=303)
        self.auth.clear_cookie(response, request)
        return response

    # ── pages ────────────────────────────────────────────────────────────────────────────────
    def runs(self, request: Request) -> Response:
        page = self.page(request)
        try:
            filters = RunFilters.parse(request.query_params)
        except ValueError as exc:
            return page.respond("400", error_body(400, str(exc)), status=400)
        rows = self.harvest.list(**filters.list_kwargs())
        workflows = sorted(self.harvest.registry.workflows)
        return page.respond("Runs", render_runs_page(filters, rows, workflows))

    def _graph(self, x: Any, history: list[Any]) -> tuple[str | None, list[str] | None, str | None]:
        definition = self.harvest.registry.workflows.get(x.workflow_type)
        dag, note = run_definition(definition, history) if definition is not None else (None, None)
        if dag is None:
            return None, None, None
        try:
            graph = build_run_graph(dag, x, history, note)
        except Exception as exc:  # noqa: BLE001 - a read-only view degrades: the rest still shows
            log.warning("run %s: the DAG graph cannot be drawn: %s", x.id, exc, extra=logs.run(x.id))
            return '<p class="empty">the graph cannot be drawn from this history</p>', None, None
        link = f"/ui/dags/{quote(x.workflow_type, safe='')}/runs/{quote(x.id, safe='')}"
        return (
            render_graph(graph, compensation_states(history)),
            [n["node_name"] for n in graph["nodes"]],
            link,
        )

    def run(self, request: Request, run_id: str, done: str | None = None) -> Response:
        page = self.page(request)
        try:
            x = self.harvest.describe(check_id(run_id))
            history = self.harvest.history(run_id, strict=False)  # a read-only view degrades
        except (HarvestError, ValueError) as exc:
            status = http_status(exc)
            message = f"no run with id {run_id!r}" if isinstance(exc, ExecutionNotFound) else str(exc)
            return page.respond(str(status), error_body(status, message), status=status)
        view = build_run_view(
            history,
            self.harvest.store.attempt_errors(run_id),
            live=x.status not in TERMINAL_STATUSES,
            held=self.harvest.store.held_activities(run_id),
        )
        graph_html, nodes, link = self._graph(x, history)
        body = render_run_page(
            page,
            x,
            history,
            view,
            graph_html=graph_html,
            dag_nodes=nodes,
            dag_link=link,
            done=done,
            can_request_cancel="request-cancel" in self.actions.table,
        )
        live = run_href(run_id, "/state.json") if x.status == "RUNNING" else ""
        return page.respond(f"{x.workflow_type} {x.id}", body, live=live, version=_version(x))

    def state(self, request: Request, run_id: str) -> Response:
        self.page(request)
        x = self.harvest.describe(check_id(run_id))
        return JSONResponse(
            {
                "execution_id": x.id,
                "status": x.status,
                "display_status": x.display_status,
                "history_length": x.history_length,
                "version": _version(x),
            },
            headers={"Cache-Control": "no-store"},
        )

    def retry_preview(self, request: Request, run_id: str, from_node: str | None = None) -> Response:
        page = self.page(request)
        node = (from_node or "").strip() or None
        try:
            x = self.harvest.describe(check_id(run_id))
            plan = self.harvest.retry_dag_run(x.workflow_type, run_id, node, dry_run=True)
        except (HarvestError, ValueError) as exc:
            status = http_status(exc)
            return page.respond(
                str(status),
                error_body(status, f"{type(exc).__name__}: {exc}", back=run_href(run_id)),
                status=status,
            )
        return page.respond("Retry preview", render_retry_preview(page, run_id, node, plan))

    def act(self, request: Request, run_id: str, action: str, form: Form) -> Response:
        return self.actions.perform(request, run_id, action, form)

    # ── docs and static files ────────────────────────────────────────────────────────────────
    def static(self, name: str) -> Response:
        found = self.files.get(name)
        if found is None:
            return JSONResponse({"error": "NotFound", "detail": "no such file"}, status_code=404)
        return Response(
            found[0],
            media_type=found[1],
            headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"},
        )

    def docs(self, request: Request) -> Response:
        page = self.page(request)
        if "swagger/swagger-ui-bundle.js" not in self.files:
            return page.respond("API docs", plain_docs(self.app.openapi()))
        html = swagger_page(self.app.title, page.csrf)
        return HTMLResponse(html, headers={**SECURITY_HEADERS, "Content-Security-Policy": DOCS_CSP})

    def openapi(self) -> JSONResponse:
        return JSONResponse(self.app.openapi())

    def router(self) -> APIRouter:
        r = APIRouter(include_in_schema=False)
        r.add_api_route("/console/static/{name:path}", self.static, methods=["GET"])
        r.add_api_route("/console/login", self.login_form, methods=["GET"])
        r.add_api_route("/console/login", self.login, methods=["POST"])
        r.add_api_route("/console/logout", self.logout, methods=["POST"])
        r.add_api_route("/console", self.runs, methods=["GET"])
        r.add_api_route("/console/runs/{run_id}", self.run, methods=["GET"])
        r.add_api_route("/console/runs/{run_id}/state.json", self.state, methods=["GET"])
        r.add_api_route("/console/runs/{run_id}/retry", self.retry_preview, methods=["GET"])
        r.add_api_route("/console/runs/{run_id}/{action}", self.act, methods=["POST"])
        r.add_api_route("/docs", self.docs, methods=["GET"])
        r.add_api_route(
            "/openapi.json", self.openapi, methods=["GET"], dependencies=[self.auth.api_dependency()]
        )
        return r


def register_console(app: FastAPI, harvest: Harvest, auth: Auth) -> None:
    """Serve the console, ``/docs`` and ``/openapi.json`` from ``app`` (built with
    ``docs_url=None, redoc_url=None, openapi_url=None``)."""
    app.include_router(Console(app, harvest, auth).router())
    app.include_router(SchedulesConsole(harvest, auth).router())  # /console/schedules
    app.include_router(LimitsConsole(harvest, auth).router())  # /console/limits
    app.exception_handler(LoginRequired)(login_redirect)


__all__ = ["Console", "register_console"]
