"""import-beat: Celery Beat's ``beat_schedule`` as task schedules (docs/schedules.md, "Migrating
from Celery Beat"). The conversion is pure (``_core.beat``); the import runs over the embedded
default (SQLite, one process): refusals name each entry and write nothing, a second import
leaves identical schedules alone and refuses changed ones without ``update``, and an imported
tick starts the ``harvest.start_task`` run with the tick's id. That the task body then runs on a
worker is tests/integration/test_schedules.py's."""

from __future__ import annotations

import pickle
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

from harvest_celery import BeatImportRefused, Harvest, InvalidSchedule, WorkflowContext, workflow
from harvest_celery._cli import main
from harvest_celery._core.beat import Unsupported, beat_schedule_of, convert, spec_of
from harvest_celery._core.invocation import START_TASK
from harvest_celery._core.schedule import Spec

UTC = timezone.utc


def _solar() -> Any:
    return solar.__new__(solar)  # a solar instance without the ephem library it needs to run


class HourlyCrontab(crontab):
    """A custom schedule class: its ticks are whatever it says, so harvest refuses it."""


# ── the conversion ───────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize(
    ("given", "expression"),
    [
        (crontab(), "* * * * *"),
        (crontab(minute=0, hour=2), "0 2 * * *"),
        (crontab(minute="*/15"), "*/15 * * * *"),
        (crontab(minute=0, hour="*/6"), "0 */6 * * *"),
        (crontab(minute=30, hour="9-17", day_of_week="mon-fri"), "30 9-17 * * 1-5"),
        (crontab(minute="0,30", hour="8,12,18"), "*/30 8,12,18 * * *"),
        (crontab(minute="0,45", hour="8,12,18"), "0,45 8,12,18 * * *"),
        (crontab(minute=5, hour=0, day_of_week="sun"), "5 0 * * 0"),
        (crontab(minute=0, hour=0, day_of_month="1", month_of_year="*/3"), "0 0 1 */3 *"),
        (crontab(minute=0, hour=0, month_of_year="2,4,6,8"), "0 0 * 2,4,6,8 *"),
        (crontab(minute=0, hour=0, day_of_month="1-7,15"), "0 0 1-7,15 * *"),
        (crontab(minute="1,2", hour=3), "1,2 3 * * *"),
        (crontab.from_string("0 4 * * 6"), "0 4 * * 6"),
    ],
)
def test_a_crontab_becomes_the_same_five_fields(given, expression):
    assert spec_of(given, "Europe/Paris") == Spec(cron=expression, timezone="Europe/Paris")


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (timedelta(seconds=30), 30),
        (timedelta(hours=1), 3600),
        (10, 10),
        (2.0, 2),
        (schedule(run_every=timedelta(minutes=5)), 300),
        (schedule(run_every=45), 45),
    ],
)
def test_a_timedelta_a_number_and_schedule_run_every_become_every(given, seconds):
    assert spec_of(given, "Europe/Paris") == Spec(every=seconds)  # every= has no timezone


@pytest.mark.parametrize(
    ("given", "why"),
    [
        (_solar(), "solar schedules are refused"),
        (schedule(run_every=timedelta(minutes=5), relative=True), "relative=True is refused"),
        (HourlyCrontab(minute=0), "custom schedule class tests.unit.test_import_beat.HourlyCrontab"),
        (object(), "custom schedule class builtins.object"),
        (crontab(minute=0, nowfun=lambda: datetime.now(UTC)), "custom nowfun"),
        (crontab(minute=0, hour=0, day_of_month=1, day_of_week="mon"), "both day_of_month and day_of_week"),
        (timedelta(seconds=1.5), "whole seconds"),
        (timedelta(0), "at least 1s"),
        (0.5, "at least 1s"),
        (None, "must be a schedule"),
        (True, "must be a schedule"),
    ],
)
def test_what_harvest_cannot_honour_is_refused_with_why(given, why):
    with pytest.raises(Unsupported, match=why):
        spec_of(given, "UTC")


def test_a_crontab_in_a_timezone_harvest_does_not_take_is_refused():
    with pytest.raises(Unsupported, match=r"'0 2 \* \* \*' in EST: unknown timezone"):
        spec_of(crontab(minute=0, hour=2), "EST")


