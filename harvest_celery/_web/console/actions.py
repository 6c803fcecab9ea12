"""The console's operator actions: HTML forms posted to ``POST /console/runs/{id}/{action}``.

Each post needs the console session and its CSRF token (the form's ``csrf_token`` field): a
post without them changes nothing and is answered 403. The action then goes through the
``Harvest`` client, as the JSON API's does, and answers a redirect to the run page (303, with a
fixed ``done`` message), or an HTML error page with the status the API would answer (400, 404,
409, 503) and the escaped error.

Actions: ``cancel``, ``request-cancel`` (when the client has ``request_cancellation``),
``terminate``, ``pause``, ``resume``, ``signal`` (a name and a JSON payload), ``reset`` (fork
from the first N events), ``erase`` (only when the typed confirmation is the run id),
``retry`` (a DAG run, after its dry-run preview: ``GET /console/runs/{id}/retry``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from harvest_celery._client import Harvest
from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._errors import HarvestError, http_status
from harvest_celery._web.auth import CSRF_FIELD, Auth
from harvest_celery._web.console.html import SECURITY_HEADERS, Page, document, e, error_body, run_href
from harvest_celery._web.deps import check_id, check_name
from harvest_celery._web.hardening import json_too_deep

MAX_FIELDS = 20


async def form_fields(request: Request) -> dict[str, str]:
    """The posted form (``application/x-www-form-urlencoded``), first value of each field."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return {}
    text = (await request.body()).decode("utf-8", "replace")
    parsed = parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FIELDS)
    return {k: v[0] for k, v in parsed.items()}


