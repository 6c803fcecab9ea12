"""The DAG run page over hand-built histories: layout, escaping, compensation marking, serving.
No database, no workers, no browser (tests/integration/test_dag_page.py drives a real one)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from harvest_celery import DagBuilder, dag, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.registry import Registry, register_into
from harvest_celery._core.timeline import render_timeline
from harvest_celery._dag.graph import build_run_graph
from harvest_celery._errors import ExecutionNotFound
from harvest_celery._store.store import Execution
from harvest_celery._web.pages import (
    COMPENSATED,
    COMPENSATING,
    COMPENSATION_FAILED,
    compensated_nodes,
    compensation_states,
    layout,
    node_levels,
    register_pages,
    render_dag_page,
)

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
SECRET = "card-4242-secret"


# ── fixtures ─────────────────────────────────────────────────────────────────────────────────
@dag
def diamond(g: DagBuilder) -> None:
    a = g.activity("dia_a").compensate_named("undo_node")
    b = g.activity("dia_b").upstream(a).compensate_named("undo_node")
    c = g.activity("dia_c").upstream(a).compensate_named("undo_node")
    g.activity("dia_d").upstream(b, c).compensate_named("undo_node")


@workflow
async def plain(ctx: Any, value: Any) -> Any:
    return value


DIAMOND = diamond.__harvest_workflow__.extra  # type: ignore[attr-defined]


class History:
    """Builds a history; each event one second after the previous one."""

    def __init__(self) -> None:
        self.events: list[ev.HistoryEvent] = []
        self.add(ev.WorkflowStarted("diamond", {"secret": SECRET}))

    def add(self, event: ev.Event) -> History:
        self.events.append(
            ev.HistoryEvent(len(self.events) + 1, event, T0 + timedelta(seconds=len(self.events)))
        )
        return self

    def run(
        self,
        aid: str,
        name: str,
        input: Any = None,
        *,
        fail: str | None = None,
        attempts: int = 1,
        open: bool = False,
        compensation: bool = False,
    ) -> History:
        self.add(
            ev.ActivityScheduled(
                aid, name, input if input is not None else {"secret": SECRET}, compensation=compensation
            )
        )
        for attempt in range(1, attempts + 1):
            self.add(ev.ActivityStarted(aid, attempt, "w1"))
        if open:
            return self
        if fail is None:
            return self.add(ev.ActivityCompleted(aid, {"secret": SECRET}, attempts))
        return self.add(ev.ActivityFailed(aid, "RuntimeError", fail, attempts))

    def compensate(self, aid: str, node: str, **kw: Any) -> History:
        envelope = {"dag_compensate": node, "input": {"secret": SECRET}, "output": {"secret": SECRET}}
        return self.run(aid, "undo_node", envelope, compensation=True, **kw)


def failed_diamond() -> History:
    h = History().run("1", "dia_a").run("2", "dia_b").run("3", "dia_c")
    h.run("4", "dia_d", fail="dia_d failed\nTraceback ...", attempts=2)
    h.add(ev.MarkerRecorded("saga_compensated:1"))
    h.compensate("5", "dia_c").compensate("6", "dia_b").compensate("7", "dia_a")
    return h.add(ev.WorkflowFailed("DagTaskFailed", "one or more DAG tasks failed"))


def execution(status: str = "FAILED", run_id: str = "run-1", workflow_type: str = "diamond") -> Execution:
    return Execution(
        id=run_id,
        workflow_type=workflow_type,
        status=status,
        input=None,
        result=None,
        error=None,
        created_at=T0,
        updated_at=T0,
        closed_at=None if status == "RUNNING" else T0 + timedelta(seconds=20),
        cancelled_at=None,
        cancel_reason=None,
        nd_blocked_at=None,
        nd_block_reason=None,
        nd_block_count=0,
        nd_details=None,
        history_length=0,
    )


def page_for(h: History, status: str = "FAILED") -> str:
    graph = build_run_graph(DIAMOND, execution(status), h.events)
    return render_dag_page(graph, render_timeline(h.events), compensation_states(h.events))


class Dom(HTMLParser):
    """Every start tag with its attributes, and the text of each <pre> / <title> by parent."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[tuple[str, dict[str, str | None]]] = []
        self.texts: dict[str, str] = {}  # "pre#timeline" / "title@<data-node>" → text
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if not tag.endswith("/") and tag not in ("meta", "link", "rect", "path", "br"):
            self.stack.append((tag, a))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            top, _ = self.stack.pop()
            if top == tag:
                break

    def handle_data(self, data: str) -> None:
        if not self.stack:
            return
        tag, attrs = self.stack[-1]
        if tag == "pre":
            key = f"pre#{attrs.get('id')}"
        elif tag == "title" and len(self.stack) >= 2 and self.stack[-2][1].get("data-node"):
            key = f"title@{self.stack[-2][1]['data-node']}"
        else:
            return
        self.texts[key] = self.texts.get(key, "") + data

    def nodes(self) -> dict[str, dict[str, str | None]]:
        return {a["data-node"]: a for t, a in self.tags if t == "g" and a.get("data-node")}  # type: ignore[misc]

    def edges(self) -> list[tuple[str | None, str | None]]:
        return [
            (a.get("data-from"), a.get("data-to"))
            for t, a in self.tags
            if t == "path" and "edge" in (a.get("class") or "")
        ]


