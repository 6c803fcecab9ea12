"""The console's run page, for any workflow: header (status, timings, forks), the operator
actions the run's status allows, its input/result/error, the DAG graph of a DAG run, the
activities with their attempts, every attempt's error with its traceback, the saga markers and
compensations, the signals received, and the timeline.

Rendering only (``routes`` gathers the data); every user-controlled string is escaped.
"""

from __future__ import annotations

from typing import Any

from harvest_celery._core import activities as core
from harvest_celery._core.admission import admission_text
from harvest_celery._core.timeline import render_timeline
from harvest_celery._store.store import Execution
from harvest_celery._web.console.html import Page, badge, e, run_href, snippet, table, when
from harvest_celery._web.console.run_view import Activity, RunView

DONE = {
    "cancel": "Cancelled.",
    "request-cancel": "Cancellation requested.",
    "terminate": "Terminated.",
    "pause": "Paused: decisions are held until resumed.",
    "resume": "Resumed.",
    "signal": "Signal sent.",
    "erase": "Payloads erased.",
    "reset": "This run was forked by a reset.",
    "retry": "This run retries the failed run.",
}
# the activity fold's words as the console has always shown them (``data-status`` keeps the word)
STATUS_LABEL = {
    core.SUCCEEDED: "completed",
    core.FAILED: "failed",
    core.TIMED_OUT: "timed out",
    core.CANCELLED: "cancelled",
    core.RUNNING: "running",
    core.PENDING: "scheduled",
    core.SKIPPED: "skipped",
}


def status_label(status: str) -> str:
    return STATUS_LABEL.get(status, status)


def _meta(x: Execution) -> str:
    items = [
        f"<span>status {badge(x.display_status)}</span>",
        f"<span>created <b>{e(when(x.created_at))}</b></span>",
        f"<span>updated <b>{e(when(x.updated_at))}</b></span>",
        f"<span>closed <b>{e(when(x.closed_at))}</b></span>",
        f'<span>events <b id="run-events">{x.history_length}</b></span>',
    ]
    if x.admission is not None:  # waiting for admission: its place ("3rd of 7 waiting; 1/1 in use")
        items.append(f'<span class="flag" id="run-admission">{e(admission_text(x.admission))}</span>')
    if x.paused_at is not None:
        items.append(f'<span class="flag" id="run-paused">paused since {e(when(x.paused_at))}</span>')
    if x.nd_blocked:
        items.append(
            f'<span class="flag warn" id="run-nd">nd-blocked ×{x.nd_block_count}: '
            f"{e(x.nd_block_reason)}</span>"
        )
    if x.erased_at is not None:
        items.append(f'<span class="flag" id="run-erased">payloads erased {e(when(x.erased_at))}</span>')
    if x.forked_from:
        items.append(
            f'<span>forked from <a id="forked-from" href="{e(run_href(x.forked_from))}">'
            f"{e(x.forked_from)}</a></span>"
        )
    if x.forked_to:
        items.append(
            f'<span>forked to <a id="forked-to" href="{e(run_href(x.forked_to))}">{e(x.forked_to)}</a></span>'
        )
    items.extend(_links(x))
    if x.cancel_reason:
        items.append(f"<span>cancel reason <b>{e(x.cancel_reason)}</b></span>")
    return '<div class="meta">' + "".join(items) + "</div>"


def _links(x: Execution) -> list[str]:
    """The runs this one is linked to: its parent, its children, its chain's neighbours."""
    out = []
    for label, element, target in (
        ("child of", "parent", x.parent_id),
        ("continued from", "continued-from", x.continued_from),
        ("continued as", "continued-to", x.continued_to),
    ):
        if target:
            out.append(f'<span>{label} <a id="{element}" href="{e(run_href(target))}">{e(target)}</a></span>')
    if x.children:
        kids = ", ".join(
            f'<a class="child" href="{e(run_href(c["id"]))}">{e(c["id"])}</a> {e(c["status"])}'
            for c in x.children
        )
        out.append(f'<span id="children">children {kids}</span>')
    return out


def _header(x: Execution, done: str | None) -> str:
    flash = f'<p class="flash" id="flash">{e(DONE[done])}</p>' if done in DONE else ""
    live = '<span id="live" class="live" aria-live="polite">live</span>' if x.status == "RUNNING" else ""
    return (
        f'<header class="run-head"><p class="crumbs"><a href="/console">Runs</a> /</p>'
        f'<h1><span id="run-workflow">{e(x.workflow_type)}</span> '
        f'<code id="run-id">{e(x.id)}</code>{live}</h1>{_meta(x)}{flash}</header>'
    )


