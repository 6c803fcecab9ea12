"""The console's schedules page: ``GET /console/schedules`` lists each schedule with its next
ticks and its last runs (with their status), and forms to pause with a note, resume and trigger
now, posted to ``POST /console/schedules/{name}/{action}`` with the session's CSRF token (a post
without it changes nothing: 403). None is in the OpenAPI document."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from harvest_celery._client import Harvest
from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._core.schedule import Spec
from harvest_celery._errors import HarvestError, http_status
from harvest_celery._web.auth import CSRF_FIELD, Auth
from harvest_celery._web.console.actions import form_fields
from harvest_celery._web.console.html import (
    SECURITY_HEADERS,
    Page,
    badge,
    document,
    e,
    error_body,
    run_href,
    table,
)

PAGE = "/console/schedules"
Form = Annotated[dict[str, str], Depends(form_fields)]
NEXT_TICKS = 3
LAST_RUNS = 5


def _next_ticks(s: dict[str, Any]) -> list[datetime]:
    if s["ended"] or s["next_fire_at"] is None:
        return []
    spec = Spec(s["cron"], s["every_seconds"], s["timezone"], s["jitter_seconds"])
    ticks, at = [], datetime.fromisoformat(s["last_tick"])
    for _ in range(NEXT_TICKS):
        at = spec.after(at)
        ticks.append(at)
    return ticks


class SchedulesConsole:
    def __init__(self, harvest: Harvest, auth: Auth) -> None:
        self.harvest, self.auth = harvest, auth

    def page(self, request: Request) -> Response:
        page = Page(request, self.auth, self.auth.page_session(request))
        schedules = self.harvest.list_schedules()
        rows = [self._row(page, s) for s in schedules]
        done = request.query_params.get("done")
        note = f'<p id="done" class="ok">{e(done)} done</p>' if done in ("pause", "resume", "trigger") else ""
        headers = ["schedule", "workflow", "when", "next ticks", "last runs", "counters", "actions"]
        body = f"<h1>Schedules</h1>{note}{table(headers, rows, cls='schedules', empty='no schedules')}"
        return page.respond("Schedules", body)

    def _row(self, page: Page, s: dict[str, Any]) -> str:
        when = f"cron {s['cron']} ({s['timezone']})" if s["cron"] else f"every {s['every_seconds']}s"
        state = "ended" if s["ended"] else ""
        if s["paused"]:
            state = f"paused: {s['pause_note'] or ''}"
        ticks = "".join(f"<li>{e(t.isoformat())}</li>" for t in _next_ticks(s)) if not s["paused"] else ""
        runs = "".join(
            f'<li><a href="{e(run_href(run_id))}">{e(run_id)}</a> {badge(status)}</li>'
            for run_id, status in self.harvest.schedule_runs(s["name"], LAST_RUNS)
        )
        name = quote(s["name"], safe="")
        forms = (
            page.form(
                f"{PAGE}/{name}/resume", '<button type="submit" class="resume">Resume</button>', cls="action"
            )
            if s["paused"]
            else page.form(
                f"{PAGE}/{name}/pause",
                '<input type="text" name="note" maxlength="500" placeholder="note" aria-label="pause note">'
                '<button type="submit" class="pause">Pause</button>',
                cls="action",
            )
        ) + page.form(
            f"{PAGE}/{name}/trigger",
            '<button type="submit" class="trigger">Trigger now</button>',
            cls="action",
        )
        return (
            f'<tr data-schedule="{e(s["name"])}"><td>{e(s["name"])}<div class="muted state">{e(state)}</div></td>'
            f"<td>{e(_target(s))}</td><td>{e(when)}</td><td><ul class=ticks>{ticks}</ul></td>"
            f"<td><ul class=runs>{runs}</ul></td>"
            f"<td>fired {s['fired']} · skipped {s['skipped']} · missed {s['missed']}</td><td>{forms}</td></tr>"
        )

    def act(self, request: Request, name: str, action: str, form: Form) -> Response:
        session = self.auth.session(request)
        if not self.auth.csrf_ok(session, form.get(CSRF_FIELD)):
            body = error_body(
                403, "this form is not from a current console session: nothing was changed", back=PAGE
            )
            return HTMLResponse(document(None, "403", body), status_code=403, headers=SECURITY_HEADERS)
        page = Page(request, self.auth, session)
        try:
            if action == "pause":
                note = form.get("note", "")[:500]
                check_storable(note, "the pause note")
                self.harvest.pause_schedule(name, note)
            elif action == "resume":
                self.harvest.resume_schedule(name)
            elif action == "trigger":
                self.harvest.trigger_schedule(name)
            else:
                return page.respond(
                    "404", error_body(404, f"no schedule action {action!r}", back=PAGE), status=404
                )
        except (HarvestError, ValueError) as exc:
            status = http_status(exc)
            return page.respond(
                str(status), error_body(status, f"{type(exc).__name__}: {exc}", back=PAGE), status=status
            )
        return RedirectResponse(f"{PAGE}?done={action}", status_code=303)

    def router(self) -> APIRouter:
        r = APIRouter(include_in_schema=False)
        r.add_api_route(PAGE, self.page, methods=["GET"])
        r.add_api_route(PAGE + "/{name}/{action}", self.act, methods=["POST"])
        return r


def _target(s: dict[str, Any]) -> str:
    """The workflow, or ``task <name>`` for a task schedule (import-beat)."""
    return f"task {s['workflow']}" if s.get("target") == "task" else str(s["workflow"])
