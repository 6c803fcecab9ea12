"""The console's schedules page in a real headless Chromium: the next ticks, the last runs
with their status, pause with a note, resume, trigger now."""

from __future__ import annotations

import os
from typing import Any

import pytest

from harvest_celery._web.api import create_app
from tests.integration.browser import chromium, serving

pytestmark = pytest.mark.integration
QUEUE = f"sched-page-{os.environ.get('HARVEST_TEST_SLOT', '0')}"


@pytest.fixture(scope="module")
def sched(harvest: Any) -> Any:
    os.environ["HARVEST_TEST_SCHED_QUEUE"] = QUEUE
    from tests.integration.sched_app import harvest as h

    h.runtime.settings.decision_queue = QUEUE
    return h


def test_the_schedules_page_pauses_resumes_and_triggers(sched, tag, tmp_path):
    name = f"page-{tag}"
    sched.create_schedule(name, workflow="sched.tick", cron="0 2 * * *", timezone="Europe/Paris")
    try:
        with serving(create_app(sched), "schedules") as base, chromium("schedules page") as browser:
            page = browser.new_page()
            assert page.goto(f"{base}/console/schedules", wait_until="load").status == 200
            row = page.locator(f'tr[data-schedule="{name}"]')
            assert row.locator("ul.ticks li").count() == 3  # the next ticks
            assert "cron 0 2 * * * (Europe/Paris)" in row.text_content()
            row.locator("input[name=note]").fill("db migration")
            with page.expect_navigation():
                row.locator("button.pause").click()
            assert page.locator("#done").text_content() == "pause done"
            row = page.locator(f'tr[data-schedule="{name}"]')
            assert row.locator(".state").text_content() == "paused: db migration"
            assert sched.describe_schedule(name)["pause_note"] == "db migration"
            with page.expect_navigation():
                row.locator("button.resume").click()
            assert not sched.describe_schedule(name)["paused"]
            with page.expect_navigation():
                page.locator(f'tr[data-schedule="{name}"] button.trigger').click()
            runs = page.locator(f'tr[data-schedule="{name}"] ul.runs li')
            assert runs.count() == 1
            assert runs.first.locator("a").text_content().startswith(f"{name}@manual-")
            assert "RUNNING" in runs.first.text_content()  # its status (no worker runs it here)
            page.screenshot(path=str(tmp_path / "schedules.png"), full_page=True)
            forged = page.request.post(f"{base}/console/schedules/{name}/pause", form={"note": "x"})
            assert forged.status == 403 and not sched.describe_schedule(name)["paused"]  # no CSRF token
    finally:
        sched.delete_schedule(name)
