"""DAG compensation end to end on real Postgres, Redis and Celery workers."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from harvest_celery import WorkflowCancelledError, WorkflowFailed
from harvest_celery._store.schema import events

from .conftest import DATABASE_URL, ROOT, effects, scrape_all, wait_for, worker_env, workers_decide

pytestmark = pytest.mark.integration


def ran(redis_client, tag):
    return [e["name"] for e in effects(redis_client, tag)]


def undos(redis_client, tag):
    return [e for e in effects(redis_client, tag) if e["name"].startswith("undo:")]


def names(harvest, run_id):
    return [h.describe() for h in harvest.history(run_id)]


def names_raw(harvest, run_id):
    """As ``names``, reading offloaded payloads as their references (this process has no store)."""
    return [h.describe() for h in harvest.history(run_id, strict=False)]


def test_diamond_failure_dispatches_comp_c_comp_b_comp_a_in_that_order(harvest, workers, redis_client, tag):
    before = scrape_all("harvest_saga_compensated_total", workflow="diamond")
    run_id = harvest.start_workflow("diamond", {"tag": tag, "fail": ["dia_d"]})
    with pytest.raises(WorkflowFailed, match="one or more DAG tasks failed"):
        harvest.result(run_id, timeout=30)
    assert [e["name"] for e in undos(redis_client, tag)] == ["undo:dia_c", "undo:dia_b", "undo:dia_a"]
    # queue inheritance, observed on the queue each compensator actually ran on
    queues = {e["name"]: e["queue"] for e in undos(redis_client, tag)}
    assert queues == {"undo:dia_c": "inventory", "undo:dia_b": "beta", "undo:dia_a": "alpha"}
    assert names(harvest, run_id).count("MarkerRecorded(saga_compensated:1)") == 1
    assert scrape_all("harvest_saga_compensated_total", workflow="diamond") == before + 1


def test_each_envelope_input_shape(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("shapes", {"tag": tag})
    with pytest.raises(WorkflowFailed, match="one or more DAG tasks failed"):
        harvest.result(run_id, timeout=30)
    env = {e["name"][5:]: e["value"] for e in undos(redis_client, tag)}
    src_out = {"tag": tag, "node": "sh_src"}
    other_out = {"tag": tag, "node": "sh_other"}
    assert env["sh_src"]["input"] == {"conf": {"tag": tag}, "dag_task": "sh_src"}  # unbound wrapper
    assert env["sh_src"]["output"] == src_out
    assert env["sh_from"]["input"] == src_out  # input_from: the raw upstream output
    assert env["sh_all"]["input"] == {"sh_src": src_out, "sh_other": other_out}
    assert env["sh_alias"]["input"] == {"first": src_out, "second": other_out}
    items = [{"tag": tag, "item": 1}, {"tag": tag, "item": 2}]
    assert env["sh_cell"]["input"] == items  # mapped: the whole upstream array, never one cell
    assert env["sh_cell"]["output"] == [{"tag": tag, "node": "sh_cell"}] * 2
    assert all(e["dag_compensate"] == name for name, e in env.items())
    # LIFO over forward level order: level 1 (from, all, alias, cell) then level 0 (src, other)
    assert [e["name"] for e in undos(redis_client, tag)] == [
        "undo:sh_cell",
        "undo:sh_alias",
        "undo:sh_all",
        "undo:sh_from",
        "undo:sh_other",
        "undo:sh_src",
    ]


def test_an_empty_mapped_upstream_is_never_compensated(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("map_collect", {"tag": tag, "items": []})
    with pytest.raises(WorkflowFailed, match="one or more DAG tasks failed"):
        harvest.result(run_id, timeout=30)
    assert [e["name"] for e in undos(redis_client, tag)] == ["undo:mp_produce"]
    assert "mp_cell" not in ran(redis_client, tag)


def test_collect_all_with_failed_cells_is_compensated_once_with_the_whole_cells_array(
    harvest, workers, redis_client, tag
):
    run_id = harvest.start_workflow("map_collect", {"tag": tag, "items": [1, -2, 3]})
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    compensations = undos(redis_client, tag)
    assert [e["name"] for e in compensations] == ["undo:mp_cell", "undo:mp_produce"]
    assert compensations[0]["value"]["output"] == [
        {"status": "succeeded", "value": 10},
        {"status": "failed", "error": "negative -2"},
        {"status": "succeeded", "value": 30},
    ]
    assert [c["n"] for c in compensations[0]["value"]["input"]] == [1, -2, 3]


def test_a_failfast_mapped_node_is_not_compensated_but_its_upstream_is(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("map_failfast", {"tag": tag, "items": [1, -2, 3]})
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    assert [e["name"] for e in undos(redis_client, tag)] == ["undo:mp_produce"]
    assert ran(redis_client, tag).count("mp_cell") == 3  # every cell was awaited
    assert "mp_after" not in ran(redis_client, tag)
    assert not harvest.describe(run_id).nd_blocked


def test_a_cancelled_dag_run_skips_the_unwind(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("cancellable", {"tag": tag, "slow": "cx_slow"})
    wait_for(lambda: "cx_slow" in ran(redis_client, tag), what="the slow node's body")
    harvest.cancel_workflow_execution(run_id, reason="operator")
    wait_for(lambda: names(harvest, run_id)[-1] == "WorkflowFailed", what="the post-cancel outcome")
    with pytest.raises(WorkflowCancelledError, match="one or more DAG tasks failed"):
        harvest.result(run_id, timeout=5)
    assert undos(redis_client, tag) == []
    assert not any("Marker" in n for n in names(harvest, run_id))
    assert harvest.describe(run_id).status == "CANCELLED"


def test_known_limitation_raising_the_cap_mid_unwind_diverges(harvest, workers, redis_client, tag):
    w1 = workers["w1"]
    try:
        w1.restart({"HARVEST_TEST_CAP": "300"})
        run_id = harvest.start_workflow("capped", {"tag": tag})
        wait_for(lambda: "undo:cap_right" in ran(redis_client, tag), what="the unwind's first compensator")
        w1.restart({"HARVEST_TEST_CAP": ""})  # the cap is raised while the unwind is in flight
        row = wait_for(lambda: (r := harvest.describe(run_id)).nd_blocked and r, timeout=30, what="nd-block")
        assert row.status == "RUNNING"
        assert row.nd_details["expected"] == "ActivityScheduled(cap_big)"
        assert row.nd_details["actual"] == "MarkerRecorded(saga_compensated:1)"
        w1.restart({"HARVEST_TEST_CAP": "300"})  # reverted: the run recovers
        with pytest.raises(WorkflowFailed, match="cap_big.*over the cap of 300 bytes"):
            harvest.result(run_id, timeout=30)
        assert [e["name"] for e in undos(redis_client, tag)] == ["undo:cap_right", "undo:cap_left"]
        assert "cap_big" not in ran(redis_client, tag)
    finally:
        w1.restart({"HARVEST_TEST_CAP": ""})


def scheduled_inline(run_id):
    """Each ActivityScheduled's input as the events table holds it inline: name → input."""
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(events.c.data).where(events.c.execution_id == run_id).order_by(events.c.seq)
        ).fetchall()
    engine.dispose()
    return {r.data["activity_name"]: r.data["input"] for r in rows if r.data["type"] == "ActivityScheduled"}