# ── compensation marking ─────────────────────────────────────────────────────────────────────
def test_a_compensated_diamond_marks_the_three_undone_nodes():
    h = failed_diamond()
    assert compensation_states(h.events) == {"dia_c": COMPENSATED, "dia_b": COMPENSATED, "dia_a": COMPENSATED}
    assert compensated_nodes(h.events) == {"dia_a", "dia_b", "dia_c"}


def test_a_compensation_counts_when_dispatched_failed_and_open_are_told_apart():
    h = History().run("1", "dia_a").run("2", "dia_b").run("3", "dia_c").run("4", "dia_d", fail="x")
    h.compensate("5", "dia_c", fail="refund declined", attempts=3)
    h.compensate("6", "dia_b", open=True)
    assert compensation_states(h.events) == {"dia_c": COMPENSATION_FAILED, "dia_b": COMPENSATING}
    assert compensated_nodes(h.events) == {"dia_b", "dia_c"}


def test_a_retried_compensation_that_then_completes_is_compensated():
    h = History().run("1", "dia_a").run("2", "dia_b", fail="x")
    h.add(ev.ActivityScheduled("3", "undo_node", {"dag_compensate": "dia_a", "input": 1, "output": 2}))
    h.add(ev.ActivityStarted("3", 1, "w1")).add(ev.ActivityFailed("3", "RuntimeError", "flaky", 1))
    h.add(ev.ActivityStarted("3", 2, "w1")).add(ev.ActivityCompleted("3", "ok", 2))
    assert compensation_states(h.events) == {"dia_a": COMPENSATED}


def test_an_envelope_shaped_forward_input_naming_nothing_dispatched_is_not_a_compensation():
    h = History().run("1", "release", {"dag_compensate": "ghost", "input": 1, "output": 2})
    assert compensation_states(h.events) == {}
    assert compensated_nodes(h.events) == set()


def test_a_run_without_an_unwind_marks_nothing():
    h = History().run("1", "dia_a").run("2", "dia_b").run("3", "dia_c").run("4", "dia_d")
    assert compensated_nodes(h.events) == set()
    dom = Dom(page_for(h.add(ev.WorkflowCompleted({"ok": True})), "COMPLETED"))
    assert {n: a["data-compensation"] for n, a in dom.nodes().items()} == dict.fromkeys(
        ["dia_a", "dia_b", "dia_c", "dia_d"], "none"
    )


# ── layout ───────────────────────────────────────────────────────────────────────────────────
def test_levels_are_longest_paths_over_depends_on():
    nodes = [
        {"node_name": "a", "depends_on": []},
        {"node_name": "b", "depends_on": ["a"]},
        {"node_name": "c", "depends_on": ["a", "b"]},
        {"node_name": "z", "depends_on": ["ghost"]},
    ]
    assert node_levels(nodes) == {"a": 0, "b": 1, "c": 2, "z": 0}


