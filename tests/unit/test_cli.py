"""The ``harvest`` command line, run in-process against SQLite (embedded mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from harvest_celery import _cli
from harvest_celery._cli import main
from harvest_celery._core import events as ev
from harvest_celery._core.timeline import render_timeline
from harvest_celery._store.store import Store

APP = "tests.unit.cli_app"
ROOT = Path(__file__).resolve().parents[2]
ORDER = json.dumps({"order_id": 5, "items": [{"qty": 2, "price": 3}]})


@pytest.fixture
def db(cli_db):
    """A migrated SQLite database, and the CLI app freshly pointed at it."""
    return cli_db(APP)


def runs(url):
    return Store(url).list()


def test_db_upgrade_creates_tables(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HARVEST_DATABASE_URL", raising=False)
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert main(["--database-url", url, "db", "upgrade"]) == 0
    tables = set(sa.inspect(sa.create_engine(url)).get_table_names())
    assert {
        "harvest_executions",
        "harvest_events",
        "harvest_activity_tasks",
        "harvest_alembic_version",
    } <= tables
    assert "upgraded to head" in capsys.readouterr().out


def test_db_upgrade_without_a_database_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.delenv("HARVEST_DATABASE_URL", raising=False)
    monkeypatch.delenv("HARVEST_APP", raising=False)
    assert main(["db", "upgrade"]) == 2
    assert "harvest: error: no database" in capsys.readouterr().err


def test_demo_runs_the_four_runs(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    summary = out[out.index("summary:") :]
    assert "(a) order_pipeline  COMPLETED" in summary
    assert "(b) checkout        COMPLETED" in summary
    assert "(c) checkout        FAILED     (ActivityError)" in summary
    assert "(d) checkout        CANCELLED  (SagaCompensationFailed)" in summary
    # (c) compensates: the refund is dispatched as a compensation and runs.
    assert "refund_payment #3 queue=payments (compensation)" in out
    assert "ch_3=refunded" in out
    # (d) the known limitation, stated honestly: nothing was undone.
    assert "expected ActivityScheduled(release_reservation), got WorkflowCancelled" in out
    assert "ch_4=charged, rsv_4=reserved" in out
    assert "known limitation" in out
    assert "demo-checkout-4  checkout  CANCELLED (cancel branch failed: SagaCompensationFailed" in out
    # (d2) the same cancel, cooperative: the release and the refund run as activities
    assert "(d2) checkout        CANCELLED  (Cancelled)" in summary
    assert "ch_7=refunded, rsv_7=released" in out


def test_start_then_show_prints_the_timeline(db, capsys):
    assert main(["--app", APP, "start", "order_pipeline", ORDER, "--id", "o-5"]) == 0
    assert capsys.readouterr().out.strip() == "o-5"
    assert main(["--app", APP, "show", "o-5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "o-5  order_pipeline  COMPLETED"
    assert 'result    "order 5 confirmed for 6"' in out
    scheduled = [line for line in lines if "ActivityScheduled" in line]
    assert len(scheduled) == 3
    assert "validate_order #1 queue=default" in scheduled[0]
    assert "price_order #2 queue=pricing" in scheduled[1]
    started = next(line for line in lines if "ActivityStarted" in line)
    assert "attempt=1 worker=" in started
    assert any("+0.000s  WorkflowStarted" in line for line in lines)


def test_show_and_list_need_only_the_database(db, capsys):
    assert main(["--app", APP, "start", "order_pipeline", ORDER, "--id", "o-6"]) == 0
    capsys.readouterr()
    assert main(["--database-url", db, "show", "o-6"]) == 0
    assert "ActivityCompleted" in capsys.readouterr().out


def test_list_shows_the_run(db, capsys):
    assert main(["--app", APP, "start", "order_pipeline", ORDER, "--id", "o-7"]) == 0
    capsys.readouterr()
    assert main(["--database-url", db, "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["ID", "WORKFLOW", "STATUS"]
    assert row.split()[:3] == ["o-7", "order_pipeline", "COMPLETED"]
    assert main(["--database-url", db, "list", "--status", "failed"]) == 0
    assert "(no runs)" in capsys.readouterr().out
    assert main(["--database-url", db, "list", "--nd-blocked"]) == 0
    assert "(no runs)" in capsys.readouterr().out


def test_result_prints_json(db, capsys):
    assert main(["--app", APP, "start", "order_pipeline", ORDER, "--id", "o-8", "--wait", "5"]) == 0
    assert capsys.readouterr().out.splitlines() == ["o-8", '"order 5 confirmed for 6"']
    assert main(["--app", APP, "result", "o-8"]) == 0
    assert capsys.readouterr().out.strip() == '"order 5 confirmed for 6"'


def test_result_of_a_failed_run_exits_1(db, capsys):
    bad = json.dumps({"order_id": 9, "items": []})  # validate_order raises ValueError
    assert main(["--app", APP, "start", "order_pipeline", bad, "--id", "o-9", "--wait", "10"]) == 1
    assert "workflow o-9 failed: ActivityError" in capsys.readouterr().err


def test_bad_json_input_is_rejected_before_anything_is_written(db, capsys):
    assert main(["--app", APP, "start", "order_pipeline", "{order: 1}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harvest: error: INPUT_JSON is not valid JSON")
    assert "{order: 1}" in err
    assert runs(db) == []


def test_bad_json_signal_payload_names_the_argument(db, capsys):
    assert main(["--app", APP, "signal", "nope", "go", "[1,"]) == 2
    assert "harvest: error: PAYLOAD_JSON is not valid JSON" in capsys.readouterr().err


def test_unknown_workflow_is_rejected_before_anything_is_written(db, capsys):
    assert main(["--app", APP, "start", "no_such_workflow", "{}"]) == 2
    assert "harvest: error: unknown workflow 'no_such_workflow'" in capsys.readouterr().err
    assert runs(db) == []


def test_show_unknown_id_exits_2(db, capsys):
    assert main(["--database-url", db, "show", "missing"]) == 2
    assert capsys.readouterr().err.strip() == "harvest: error: no execution with id 'missing'"


def test_cancel_a_finished_run_exits_2(db, capsys):
    assert main(["--app", APP, "start", "order_pipeline", ORDER, "--id", "o-10"]) == 0
    assert main(["--app", APP, "cancel", "o-10", "--reason", "too late"]) == 2
    assert "cannot cancel execution 'o-10'" in capsys.readouterr().err


def test_commands_that_run_workflows_need_an_app(db, capsys):
    assert main(["--database-url", db, "start", "order_pipeline", ORDER]) == 2
    assert "needs --app" in capsys.readouterr().err
    assert runs(db) == []


def test_unimportable_app_is_a_clear_error(db, capsys):
    assert main(["--app", "no.such.module:harvest", "start", "order_pipeline", ORDER]) == 2
    assert "cannot import 'no.such.module'" in capsys.readouterr().err


def test_worker_execs_celery_on_default_and_decision_queues(db, monkeypatch):
    seen = {}
    monkeypatch.setattr(_cli, "_exec", lambda argv, env: seen.update(argv=argv, env=env))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("HARVEST_CLI_TEST_CELERY", "1")
    assert (
        main(["worker", "-A", f"{APP}:celery_harvest", "--concurrency", "2", "--metrics-port", "9808"]) == 0
    )
    argv = seen["argv"]
    assert argv[:3] == [sys.executable, "-m", "celery"]
    assert argv[3:6] == ["-A", f"{APP}:app", "worker"]
    assert argv[argv.index("-Q") + 1] == "default,harvest"
    assert argv[argv.index("--concurrency") + 1] == "2"
    env = seen["env"]
    assert env["HARVEST_APP"] == f"{APP}:celery_harvest"
    assert env["HARVEST_METRICS_PORT"] == "9808"
    assert os.path.isdir(env["PROMETHEUS_MULTIPROC_DIR"])
    os.rmdir(env["PROMETHEUS_MULTIPROC_DIR"])


def test_worker_refuses_an_embedded_app(db, capsys):
    assert main(["--app", APP, "worker"]) == 2
    assert "embedded mode" in capsys.readouterr().err


def test_timeline_renders_key_fields():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    history = [
        ev.HistoryEvent(0, ev.WorkflowStarted("checkout", {"order_id": 1}), t0),
        ev.HistoryEvent(
            1, ev.ActivityScheduled("1", "charge_payment", {}, "payments"), t0 + timedelta(seconds=0.1)
        ),
        ev.HistoryEvent(2, ev.ActivityStarted("1", 2, "host:1"), t0 + timedelta(seconds=0.2)),
        ev.HistoryEvent(3, ev.ActivityFailed("1", "RuntimeError", "x" * 500, 2), t0 + timedelta(seconds=0.3)),
        ev.HistoryEvent(4, ev.MarkerRecorded("saga_compensated:1"), t0 + timedelta(seconds=0.4)),
        ev.HistoryEvent(5, ev.SignalReceived("approved", True), t0 + timedelta(seconds=0.5)),
        ev.HistoryEvent(6, ev.WorkflowCancelled("asked"), t0 + timedelta(seconds=1.25)),
    ]
    lines = render_timeline(history)
    assert len(lines) == 7
    assert lines[1].split() == ["1", "+0.100s", "ActivityScheduled", "charge_payment", "#1", "queue=payments"]
    assert "charge_payment #1 attempt=2 worker=host:1" in lines[2]
    assert lines[3].endswith("...") and len(lines[3]) < 160
    assert lines[4].endswith("MarkerRecorded     saga_compensated:1")
    assert "approved payload=true" in lines[5]
    assert '+1.250s  WorkflowCancelled  reason="asked"' in lines[6]


def test_python_m_harvest_celery_demo_runs_with_no_services(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "harvest_celery", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "embedded mode" in proc.stderr
    assert "(d) checkout        CANCELLED" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # nothing left behind in the working directory
