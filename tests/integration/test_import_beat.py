"""import-beat on real Postgres, Redis, a Celery worker and a ``harvest scheduler`` process: a
Beat config with a crontab entry, a timedelta entry and one unsupported entry is refused by name
and writes nothing; with ``--skip-unsupported`` it creates the two, a second import leaves them
alone, and the every-2-seconds entry's ticks run the task's own body on a worker, as durable
runs named by the tick. Nothing is asserted on time."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery._core.invocation import START_TASK
from tests.integration import test_schedules as schedules_tests
from tests.integration.conftest import DATABASE_URL, ROOT
from tests.integration.test_schedules import Scheduler, _env, _row, _ticks, _wait

pytestmark = pytest.mark.integration
NAMES = ("beat-nightly", "beat-often", "beat-sunrise")
# the schedules tests' fixtures: their app, its worker, and each test's schedules deleted after it
sched = schedules_tests.sched
sched_worker = schedules_tests.sched_worker
no_schedule_left = schedules_tests.no_schedule_left


def _import_beat(tag: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harvest_celery",
            "-A",
            "tests.integration.sched_app:harvest",
            "schedules",
            "import-beat",
            "tests.integration.beat_config:app",
            *flags,
        ],
        cwd=ROOT,
        env=_env(HARVEST_TEST_BEAT_TAG=tag),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _stored() -> list[dict[str, Any]]:
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT * FROM harvest_schedules WHERE name IN :names ORDER BY name").bindparams(
                sa.bindparam("names", expanding=True)
            ),
            {"names": list(NAMES)},
        ).all()
    engine.dispose()
    return [dict(r._mapping) for r in rows]


def test_import_beat_refuses_by_name_then_skips_and_its_task_ticks_run(
    sched, sched_worker, tag, redis_client
):
    refused = _import_beat(tag)
    assert refused.returncode == 2, refused.stderr
    assert "refused 1 entry and wrote nothing" in refused.stderr
    assert "'beat-sunrise': solar schedules are refused" in refused.stderr
    assert _stored() == []  # nothing was written

    done = _import_beat(tag, "--skip-unsupported")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "created beat-nightly",
        "created beat-often",
        "skipped beat-sunrise: solar schedules are refused: harvest has no sunrise/sunset ticks",
    ]
    stored = {r["name"]: r for r in _stored()}
    assert sorted(stored) == ["beat-nightly", "beat-often"]
    nightly, often = stored["beat-nightly"], stored["beat-often"]
    assert (nightly["target"], nightly["workflow"], nightly["cron"], nightly["timezone"]) == (
        "task",
        "sched.beat_add",
        "0 2 * * *",
        "Europe/Paris",
    )
    assert (often["target"], often["every_seconds"], often["cron"]) == ("task", 2, None)
    assert often["input"] != {"args": [3, 4], "kwargs": {"tag": tag}}  # stored through the codec
    assert sched.describe_schedule("beat-often")["queue"] is None  # the adopted task's queue

    again = _import_beat(tag, "--skip-unsupported", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["unchanged"] == ["beat-nightly", "beat-often"]
    assert {r["name"]: r["spec_version"] for r in _stored()} == {"beat-nightly": 1, "beat-often": 1}

    scheduler = Scheduler(f"beat-{tag}")
    sched_worker.start()  # runs the task; its sweeper fires ticks too, beside the scheduler
    scheduler.start()
    try:
        _wait(
            lambda: sum(r["status"] == "COMPLETED" for r in _row("beat-often")["runs"]) >= 2,
            "two completed task ticks",
        )
    finally:
        scheduler.stop()
        sched_worker.stop()
    state = _row("beat-often")
    completed = [r["id"] for r in state["runs"] if r["status"] == "COMPLETED"]
    nominal = set(_ticks("beat-often", 2, state["row"]["created_at"], state["row"]["last_tick"]))
    assert set(completed) <= nominal  # each run is named by its nominal tick
    for run_id in completed:
        run = sched.describe(run_id)
        assert run.workflow_type == START_TASK
        assert run.result == 7  # the task's own return value
    calls = [json.loads(x) for x in redis_client.lrange(f"beat-effects:{tag}", 0, -1)]
    assert len(calls) >= len(completed) and all(c == [3, 4] for c in calls)  # the body ran
    assert _row("beat-nightly")["runs"] == []  # 02:00 Paris is not now's business