def test_the_diamond_is_three_columns_with_b_and_c_stacked_and_a_d_centred():
    graph = build_run_graph(DIAMOND, execution(), failed_diamond().events)
    pos, width, height = layout(graph["nodes"])
    (ax, ay), (bx, by), (cx, cy), (dx, dy) = (pos[n] for n in ("dia_a", "dia_b", "dia_c", "dia_d"))
    assert ax < bx == cx < dx
    assert by < cy
    assert ay == dy == (by + cy) // 2
    assert width > dx and height > cy


def test_the_page_draws_forward_nodes_only_with_statuses_and_edges():
    dom = Dom(page_for(failed_diamond()))
    nodes = dom.nodes()
    assert list(nodes) == ["dia_a", "dia_b", "dia_c", "dia_d"]  # never undo_node
    assert [a["data-status"] for a in nodes.values()] == ["succeeded", "succeeded", "succeeded", "failed"]
    assert [a["data-compensation"] for a in nodes.values()] == [COMPENSATED] * 3 + ["none"]
    assert sorted(dom.edges()) == [
        ("dia_a", "dia_b"),
        ("dia_a", "dia_c"),
        ("dia_b", "dia_d"),
        ("dia_c", "dia_d"),
    ]
    badges = [a.get("data-badge") for t, a in dom.tags if t == "g" and a.get("data-badge")]
    assert badges == [COMPENSATED] * 3
    assert any(t == "marker" and a.get("id") == "arrow" for t, a in dom.tags)


def test_hover_titles_carry_timings_attempts_and_the_error():
    dom = Dom(page_for(failed_diamond()))
    d = dom.texts["title@dia_d"]
    assert "status: failed" in d and "attempts: 2" in d
    assert "error: RuntimeError: dia_d failed" in d and "Traceback" not in d
    assert "started: 2024-01-01" in d and "duration:" in d
    assert "compensation: compensated" in dom.texts["title@dia_a"]


def test_the_header_legend_and_timeline():
    text = page_for(failed_diamond())
    dom = Dom(text)
    state = next(a for t, a in dom.tags if a.get("id") == "run-state")
    assert state["data-state"] == "FAILED"
    assert "2024-01-01 00:00:00.000 UTC" in text and "2024-01-01 00:00:20.000 UTC" in text
    legend = [a["data-legend"] for t, a in dom.tags if t == "li" and a.get("data-legend")]
    assert legend == [
        "succeeded",
        "failed",
        "timed_out",
        "cancelled",
        "running",
        "pending",
        "skipped",
        COMPENSATED,
        COMPENSATING,
        COMPENSATION_FAILED,
    ]
    timeline = dom.texts["pre#timeline"]
    assert "MarkerRecorded" in timeline and "saga_compensated:1" in timeline
    assert timeline.splitlines() == render_timeline(failed_diamond().events)


def test_skipped_nodes_are_dashed_and_a_live_run_refreshes():
    h = History().run("1", "dia_a", fail="boom")
    sealed = page_for(h.add(ev.WorkflowFailed("DagTaskFailed", "x")))
    statuses = {n: a["data-status"] for n, a in Dom(sealed).nodes().items()}
    assert statuses == {"dia_a": "failed", "dia_b": "skipped", "dia_c": "skipped", "dia_d": "skipped"}
    assert sealed.count('stroke-dasharray="6 4"') == 3
    assert 'http-equiv="refresh"' not in sealed
    live = page_for(History().run("1", "dia_a", open=True), "RUNNING")
    assert {n: a["data-status"] for n, a in Dom(live).nodes().items()}["dia_a"] == "running"
    assert 'http-equiv="refresh"' in live


# ── safety ───────────────────────────────────────────────────────────────────────────────────
def test_the_page_is_self_contained():
    text = page_for(failed_diamond())
    dom = Dom(text)
    assert not [a for t, a in dom.tags if a.get("src")]
    assert [a.get("href") for t, a in dom.tags if a.get("href")] == ["data:,"]
    urls = set(re.findall(r"https?://[^\s\"'<>]+", text))
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace name, never fetched
    csp = next(a["content"] for t, a in dom.tags if a.get("http-equiv") == "Content-Security-Policy")
    assert csp is not None and "default-src 'none'" in csp


