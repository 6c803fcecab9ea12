"""``fast_paths``, on real Postgres, Redis and Celery workers: the scenarios of test_core.py,
test_saga.py, test_cancel.py and test_payloads.py write the same histories with the fast paths
on (one-statement completions, inline decisions, warm replays, eager runs) as with every step
through the decision task (``Harvest(fast_paths=False)``: workers restarted with
``HARVEST_TEST_FAST_PATHS=0``); and with an offloading payload store that lists its keys
(``HARVEST_TEST_OFFLOAD``) a worker's steps take the one-statement path."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from harvest_celery import (
    FernetCodec,
    Harvest,
    PostgresPayloadStore,
    WorkflowCancelledError,
    WorkflowContext,
    WorkflowFailed,
    activity,
    workflow,
)
from harvest_celery._store.schema import events

from .conftest import DATABASE_URL, effects, scrape_all, wait_for, worker_env
from .test_completion_paths import dispose

pytestmark = pytest.mark.integration

# name → (workflow, input); the cancel scenario is cancelled once its second step has started
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "core: three steps": ("three_steps", {}),
    "core: retried": ("retrying", {"succeed_on": 3}),
    "core: non-retryable": ("non_retryable", {}),
    "core: timer": ("sleeper", {"seconds": 0.5}),
    "saga: completes": ("saga_steps", {"n": 3}),
    "saga: unwinds": ("saga_steps", {"n": 3, "fail_at": 3}),
    "cancel: branch returns": ("cancel_and_compensate", {"slow": 1.5}),
}


def _shape(harvest: Any, run_id: str, tag: str) -> list[Any]:
    """The history without times (a timer's ``fire_at`` too), worker ids and the run's tag."""
    out = []
    for item in harvest.history(run_id):
        data = item.event.to_data()
        data.pop("worker_id", None)
        data.pop("fire_at", None)
        out.append((item.seq, json.loads(json.dumps(data, sort_keys=True).replace(tag, "TAG"))))
    return out


def _settled(harvest: Any, run_id: str) -> None:
    try:
        harvest.result(run_id, timeout=60)
    except (WorkflowFailed, WorkflowCancelledError):
        pass
    wait_for(
        lambda: harvest.store.cancel_branch(run_id) is None or harvest.store.cancel_branch(run_id).settled,
        what="the cancel branch to settle",
    )


def _run_all(harvest: Any, redis_client: Any) -> dict[str, list[Any]]:
    started = {}
    for name, (flow, data) in SCENARIOS.items():
        tag = uuid.uuid4().hex[:12]
        started[name] = (harvest.start_workflow(flow, {"tag": tag, **data}), tag)
    rid, tag = started["cancel: branch returns"]
    wait_for(
        lambda: "forward:2" in [e["name"] for e in effects(redis_client, tag)],
        what="the second step to start",
    )
    harvest.cancel_workflow_execution(rid, reason="compared")
    for rid, _tag in started.values():
        _settled(harvest, rid)
    return {name: _shape(harvest, rid, tag) for name, (rid, tag) in started.items()}


def _paths() -> dict[str, float]:
    return {p: scrape_all("harvest_decisions_total", path=p) for p in ("one_statement", "inline", "task")}


def _fallbacks() -> dict[str, float]:
    from harvest_celery._runtime.completion import FALLBACK_REASONS

    return {r: v for r in FALLBACK_REASONS if (v := scrape_all("harvest_decision_fallbacks_total", reason=r))}


def test_the_core_scenarios_write_the_same_histories_with_fast_paths_on_and_off(
    harvest, workers, redis_client
):
    before = _paths()
    fast = _run_all(harvest, redis_client)
    after = _paths()
    assert after["one_statement"] > before["one_statement"] and after["inline"] > before["inline"], (
        before,
        after,
        _fallbacks(),
    )
    with worker_env(workers, HARVEST_TEST_FAST_PATHS="0"):
        plain = _run_all(harvest, redis_client)
        # fresh worker processes: every decision they took went through the decision task
        assert {p: v for p, v in _paths().items() if p != "task"} == {"one_statement": 0, "inline": 0}
    for name in SCENARIOS:
        assert fast[name] == plain[name], name


def test_a_workers_steps_take_one_statement_with_an_offloading_store(harvest, workers, redis_client, tag):
    with worker_env(workers, HARVEST_TEST_OFFLOAD="1024"):
        rid = harvest.start_workflow("three_steps", {"tag": tag, "pad": "p" * 2000})
        assert harvest.result(rid, timeout=60) == f"done:{tag}"
        # step_one runs eagerly on the decision worker that holds the warm replay: its
        # completion and the next decision, its 2 KB output offloaded, in one statement
        assert scrape_all("harvest_decisions_total", path="one_statement") >= 1
        engine = sa.create_engine(DATABASE_URL)
        with engine.connect() as conn:
            outputs = (
                conn.execute(
                    sa.select(events.c.data)
                    .where((events.c.execution_id == rid) & (events.c.type == "ActivityCompleted"))
                    .order_by(events.c.seq)
                )
                .scalars()
                .all()
            )
        engine.dispose()
        assert outputs[0]["output"]["_harvest_offload_envelope"] == 1
        assert outputs[0]["output"]["key"].startswith(f"{rid}/")
        reader = Harvest(DATABASE_URL, payload_store=PostgresPayloadStore(), offload_threshold=1024)
        completed = [e.event.output for e in reader.history(rid) if e.event.type == "ActivityCompleted"]
        dispose(reader)
        assert [out["pad"] for out in completed[:2]] == ["p" * 2000] * 2


# ── test_payloads.py's scenario, in process ──────────────────────────────────────────────────
@activity(name="fp_echo")
def fp_echo(value: dict) -> dict:
    return {"echo": value}


@activity(name="fp_blob")
def fp_blob(size: int) -> str:
    return "z" * size


@workflow(name="fp_payloads")
async def fp_payloads(ctx: WorkflowContext, data: dict) -> dict:
    first = await ctx.execute_activity(fp_echo, data)
    big = await ctx.execute_activity(fp_blob, data["size"])
    got = await ctx.wait_signal("confirm")
    return {"first": first, "big": len(big), "got": got}


@pytest.mark.parametrize("offload", [1024, None], ids=["offload", "inline"])
def test_the_payload_scenario_writes_the_same_history_with_fast_paths_on_and_off(harvest, offload):
    codec = FernetCodec({"k1": Fernet.generate_key()}, primary="k1")
    shapes = []
    for fast_paths in (True, False):
        h = Harvest(
            DATABASE_URL,
            codec=codec,
            fast_paths=fast_paths,
            payload_store=PostgresPayloadStore() if offload else None,
            offload_threshold=offload or 256 * 1024,
        )
        h.register(fp_echo, fp_blob, fp_payloads)
        rid = h.start_workflow(
            "fp_payloads", {"card": "4111", "size": 3000}, execution_id=f"fp-{uuid.uuid4().hex[:10]}"
        )
        h.drain()
        h.signal(rid, "confirm", {"ok": True})
        assert h.result(rid, timeout=20) == {
            "first": {"echo": {"card": "4111", "size": 3000}},
            "big": 3000,
            "got": {"ok": True},
        }
        shapes.append(_shape(h, rid, rid))
        dispose(h)
    assert shapes[0] == shapes[1]
