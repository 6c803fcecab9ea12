"""The DAG run page (``GET /ui/dags/{name}/runs/{run_id}``): one run drawn as a graph, in HTML.

A pure renderer over the run graph (``build_run_graph``), the run's timeline
(``render_timeline``) and which nodes were compensated (``compensation_states``), plus
``register_pages(app, harvest)`` to serve it from the operator API.

The page is self-contained: one HTML document with inline CSS, an inline SVG and a few lines of
inline script (hover details); no external script, style sheet, font or image, and a
Content-Security-Policy that forbids loading any, so it works offline and leaks nothing.

Columns are levels (longest path over ``depends_on``), rows the declaration order within a level.
Compensators are not nodes (the graph carries forward nodes only); a node whose compensation was
dispatched carries a "↺" badge instead, read from history by ``compensation_states``.

Payloads: the run graph carries none. The timeline is ``render_timeline``'s text as is, which
shows short (60-character) snippets of inputs and outputs, exactly as ``harvest show`` does.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from harvest_celery._core import events as ev
from harvest_celery._core.jsonvalues import storable_text
from harvest_celery._core.timeline import render_timeline
from harvest_celery._dag.builder import depths
from harvest_celery._dag.canvas_run import run_definition
from harvest_celery._dag.folds import OPEN, SUCCEEDED, fold_dispatches
from harvest_celery._dag.graph import build_run_graph
from harvest_celery._errors import ExecutionNotFound, HarvestError, RegistrationError

COMPENSATED = "compensated"
COMPENSATION_FAILED = "compensation failed"
COMPENSATING = "compensating"
NO_COMPENSATION = "none"
MAX_PATH_PART = 200

# status → (fill, stroke, text colour)
STATUS_STYLE: dict[str, tuple[str, str, str]] = {
    "succeeded": ("#dcf5e3", "#1f8a3d", "#0f5224"),
    "failed": ("#fde2e1", "#c62828", "#7f1414"),
    "timed_out": ("#ffead1", "#e8710a", "#7a3b00"),
    "cancelled": ("#e7e7e9", "#6b6f76", "#3c3f44"),
    "running": ("#dce9fd", "#1d6fd6", "#0b3d80"),
    "pending": ("#f3f4f6", "#b4b8be", "#4b5058"),
    "skipped": ("#ffffff", "#9aa0a6", "#5f6368"),
}
UNKNOWN_STYLE = ("#ffffff", "#444444", "#222222")
COMPENSATION_STYLE: dict[str, tuple[str, str]] = {  # badge fill, text
    COMPENSATED: ("#6d3fc0", "#ffffff"),
    COMPENSATING: ("#b7791f", "#ffffff"),
    COMPENSATION_FAILED: ("#b3261e", "#ffffff"),
}
RUN_STATE_COLOUR = {
    "RUNNING": "#1d6fd6",
    "COMPLETED": "#1f8a3d",
    "FAILED": "#c62828",
    "CANCELLED": "#6b6f76",
    "TERMINATED": "#6b6f76",
    "CONTINUED_AS_NEW": "#1f8a3d",
    "TIMED_OUT": "#b3261e",
}

# geometry of the SVG (px)
NODE_W, NODE_H = 228, 58
COL_GAP, ROW_GAP = 84, 44  # ROW_GAP leaves room for the compensation badge under a node
MARGIN = 28
LABEL_CHARS = 23


# ── compensation, from history ───────────────────────────────────────────────────────────────
def compensation_states(history: Sequence[ev.HistoryEvent]) -> dict[str, str]:
    """``{node: "compensated" | "compensation failed" | "compensating"}`` for every forward node
    whose compensation was dispatched in this run (its latest compensation dispatch decides).

    The compensation dispatches are those of ``fold_dispatches`` (history only, the definition is
    never consulted): an input that is an envelope ``{dag_compensate, input, output}`` naming a
    node dispatched earlier in the same run, or carried into it. Outcome by activity id: a
    completion wins, else a failure (the last attempt failed or timed out), else it is still open.
    """
    badge = {SUCCEEDED: COMPENSATED, OPEN: COMPENSATING}  # failed or timed out: COMPENSATION_FAILED
    return {
        d.compensates: badge.get(d.outcome, COMPENSATION_FAILED)
        for d in fold_dispatches(history).compensations()
        if d.compensates is not None
    }


def compensated_nodes(history: Sequence[ev.HistoryEvent]) -> set[str]:
    """The forward nodes whose compensation was dispatched (whatever its outcome so far); see
    ``compensation_states`` for the outcome of each."""
    return set(compensation_states(history))


# ── layout ───────────────────────────────────────────────────────────────────────────────────
def node_levels(nodes: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Longest-path level of each node over ``depends_on`` (roots are 0), by the builder's own
    ``depths``. An upstream that is not a node of the graph is ignored; a cycle (never built by
    ``@dag``) is cut where it is met."""
    return depths({n["node_name"]: n["depends_on"] for n in nodes}, lambda _name: 0)