def _reason_form(page: Page, x: Execution, action: str, label: str, cls: str = "") -> str:
    inner = (
        f'<input type="text" name="reason" maxlength="1000" placeholder="reason (optional)" '
        f'aria-label="{e(label)} reason"><button type="submit" class="{e(cls)}">{e(label)}</button>'
    )
    return page.form(run_href(x.id, f"/{action}"), inner, cls="action", form_id=f"form-{action}")


def _live_actions(page: Page, x: Execution, can_request_cancel: bool) -> list[str]:
    out = [
        page.form(
            run_href(x.id, "/signal"),
            '<input type="text" name="name" required maxlength="200" placeholder="signal name" '
            'aria-label="signal name"><textarea name="payload" rows="2" '
            'placeholder="JSON payload (empty: null)" aria-label="signal payload"></textarea>'
            '<button type="submit">Send signal</button>',
            cls="action wide",
            form_id="form-signal",
        )
    ]
    if x.paused_at is None:
        out.append(
            page.form(
                run_href(x.id, "/pause"),
                '<button type="submit">Pause</button>',
                cls="action",
                form_id="form-pause",
            )
        )
    else:
        out.append(
            page.form(
                run_href(x.id, "/resume"),
                '<button type="submit">Resume</button>',
                cls="action",
                form_id="form-resume",
            )
        )
    if can_request_cancel:
        out.append(_reason_form(page, x, "request-cancel", "Request cancellation"))
    out.append(_reason_form(page, x, "cancel", "Cancel", "danger"))
    out.append(_reason_form(page, x, "terminate", "Terminate", "danger"))
    return out


def _terminal_actions(page: Page, x: Execution, dag_nodes: list[str] | None) -> list[str]:
    out = []
    if dag_nodes is not None and x.status != "COMPLETED":
        options = '<option value="">the first failed node</option>' + "".join(
            f'<option value="{e(n)}">{e(n)}</option>' for n in dag_nodes
        )
        out.append(
            page.form(
                run_href(x.id, "/retry"),
                f'<label>retry from <select name="from_node">{options}</select></label>'
                '<button type="submit">Preview retry…</button>',
                cls="action",
                method="get",
                form_id="form-retry",
            )
        )
    if x.erased_at is None:
        # forks hold copies of the payloads: erasing without them is refused while they do
        forks = (
            '<label><input type="checkbox" name="with_forks" value="1"> with its forks</label>'
            if x.forked_from is not None
            or x.forked_to is not None
            or x.parent_id is not None
            or x.continued_from is not None
            or x.continued_to is not None
            or x.children
            else ""
        )
        out.append(
            page.form(
                run_href(x.id, "/erase"),
                f'<input type="text" name="confirm" required autocomplete="off" '
                f'placeholder="type the run id to confirm" aria-label="type {e(x.id)} to confirm">'
                f'{forks}<button type="submit" class="danger">Erase payloads</button>',
                cls="action wide",
                form_id="form-erase",
            )
        )
    return out


def _actions(page: Page, x: Execution, dag_nodes: list[str] | None, can_request_cancel: bool) -> str:
    if page.session is None:
        return ""  # a bearer caller: no session, so no CSRF token to post with
    forms = (
        _live_actions(page, x, can_request_cancel)
        if x.status == "RUNNING"
        else _terminal_actions(page, x, dag_nodes)
    )
    forms.append(
        page.form(
            run_href(x.id, "/reset"),
            f'<label>reset to the first <input type="number" name="to_seq" min="1" '
            f'max="{max(x.history_length, 1)}" required aria-label="events to keep"> events'
            '</label><input type="text" name="new_execution_id" maxlength="200" '
            'placeholder="new run id (optional)" aria-label="new run id">'
            '<button type="submit">Reset (fork)</button>',
            cls="action wide",
            form_id="form-reset",
        )
    )
    return '<section id="actions"><h2>Actions</h2><div class="actions">' + "".join(forms) + "</div></section>"


def _payloads(x: Execution) -> str:
    rows = [("input", x.input), ("result", x.result), ("error", x.error)]
    parts = [
        f'<div class="payload"><h3>{name}</h3><pre id="run-{name}">{e(snippet(value, 2000))}</pre></div>'
        for name, value in rows
        if value is not None
    ]
    if not parts:
        return ""
    return '<section id="payloads"><h2>Input, result and error</h2>' + "".join(parts) + "</section>"


def _attempts(act: Activity) -> str:
    items = []
    for number in sorted(act.attempts):
        a = act.attempts[number]
        error = f' · <span class="err">{e(a.error_type)}: {e(a.message)}</span>' if a.error_type else ""
        worker = f" on {e(a.worker)}" if a.worker else ""
        items.append(
            f'<li data-attempt="{number}" data-status="{e(a.status)}">'
            f"#{number} {e(status_label(a.status))}{worker} "
            f'<span class="muted">{e(when(a.started_at))}</span>{error}</li>'
        )
    return '<ul class="attempts">' + "".join(items) + "</ul>" if items else '<span class="muted">-</span>'


