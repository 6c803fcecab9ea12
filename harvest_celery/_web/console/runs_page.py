"""The console's runs list: filters (status, workflow, nd-blocked, creation time) and paging.

``RunFilters.parse`` reads the query string (a bad value is a ``ValueError``: a 400 page);
``render_runs_page`` draws the filter form, the table and the paging links. Reads no payload:
the list comes from ``Harvest.list``, which selects no payload column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, get_args
from urllib.parse import urlencode

from harvest_celery._store.store import Execution
from harvest_celery._web.console.html import badge, e, run_href, table, when
from harvest_celery._web.models import StatusFilter

STATUSES: tuple[str, ...] = get_args(StatusFilter)  # the API's list filter, one source
PAGE_SIZES = (25, 50, 100, 200)
MAX_OFFSET = 2**31 - 1


def _time(text: str, what: str) -> datetime | None:
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{what} is a date and time like 2024-05-01T13:30") from None
    return at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)


@dataclass(frozen=True)
class RunFilters:
    status: str = ""
    workflow: str = ""
    nd_blocked: str = ""  # "" any · "yes" · "no"
    created_from: str = ""
    created_to: str = ""
    limit: int = 50
    offset: int = 0

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> RunFilters:
        status = query.get("status", "").strip().upper()
        if status and status not in STATUSES:
            raise ValueError(f"status is one of {', '.join(STATUSES)}")
        nd = query.get("nd_blocked", "").strip().lower()
        if nd not in ("", "yes", "no"):
            raise ValueError("nd_blocked is yes, no or empty")
        workflow = query.get("workflow", "").strip()
        if len(workflow) > 200 or "\x00" in workflow:
            raise ValueError("workflow is a name of at most 200 characters")
        try:
            limit = int(query.get("limit") or 50)
            offset = int(query.get("offset") or 0)
        except ValueError:
            raise ValueError("limit and offset are whole numbers") from None
        if limit not in PAGE_SIZES or not 0 <= offset <= MAX_OFFSET:
            raise ValueError(f"limit is one of {PAGE_SIZES}; offset is 0 or more")
        made = cls(
            status, workflow, nd, query.get("from", "").strip(), query.get("to", "").strip(), limit, offset
        )
        made.bounds()  # a bad time is refused here
        return made

    def bounds(self) -> tuple[datetime | None, datetime | None]:
        return _time(self.created_from, "from"), _time(self.created_to, "to")

    def list_kwargs(self) -> dict[str, Any]:
        after, before = self.bounds()
        return {
            "status": self.status or None,
            "workflow": self.workflow or None,
            "nd_blocked": {"yes": True, "no": False}.get(self.nd_blocked),
            "limit": self.limit + 1,
            "offset": self.offset,  # one more: is there a next page?
            "created_after": after,
            "created_before": before,
        }

    def query(self, **override: Any) -> str:
        fields = {
            "status": self.status,
            "workflow": self.workflow,
            "nd_blocked": self.nd_blocked,
            "from": self.created_from,
            "to": self.created_to,
            "limit": self.limit,
            "offset": self.offset,
            **override,
        }
        return urlencode({k: v for k, v in fields.items() if v not in ("", None, 0) or k == "offset"})


def _select(name: str, current: str, options: Iterable[tuple[str, str]], label: str) -> str:
    opts = "".join(
        f'<option value="{e(v)}"{" selected" if v == current else ""}>{e(text)}</option>'
        for v, text in options
    )
    return f'<label>{e(label)} <select name="{e(name)}" id="f-{e(name)}">{opts}</select></label>'


def _filters(f: RunFilters, workflows: list[str]) -> str:
    names = "".join(f'<option value="{e(n)}">' for n in workflows)
    return (
        '<form method="get" action="/console" class="filters" id="filters">'
        + _select("status", f.status, [("", "any")] + [(s, s) for s in STATUSES], "status")
        + f'<label>workflow <input type="text" name="workflow" id="f-workflow" list="workflows" '
        f'value="{e(f.workflow)}" maxlength="200" placeholder="any"></label>'
        f'<datalist id="workflows">{names}</datalist>'
        + _select("nd_blocked", f.nd_blocked, [("", "any"), ("yes", "yes"), ("no", "no")], "nd-blocked")
        + f'<label>created from <input type="datetime-local" name="from" id="f-from" value="{e(f.created_from)}"></label>'
        f'<label>to <input type="datetime-local" name="to" id="f-to" value="{e(f.created_to)}"></label>'
        + _select("limit", str(f.limit), [(str(n), str(n)) for n in PAGE_SIZES], "per page")
        + '<button type="submit">Filter</button><a href="/console" class="small">clear</a>'
        '<span class="muted small">times in UTC</span></form>'
    )


def _row(x: Execution) -> str:
    flags = []
    if x.paused_at is not None:
        flags.append("paused")
    if x.nd_blocked:
        flags.append("nd-blocked")
    if x.erased_at is not None:
        flags.append("erased")
    if x.forked_from:
        flags.append("fork")
    return (
        f'<tr data-run="{e(x.id)}"><td class="mono"><a href="{e(run_href(x.id))}">{e(x.id)}</a></td>'
        f"<td>{e(x.workflow_type)}</td><td>{badge(x.display_status)}</td>"
        f"<td>{e(when(x.created_at))}</td><td>{e(when(x.closed_at))}</td>"
        f"<td>{x.history_length}</td><td>{e(', '.join(flags))}</td></tr>"
    )


def render_runs_page(f: RunFilters, rows: list[Execution], workflows: list[str]) -> str:
    """The body of the runs list; ``rows`` may hold one run more than the page (a next page)."""
    more = len(rows) > f.limit
    shown = rows[: f.limit]
    paging = []
    if f.offset > 0:
        paging.append(
            f'<a id="prev" href="/console?{e(f.query(offset=max(f.offset - f.limit, 0)))}">← newer</a>'
        )
    paging.append(f'<span class="muted">runs {f.offset + 1 if shown else 0}–{f.offset + len(shown)}</span>')
    if more:
        paging.append(f'<a id="next" href="/console?{e(f.query(offset=f.offset + f.limit))}">older →</a>')
    body = table(
        ["run", "workflow", "status", "created", "closed", "events", "flags"],
        [_row(x) for x in shown],
        cls="grid runs",
        empty="no run matches these filters",
    )
    return (
        f'<h1>Runs</h1>{_filters(f, workflows)}<div id="runs">{body}</div>'
        f'<nav class="paging">{"".join(paging)}</nav>'
    )