def test_no_payload_outside_the_timeline():
    text = page_for(failed_diamond())
    outside = re.sub(r"<pre id=\"timeline\">.*?</pre>", "", text, flags=re.S)
    assert SECRET not in outside
    # the timeline is render_timeline's text as is: it shows short payload snippets (documented)
    assert SECRET in Dom(text).texts["pre#timeline"]


def test_every_string_is_escaped():
    evil = '<script>alert("x")</script>'
    graph: dict[str, Any] = {
        "run_id": f'run"{evil}',
        "dag_name": f"dag{evil}",
        "state": f"FAILED{evil}",
        "started_at": T0,
        "finished_at": None,
        "nodes": [
            {
                "node_name": f'n"1{evil}',
                "status": f'failed"{evil}',
                "depends_on": [],
                "started_at": T0,
                "finished_at": None,
                "attempts": 1,
                "error_type": f"E{evil}",
                "error": f"msg {evil}",
            },
            {
                "node_name": "n2&",
                "status": "pending",
                "depends_on": [f'n"1{evil}'],
                "started_at": None,
                "finished_at": None,
                "attempts": 0,
                "error_type": None,
                "error": None,
            },
        ],
    }
    text = render_dag_page(
        graph, [f"  1  +0.000s  WorkflowStarted  x input={evil}</pre>"], {f'n"1{evil}': f"compensated{evil}"}
    )
    assert "<script>alert" not in text and 'alert("x")' not in text
    assert "</pre>\n" not in text and text.count("</pre>") == 1
    dom = Dom(text)
    nodes = dom.nodes()
    assert set(nodes) == {f'n"1{evil}', "n2&"}  # the attributes round-trip exactly
    assert nodes[f'n"1{evil}']["data-status"] == f'failed"{evil}'
    assert nodes[f'n"1{evil}']["data-compensation"] == f"compensated{evil}"
    assert dom.edges() == [(f'n"1{evil}', "n2&")]
    assert f"input={evil}</pre>" in dom.texts["pre#timeline"]
    assert "msg &lt;script&gt;" in text
    # only the page's own script element
    assert sum(1 for t, _ in dom.tags if t == "script") == 1


# ── serving ──────────────────────────────────────────────────────────────────────────────────
class FakeHarvest:
    def __init__(self, runs: dict[str, tuple[Execution, list[ev.HistoryEvent]]]) -> None:
        self.registry = Registry()
        register_into(self.registry, [diamond, plain])
        self.runs = runs

    def describe(self, run_id: str) -> Execution:
        if run_id not in self.runs:
            raise ExecutionNotFound(run_id)
        return self.runs[run_id][0]

    def history(self, run_id: str, *, strict: bool = True) -> list[ev.HistoryEvent]:
        assert strict is False  # a read-only view degrades
        return self.runs[run_id][1]


def client() -> TestClient:
    h = failed_diamond()
    harvest = FakeHarvest(
        {"run-1": (execution(), h.events), "plain-1": (execution("COMPLETED", "plain-1", "plain"), [])}
    )
    app = FastAPI()
    register_pages(app, harvest)
    return TestClient(app)


def test_the_page_is_served_as_html():
    resp = client().get("/ui/dags/diamond/runs/run-1")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    nodes = Dom(resp.text).nodes()
    assert [a["data-compensation"] for a in nodes.values()] == [COMPENSATED] * 3 + ["none"]


def test_unknown_dag_non_dag_other_dags_run_and_bad_ids_are_html_errors():
    c = client()
    for path, code in [
        ("/ui/dags/nope/runs/run-1", 404),
        ("/ui/dags/plain/runs/plain-1", 404),
        ("/ui/dags/diamond/runs/plain-1", 404),
        ("/ui/dags/diamond/runs/missing", 404),
        ("/ui/dags/diamond/runs/%20", 400),
        (f"/ui/dags/diamond/runs/{'x' * 201}", 400),
        ("/ui/dags/diamond/runs/a%00b", 400),
    ]:
        resp = c.get(path)
        assert resp.status_code == code, path
        assert resp.headers["content-type"].startswith("text/html"), path
        assert "<script>" not in resp.text