def layout(nodes: Sequence[dict[str, Any]]) -> tuple[dict[str, tuple[int, int]], int, int]:
    """``({node: (x, y)}, width, height)``: columns by level, rows in graph order within a level,
    each column centred vertically."""
    levels = node_levels(nodes)
    columns: dict[int, list[str]] = {}
    for n in nodes:
        columns.setdefault(levels[n["node_name"]], []).append(n["node_name"])
    n_cols = max(columns, default=-1) + 1
    n_rows = max((len(c) for c in columns.values()), default=0)
    pitch = NODE_H + ROW_GAP
    height = 2 * MARGIN + max(n_rows * pitch - ROW_GAP, NODE_H) + 20
    width = 2 * MARGIN + max(n_cols * (NODE_W + COL_GAP) - COL_GAP, NODE_W)
    positions: dict[str, tuple[int, int]] = {}
    for col, names in columns.items():
        top = MARGIN + ((n_rows - len(names)) * pitch) // 2
        for row, name in enumerate(names):
            positions[name] = (MARGIN + col * (NODE_W + COL_GAP), top + row * pitch)
    return positions, width, height


# ── rendering ────────────────────────────────────────────────────────────────────────────────
def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(at: Any) -> str:
    if at is None:
        return "-"
    if isinstance(at, datetime):
        text = at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        return text + (" UTC" if at.utcoffset() is not None else "")
    return str(at)


