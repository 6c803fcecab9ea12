"""docs/grafana/harvest.json: well-formed, the panels the issue asks for, and every metric its
PromQL queries is one the metrics registry collects (names read from the collectors, with the
``_total`` / ``_bucket`` / ``_sum`` / ``_count`` suffixes by kind) — never by grepping source."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harvest_celery._runtime.metrics import _SPECS, FROM_POSTGRES, HISTOGRAMS, METRICS

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "harvest.json"

# PromQL words that are not metric names (functions are recognised by the "(" after them)
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"(?<![\w:])\d[\w.]*", "", text)  # numbers and durations (0.95, 5m)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if word in _KEYWORDS or text[m.end() :].lstrip().startswith("("):
            continue  # a keyword, or a function call
        names.add(word)
    return names


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def _queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if var["type"] == "query":
            text = query["query"] if isinstance(query, dict) else query
            found = re.fullmatch(r"label_values\((\w+),\s*\w+\)", text)
            assert found, f"variable {var['name']}: {text}"
            exprs.append(found.group(1))
    return exprs


def test_the_extractor_reads_metric_names_only() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, queue) (rate(harvest_x_bucket{queue=~"a|b"}[$__rate_interval])))'
        " / on (queue) sum without (le) (harvest_y_total offset 5m) > bool 0"
    )
    assert metric_names(expr) == {"harvest_x_bucket", "harvest_y_total"}


def test_registry_names_have_the_suffixes_of_their_kind() -> None:
    names = METRICS.exported_names()
    assert "harvest_activity_completed_total" in names
    assert {f"harvest_activity_schedule_to_start_seconds{s}" for s in ("_bucket", "_sum", "_count")} <= names
    assert "harvest_activity_schedule_to_start_seconds_total" not in names
    assert "harvest_decisions_bucket" not in names and "harvest_limit_waiting_total" not in names
    assert {"harvest_limit_waiting", "harvest_limit_in_use"} <= names
    for key, (name, _doc, _labels) in _SPECS.items():
        if key not in HISTOGRAMS and key not in FROM_POSTGRES:
            assert f"{name}_total" in names, key


def test_every_metric_the_dashboard_queries_is_in_the_registry() -> None:
    exported = METRICS.exported_names()
    queried = set().union(*(metric_names(e) for e in _queries(_dashboard())))
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, f"not in the registry: {sorted(queried - exported)}"


@pytest.mark.parametrize(
    ("title", "metric"),
    [
        ("Steps per second", "harvest_activity_completed_total"),
        ("Decisions by path", "harvest_decisions_total"),
        ("Unwinds", "harvest_saga_compensated_total"),
        ("nd-blocked decisions", "harvest_nd_blocked_total"),
        ("Tasks waiting for a concurrency slot", "harvest_limit_waiting"),
        ("Schedule-to-start lag", "harvest_activity_schedule_to_start_seconds_bucket"),
    ],
)
def test_the_dashboard_has_the_panels_the_issue_asks_for(title: str, metric: str) -> None:
    panels = {p["title"]: p for p in _dashboard()["panels"]}
    assert title in panels
    assert metric in set().union(*(metric_names(t["expr"]) for t in panels[title]["targets"]))


def test_the_dashboard_is_importable() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "harvest-celery"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert "execution_id" not in target["expr"]  # a run id is never a label
