"""What an operator sees of waiting work, on every surface (issues 23 and 24, "Visibility";
docs/flow-control.md, "Seeing it"), over the embedded SQLite app with messages delivered by hand
(a waiting run or row needs no worker to be seen):

* a run waiting for admission: ``harvest show`` prints its place ("3rd of 3 waiting; 1/1 in
  use"), the API gives ``display_status`` WAITING with ``admission``, the console run page shows
  the same line, and a list filtered on WAITING (API, console) holds exactly the waiting runs;
* an activity held back by its limit: ``harvest show`` prints "waiting for a slot of wv_charge
  (1/1 in use)" (from Postgres: ``stuck()``'s hint of kind ``slot``), as the console's run page
  does beside the activity."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harvest_celery._cli import main
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._web.api import create_app

APP = "tests.unit.cli_waiting_app"
PLACE = "waiting for admission to wv_one: 3rd of 3 waiting; 1/1 in use"
SLOT = "waiting for a slot of wv_charge (1/1 in use)"


@pytest.fixture
def h(cli_db, monkeypatch) -> Any:
    """The app's Harvest on a fresh database: w1 admitted, w2..w4 waiting for admission (same
    customer), w9 admitted (another customer); p1 holding wv_charge's one slot, p2 held back."""
    cli_db(APP)
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    harvest = importlib.import_module(APP).harvest  # the module --app loads (not a stale one)
    harvest._inline = None  # deliver messages by hand: nothing runs unless the test says so
    harvest.runtime.dispatcher = InlineDispatcher()
    for run_id in ("w1", "w2", "w3", "w4"):
        harvest.start_workflow("wv_one", {"customer": "A"}, run_id)
    harvest.start_workflow("wv_one", {"customer": "B"}, "w9")
    for run_id in ("p1", "p2"):
        harvest.start_workflow("wv_pay", {"n": run_id}, run_id)
    queue = harvest.runtime.dispatcher.queue
    while queue:  # decisions only: p1's activity message stays unsent, holding its slot
        message = queue.popleft()
        if message.task_name == "harvest.decide":
            harvest.runtime.run_decision(message.args[0])
    return harvest


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()


def test_harvest_show_prints_a_waiting_runs_place(h, capsys):
    assert main(["--database-url", h.database_url, "show", "w4"]) == 0
    out = capsys.readouterr().out
    assert "WAITING" in out.splitlines()[0]
    assert f"  {PLACE}\n" in out
    assert main(["--database-url", h.database_url, "show", "w1"]) == 0
    assert "waiting for admission" not in capsys.readouterr().out  # admitted: no place


def test_harvest_show_with_the_app_adds_why_the_run_waits(h, capsys):
    h.pause("w1")  # the holder's state, named from Postgres alone
    assert main(["--database-url", h.database_url, "--app", APP, "show", "w4"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"  {re.escape(PLACE)} \(slot held by run w1: paused\) for \d+s\n", out), out


def test_harvest_show_and_stuck_name_the_slot_an_activity_waits_for(h, capsys):
    (hint,) = h.stuck("p2")
    assert (hint["kind"], hint["activity"], hint["in_use"], hint["concurrency"]) == (
        "slot",
        "wv_charge",
        1,
        1,
    )
    assert main(["--database-url", h.database_url, "--app", APP, "show", "p2"]) == 0
    assert re.search(rf"  waiting: {re.escape(SLOT)} for \d+s\n", capsys.readouterr().out)
    assert main(["--database-url", h.database_url, "--app", APP, "show", "p1"]) == 0
    assert "waiting for a slot" not in capsys.readouterr().out  # it holds the slot


def test_the_api_gives_a_waiting_runs_status_and_place(h):
    client = TestClient(create_app(h))
    body = client.get("/workflows/w4").json()
    assert (body["status"], body["display_status"]) == ("RUNNING", "WAITING")
    assert {k: body["admission"][k] for k in ("position", "waiting", "in_use", "concurrency")} == {
        "position": 3,
        "waiting": 3,
        "in_use": 1,
        "concurrency": 1,
    }
    admitted = client.get("/workflows/w1").json()
    assert admitted["display_status"] == "RUNNING" and admitted["admission"] is None


def test_a_list_filtered_on_waiting_holds_exactly_the_waiting_runs(h):
    client = TestClient(create_app(h))
    listed = client.get("/workflows", params={"status": "WAITING"})
    assert listed.status_code == 200, listed.text
    rows = listed.json()["workflows"]
    assert sorted(r["execution_id"] for r in rows) == ["w2", "w3", "w4"]
    assert {r["display_status"] for r in rows} == {"WAITING"}
    running = client.get("/workflows", params={"status": "RUNNING"}).json()["workflows"]
    assert {"w1", "w9", "p1", "p2"} <= {r["execution_id"] for r in running}
    assert client.get("/workflows", params={"status": "SLEEPING"}).status_code == 422


def test_the_console_run_page_shows_the_place_and_the_held_activity(h):
    client = TestClient(create_app(h))
    page = client.get("/console/runs/w4")
    assert page.status_code == 200, page.text
    found = re.search(r'<span class="flag" id="run-admission">.*?</span>', page.text, re.S)
    assert found and _text(found.group(0)) == PLACE
    assert 'id="run-admission"' not in client.get("/console/runs/w1").text
    held = client.get("/console/runs/p2").text
    assert re.search(rf'<span class="muted held">{re.escape(SLOT)}</span>', held), _text(held)


def test_the_console_runs_list_filters_on_waiting(h):
    client = TestClient(create_app(h))
    page = client.get("/console", params={"status": "WAITING"})
    assert page.status_code == 200, page.text
    linked = set(re.findall(r'href="/console/runs/([^"/]+)"', page.text))
    assert linked == {"w2", "w3", "w4"}
    assert '<option value="WAITING" selected' in page.text or 'value="WAITING" selected' in page.text
