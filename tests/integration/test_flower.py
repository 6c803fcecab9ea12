"""Flower, tested for real: a Flower process reads the test broker's events while a saga fails
a step and compensates, on workers started with task events (``-E``) and eager dispatch on.

What a Celery user sees in Flower (read through its HTTP API): every activity and compensator
under its own task name and its queue, a failed attempt as FAILURE with its exception (the
retry is a new task id), arguments that are ids only (the order's card number is nowhere),
task ids that carry the execution id (so a search for ``order-…:`` finds the run), eager runs
as well as delivered ones, and a refused duplicate claim that never shows SUCCESS or FAILURE.

The app (``flower_app``) has its own queues and its own database: see its docstring.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import WorkflowFailed
from tests.processes import stop_group

from .conftest import ADMIN_URL, BROKER_URL, LOG_DIR, ROOT, Worker, wait_for, workers_decide

pytestmark = pytest.mark.integration

APP = "tests.integration.flower_app"
WAIT = 60.0  # generous: a loaded two-core machine delivers events late


def _fresh_database(name: str) -> None:
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": name}
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Flower:
    """A real ``celery flower`` process on the test broker, its API open (local use only)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = LOG_DIR / "flower.log"

    def start(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT), FLOWER_UNAUTHENTICATED_API="true")
        # --enable_events=False: Flower would otherwise switch task events on in every worker
        # on this broker every 5 s; the test's workers have them on by -E, as docs/flower.md says
        cmd = [
            sys.executable,
            "-m",
            "celery",
            f"--broker={BROKER_URL}",
            "flower",
            f"--port={self.port}",
            "--address=127.0.0.1",
            "--enable_events=False",
        ]
        with open(self.log, "ab") as out:
            out.write(f"\n===== start {time.time()} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def get(self, path: str, **params: str) -> Any:
        """The JSON at ``path`` (None on 404)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}{path}{query}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read().decode())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def wait_listening(self, app: Any) -> None:
        """Until Flower's event receiver is subscribed: events sent before that are lost (the
        Redis transport fans events out with PUBLISH), so a probe event is sent until it shows."""
        assert self.proc is not None

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"flower exited: see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthcheck", timeout=5):
                    return True
            except OSError:
                return False

        wait_for(up, timeout=WAIT, interval=0.2, what=f"flower on port {self.port} (see {self.log})")
        probe = f"probe-{uuid.uuid4().hex}"

        def heard() -> bool:
            with app.events.default_dispatcher() as dispatcher:
                dispatcher.send("task-sent", uuid=probe, name="flower_it.probe")
            return self.get(f"/api/task/info/{probe}") is not None

        wait_for(heard, timeout=WAIT, interval=0.5, what="flower to receive a probe event")

    def stop(self) -> None:
        stop_group(self.proc)


@pytest.fixture(scope="module")
def env(redis_client: Any) -> Iterator[SimpleNamespace]:
    """Flower, and two workers with task events on: A takes decisions and ``flower_a``, B
    ``flower_b``. So the charge's completion on B runs the shipping attempt eagerly on B, and
    the failed shipping's unwind runs the refund eagerly on B; the rest goes through the broker.
    """
    from tests.integration import flower_app

    _fresh_database(flower_app.DATABASE_URL.rsplit("/", 1)[1])
    flower_app.harvest.migrate()
    redis_client.delete(flower_app.POSTRUN)
    flower = Flower()
    workers = [
        Worker("flower-a", f"{flower_app.DECIDE},{flower_app.QUEUE_A}", app=APP, extra_args=["-E"]),
        Worker("flower-b", flower_app.QUEUE_B, app=APP, extra_args=["-E"]),
    ]
    try:
        flower.start()
        for w in workers:
            w.start()
        flower.wait_listening(flower_app.app)
        yield SimpleNamespace(app=flower_app, flower=flower, redis=redis_client)
    finally:
        for w in workers:
            w.stop()
        flower.stop()


def _ran(env: SimpleNamespace, rid: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in env.redis.lrange(f"flower:ran:{rid}", 0, -1)]


def _run_tasks(env: SimpleNamespace, rid: str) -> dict[str, dict[str, Any]]:
    """Flower's tasks whose id carries the run id, as its API lists them."""
    tasks = env.flower.get("/api/tasks") or {}
    return {tid: t for tid, t in tasks.items() if rid in tid}


