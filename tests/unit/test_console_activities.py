"""The console's run page shows the one activity fold's statuses: a timed-out attempt shows as
timed out (in history, or known only from its recorded attempt error), an unfinished activity of
a cancelled run as cancelled. On the view-model and on the rendered page (open mode, no token)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from harvest_celery._web.api import create_app
from harvest_celery._web.console.run_page import STATUS_LABEL
from harvest_celery._web.console.run_view import build_run_view
from tests.unit.rungraph_cases import by_hand, harvest_at, load, pump, recorded


@pytest.fixture
def h(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    return harvest_at(f"sqlite:///{tmp_path / 'console.db'}")


def page(h, run_id: str) -> str:
    response = TestClient(create_app(h)).get(f"/console/runs/{run_id}")
    assert response.status_code == 200, response.text
    return response.text


def activity_row(html: str, name: str) -> str:
    found = re.search(rf'<tr data-activity="{name}"[^>]*>.*?</tr>', html, re.S)
    assert found, f"no activity row for {name}"
    return found.group(0)


def attempts(row: str) -> list[tuple[str, str, str]]:
    """``(number, data-status, shown text)`` of each attempt in an activity row."""
    return [
        (n, s, re.sub(r"<[^>]+>", "", text).split(" on ")[0].strip())
        for n, s, text in re.findall(
            r'<li data-attempt="(\d+)" data-status="([a-z_]+)">(.*?)</li>', row, re.S
        )
    ]


def test_a_timed_out_attempt_in_history_shows_as_timed_out(h):
    run_id = load(h, recorded("timeout"))
    view = build_run_view(h.history(run_id), h.attempt_errors(run_id))
    slow = next(a for a in view.activities if a.name == "gr_slow")
    assert (slow.status, slow.attempts[1].status) == ("timed_out", "timed_out")
    row = activity_row(page(h, run_id), "gr_slow")
    assert 'data-status="timed_out"' in row and '<td class="nw">timed out</td>' in row
    assert attempts(row) == [("1", "timed_out", "#1 timed out")]


def test_a_retried_attempt_that_timed_out_shows_as_timed_out_from_its_attempt_error(h):
    by_hand(h)
    run_id = h.start_workflow("gr_deadline_twice", {}, execution_id="twice")
    pump(h, expire=("gr_slow",))  # attempt 1's lease expires (retried), then attempt 2's (final)
    assert h.describe(run_id).status == "FAILED"
    assert [e.attempt for e in h.attempt_errors(run_id) if e.activity_id] == [1, 2]
    view = build_run_view(h.history(run_id), h.attempt_errors(run_id))
    (slow,) = view.activities
    assert {n: a.status for n, a in slow.attempts.items()} == {1: "timed_out", 2: "timed_out"}
    assert slow.attempts[1].error_type == "StartToCloseTimeout"
    row = activity_row(page(h, run_id), "gr_slow")
    assert attempts(row) == [("1", "timed_out", "#1 timed out"), ("2", "timed_out", "#2 timed out")]


def test_the_unfinished_activities_of_a_cancelled_run_show_as_cancelled(h):
    run_id = load(h, recorded("cancel"))
    html = page(h, run_id)
    assert 'data-status="succeeded"' in activity_row(html, "gr_reserve")
    for name in ("gr_pack", "gr_label"):  # pack started, label never did
        row = activity_row(html, name)
        assert 'data-status="cancelled"' in row and '<td class="nw">cancelled</td>' in row


def test_a_live_run_shows_running_and_scheduled(h):
    run_id = load(h, recorded("live"))
    html = page(h, run_id)
    assert '<td class="nw">running</td>' in activity_row(html, "gr_pack")
    label = activity_row(html, "gr_label")  # scheduled, never started: the fold's pending
    assert 'data-status="pending"' in label and '<td class="nw">scheduled</td>' in label


def test_every_word_has_a_label():
    from harvest_celery._core.activities import STATUSES

    assert set(STATUS_LABEL) == set(STATUSES)