def test_an_entry_carries_its_task_its_call_and_its_queue_option():
    entry = convert(
        "nightly",
        {"task": "t.add", "schedule": 60, "args": (1, 2), "kwargs": {"k": 3}, "options": {"queue": "q"}},
        "UTC",
    )
    assert (entry.task, entry.spec, entry.args, entry.kwargs, entry.queue) == (
        "t.add",
        Spec(every=60),
        [1, 2],
        {"k": 3},
        "q",
    )


@pytest.mark.parametrize(
    ("name", "entry", "why"),
    [
        ("a:b", {"task": "t", "schedule": 60}, "may not hold a ':'"),
        ("a/b", {"task": "t", "schedule": 60}, "may not hold a '/'"),
        ("", {"task": "t", "schedule": 60}, "schedule name ''"),
        ("x" * 181, {"task": "t", "schedule": 60}, "at most 180 characters"),
        ("r", {"task": "t", "schedule": 60, "relative": True}, "relative=True is refused"),
        ("o", {"task": "t", "schedule": 60, "options": {"expires": 30}}, "option 'expires'"),
        ("p", {"task": "t", "schedule": 60, "options": {"priority": 9}}, "option 'priority'"),
        ("c", {"task": "t", "schedule": 60, "options": {"countdown": 5}}, "option 'countdown'"),
        ("e", {"task": "t", "schedule": 60, "options": {"queue": ""}}, "option 'queue' must be a queue"),
        ("k", {"task": "t", "schedule": 60, "every": 5}, "'every' is not a Beat entry key"),
        ("t", {"schedule": 60}, "'task' must name a task"),
        ("a", {"task": "t", "schedule": 60, "args": "xy"}, "'args' must be a list"),
        ("n", "t", "an entry is a dict"),
        ("q", {"task": "t", "schedule": 60, "kwargs": {"queue": "x"}}, "kwargs 'queue' is refused"),
    ],
)
def test_an_entry_harvest_cannot_honour_is_refused_with_why(name, entry, why):
    with pytest.raises(Unsupported, match=why):
        convert(name, entry, "UTC")


def test_the_timezone_is_the_apps_or_utc():
    app = Celery("tz", set_as_current=False)
    app.conf.beat_schedule = {"x": {"task": "t", "schedule": 60}}
    assert beat_schedule_of(app) == ({"x": {"task": "t", "schedule": 60}}, "UTC")
    app.conf.timezone = "Europe/Paris"
    assert beat_schedule_of(app)[1] == "Europe/Paris"
    assert beat_schedule_of({"y": {}}) == ({"y": {}}, "UTC")
    with pytest.raises(InvalidSchedule, match="a Celery app or its beat_schedule"):
        beat_schedule_of(42)


def test_the_refusal_names_each_entry_and_pickles():
    err = BeatImportRefused({"b": "solar", "a": "relative"})
    assert str(err) == "import-beat refused 2 entries and wrote nothing:\n  'a': relative\n  'b': solar"
    again = pickle.loads(pickle.dumps(err))
    assert again.refused == {"a": "relative", "b": "solar"} and str(again) == str(err)
    assert isinstance(err, ValueError)


# ── the import, embedded ─────────────────────────────────────────────────────────────────────
@workflow(name="ib.report")
async def ib_report(ctx: WorkflowContext, data: object) -> object:
    return data


def beat_config() -> dict[str, Any]:
    return {
        "nightly": {"task": "ib.add", "schedule": crontab(minute=0, hour=2), "args": (1, 2)},
        "often": {
            "task": "ib.add",
            "schedule": timedelta(seconds=1),
            "args": [3, 4],
            "options": {"queue": "q"},
        },
        "sunrise": {"task": "ib.add", "schedule": _solar()},
    }


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'b.db'}").register(ib_report)
    harvest.migrate()
    harvest.adopt_task("ib.add", queue="adds")
    yield harvest
    harvest.store.dispose()


def _names(h: Harvest) -> list[str]:
    return [s["name"] for s in h.list_schedules()]


