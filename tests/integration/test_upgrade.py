"""Rolling upgrade from the build that was deployed before the restructure (``DEPLOYED``, schema
head 0003): its schema migrated to head with runs in flight, then the current workers finishing
them; then a worker of that build and a current one side by side on one migrated database.

The deployed build is taken from git history into a temporary directory (``git archive``), so
this runs on any full clone (CI's included) and never touches the working tree. Both builds run
tests/integration/upgrade_app.py, on their own database and their own queues."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from .conftest import ADMIN_URL, BROKER_URL, DB_NAME, ROOT, Worker, wait_for

pytestmark = pytest.mark.integration

# The last commit before the layer restructure (a497510): what was deployed, schema head 0003.
DEPLOYED = "3c567460183d3f7c366dcf9e7eef0e4ac6582fd1"
UP_DB = f"{DB_NAME}_upgrade"
UP_URL = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{UP_DB}"
TERMINAL = {"WorkflowCompleted", "WorkflowFailed"}


def _recreate_database() -> None:
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": UP_DB}
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{UP_DB}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{UP_DB}"'))
    admin.dispose()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deployed build's package, with the upgrade app beside it."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs the git history (a clone, not an unpacked archive)")
    where = tmp_path_factory.mktemp("deployed")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", DEPLOYED, "harvest_celery"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    shutil.copy(ROOT / "tests" / "integration" / "upgrade_app.py", where / "upgrade_app.py")
    return where


@pytest.fixture(scope="module")
def env(redis_client: Any) -> Iterator[dict[str, str]]:
    _recreate_database()
    values = {"HARVEST_UPGRADE_DATABASE_URL": UP_URL, "HARVEST_TEST_BROKER_URL": BROKER_URL}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    for queue in ("up_decide", "up_a", "up_b"):
        redis_client.delete(queue)
    yield values
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def old_build(deployed: Path, script: str, *args: str) -> str:
    """Run ``script`` with the deployed build (its checkout first on the path, and the cwd)."""
    env = dict(os.environ, PYTHONPATH=str(deployed))
    env.pop("HARVEST_METRICS_PORT", None)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=deployed,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


MIGRATE = """
import harvest_celery, sys
from harvest_celery._migrate import upgrade
assert harvest_celery.__file__.startswith(sys.argv[1]), harvest_celery.__file__
upgrade(sys.argv[2])
"""

START = """
import json, sys
from upgrade_app import harvest
if sys.argv[1] == "unsent":  # crash between the commit and the send: the rows stay in the outbox
    harvest.runtime.flush = lambda messages: None
for run_id, data in json.loads(sys.argv[2]):
    harvest.start_workflow("up_order", data, execution_id=run_id)
