"""Deadlines end to end on real Postgres, Redis and a Celery worker process (its own app and
queues: ``deadlines_app``, a 2 s grace period): a timeout undoes a parked run through its cancel
branch and ends it TIMED_OUT, a run that completes anyway is COMPLETED, a non-cancellable sleep
is sealed at the grace period's end with a running body's result recorded, a run mid-unwind is
never sealed, a failing branch is flagged and counted, and bad timeouts write nothing."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import WorkflowTimedOut
from harvest_celery._store.schema import events as events_table
from harvest_celery._store.schema import executions
from harvest_celery._web.api import create_app

from .conftest import Worker, wait_for

pytestmark = pytest.mark.integration

# this module's worker: a port no other module's worker takes (the session's two +0/+1,
# test_observability's +4/+5, test_schedules' +7)
PORT = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808")) + 8


@pytest.fixture(autouse=True)
def _open_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)


@pytest.fixture(scope="module")
def dl(harvest: Any, redis_client: Any) -> Any:
    """The deadlines app, its worker deciding on its own queues and running its activities. The
    queues are this session's own (``deadlines_app``): a worker of another run on the same broker
    took this module's decision requests when they had fixed names."""
    suffix = f"_s{os.environ.get('HARVEST_TEST_SLOT', '0')}_{uuid.uuid4().hex[:8]}"
    os.environ["HARVEST_TEST_DL_SUFFIX"] = suffix  # before the import; the worker inherits it
    from tests.integration import deadlines_app

    assert deadlines_app.DECIDE.endswith(suffix), "deadlines_app was imported before the fixture"
    worker = Worker(
        "dl",
        f"{deadlines_app.DECIDE},{deadlines_app.QUEUE}",
        {"HARVEST_METRICS_PORT": str(PORT), "HARVEST_TEST_DL_SUFFIX": suffix},
        app="tests.integration.deadlines_app",
    )
    worker.start()
    try:
        yield deadlines_app
    finally:
        worker.stop()


def noted(redis_client: Any, tag: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in redis_client.lrange(f"dl:{tag}", 0, -1)]


def types(h: Any, run_id: str) -> list[str]:
    return [item.event.type for item in h.history(run_id)]


def timed_out(h: Any, run_id: str, timeout: float = 60) -> WorkflowTimedOut:
    with pytest.raises(WorkflowTimedOut) as caught:
        h.result(run_id, timeout=timeout)
    return caught.value