def test_an_unsupported_entry_is_refused_by_name_and_nothing_is_written(h):
    with pytest.raises(BeatImportRefused) as info:
        h.import_beat(beat_config())
    assert list(info.value.refused) == ["sunrise"] and "solar" in info.value.refused["sunrise"]
    assert _names(h) == []
    done = h.import_beat(beat_config(), skip_unsupported=True)
    assert (done.created, done.unchanged, done.updated) == (["nightly", "often"], [], [])
    assert list(done.refused) == ["sunrise"]
    views = {s["name"]: s for s in h.list_schedules()}
    assert {
        k: views["nightly"][k] for k in ("target", "workflow", "cron", "timezone", "queue", "overlap")
    } == {
        "target": "task",
        "workflow": "ib.add",
        "cron": "0 2 * * *",
        "timezone": "UTC",
        "queue": None,
        "overlap": "skip",
    }
    assert (views["often"]["every_seconds"], views["often"]["queue"]) == (1, "q")


def test_a_task_that_is_not_adopted_is_refused_like_an_unknown_activity(h):
    config = {
        "x": {"task": "ib.nope", "schedule": 60},
        "y": {"task": "ib.add", "schedule": 60, "args": [{1}]},
    }
    with pytest.raises(BeatImportRefused) as info:
        h.import_beat(config)
    assert info.value.refused["x"].startswith("UnknownActivity: unknown task 'ib.nope'")
    assert info.value.refused["y"].startswith("PayloadNotSerializable")
    assert _names(h) == []


def test_a_second_import_leaves_identical_schedules_alone_and_refuses_changed_ones(h):
    h.import_beat(beat_config(), skip_unsupported=True)
    before = {s["name"]: s["spec_version"] for s in h.list_schedules()}
    again = h.import_beat(beat_config(), skip_unsupported=True)
    assert (again.created, again.unchanged, again.updated) == ([], ["nightly", "often"], [])
    assert {s["name"]: s["spec_version"] for s in h.list_schedules()} == before

    changed = beat_config()
    changed["nightly"]["schedule"] = crontab(minute=0, hour=3)
    changed["often"]["args"] = [5, 6]
    changed["new"] = {"task": "ib.add", "schedule": 60}
    with pytest.raises(BeatImportRefused) as info:
        h.import_beat(changed, skip_unsupported=True)  # skipping does not cover a changed one
    assert set(info.value.refused) == {"nightly", "often"}
    assert "cron '0 2 * * *' -> '0 3 * * *'" in info.value.refused["nightly"]
    assert "args/kwargs" in info.value.refused["often"] and "--update" in info.value.refused["often"]
    assert _names(h) == ["nightly", "often"]  # "new" was not written either
    assert h.describe_schedule("nightly")["cron"] == "0 2 * * *"

    done = h.import_beat(changed, skip_unsupported=True, update=True)
    assert (done.created, done.unchanged, done.updated) == (["new"], [], ["nightly", "often"])
    assert h.describe_schedule("nightly")["cron"] == "0 3 * * *"
    assert h.describe_schedule("nightly")["spec_version"] == before["nightly"] + 1
    fired = _fire(h, "often")
    assert h.describe(fired).input["call"] == {"args": [5, 6], "kwargs": {}}


def test_an_imported_schedule_is_edited_like_any_other(h):
    h.import_beat(beat_config(), skip_unsupported=True)
    assert h.update_schedule("often", every=timedelta(seconds=5), overlap="allow_all") == 2
    view = h.describe_schedule("often")
    assert (view["target"], view["workflow"], view["every_seconds"], view["overlap"]) == (
        "task",
        "ib.add",
        5,
        "allow_all",
    )
    # an operator's overlap is not Beat's business: a re-import compares only what Beat defines
    changed = h.import_beat(beat_config(), skip_unsupported=True, update=True)
    assert changed.updated == ["often"] and h.describe_schedule("often")["overlap"] == "allow_all"
    assert h.describe_schedule("often")["every_seconds"] == 1


def test_a_name_held_by_a_workflow_schedule_is_refused(h):
    h.create_schedule("nightly", workflow="ib.report", every=timedelta(hours=1))
    with pytest.raises(BeatImportRefused) as info:
        h.import_beat(beat_config(), update=True, skip_unsupported=False)
    assert "taken by a schedule of workflow 'ib.report'" in info.value.refused["nightly"]
    assert _names(h) == ["nightly"] and h.describe_schedule("nightly")["target"] == "workflow"


def test_a_bad_overlap_is_refused_before_anything(h):
    with pytest.raises(InvalidSchedule, match="overlap"):
        h.import_beat(beat_config(), skip_unsupported=True, overlap="cancel_other")
    assert _names(h) == []