@pytest.fixture(scope="module")
def run(env: SimpleNamespace) -> SimpleNamespace:
    """One checkout that fails to ship and compensates; returns once Flower has a final state
    for every attempt the bodies say ran."""
    secret = uuid.uuid4().hex
    rid = f"order-{uuid.uuid4().hex[:10]}"
    order = {"order_id": rid, "card": f"4111-{secret}"}
    with workers_decide(env.app.harvest):  # a decide task for Flower to show
        env.app.harvest.start_workflow("flower_checkout", order, execution_id=rid)
    with pytest.raises(WorkflowFailed, match="courier refused"):
        env.app.harvest.result(rid, timeout=WAIT)
    ran = _ran(env, rid)
    names = sorted(r["name"] for r in ran)
    assert names == [
        "charge_card",
        "refund_card",
        "release_stock",
        "reserve_stock",
        "ship_order",
        "ship_order",
    ], ran

    deadline = time.monotonic() + WAIT
    while missing := _unsettled(tasks := _run_tasks(env, rid), ran, rid):
        # a sender's task-sent and a worker's events travel apart: either may arrive first
        if time.monotonic() > deadline:
            raise AssertionError(f"flower, after {WAIT}s, still lacks: {missing}")
        time.sleep(0.5)
    return SimpleNamespace(rid=rid, secret=secret, ran=ran, tasks=tasks)


def _unsettled(tasks: dict[str, dict[str, Any]], ran: list[dict[str, Any]], rid: str) -> list[str]:
    """What Flower does not show yet: a final state for every attempt that ran, the queue of
    every delivered one, and the run's decisions."""
    missing = []
    for r in ran:
        task = tasks.get(r["task_id"]) or {}
        if task.get("state") not in ("SUCCESS", "FAILURE"):
            missing.append(f"{r['task_id']} state={task.get('state')}")
        elif not r["eager"] and task.get("routing_key") is None:
            missing.append(f"{r['task_id']} routing_key")
    decisions = {tid: t for tid, t in tasks.items() if tid.startswith(f"decide:{rid}:")}
    if not decisions:
        missing.append("a decision")
    missing += [
        f"{tid} state={t['state']} routing_key={t['routing_key']}"
        for tid, t in decisions.items()
        if t["state"] != "SUCCESS" or t["routing_key"] is None
    ]
    return missing


def test_every_activity_and_compensator_shows_under_its_own_name_and_queue(env, run):
    queues = {
        name: env.app.harvest.registry.activity(name).default_queue
        for name in ("reserve_stock", "charge_card", "ship_order", "refund_card", "release_stock")
    }
    for r in run.ran:
        task = run.tasks[r["task_id"]]
        assert task["name"] == r["name"]
        assert task["worker"] == r["worker"]
        assert r["queue"] == queues[r["name"]]  # what Celery told the body
        if not r["eager"]:  # the queue column: from the sender's task-sent event
            assert task["routing_key"] == queues[r["name"]], (r, task)
    delivered = {r["name"] for r in run.ran if not r["eager"]}
    # release_stock: a compensator, delivered on its own queue (the first step may run eagerly
    # in the decision task that scheduled it, on a worker consuming its queue)
    assert {"charge_card", "ship_order", "release_stock"} <= delivered
    decisions = [t for tid, t in run.tasks.items() if tid.startswith(f"decide:{run.rid}:")]
    assert decisions and all(t["name"] == "harvest.decide" for t in decisions)
    assert all(t["routing_key"] == env.app.DECIDE and t["args"] == repr([run.rid]) for t in decisions)