def test_an_offloaded_oversized_envelope_is_dispatched(harvest, workers, redis_client, tag):
    # no store: the 3 KB envelope is over a 2 KB cap and refused, as the spec pins
    # the cap and the store are the workers' settings: their decision workers take each run's
    # first decision (not this test's start)
    with worker_env(workers, HARVEST_TEST_CAP="2048"), workers_decide(harvest):
        refused = harvest.start_workflow("offloaded_envelope", {"tag": f"{tag}-no", "pad": 3000})
        with pytest.raises(
            WorkflowFailed,
            match="SagaCompensationFailed.*input of activity 'undo_node' "
            "is 3[0-9]{3} bytes, over the cap of 2048 bytes",
        ):
            harvest.result(refused, timeout=30)
        assert undos(redis_client, f"{tag}-no") == []
        assert "undo_node" not in scheduled_inline(refused)

    # a store takes what is over 1 KB: the envelope (and the forward input, over the cap too)
    # are stored as references, dispatched, and the compensator gets the whole value
    with worker_env(workers, HARVEST_TEST_CAP="2048", HARVEST_TEST_OFFLOAD="1024"), workers_decide(harvest):
        run_id = harvest.start_workflow("offloaded_envelope", {"tag": tag, "pad": 3000, "blob": "i" * 3000})
        with pytest.raises(WorkflowFailed) as failed:
            harvest.result(run_id, timeout=30)
        assert (failed.value.error_type, failed.value.error_message) == (
            "DagTaskFailed",
            "one or more DAG tasks failed",
        )  # a clean unwind, not SagaCompensationFailed
        assert [e["value"] for e in effects(redis_client, tag) if e["name"] == "ob_big"] == [3000]
        [undo] = undos(redis_client, tag)
        envelope = undo["value"]
        assert envelope["dag_compensate"] == "ob_big" and undo["queue"] == "inventory"
        assert envelope["output"] == {"tag": tag, "pad": "o" * 3000}
        assert envelope["input"]["conf"]["blob"] == "i" * 3000
        inline = scheduled_inline(run_id)
        for name in ("ob_big", "undo_node"):
            assert inline[name]["_harvest_offload_envelope"] == 1 and inline[name]["store_id"] == "pg"


def test_removing_the_store_stalls_a_run_with_references_until_it_is_restored(
    harvest, workers, redis_client, tag
):
    """docs/payloads.md, a store removed after the run offloaded something: nothing diverges, the
    run's decisions fail on its references and it stays RUNNING; restored, it carries on."""
    with worker_env(workers, HARVEST_TEST_OFFLOAD="1024"), workers_decide(harvest):  # the workers' store
        run_id = harvest.start_workflow("offload_then_wait", {"tag": tag, "pad": "p" * 2000})
        wait_for(
            lambda: (
                "ActivityCompleted(1)" in names_raw(harvest, run_id)
                and harvest.store.decision_request(run_id)[1] is None
            ),
            what="the run to park",
        )
        assert scheduled_inline(run_id)["step_one"]["_harvest_offload_envelope"] == 1
    # the workers now run without a store
    log = workers["w1"].log
    seen = log.stat().st_size
    harvest.signal(run_id, "go")
    wait_for(
        lambda: "no payload store is configured" in log.read_bytes()[seen:].decode(errors="replace"),
        what="the decision to fail on the reference",
    )
    time.sleep(2)
    row = harvest.describe(run_id)
    assert row.status == "RUNNING" and not row.nd_blocked
    assert "step_three" not in ran(redis_client, tag)
    with worker_env(workers, HARVEST_TEST_OFFLOAD="1024"):  # restored: the sweeper re-sends it
        assert harvest.result(run_id, timeout=30) == f"done:{tag}"
    assert ran(redis_client, tag) == ["step_one", "step_three"]


def test_a_worker_refuses_to_boot_when_a_dag_names_an_unregistered_compensator(harvest):
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.bad_app",
            "worker",
            "-Q",
            "nobody",
            "-P",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "dag 'shipping' references unregistered compensator 'unship' for task 'ship'" in (
        proc.stdout + proc.stderr
    )