def counted(metric: str, **labels: str) -> float:
    """A counter of this module's worker, summed over the samples whose labels match."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items())
    )


# ── the outcome table ────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("workflow", ["dl_parked", "dl_napper"])
def test_a_timeout_undoes_a_parked_run_and_ends_timed_out(dl, redis_client, tag, workflow):
    h = dl.harvest
    run_id = h.start_workflow(workflow, {"tag": tag}, execution_timeout=3)
    err = timed_out(h, run_id)
    assert (err.outcome, err.timeout) == ("cancelled", "execution")
    assert err.reason == "execution_timeout of 3s expired"
    refunds = [n for n in noted(redis_client, tag) if n["name"] == "refund"]
    assert len(refunds) == 1 and "timeout" in refunds[0]["value"]  # ctx.cancellation_reason()
    x = h.describe(run_id)
    assert (x.status, x.display_status, x.timeout) == ("TIMED_OUT", "TIMED_OUT", "execution")
    assert x.cancelled_at is None and not x.timeout_overrun  # never sealed, never terminated
    seen = types(h, run_id)
    assert seen.count("WorkflowTimeoutRequested") == 1 and seen[-1] == "WorkflowFailed"
    assert ("TimerStarted" in seen) == (workflow == "dl_napper")
    assert "TimerFired" not in seen  # a deadline is never a timer


def test_a_run_that_completes_anyway_is_completed(dl, tag):
    h = dl.harvest
    run_id = h.start_workflow("dl_stubborn", {"tag": tag}, execution_timeout=1)
    wait_for(lambda: h.describe(run_id).timed_out_at is not None, what="the timeout request")
    assert h.describe(run_id).display_status == "CANCELLING"
    h.signal(run_id, "go")
    assert h.result(run_id, timeout=60) == {"done": "anyway", "cancelled": True}
    assert h.describe(run_id).status == "COMPLETED"


def test_a_plain_sleep_is_sealed_at_the_end_of_the_grace_and_a_running_body_is_recorded(
    dl, redis_client, tag
):
    h = dl.harvest
    run_id = h.start_workflow("dl_sleepy", {"tag": tag}, run_timeout=1)
    wait_for(lambda: any(n["name"] == "hold:start" for n in noted(redis_client, tag)), what="the body")
    wait_for(lambda: h.describe(run_id).status == "TIMED_OUT", what="the grace period's seal")
    x = h.describe(run_id)
    assert x.cancelled_at is not None and "grace period ended" in (x.cancel_reason or "")
    assert x.timeout == "run"
    with pytest.raises(WorkflowTimedOut) as pending:  # the body still runs: the branch is open
        h.result(run_id, timeout=0.5)
    assert pending.value.outcome == "pending"
    redis_client.set(f"dl-release:{tag}", 1, ex=600)
    err = timed_out(h, run_id)
    assert err.outcome == "stopped"  # it still waits on a timer a sealed run never gets
    seen = types(h, run_id)
    assert "WorkflowCancelled" in seen and "ActivityCompleted" in seen  # the body's result is kept
    assert seen.index("WorkflowCancelled") < seen.index("ActivityCompleted")


def test_mid_unwind_at_the_end_of_the_grace_the_run_is_left_running(dl, redis_client, tag):
    h = dl.harvest
    run_id = h.start_workflow("dl_unwinding", {"tag": tag}, execution_timeout=1)
    wait_for(lambda: h.describe(run_id).timeout_overrun, what="the grace period's end")
    x = h.describe(run_id)
    assert (x.status, x.display_status, x.cancelled_at) == ("RUNNING", "CANCELLING", None)
    assert [n["name"] for n in noted(redis_client, tag)] == ["charge", "refund"]  # the refund ran
    assert "WorkflowCancelled" not in types(h, run_id)
    h.signal(run_id, "confirmed")
    assert timed_out(h, run_id).outcome == "cancelled"


def test_a_failing_branch_is_flagged_and_counted(dl, tag):
    h = dl.harvest
    failed = ("harvest_cancel_branch_failed_total", {"workflow": "dl_breaks"})
    ended = ("harvest_workflow_terminal_total", {"workflow": "dl_breaks", "outcome": "timed_out"})
    before = [counted(name, **labels) for name, labels in (failed, ended)]
    run_id = h.start_workflow("dl_breaks", {"tag": tag}, execution_timeout=1)
    err = timed_out(h, run_id)
    assert (err.outcome, err.error) == ("failed", "RuntimeError: undo failed")
    assert h.describe(run_id).display_status == "TIMED_OUT (cancel branch failed: RuntimeError: undo failed)"
    wait_for(lambda: counted(failed[0], **failed[1]) > before[0], what="harvest_cancel_branch_failed_total")
    wait_for(lambda: counted(ended[0], **ended[1]) > before[1], what="terminal{outcome=timed_out}")
    assert [x.id for x in h.list(status="TIMED_OUT", workflow="dl_breaks")][:1] == [run_id]


def test_over_the_api_the_timeout_is_in_seconds_and_the_status_is_served(dl, tag):
    client = TestClient(create_app(dl.harvest))
    started = client.post(
        "/workflows", json={"workflow": "dl_breaks", "input": {"tag": tag}, "execution_timeout": 1}
    )
    assert started.status_code == 201
    run_id = started.json()["execution_id"]
    timed_out(dl.harvest, run_id)
    shown = client.get(f"/workflows/{run_id}").json()
    assert (shown["status"], shown["timeout"]) == ("TIMED_OUT", "execution")
    listed = client.get("/workflows", params={"status": "TIMED_OUT", "workflow": "dl_breaks"}).json()
    assert run_id in [w["execution_id"] for w in listed["workflows"]]


# ── bad input writes nothing ─────────────────────────────────────────────────────────────────
def _count(h: Any, run_id: str) -> tuple[int, int]:
    with h.store.engine.connect() as conn:
        return (
            conn.execute(
                sa.select(sa.func.count()).select_from(executions).where(executions.c.id == run_id)
            ).scalar(),
            conn.execute(
                sa.select(sa.func.count())
                .select_from(events_table)
                .where(events_table.c.execution_id == run_id)
            ).scalar(),
        )


@pytest.mark.parametrize("bad", [{"execution_timeout": 0}, {"run_timeout": -1}])
def test_a_timeout_that_is_not_positive_is_refused_and_writes_nothing(dl, tag, bad):
    h = dl.harvest
    run_id = f"bad-{tag}"
    with pytest.raises(ValueError, match="timeout"):
        h.start_workflow("dl_parked", {"tag": tag}, run_id, **bad)
    with pytest.raises(ValueError, match="timeout"):
        h.signal_with_start("dl_parked", {"tag": tag}, run_id, "approve", **bad)
    answer = TestClient(create_app(h)).post(
        "/workflows", json={"workflow": "dl_parked", "input": {"tag": tag}, "execution_id": run_id, **bad}
    )
    assert answer.status_code == 400 and answer.json()["error"] == "ValueError"
    assert _count(h, run_id) == (0, 0)
