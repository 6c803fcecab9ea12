"""Observability on real Postgres, Redis and Celery worker processes (issue 29, items 6-8):

* the eager path as Celery code sees it: with ``task_prerun`` / ``task_postrun`` /
  ``task_failure`` listeners connected, every attempt runs exactly once (one ``ActivityStarted``,
  one body run), and eager and delivered attempts look the same to the listeners and to
  ``current_task``;
* harvest's run lines in a worker's log carry ``execution_id`` (and the attempt's fields), as
  one JSON object per line under ``HARVEST_LOG_FORMAT=json``, with Celery's own lines unchanged;
* the steps and schedule-to-start metrics as the workers serve them.

The app is ``tests/integration/obs_app.py`` (its docstring draws the four attempts).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from .conftest import ADMIN_URL, Worker, wait_for, workers_decide

APP = "tests.integration.obs_app"
_PORT = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808")) + 4  # beside the session's two
PORTS = {"obs-a": _PORT, "obs-b": _PORT + 1}
EAGER = {"obs_a_ok": True, "obs_b_ok": False, "obs_b_fail": True, "obs_a_fail": False}


def _fresh_database(name: str) -> None:
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": name}
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()


@pytest.fixture(scope="module")
def env(redis_client: Any) -> Iterator[SimpleNamespace]:
    """Worker A (decisions and ``obs_a``, JSON logs) and worker B (``obs_b``, text logs)."""
    from tests.integration import obs_app

    _fresh_database(obs_app.DATABASE_URL.rsplit("/", 1)[1])
    obs_app.harvest.migrate()
    a = Worker(
        "obs-a",
        f"{obs_app.DECIDE},{obs_app.QUEUE_A}",
        {"HARVEST_LOG_FORMAT": "json", "HARVEST_METRICS_PORT": str(PORTS["obs-a"])},
        app=APP,
    )
    b = Worker("obs-b", obs_app.QUEUE_B, {"HARVEST_METRICS_PORT": str(PORTS["obs-b"])}, app=APP)
    try:
        a.start()
        b.start()
        yield SimpleNamespace(app=obs_app, redis=redis_client, a=a, b=b)
    finally:
        a.stop()
        b.stop()


@pytest.fixture(scope="module")
def run(env: SimpleNamespace) -> SimpleNamespace:
    rid = f"obs-{uuid.uuid4().hex[:10]}"
    with workers_decide(env.app.harvest):  # worker A's decide task runs obs_a_ok eagerly
        env.app.harvest.start_workflow("obs_flow", 1, execution_id=rid)
    assert env.app.harvest.result(rid, timeout=60) == 23
    history = env.app.harvest.history(rid)
    scheduled = {
        e.event.activity_id: e.event.activity_name for e in history if e.event.type == "ActivityScheduled"
    }
    started = [scheduled[e.event.activity_id] for e in history if e.event.type == "ActivityStarted"]
    # The last attempt's outcome closes the run inside the task, before Celery's tracer sends its
    # task_failure and task_postrun: result() can return before the listeners have written them.
    postruns = len(EAGER)
    key = f"obs:seen:{rid}"
    wait_for(
        lambda: [json.loads(x)["signal"] for x in env.redis.lrange(key, 0, -1)].count("postrun") >= postruns,
        timeout=30,
        what="every attempt's task_postrun",
    )
    seen = [json.loads(x) for x in env.redis.lrange(key, 0, -1)]
    return SimpleNamespace(rid=rid, scheduled=scheduled, started=started, seen=seen)


def _by_attempt(run: SimpleNamespace) -> dict[str, list[dict[str, Any]]]:
    """What was seen of each activity's attempt, in order (body and signals), by activity name."""
    names = {f"{run.rid}:{aid}:1": name for aid, name in run.scheduled.items()}
    out: dict[str, list[dict[str, Any]]] = {}
    for item in run.seen:
        out.setdefault(names[item["task_id"]], []).append(item)
    return out


def test_every_attempt_runs_once_with_the_prerun_listener_connected(
    env: SimpleNamespace, run: SimpleNamespace
) -> None:
    assert sorted(run.started) == sorted(EAGER), run.started  # one ActivityStarted each
    seen = _by_attempt(run)
    for name, eager in EAGER.items():
        bodies = [s for s in seen[name] if s["signal"] == "body"]
        assert len(bodies) == 1, (name, seen[name])
        assert bodies[0]["eager"] is eager, (name, bodies[0])  # the run drew both paths
    # and no second claim was tried: harvest's own prerun hook skipped the eager requests (a
    # second claim would be refused, and logged so, by one of the two workers)
    for worker in (env.a, env.b):
        assert not [x for x in _log_since_start(worker) if f"claim of {run.rid}/" in x], worker.name


