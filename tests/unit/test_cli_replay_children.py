"""``harvest replay`` reads histories holding every event type of child workflows and
continue-as-new (issue 26): from the database and from ``harvest export`` files, passing under
the code that recorded them and reporting a build that drifted. Embedded (SQLite), no services;
the app is tests/unit/cli_children_app.py."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from harvest_celery._cli import main

APP = "tests.unit.cli_children_app"
NEW_TYPES = {
    "ChildWorkflowScheduled",
    "ChildWorkflowStarted",
    "ChildWorkflowStartRefused",
    "ChildWorkflowClosed",
    "WorkflowContinuedAsNew",
}


@pytest.fixture
def app(cli_db, capsys) -> Any:
    cli_db(APP)
    assert main(["--app", APP, "list"]) == 0  # imports the app module once, against the database
    capsys.readouterr()
    return sys.modules[APP]


def cli(capsys, *argv: str, build: str = "harvest") -> tuple[int, str]:
    code = main(["--app", f"{APP}:{build}", *argv])
    return code, capsys.readouterr().out


def record(app: Any) -> list[str]:
    """A parent whose child completed, a parent refused a taken id, a chain's first link."""
    h = app.harvest
    h.start_workflow("rc_parent", "rome", execution_id="par")
    h.start_workflow("rc_waits", None, execution_id="taken")
    h.start_workflow("rc_takes_id", "taken", execution_id="asks")
    h.start_workflow("rc_chain", 0, execution_id="ch")
    h.drain()
    assert h.result("par") == "booked-rome" and h.result("asks") == "refused" and h.result("ch") == 2
    runs = ["par", "asks", "ch"]
    held = {e.event.type for r in runs for e in h.history(r)}
    assert NEW_TYPES <= held
    return runs


def test_replay_reads_every_new_event_type_from_the_database_and_from_export_files(app, capsys, tmp_path):
    runs = record(app)
    ids = [a for r in runs for a in ("--id", r)]
    code, text = cli(capsys, "replay", "--strict", *ids)
    assert code == 0, text
    assert all(f"OK       {r} (" in text for r in runs)
    files = []
    for r in runs:
        out = tmp_path / f"{r}.json"
        code, _ = cli(capsys, "export", r, "--out", str(out))
        assert code == 0
        files.append(str(out))
    exported = {e["type"] for f in files for e in json.loads(open(f).read())["events"]}
    assert NEW_TYPES <= exported
    code, text = cli(capsys, "replay", "--strict", "--json", "--file", *files)
    assert code == 0, text
    verdicts = {r["execution_id"]: r["result"] for r in json.loads(text)["runs"]}
    assert verdicts == dict.fromkeys(runs, "ok")


def test_replay_reports_a_build_whose_child_or_chain_drifted(app, capsys, tmp_path):
    record(app)
    out = tmp_path / "par.json"
    assert cli(capsys, "export", "par", "--out", str(out))[0] == 0
    code, text = cli(capsys, "replay", "--strict", "--file", str(out), build="drifted")
    assert code == 1
    assert "expected ChildWorkflowScheduled(rc_other_trip), got ChildWorkflowScheduled(rc_trip)" in text
    code, text = cli(capsys, "replay", "--strict", "--id", "ch", build="drifted")
    assert code == 1
    assert "expected ChildWorkflowScheduled(rc_trip), got WorkflowContinuedAsNew(ch-n1)" in text, text