def _held(act: Activity) -> str:
    return f'<br><span class="muted held">{e(act.held)}</span>' if act.held else ""


def _activities(view: RunView) -> str:
    rows = [
        f'<tr data-activity="{e(a.name)}" data-status="{e(a.status)}"><td class="mono nw">#{e(a.activity_id)}</td>'
        f"<td>{e(a.name)}{' <span class=tag>compensation</span>' if a.compensation else ''}</td>"
        f'<td>{e(a.queue)}</td><td class="nw">{e(status_label(a.status))}{_held(a)}</td>'
        f"<td>{e(when(a.scheduled_at))}</td>"
        f'<td>{_attempts(a)}</td><td><code class="snip">{e(snippet(a.input, 120))}</code></td></tr>'
        for a in view.activities
    ]
    return (
        '<section id="activities"><h2>Activities</h2>'
        + table(
            ["id", "activity", "queue", "status", "scheduled", "attempts", "input"],
            rows,
            cls="grid",
            empty="no activity was scheduled",
        )
        + "</section>"
    )


def _errors(view: RunView) -> str:
    items = []
    for err in view.errors:
        trace = (
            f'<details><summary>traceback</summary><pre class="tb">{e(err.traceback)}</pre></details>'
            if err.traceback
            else ""
        )
        items.append(
            f'<li class="error-item" data-who="{e(err.who)}"><p><b>{e(err.who)}</b> attempt '
            f'{err.attempt} · <span class="muted">{e(when(err.recorded_at))}</span></p>'
            f'<p class="err"><span class="etype">{e(err.error_type)}</span>: '
            f'<span class="emsg">{e(err.message)}</span></p>{trace}</li>'
        )
    body = f'<ul class="errors">{"".join(items)}</ul>' if items else '<p class="empty">no error recorded</p>'
    return f'<section id="errors"><h2>Errors</h2>{body}</section>'


def _saga(view: RunView) -> str:
    markers = [
        f'<tr data-marker="{e(m.name)}"><td>{m.seq}</td><td class="mono">{e(m.name)}</td>'
        f'<td><code class="snip">{e(snippet(m.details, 200))}</code></td><td>{e(when(m.recorded_at))}</td></tr>'
        for m in view.markers
    ]
    comps = [
        f'<tr data-compensation="{e(a.name)}"><td class="mono">#{e(a.activity_id)}</td><td>{e(a.name)}</td>'
        f"<td>{e(status_label(a.status))}</td><td>{len(a.attempts)}</td></tr>"
        for a in view.compensations
    ]
    if not markers and not comps:
        return ""
    return (
        '<section id="saga"><h2>Saga: markers and compensations</h2>'
        + table(["seq", "marker", "details", "recorded"], markers, cls="grid", empty="no saga marker")
        + table(["id", "compensation", "status", "attempts"], comps, cls="grid", empty="no compensation ran")
        + "</section>"
    )


def _signals(view: RunView) -> str:
    rows = [
        f'<tr data-signal="{e(s.name)}"><td>{s.seq}</td><td>{e(s.name)}</td>'
        f'<td><code class="snip">{e(snippet(s.payload, 200))}</code></td><td>{e(when(s.recorded_at))}</td></tr>'
        for s in view.signals
    ]
    return (
        '<section id="signals"><h2>Signals</h2>'
        + table(["seq", "signal", "payload", "received"], rows, cls="grid", empty="no signal received")
        + "</section>"
    )


def render_run_page(
    page: Page,
    x: Execution,
    history: list[Any],
    view: RunView,
    *,
    graph_html: str | None,
    dag_nodes: list[str] | None,
    dag_link: str | None,
    can_request_cancel: bool,
    done: str | None,
) -> str:
    """The page's body (``Page.respond`` wraps it)."""
    graph = ""
    if graph_html is not None:
        link = f' <a class="small" href="{e(dag_link)}">full page</a>' if dag_link else ""
        graph = f'<section id="graph"><h2>DAG graph{link}</h2>{graph_html}</section>'
    timeline = "\n".join(render_timeline(history))
    return (
        _header(x, done)
        + _actions(page, x, dag_nodes, can_request_cancel)
        + graph
        + _payloads(x)
        + _activities(view)
        + _errors(view)
        + _saga(view)
        + _signals(view)
        + f'<section id="timeline-section"><h2>Timeline</h2><pre id="timeline">{e(timeline)}</pre></section>'
    )