def test_eager_and_delivered_attempts_look_the_same_to_celery_code(run: SimpleNamespace) -> None:
    seen = _by_attempt(run)
    for name in EAGER:
        order = [s["signal"] for s in seen[name]]
        failing = name.endswith("_fail")
        assert order == (
            ["prerun", "body", "failure", "postrun"] if failing else ["prerun", "body", "postrun"]
        ), (
            name,
            order,
        )
        aid = next(a for a, n in run.scheduled.items() if n == name)
        for item in seen[name]:
            # current_task is the attempt itself, in the body and in every listener
            assert item["current"] == item["task_id"] == f"{run.rid}:{aid}:1", (name, item)
            assert item["current_name"] == name
            assert item["eager"] is EAGER[name]  # the mark is in delivery_info on the eager path only
            assert item["queue"] == ("obs_a" if name.startswith("obs_a") else "obs_b")
            assert item["args"] == [run.rid, aid, 1]
        assert len({item["pid"] for item in seen[name]}) == 1  # one process ran and signalled it
        postrun = next(s for s in seen[name] if s["signal"] == "postrun")
        assert postrun["state"] == ("FAILURE" if failing else "SUCCESS")
        if failing:
            assert next(s for s in seen[name] if s["signal"] == "failure")["exception"] == "ValueError"


def _log_since_start(worker: Worker) -> list[str]:
    text = worker.log.read_text(errors="replace")
    return text.rsplit("===== start", 1)[1].splitlines()[1:]


def test_run_lines_in_a_workers_log_carry_the_run_as_json(env: SimpleNamespace, run: SimpleNamespace) -> None:
    aid = next(a for a, n in run.scheduled.items() if n == "obs_a_fail")
    # a duplicate of a finished attempt's message: A's claim refuses it and says so at INFO
    env.app.app.send_task("obs_a_fail", args=[run.rid, aid, 1], queue=env.app.QUEUE_A)

    def refused() -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in _log_since_start(env.a) if x.startswith("{")]
        return [x for x in lines if "refused" in x["message"] and x.get("execution_id") == run.rid]

    line = wait_for(refused, timeout=30, what="the refused claim's JSON line in worker A's log")[0]
    assert line["logger"] == "harvest_celery" and line["level"] == "INFO"
    assert (line["activity_id"], line["attempt"]) == (aid, 1)
    lines = _log_since_start(env.a)
    ours = [json.loads(x) for x in lines if x.startswith("{")]  # every one parses
    assert all(x["logger"].startswith("harvest_celery") for x in ours)
    sweeper = [x for x in ours if x["message"].startswith("harvest sweeper started")]
    assert sweeper and "execution_id" not in sweeper[0]  # a process-wide line carries no run
    plain = [x for x in lines if not x.startswith("{")]
    assert any(" ready." in x and x.lstrip().startswith("[") for x in plain)  # Celery's format, unchanged
    assert not [x for x in plain if "harvest sweeper started" in x or "claim of" in x]
    # worker B keeps text: its harvest lines go through the root logger's (Celery's) format
    assert not [x for x in _log_since_start(env.b) if x.startswith('{"time"')]


def _scrape(port: int, metric: str, **labels: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_steps_and_schedule_to_start_as_the_workers_serve_them(run: SimpleNamespace) -> None:
    def total(metric: str, **labels: str) -> float:
        return sum(_scrape(port, metric, **labels) for port in PORTS.values())

    # the two completions; the failed attempts are not steps
    assert total("harvest_activity_completed_total", workflow="obs_flow") == 2
    assert total("harvest_activity_completed_total", workflow="obs_flow", queue="obs_b") == 1
    # every first attempt's lag once, by the process that claimed it
    assert total("harvest_activity_schedule_to_start_seconds_count", queue="obs_a") == 2
    assert total("harvest_activity_schedule_to_start_seconds_count", queue="obs_b") == 2
    assert 0 <= total("harvest_activity_schedule_to_start_seconds_sum") < 30
