"""``harvest schedules list|create|pause|resume|trigger|backfill|delete`` on the embedded app
(docs/schedules.md, "Operations"): each command through ``main``, ``list --failing`` naming the
schedules behind the ``harvest_schedule_failing`` alert, and bad input refused with nothing
written. The firing itself is tests/integration/test_schedules.py's."""

from __future__ import annotations

import json

import pytest

from harvest_celery._cli import main

APP = "tests.unit.cli_sched_app:harvest"


@pytest.fixture
def db(cli_db):
    return cli_db("tests.unit.cli_sched_app")


def listed(capsys, *more: str) -> list[dict]:
    capsys.readouterr()
    assert main(["--app", APP, "schedules", "list", "--json", *more]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_each_schedules_command_and_list_failing(db, capsys):
    for name, data in (("ok", {}), ("bad", {"fail": True})):
        argv = ["schedules", "create", name, "--workflow", "cs.job", "--every", "3600"]
        assert main(["--app", APP, *argv, "--input", json.dumps(data), "--overlap", "allow_all"]) == 0
    assert [(s["name"], s["every_seconds"], s["overlap"]) for s in listed(capsys)] == [
        ("bad", 3600, "allow_all"),
        ("ok", 3600, "allow_all"),
    ]
    assert main(["--app", APP, "schedules", "pause", "ok", "--note", "maintenance"]) == 0
    (ok,) = [s for s in listed(capsys) if s["name"] == "ok"]
    assert ok["paused"] and ok["pause_note"] == "maintenance"
    assert main(["--app", APP, "schedules", "resume", "ok"]) == 0
    assert "resumed ok" in capsys.readouterr().out
    for name in ("ok", "bad"):
        assert main(["--app", APP, "schedules", "trigger", name]) == 0
        run_id = capsys.readouterr().out.strip()
        assert run_id.startswith(f"{name}@manual-")
    from tests.unit.cli_sched_app import harvest

    harvest.drain()
    assert [s["name"] for s in listed(capsys, "--failing")] == ["bad"]  # what the alert counts
    assert main(["--app", APP, "schedules", "list"]) == 0
    text = capsys.readouterr().out
    assert "bad  cs.job  every 3600s" in text and " FAILED " in text
    # a backfill over a range past the last tick is refused
    end = "2999-01-01T00:00:00Z"
    assert (
        main(["--app", APP, "schedules", "backfill", "ok", "--start", "2026-01-01T00:00:00Z", "--end", end])
        == 2
    )
    assert main(["--app", APP, "schedules", "delete", "bad"]) == 0
    assert [s["name"] for s in listed(capsys)] == ["ok"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--cron", "0 2 * * *", "--every", "60"],
        [],
        ["--every", "60", "--timezone", "UTC"],
        ["--cron", "* * * * * *"],
        ["--every", "60", "--end-at", "2026-12-01T02:00:00"],  # no UTC offset
    ],
)
def test_bad_input_is_refused_and_writes_nothing(db, capsys, argv):
    assert main(["--app", APP, "schedules", "create", "s", "--workflow", "cs.job", *argv]) == 2
    assert capsys.readouterr().err
    assert listed(capsys) == []