def test_a_failed_attempt_is_a_failure_with_its_exception_and_the_retry_is_a_new_task_id(run):
    shipping = sorted(r["task_id"] for r in run.ran if r["name"] == "ship_order")
    activity_id = shipping[0].split(":")[-2]
    assert shipping == [f"{run.rid}:{activity_id}:1", f"{run.rid}:{activity_id}:2"]
    for task_id in shipping:
        task = run.tasks[task_id]
        assert task["state"] == "FAILURE"
        assert task["exception"] == f"ValueError('courier refused {run.rid}')"
        assert "in ship_order" in task["traceback"] and "ValueError: courier refused" in task["traceback"]
    others = [r["task_id"] for r in run.ran if r["name"] != "ship_order"]
    assert all(run.tasks[t]["state"] == "SUCCESS" and run.tasks[t]["result"] == "None" for t in others)


def test_task_args_are_ids_and_no_payload_reaches_flower(env, run):
    for r in run.ran:
        execution_id, activity_id, attempt = r["task_id"].rsplit(":", 2)
        assert run.tasks[r["task_id"]]["args"] == repr([execution_id, activity_id, int(attempt)])
        assert run.tasks[r["task_id"]]["kwargs"] in ("{}", {})
    everything = json.dumps(env.flower.get("/api/tasks"))  # every field of every task
    assert run.secret not in everything
    for r in run.ran:  # and each task's own page
        assert run.secret not in json.dumps(env.flower.get(f"/api/task/info/{r['task_id']}"))


def test_task_ids_carry_the_execution_id_so_a_search_finds_the_run(env, run):
    assert all(r["task_id"].startswith(f"{run.rid}:") for r in run.ran)
    found = env.flower.get("/api/tasks", search=f"{run.rid}:")
    assert {r["task_id"] for r in run.ran} <= set(found)
    assert all(run.rid in tid for tid in found)


def test_eager_runs_are_visible_in_flower(run):
    eager = [r for r in run.ran if r["eager"]]
    assert eager, "the saga was laid out so that some attempts run eagerly"
    for r in eager:
        task = run.tasks[r["task_id"]]
        assert task["name"] == r["name"] and task["worker"] == r["worker"]
        assert task["received"] and task["started"]
        assert task["state"] == ("FAILURE" if r["name"] == "ship_order" else "SUCCESS")


def test_eager_runs_show_their_queue(env, run):
    eager = [r for r in run.ran if r["eager"]]
    assert eager
    for r in eager:
        assert (
            run.tasks[r["task_id"]]["routing_key"]
            == env.app.harvest.registry.activity(r["name"]).default_queue
        )


def test_a_refused_duplicate_claim_never_shows_success_or_failure(env, run):
    """Celery acks an ignored task without a final event: Flower shows it STARTED."""
    first = next(r for r in run.ran if r["name"] == "reserve_stock")
    execution_id, activity_id, attempt = first["task_id"].rsplit(":", 2)
    dup = f"dup-{run.rid}"
    env.app.app.send_task(
        "reserve_stock", args=[execution_id, activity_id, int(attempt)], queue=env.app.QUEUE_A, task_id=dup
    )
    outcome = wait_for(lambda: env.redis.hget(env.app.POSTRUN, dup), timeout=WAIT, what="the duplicate ran")
    assert json.loads(outcome)["state"] == "IGNORED"
    # a later task on the same worker: once Flower has its end, it has every earlier event too
    marker = env.app.ping.apply_async(queue=env.app.QUEUE_A).id
    wait_for(
        lambda: (env.flower.get(f"/api/task/info/{marker}") or {}).get("state") == "SUCCESS",
        timeout=WAIT,
        interval=0.5,
        what="the marker task in flower",
    )
    task = env.flower.get(f"/api/task/info/{dup}")
    assert task["state"] == "STARTED" and task["succeeded"] is None and task["failed"] is None
    assert len(_ran(env, run.rid)) == len(run.ran)  # the body did not run again