def _duration(start: Any, end: Any) -> str | None:
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return None
    seconds = (end - start).total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def _label(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def _node_title(node: dict[str, Any], compensation: str) -> str:
    lines = [
        node["node_name"],
        f"status: {node['status']}",
        f"attempts: {node['attempts']}",
        f"started: {_when(node['started_at'])}",
        f"finished: {_when(node['finished_at'])}",
    ]
    took = _duration(node["started_at"], node["finished_at"])
    if took:
        lines.append(f"duration: {took}")
    if node.get("error_type") or node.get("error"):
        lines.append(f"error: {node.get('error_type') or 'Error'}: {node.get('error') or ''}")
    if compensation != NO_COMPENSATION:
        lines.append(f"compensation: {compensation}")
    return "\n".join(lines)


def _edges(nodes: list[dict[str, Any]], positions: dict[str, tuple[int, int]]) -> list[str]:
    """One curved arrow per ``depends_on`` edge, upstream's right side to the node's left."""
    out = []
    for node in nodes:
        x2, y2 = positions[node["node_name"]]
        for up in node["depends_on"]:
            if up not in positions:
                continue
            x1, y1 = positions[up]
            sx, sy, tx, ty = x1 + NODE_W, y1 + NODE_H // 2, x2 - 2, y2 + NODE_H // 2
            mid = (sx + tx) // 2
            out.append(
                f'<path class="edge" data-from="{_e(up)}" data-to="{_e(node["node_name"])}" '
                f'd="M{sx},{sy} C{mid},{sy} {mid},{ty} {tx},{ty}" fill="none" '
                f'stroke="#7d8590" stroke-width="1.6" marker-end="url(#arrow)">'
                f"<title>{_e(up)} → {_e(node['node_name'])}</title></path>"
            )
    return out


def _svg(graph: dict[str, Any], compensation: dict[str, str]) -> str:
    nodes = graph["nodes"]
    positions, width, height = layout(nodes)
    out = [
        f'<svg id="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="DAG run graph">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#7d8590"/></marker></defs>',
        '<g class="edges">',
        *_edges(nodes, positions),
        '</g><g class="nodes">',
    ]
    for node in nodes:
        name, status = node["node_name"], node["status"]
        comp = compensation.get(name, NO_COMPENSATION)
        fill, stroke, ink = STATUS_STYLE.get(status, UNKNOWN_STYLE)
        x, y = positions[name]
        dash = ' stroke-dasharray="6 4"' if status == "skipped" else ""
        attempts = node["attempts"]
        sub = status.replace("_", " ")
        if attempts:
            sub += f" · {attempts} attempt" + ("s" if attempts != 1 else "")
        took = _duration(node["started_at"], node["finished_at"])
        if took:
            sub += f" · {took}"
        out.append(
            f'<g class="node status-{_e(status)}" data-node="{_e(name)}" data-status="{_e(status)}" '
            f'data-compensation="{_e(comp)}" transform="translate({x},{y})" tabindex="0">'
            f"<title>{_e(_node_title(node, comp))}</title>"
            f'<rect class="box" width="{NODE_W}" height="{NODE_H}" rx="10" ry="10" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="2"{dash}/>'
            f'<rect width="6" height="{NODE_H - 16}" x="8" y="8" rx="3" fill="{stroke}"/>'
            f'<text x="24" y="25" class="name" fill="{ink}">{_e(_label(name))}</text>'
            f'<text x="24" y="44" class="sub" fill="{ink}">{_e(sub)}</text>'
        )
        if comp != NO_COMPENSATION:
            badge_fill, badge_ink = COMPENSATION_STYLE.get(comp, ("#444444", "#ffffff"))
            text = f"↺ {comp}"
            bw = 16 + 7 * len(text)
            out.append(
                f'<g class="badge" data-badge="{_e(comp)}" transform="translate(10,{NODE_H + 6})">'
                f'<rect width="{bw}" height="20" rx="10" ry="10" fill="{badge_fill}"/>'
                f'<text x="{bw // 2}" y="14" text-anchor="middle" class="badge-text" '
                f'fill="{badge_ink}">{_e(text)}</text></g>'
            )
        out.append("</g>")
    out.append("</g></svg>")
    return "".join(out)


def _legend() -> str:
    items = []
    for status, (fill, stroke, _ink) in STATUS_STYLE.items():
        dash = ' stroke-dasharray="4 3"' if status == "skipped" else ""
        items.append(
            f'<li data-legend="{_e(status)}"><svg width="26" height="16" aria-hidden="true">'
            f'<rect x="1" y="1" width="24" height="14" rx="4" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="2"{dash}/></svg>{_e(status.replace("_", " "))}</li>'
        )
    for comp, (fill, ink) in COMPENSATION_STYLE.items():
        items.append(
            f'<li data-legend="{_e(comp)}"><span class="pill" style="background:{fill};'
            f'color:{ink}">↺</span>{_e(comp)}</li>'
        )
    return '<ul class="legend">' + "".join(items) + "</ul>"


def _table(graph: dict[str, Any], compensation: dict[str, str]) -> str:
    rows = []
    for n in graph["nodes"]:
        comp = compensation.get(n["node_name"], NO_COMPENSATION)
        error = (
            f"{n.get('error_type') or 'Error'}: {n.get('error') or ''}"
            if (n.get("error_type") or n.get("error"))
            else ""
        )
        rows.append(
            f'<tr data-row="{_e(n["node_name"])}"><td class="mono">{_e(n["node_name"])}</td>'
            f'<td><span class="dot status-{_e(n["status"])}"></span>{_e(n["status"])}</td>'
            f"<td>{_e(n['attempts'])}</td><td>{_e(_when(n['started_at']))}</td>"
            f"<td>{_e(_duration(n['started_at'], n['finished_at']) or '-')}</td>"
            f'<td>{_e("" if comp == NO_COMPENSATION else comp)}</td><td class="err">{_e(error)}</td></tr>'
        )
    return (
        '<table class="nodes"><thead><tr><th>node</th><th>status</th><th>attempts</th>'
        "<th>started</th><th>duration</th><th>compensation</th><th>error</th></tr></thead>"
        "<tbody>" + "".join(rows) + "</tbody></table>"
    )


CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:#1f2328;background:#f6f8fa}
header{background:#fff;border-bottom:1px solid #d0d7de;padding:16px 28px}
header h1{margin:0 0 6px;font-size:20px;font-weight:600}
header h1 .run{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-weight:400;color:#57606a;
font-size:15px;margin-left:8px}
.meta{display:flex;gap:22px;flex-wrap:wrap;color:#57606a;font-size:13px}
.meta b{color:#1f2328;font-weight:600}
.state{display:inline-block;padding:1px 10px;border-radius:999px;color:#fff;font-weight:600;
font-size:12px;letter-spacing:.03em}
main{padding:20px 28px;max-width:1400px}
section{background:#fff;border:1px solid #d0d7de;border-radius:10px;padding:14px 18px;margin-bottom:18px}
section h2{font-size:13px;text-transform:uppercase;letter-spacing:.06em;color:#57606a;margin:0 0 10px}
.graph{overflow-x:auto}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
svg .name{font-size:14px;font-weight:600}
svg .sub{font-size:12px}
svg .badge-text{font-size:11.5px;font-weight:600}
svg .node{cursor:default;outline:none}
svg .node:hover .box,svg .node:focus .box{stroke-width:3.5;filter:drop-shadow(0 2px 4px rgba(0,0,0,.18))}
#details{min-height:1.5em;margin:8px 0 0;padding:8px 12px;background:#f6f8fa;border-radius:6px;
color:#3c4248;white-space:pre-wrap;
font:12px/1.5 ui-monospace,"DejaVu Sans Mono",monospace}
.legend{list-style:none;display:flex;flex-wrap:wrap;gap:6px 18px;margin:0;padding:0;font-size:13px}
.legend li{display:flex;align-items:center;gap:6px}
.pill{display:inline-block;width:22px;height:16px;border-radius:8px;text-align:center;font-size:11px;
line-height:16px;font-weight:700}
table.nodes{border-collapse:collapse;width:100%;font-size:13px}
table.nodes th{text-align:left;color:#57606a;font-weight:600;border-bottom:1px solid #d0d7de;padding:4px 8px}
table.nodes td{border-bottom:1px solid #eaeef2;padding:4px 8px;vertical-align:top}
.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace}
.err{color:#7f1414;max-width:420px;overflow-wrap:anywhere}
.dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:6px;background:#999}
"""
DOT_CSS = "".join(f".dot.status-{s}{{background:{stroke}}}" for s, (_f, stroke, _i) in STATUS_STYLE.items())
PRE_CSS = (
    "pre#timeline{margin:0;padding:12px;background:#0d1117;color:#c9d1d9;border-radius:8px;"
    'overflow-x:auto;font:12px/1.5 ui-monospace,"DejaVu Sans Mono",monospace}'
)

SCRIPT = """
(function(){
  var out=document.getElementById('details');
  var nodes=document.querySelectorAll('#dag .node');
  function show(n){var t=n.querySelector('title');out.textContent=t?t.textContent:'';}
  for(var i=0;i<nodes.length;i++){
    nodes[i].addEventListener('mouseenter',function(){show(this);});
    nodes[i].addEventListener('focus',function(){show(this);});
  }
})();
"""

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)


def _document(title: str, body: str, *, refresh: bool = False) -> str:
    head = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
    ]
    if refresh:
        head.append('<meta http-equiv="refresh" content="5">')
    head.append(f"<title>{_e(title)}</title><style>{CSS}{DOT_CSS}{PRE_CSS}</style></head>")
    return "".join(head) + f"<body>{body}</body></html>"


def render_dag_page(graph: dict[str, Any], timeline: list[str], compensation: dict[str, str]) -> str:
    """The run page: header (run state, timestamps), the graph as an inline SVG, a legend, a node
    table and the timeline in a ``<pre>``. Every string is escaped; self-contained HTML."""
    state = str(graph["state"])
    colour = RUN_STATE_COLOUR.get(state, "#57606a")
    took = _duration(graph["started_at"], graph["finished_at"])
    unwound = sum(1 for v in compensation.values() if v == COMPENSATED)
    meta = [
        f'<span>state <span class="state" id="run-state" data-state="{_e(state)}" '
        f'style="background:{colour}">{_e(state)}</span></span>',
        f'<span>started <b id="run-started">{_e(_when(graph["started_at"]))}</b></span>',
        f'<span>finished <b id="run-finished">{_e(_when(graph["finished_at"]))}</b></span>',
    ]
    if took:
        meta.append(f"<span>took <b>{_e(took)}</b></span>")
    meta.append(f"<span>nodes <b>{len(graph['nodes'])}</b></span>")
    if compensation:
        meta.append(f"<span>compensated <b>{unwound}/{len(compensation)}</b></span>")
    body = (
        f'<header><h1>{_e(graph["dag_name"])}<span class="run" id="run-id">{_e(graph["run_id"])}</span>'
        f'</h1><div class="meta">{"".join(meta)}</div></header><main>'
        f'<section><h2>Graph</h2><div class="graph">{_svg(graph, compensation)}</div>'
        f'<div id="details" aria-live="polite">Hover a node for its timings, attempts and error.</div>'
        f"</section>"
        f"<section><h2>Legend</h2>{_legend()}</section>"
        f"<section><h2>Nodes</h2>{_table(graph, compensation)}</section>"
        f'<section><h2>Timeline</h2><pre id="timeline">{_e(chr(10).join(timeline))}</pre></section>'
        f"</main><script>{SCRIPT}</script>"
    )
    title = f"{graph['dag_name']} · {graph['run_id']} · {state}"
    return _document(title, body, refresh=state == "RUNNING")


def render_graph(graph: dict[str, Any], compensation: dict[str, str]) -> str:
    """The graph as the DAG page draws it (SVG, legend, node table) for embedding in another
    page, e.g. the console's run page, which styles it with ``GRAPH_CSS``."""
    return f'<div class="graph">{_svg(graph, compensation)}</div>{_legend()}{_table(graph, compensation)}'


# the rules of CSS that the embedded graph needs (served as the console's graph.css)
GRAPH_CSS = (
    "\n".join(
        rule + "}"
        for rule in CSS.replace("\n", "").split("}")
        if rule.startswith(("svg", ".legend", ".pill", "table.nodes", ".dot", ".mono", ".graph"))
    )
    + DOT_CSS
)


def render_error_page(status_code: int, message: str) -> str:
    body = f'<header><h1>{status_code}</h1><div class="meta" id="error">{_e(message)}</div></header>'
    return _document(f"{status_code} · harvest", body)


# ── serving ──────────────────────────────────────────────────────────────────────────────────
_HTML = {"text/html": {"schema": {"type": "string"}}}


def _valid(value: str) -> bool:
    return bool(value.strip()) and len(value) <= MAX_PATH_PART and storable_text(value)


def register_pages(app: FastAPI, harvest: Any, dependencies: Sequence[Any] = ()) -> None:
    """Serve the DAG run page at ``GET /ui/dags/{name}/runs/{run_id}`` from ``app``.

    Read-only, behind ``dependencies`` (the app's page auth: with a token, a console session or
    the bearer header); errors are HTML pages too: 400 a malformed name or id, 404 an unknown
    DAG (or a workflow that is not a DAG), an unknown run or a run of another DAG, 503 a history
    the server cannot read.
    """

    @app.get(
        "/ui/dags/{name}/runs/{run_id}",
        response_class=HTMLResponse,
        tags=["ui"],
        dependencies=list(dependencies),
        responses={
            400: {"description": "a malformed name or id", "content": _HTML},
            404: {"description": "unknown DAG or run", "content": _HTML},
            503: {"description": "the run's history cannot be read", "content": _HTML},
        },
    )
    def dag_run_page(name: str, run_id: str) -> HTMLResponse:
        """The DAG run drawn as a graph (HTML)."""

        def error(code: int, message: str) -> HTMLResponse:
            return HTMLResponse(render_error_page(code, message), status_code=code)

        if not _valid(name) or not _valid(run_id):
            return error(
                400,
                f"a DAG name and a run id are non-empty strings of at most {MAX_PATH_PART} "
                "characters with no NUL character",
            )
        try:
            definition = harvest.registry.workflow(name)
        except RegistrationError:
            return error(404, f"no DAG named {name!r} is registered")
        if definition.kind not in ("dag", "canvas") or (
            definition.kind == "dag" and definition.extra is None
        ):
            return error(404, f"{name!r} is a workflow, not a DAG")
        try:
            execution = harvest.describe(run_id)
            if execution.workflow_type != name:
                return error(404, f"run {run_id!r} is not a run of DAG {name!r}")
            history = harvest.history(run_id, strict=False)  # a read-only view degrades
        except ExecutionNotFound:
            return error(404, f"no run with id {run_id!r}")
        except (HarvestError, ValueError) as exc:
            return error(503, f"the run cannot be read: {type(exc).__name__}")
        dag, note = run_definition(definition, history)  # a canvas run's: from its stored graph
        assert dag is not None
        graph = build_run_graph(dag, execution, history, note)
        return HTMLResponse(render_dag_page(graph, render_timeline(history), compensation_states(history)))