def _fire(h: Harvest, name: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        fired = [r for f in h.fire_schedules() if f.name == name for r in f.fired]
        if fired:
            return fired[0]
        time.sleep(0.05)
    raise AssertionError(f"{name} never fired")


def test_an_imported_tick_starts_the_task_run_with_the_tick_id(h):
    h.import_beat(beat_config(), skip_unsupported=True)
    run_id = _fire(h, "often")
    assert run_id.startswith("often@")
    nominal = datetime.strptime(run_id[len("often@") :], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    run = h.describe(run_id)
    assert run.workflow_type == START_TASK
    assert run.input == {"task": "ib.add", "call": {"args": [3, 4], "kwargs": {}}, "queue": "q",
                         "countdown": None, "eta": None}  # fmt: skip
    started = h.history(run_id)[0]
    assert started.event.scheduled_for == nominal.isoformat()  # type: ignore[attr-defined]
    # the task cannot run here (an adopted task needs a Celery worker), so the run stays open:
    # under overlap "skip" the following ticks are skipped, judged on the run id like a workflow's
    deadline = time.monotonic() + 10
    while h.describe_schedule("often")["skipped"] == 0 and time.monotonic() < deadline:
        assert all(not f.fired for f in h.fire_schedules() if f.name == "often")
        time.sleep(0.05)
    view = h.describe_schedule("often")
    assert view["skipped"] >= 1 and (view["fired"], view["last_run_id"]) == (1, run_id)
    assert h.describe_schedule("often")["last_run_status"] == "RUNNING"


def test_a_process_that_did_not_adopt_the_task_fires_none_of_its_schedules(h, tmp_path):
    h.import_beat(beat_config(), skip_unsupported=True)
    other = Harvest(h.database_url)  # same database and decision queue, no adopted task
    deadline = time.monotonic() + 2.5  # "often" is due at least twice in this time
    while time.monotonic() < deadline:
        assert other.fire_schedules() == []
        time.sleep(0.1)
    assert h.describe_schedule("often")["fired"] == 0
    other.store.dispose()


def test_a_trigger_of_a_task_schedule_starts_the_task_run(h):
    h.import_beat(beat_config(), skip_unsupported=True)
    run_id = h.trigger_schedule("nightly")
    assert run_id is not None and run_id.startswith("nightly@manual-")
    assert h.describe(run_id).input["call"] == {"args": [1, 2], "kwargs": {}}


def test_start_task_records_scheduled_for(h):
    when = datetime(2026, 12, 1, 2, tzinfo=UTC)
    run_id = h.start_task("ib.add", 1, 2, scheduled_for=when)
    assert h.history(run_id)[0].event.scheduled_for == when.isoformat()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="aware datetime"):
        h.start_task("ib.add", 1, 2, scheduled_for=datetime(2026, 12, 1))


# ── the CLI ──────────────────────────────────────────────────────────────────────────────────
DB: list[Path] = []
app = Celery("ib_cli", set_as_current=False)
app.conf.timezone = "Europe/Paris"
app.conf.beat_schedule = beat_config()


def cli_harvest() -> Harvest:
    """The ``-A`` of the CLI test (called by the CLI: a factory)."""
    harvest = Harvest(f"sqlite:///{DB[-1]}")
    harvest.adopt_task("ib.add")
    return harvest


def test_the_cli_refuses_by_name_then_skips_and_imports(tmp_path, capsys):
    DB.append(tmp_path / "cli.db")
    Harvest(f"sqlite:///{DB[-1]}").migrate()
    base = ["-A", "tests.unit.test_import_beat:cli_harvest", "schedules", "import-beat"]
    assert main([*base, "tests.unit.test_import_beat:app"]) == 2
    err = capsys.readouterr().err
    assert "refused 1 entry and wrote nothing" in err and "'sunrise': solar" in err
    assert main([*base, "tests.unit.test_import_beat:app", "--skip-unsupported"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == ["created nightly", "created often"] and "skipped sunrise: solar" in out
    assert main([*base, "tests.unit.test_import_beat", "--skip-unsupported", "--json"]) == 0  # attr: app
    assert '"unchanged": [\n    "nightly",\n    "often"\n  ]' in capsys.readouterr().out
    assert cli_harvest().describe_schedule("nightly")["timezone"] == "Europe/Paris"
    assert main([*base, "tests.unit.nope:app"]) == 2
    assert "cannot import 'tests.unit.nope'" in capsys.readouterr().err
