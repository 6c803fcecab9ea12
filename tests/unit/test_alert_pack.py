"""The starter alert pack: well-formed, in step with its YAML twin, every runbook link resolves
and every metric it queries is one the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harvest_celery._runtime.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "docs" / "alerts" / "starter-pack-v0.1.0.json"
RULES_YAML = ROOT / "config" / "prometheus" / "harvest-alerts.yml"
RUNBOOK = ROOT / "docs" / "runbooks" / "harvest-alerts.md"

REQUIRED_ALERTS = {
    "harvest_saga_compensation_spike",
    "harvest_saga_compensation_failed",
    "harvest_nd_blocked",
    "harvest_saga_compensations_quiet",
}

# PromQL words that look like identifiers but are not metric names.
_PROMQL_WORDS = {
    "sum",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "rate",
    "irate",
    "increase",
    "delta",
    "max",
    "min",
    "avg",
    "count",
    "topk",
    "bottomk",
    "absent",
    "clamp_min",
    "clamp_max",
    "bool",
    "histogram_quantile",
    "vector",
    "changes",
    "resets",
    "time",
    "outcome",
    "workflow",
    "queue",
}


def _pack() -> dict[str, Any]:
    return json.loads(PACK.read_text())  # type: ignore[no-any-return]


def _rules(pack: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in pack["groups"] for rule in group["rules"]]


def _exported_metrics() -> set[str]:
    return METRICS.exported_names()


def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lower-case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _runbook_anchors() -> set[str]:
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", RUNBOOK.read_text(), re.M)}


def test_pack_has_the_starter_alerts() -> None:
    names = [rule["alert"] for rule in _rules(_pack())]
    assert len(names) == len(set(names)), "alert names must be unique"
    assert REQUIRED_ALERTS <= set(names)


def test_every_rule_is_complete() -> None:
    for group in _pack()["groups"]:
        assert group["name"]
        for rule in group["rules"]:
            name = rule.get("alert")
            assert name, rule
            assert rule.get("expr"), name
            assert rule.get("labels", {}).get("severity") in {"page", "warning", "ticket"}, name
            annotations = rule.get("annotations", {})
            assert annotations.get("summary"), name
            assert annotations.get("description"), name
            assert annotations.get("runbook_url", "").startswith("docs/runbooks/harvest-alerts.md#"), name
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "0m")), name


def test_compensation_failure_pages() -> None:
    rules = {rule["alert"]: rule for rule in _rules(_pack())}
    assert rules["harvest_saga_compensation_failed"]["labels"]["severity"] == "page"
    assert "harvest_saga_compensation_failed_total" in rules["harvest_saga_compensation_failed"]["expr"]
    nd = rules["harvest_nd_blocked"]["expr"]
    assert "increase(harvest_nd_blocked_total[10m])" in nd and nd.endswith("> 0")
    quiet = rules["harvest_saga_compensations_quiet"]["expr"]
    assert 'harvest_workflow_terminal_total{outcome="failed"}' in quiet
    assert "harvest_saga_compensated_total" in quiet


def test_runbook_anchors_exist() -> None:
    anchors = _runbook_anchors()
    for rule in _rules(_pack()):
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: no heading for #{anchor} in {RUNBOOK.name}"
        assert anchor == rule["alert"], "each alert's runbook section is named after the alert"


def test_exprs_use_only_exported_metrics() -> None:
    exported = _exported_metrics()
    assert {
        "harvest_saga_compensated_total",
        "harvest_saga_compensation_failed_total",
        "harvest_workflow_terminal_total",
        "harvest_nd_blocked_total",
    } <= exported
    for rule in _rules(_pack()):
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
        # drop label matchers, durations and strings before looking for metric names
        bare = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"|\b\d+(?:\.\d+)?[smhdwy]?\b', " ", expr)
        identifiers = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)) - _PROMQL_WORDS
        assert identifiers, rule["alert"]
        unknown = identifiers - exported
        assert not unknown, f"{rule['alert']} queries metrics the code does not export: {unknown}"
        for label in re.findall(r"by \(([^)]*)\)", expr):
            labels = {part.strip() for part in label.split(",")}
            assert labels <= {"workflow", "queue", "outcome"}, rule["alert"]


def test_yaml_rules_match_the_json_pack() -> None:
    text = RULES_YAML.read_text()
    for rule in _rules(_pack()):
        assert f"alert: {rule['alert']}" in text
    try:
        import yaml
    except ImportError:
        pytest.skip("PyYAML not installed: text check only")
    assert yaml.safe_load(text) == _pack()