class Refused(Exception):
    """An action refused before it reached the client: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _reason(form: dict[str, str]) -> str:
    reason = form.get("reason", "")
    if len(reason) > 1000:
        raise Refused(400, "a reason has at most 1000 characters")
    check_storable(reason, "the reason")
    return reason


def _payload(form: dict[str, str]) -> Any:
    text = form.get("payload", "").strip()
    if not text:
        return None
    if json_too_deep(text.encode()):
        raise Refused(422, "the payload is nested more than 100 levels deep")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise Refused(400, f"the payload is not JSON: {exc}") from None
    return check_storable(value, "the signal payload")


def _new_id(form: dict[str, str]) -> str | None:
    new_id = form.get("new_execution_id", "").strip()
    return check_id(new_id, "the new execution id") if new_id else None


class ConsoleActions:
    """The actions of one app: its ``Harvest`` and ``Auth``."""

    def __init__(self, harvest: Harvest, auth: Auth) -> None:
        self.harvest = harvest
        self.auth = auth
        self.table: dict[str, Callable[[str, dict[str, str]], str]] = {
            "cancel": self.cancel,
            "terminate": self.terminate,
            "pause": self.pause,
            "resume": self.resume,
            "signal": self.signal,
            "reset": self.reset,
            "erase": self.erase,
            "retry": self.retry,
        }
        if hasattr(harvest, "request_cancellation"):
            self.table["request-cancel"] = self.request_cancel

    # each returns the run to show next (the new run of a reset or a retry)
    def cancel(self, run_id: str, form: dict[str, str]) -> str:
        self.harvest.cancel_workflow_execution(run_id, reason=_reason(form))
        return run_id

    def request_cancel(self, run_id: str, form: dict[str, str]) -> str:
        self.harvest.request_cancellation(run_id, reason=_reason(form))
        return run_id

    def terminate(self, run_id: str, form: dict[str, str]) -> str:
        self.harvest.terminate(run_id, reason=_reason(form))
        return run_id

    def pause(self, run_id: str, form: dict[str, str]) -> str:
        self.harvest.pause(run_id)
        return run_id

    def resume(self, run_id: str, form: dict[str, str]) -> str:
        self.harvest.resume(run_id)
        return run_id

    def signal(self, run_id: str, form: dict[str, str]) -> str:
        name = check_name(form.get("name", "").strip(), "a signal name")
        self.harvest.signal(run_id, name, _payload(form))
        return run_id

    def reset(self, run_id: str, form: dict[str, str]) -> str:
        try:
            to_seq = int(form.get("to_seq", ""))
        except ValueError:
            raise Refused(400, "to_seq is the number of leading events to keep") from None
        if not 1 <= to_seq <= 2**31 - 1:
            raise Refused(400, "to_seq is at least 1")
        return self.harvest.reset(run_id, to_seq, new_execution_id=_new_id(form))

    def erase(self, run_id: str, form: dict[str, str]) -> str:
        if form.get("confirm", "") != run_id:
            raise Refused(400, "type the run id exactly to confirm the erasure: nothing was erased")
        self.harvest.erase_payloads(run_id, with_forks=form.get("with_forks", "") == "1")
        return run_id

    def retry(self, run_id: str, form: dict[str, str]) -> str:
        x = self.harvest.describe(run_id)
        from_node = form.get("from_node", "").strip() or None
        if from_node is not None:
            check_name(from_node, "a node name")
        answer = self.harvest.retry_dag_run(
            x.workflow_type, run_id, from_node, new_execution_id=_new_id(form)
        )
        return str(answer["run_id"])

    # ── the endpoint ─────────────────────────────────────────────────────────────────────────
    def failure(self, page: Page | None, status: int, message: str, run_id: str) -> HTMLResponse:
        body = error_body(status, message, back=run_href(run_id))
        if page is None:
            return HTMLResponse(
                document(None, f"{status}", body), status_code=status, headers=SECURITY_HEADERS
            )
        return page.respond(f"{status}", body, status=status)

    def perform(self, request: Request, run_id: str, action: str, form: dict[str, str]) -> Response:
        """Check the session and its CSRF token, run the action, redirect to the run."""
        session = self.auth.session(request)
        if not self.auth.csrf_ok(session, form.get(CSRF_FIELD)):
            return self.failure(
                None,
                403,
                "this form is not from a current console session (a missing "
                "or wrong CSRF token, or you are signed out): nothing was changed",
                run_id,
            )
        page = Page(request, self.auth, session)
        handler = self.table.get(action)
        if handler is None:
            return self.failure(page, 404, f"no console action {action!r}", run_id)
        try:
            check_id(run_id)
            target = handler(run_id, form)
        except Refused as exc:
            return self.failure(page, exc.status, str(exc), run_id)
        except (HarvestError, ValueError) as exc:
            return self.failure(page, http_status(exc), f"{type(exc).__name__}: {exc}", run_id)
        return RedirectResponse(run_href(target, f"?done={action}"), status_code=303)


def render_retry_preview(page: Page, run_id: str, from_node: str | None, plan: dict[str, Any]) -> str:
    """The dry run of a DAG retry, and the form that confirms it."""

    def names(items: list[str]) -> str:
        return "".join(f"<li>{e(n)}</li>" for n in items) or "<li class=muted>none</li>"

    confirm = page.form(
        run_href(run_id, "/retry"),
        f'<input type="hidden" name="from_node" value="{e(from_node or "")}">'
        '<input type="text" name="new_execution_id" maxlength="200" '
        'placeholder="new run id (optional)" aria-label="new run id">'
        '<button type="submit" id="confirm-retry">Confirm retry</button>',
        cls="action wide",
        form_id="form-retry-confirm",
    )
    return (
        f'<p class="crumbs"><a href="/console">Runs</a> / <a href="{e(run_href(run_id))}">'
        f'{e(run_id)}</a> /</p><h1>Retry preview <span class="muted small">(dry run: nothing '
        f'forked yet)</span></h1><section id="retry-plan"><p>retry from '
        f'<b id="retry-from">{e(plan["retry_from"])}</b></p>'
        f'<h3>carried over (not re-run)</h3><ul id="carried">{names(plan["carried"])}</ul>'
        f'<h3>re-run</h3><ul id="rerun">{names(plan["rerun"])}</ul>{confirm}'
        f'<p><a href="{e(run_href(run_id))}">Back to the run</a></p></section>'
    )
