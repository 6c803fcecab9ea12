"""The DAG run page in a real headless browser (Debian's chromium driven by Playwright), served by
uvicorn over the operator API, for a real diamond run that failed and unwound on real workers.

Nothing here skips: a missing chromium or playwright fails the test with a message that says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from harvest_celery._errors import WorkflowFailed
from harvest_celery._web.api import create_app
from tests.integration.browser import chromium, serving

pytestmark = pytest.mark.integration
SCREENSHOT = Path("/tmp/harvest-dag-page.png")


@pytest.fixture(scope="module")
def server(harvest: Any, workers: Any, redis_client: Any) -> Iterator[str]:
    """uvicorn serving create_app(harvest) (which includes the pages) on 127.0.0.1, in a background thread."""
    os.environ.pop("HARVEST_API_TOKEN", None)
    app = create_app(harvest)
    with serving(app, "dag-page") as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium("DAG page", width=1280) as context:
        yield context


def test_the_failed_diamond_is_drawn_with_its_unwind(harvest, workers, redis_client, tag, server, browser):
    run_id = harvest.start_workflow("diamond", {"tag": tag, "fail": ["dia_d"]})
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)

    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    try:
        response = page.goto(f"{server}/ui/dags/diamond/runs/{run_id}", wait_until="load")
        assert response is not None and response.status == 200
        assert response.headers["content-type"].startswith("text/html")

        # the four forward nodes, never the compensator
        nodes = page.locator("svg#dag g.node")
        assert nodes.count() == 4
        drawn = {
            nodes.nth(i).get_attribute("data-node"): (
                nodes.nth(i).get_attribute("data-status"),
                nodes.nth(i).get_attribute("data-compensation"),
            )
            for i in range(4)
        }
        assert drawn == {
            "dia_a": ("succeeded", "compensated"),
            "dia_b": ("succeeded", "compensated"),
            "dia_c": ("succeeded", "compensated"),
            "dia_d": ("failed", "none"),
        }
        assert page.locator('[data-node="undo_node"]').count() == 0
        assert page.locator("svg#dag g.node g.badge").count() == 3
        assert page.locator('[data-node="dia_d"] g.badge').count() == 0
        assert (page.locator('[data-node="dia_a"] g.badge').text_content() or "").strip() == "↺ compensated"

        # four edges with arrowheads
        edges = page.locator("svg#dag path.edge")
        assert edges.count() == 4
        pairs = sorted(
            (edges.nth(i).get_attribute("data-from"), edges.nth(i).get_attribute("data-to")) for i in range(4)
        )
        assert pairs == [("dia_a", "dia_b"), ("dia_a", "dia_c"), ("dia_b", "dia_d"), ("dia_c", "dia_d")]
        assert all(edges.nth(i).get_attribute("marker-end") == "url(#arrow)" for i in range(4))

        # laid out by level: a | b, c | d, left to right; b above c
        box = {
            n: page.locator(f'[data-node="{n}"] rect.box').bounding_box()
            for n in ("dia_a", "dia_b", "dia_c", "dia_d")
        }
        assert all(b is not None and b["width"] > 100 for b in box.values())
        assert box["dia_a"]["x"] < box["dia_b"]["x"] == box["dia_c"]["x"] < box["dia_d"]["x"]  # type: ignore[index]
        assert box["dia_b"]["y"] < box["dia_c"]["y"]  # type: ignore[index]

        # colours come from the status
        stroke = page.locator('[data-node="dia_d"] rect.box').get_attribute("stroke")
        assert stroke == "#c62828"

        # header and timeline
        assert page.locator("#run-state").inner_text() == "FAILED"
        assert page.locator("#run-id").inner_text() == run_id
        timeline = page.locator("pre#timeline").inner_text()
        assert "MarkerRecorded" in timeline and "saga_compensated:1" in timeline
        assert "WorkflowFailed" in timeline

        # hover: the SVG <title> carries timings and attempts; the details panel shows it
        target = page.locator('[data-node="dia_d"]')
        target.hover()
        title = target.locator(":scope > title").text_content() or ""
        assert "attempts" in title and "status: failed" in title and "error:" in title
        from playwright.sync_api import expect

        # not wait_for_function: its string is eval'd in the page, which the console's CSP refuses
        expect(page.locator("#details")).to_contain_text("attempts", timeout=5000)
        assert "dia_d" in page.locator("#details").inner_text()

        # a screenshot a person can look at
        page.screenshot(path=str(SCREENSHOT), full_page=True)
        data = SCREENSHOT.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 5 * 1024, f"screenshot is only {len(data)} bytes"

        # nothing left the machine: every request went to our server
        assert requests, "the browser recorded no request at all"
        hosts = {urlparse(u).hostname for u in requests if not u.startswith("data:")}
        assert hosts == {"127.0.0.1"}, requests
    finally:
        page.close()


def test_an_unknown_run_is_an_html_404(server, browser):
    page = browser.new_page()
    try:
        response = page.goto(f"{server}/ui/dags/diamond/runs/no-such-run")
        assert response is not None and response.status == 404
        assert "no run with id" in page.locator("#error").inner_text()
        response = page.goto(f"{server}/ui/dags/three_steps/runs/no-such-run")
        assert response is not None and response.status == 404
    finally:
        page.close()