harvest.runtime.flush_sent()  # sent rows deleted now, not by the background batch
"""


def old_start(deployed: Path, runs: dict[str, dict[str, Any]], mode: str = "sent") -> None:
    old_build(deployed, START, mode, json.dumps(list(runs.items())))


def plan(tag: str, prefix: str, n: int, **extra: Any) -> dict[str, dict[str, Any]]:
    return {f"{prefix}-{tag}-{i}": {"tag": tag, "run": f"{prefix}-{tag}-{i}", **extra} for i in range(n)}


def history_types(h: Any, run_id: str) -> list[str]:
    return [e.event.type for e in h.store.history(run_id)]


def check_history(h: Any, run_id: str) -> None:
    """seq contiguous from 0, one terminal event and last, one outcome per scheduled activity."""
    history = h.store.history(run_id)
    assert [e.seq for e in history] == list(range(len(history))), run_id
    types = [e.event.type for e in history]
    assert sum(t in TERMINAL for t in types) == 1 and types[-1] in TERMINAL, (run_id, types)
    scheduled = [e.event.activity_id for e in history if e.event.type == "ActivityScheduled"]
    outcomes = [
        e.event.activity_id for e in history if e.event.type in ("ActivityCompleted", "ActivityFailed")
    ]
    assert sorted(scheduled) == sorted(outcomes) and len(set(outcomes)) == len(outcomes), (run_id, types)


def bodies(redis_client: Any, tag: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in redis_client.lrange(f"upgrade:{tag}", 0, -1)]


def finish(h: Any, runs: dict[str, dict[str, Any]], failing: set[str]) -> None:
    """Signal every run (``failing`` ones fail at shipping), then wait for each outcome."""
    for run_id in runs:
        wait_for(
            lambda r=run_id: "ActivityCompleted" in history_types(h, r),
            timeout=30,
            what=f"{run_id} to wait for its signal",
        )
        h.signal(run_id, "go", {"fail": run_id in failing})
    for run_id in runs:
        if run_id in failing:
            with pytest.raises(Exception, match=f"no courier for {run_id}"):
                h.result(run_id, timeout=30)
        else:
            assert h.result(run_id, timeout=30) == {"charge": f"ch-{run_id}", "shipped": f"shipped {run_id}"}
        check_history(h, run_id)


def check_bodies(
    redis_client: Any, tag: str, runs: dict[str, Any], failing: set[str]
) -> list[dict[str, Any]]:
    """Each body ran exactly once per run: charge, ship, and the refund of a failed one only."""
    ran = bodies(redis_client, tag)
    for run_id in runs:
        names = sorted(b["name"] for b in ran if b["run"] == run_id)
        expected = ["up_charge", "up_refund", "up_ship"] if run_id in failing else ["up_charge", "up_ship"]
        assert names == expected, (run_id, names)
    return ran


def test_runs_in_flight_on_the_deployed_schema_finish_after_the_upgrade(deployed, env, redis_client):
    tag = uuid.uuid4().hex[:8]
    old_build(deployed, MIGRATE, str(deployed), UP_URL)
    engine = sa.create_engine(UP_URL)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM harvest_alembic_version")).scalar() == "0003"

    # the deployed build at work: charges done (waiting for the signal), a charge dispatched to a
    # queue its worker does not consume (the message waits in Redis), starts whose messages were
    # never sent (rows left in its outbox)
    old = Worker(f"up-old-{tag}", "up_decide,up_a", app="upgrade_app", root=deployed)
    waiting, queued, unsent = plan(tag, "w", 3), plan(tag, "q", 2, first_queue="up_b"), plan(tag, "u", 2)
    old.start()
    try:
        old_start(deployed, {**waiting, **queued})
        with engine.connect() as conn:
            wait_for(
                lambda: (
                    conn.execute(
                        sa.text("SELECT count(*) FROM harvest_events WHERE type = 'ActivityCompleted'")
                    ).scalar()
                    == 3
                    and conn.execute(
                        sa.text("SELECT count(*) FROM harvest_events WHERE type = 'ActivityScheduled'")
                    ).scalar()
                    == 5
                ),
                timeout=30,
                what="the deployed build's charges",
            )
            # its sent rows are deleted in batches every 0.5 s: let it finish before the stop
            wait_for(
                lambda: conn.execute(sa.text("SELECT count(*) FROM harvest_outbox")).scalar() == 0,
                timeout=10,
                what="the deployed build's outbox to drain",
            )
    finally:
        old.stop()
    old_start(deployed, unsent, mode="unsent")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM harvest_outbox")).scalar() == 2

    # the upgrade, then the current build only
    from harvest_celery._store.migrate import upgrade

    upgrade(UP_URL)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT execution_id, task_name FROM harvest_outbox")).all()
    assert sorted(rows) == sorted((run_id, "harvest.decide") for run_id in unsent)  # backfilled
    from tests.integration.upgrade_app import harvest as h

    new = Worker(f"up-new-{tag}", "up_decide,up_a,up_b", app="tests.integration.upgrade_app")
    new.start()
    try:
        runs = {**waiting, **queued, **unsent}
        failing = {f"w-{tag}-0", f"q-{tag}-1", f"u-{tag}-0"}
        finish(h, runs, failing)
    finally:
        new.stop()
    ran = check_bodies(redis_client, tag, runs, failing)
    assert {b["run"] for b in ran if b["build"] == "old"} == set(waiting)  # only their charges
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM harvest_outbox")).scalar() == 0  # relayed
    engine.dispose()


def test_a_deployed_worker_and_a_current_one_side_by_side(deployed, env, redis_client):
    """On the migrated database, the deployed build's worker takes the charges and refunds
    (up_a), the current one the shipping (up_b); both take decisions, of runs either started."""
    from harvest_celery._store.migrate import upgrade

    upgrade(UP_URL)  # at head already after the test above; from empty when run alone
    tag = uuid.uuid4().hex[:8]
    from tests.integration.upgrade_app import harvest as h

    old = Worker(f"up-old-{tag}", "up_decide,up_a", app="upgrade_app", root=deployed)
    new = Worker(f"up-new-{tag}", "up_decide,up_b", app="tests.integration.upgrade_app")
    started_old, started_new = plan(tag, "o", 3), plan(tag, "n", 3)
    old.start()
    new.start()
    try:
        old_start(deployed, started_old)
        for run_id, data in started_new.items():
            h.start_workflow("up_order", data, execution_id=run_id)
        runs = {**started_old, **started_new}
        failing = {f"o-{tag}-0", f"n-{tag}-2"}
        finish(h, runs, failing)
    finally:
        old.stop()
        new.stop()
    ran = check_bodies(redis_client, tag, runs, failing)
    assert {b["build"] for b in ran if b["name"] == "up_ship"} == {"new"}
    assert {b["build"] for b in ran if b["name"] != "up_ship"} == {"old"}
