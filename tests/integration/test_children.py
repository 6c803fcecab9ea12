"""Child workflows and continue-as-new end to end on real Postgres, Redis and Celery workers
(docs/concepts.md, "Child workflows"): a child's saga and its parent's, a child as a saga step
undone by a compensating child, a cooperative cancel passed down, the parent-close policies, a
refused child id, parents cancelled while their children close (no Postgres deadlock), a long
continue-as-new chain followed by result() with a signal routed to its current run, and the
erasure and purge of a chain and of a parent with its children as families, and the legal ids
derived from 200-character sources."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import ForksHoldCopies, WorkflowCancelledError, WorkflowFailed
from harvest_celery._core.ids import MAX_ID_LENGTH, check_execution_id
from harvest_celery._store.schema import child_notices, executions
from harvest_celery.replay import WorkflowReplayer

from .conftest import effects, scrape_all, wait_for, worker_env

pytestmark = pytest.mark.integration


def ran(redis_client: Any, tag: str) -> list[str]:
    return [e["name"] for e in effects(redis_client, tag)]


def types(harvest: Any, run_id: str) -> list[str]:
    return [h.event.type for h in harvest.history(run_id)]


def scheduled(harvest: Any, run_id: str) -> list[Any]:
    return [h.event for h in harvest.history(run_id) if h.event.type == "ChildWorkflowScheduled"]


def test_a_failed_child_unwinds_itself_then_the_parent_unwinds_its_own(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow(
        "ch_checkout", {"tag": tag, "fail_flight": True}, execution_id=f"co-{tag}"
    )
    with pytest.raises(WorkflowFailed) as failed:
        harvest.result(run_id, timeout=60)
    assert "ChildWorkflowFailed" in str(failed.value)
    child = f"co-{tag}-c1"
    # the child undid its own hotel; the parent refunded its charge; nobody cancelled a trip
    assert ran(redis_client, tag) == ["charge", "hotel", "flight", "unhotel", "refund"]
    assert harvest.describe(child).status == "FAILED" and harvest.describe(child).parent_id == run_id
    assert harvest.describe(run_id).children == (
        {"id": child, "workflow": "ch_book_trip", "status": "FAILED"},
    )
    assert types(harvest, run_id).count("ChildWorkflowClosed") == 1


def test_a_child_step_is_undone_by_a_compensating_child_with_its_result(harvest, workers, redis_client, tag):
    before = scrape_all("harvest_saga_compensated_total", workflow="ch_checkout")
    run_id = harvest.start_workflow("ch_checkout", {"tag": tag, "fail_ship": True}, execution_id=f"cs-{tag}")
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=60)
    kids = scheduled(harvest, run_id)
    assert [(k.workflow_type, k.compensation) for k in kids] == [
        ("ch_book_trip", False),
        ("ch_cancel_trip", True),
    ]
    cancel = next(e for e in effects(redis_client, tag) if e["name"] == "cancel_trip")
    assert cancel["value"] == {"trip": f"trip-{tag}"}  # the compensator received the child's result
    assert ran(redis_client, tag) == ["charge", "hotel", "flight", "ship", "cancel_trip", "refund"]
    markers = [h.event.name for h in harvest.history(run_id) if h.event.type == "MarkerRecorded"]
    assert markers == ["saga_compensated:1"]
    wait_for(
        lambda: scrape_all("harvest_saga_compensated_total", workflow="ch_checkout") == before + 1,
        what="the compensated counter",
    )


def test_a_cooperative_cancel_reaches_the_open_child_which_refunds_durably(
    harvest, workers, redis_client, tag
):
    run_id = harvest.start_workflow("ch_cancel_parent", {"tag": tag}, execution_id=f"cc-{tag}")
    wait_for(lambda: "child_charge" in ran(redis_client, tag), what="the child's charge")
    wait_for(lambda: "ChildWorkflowStarted" in types(harvest, run_id), what="the child's start")
    harvest.request_cancellation(run_id, reason="customer asked")
    with pytest.raises(WorkflowCancelledError):
        harvest.result(run_id, timeout=60)
    child = f"cc-{tag}-c1"
    assert harvest.describe(child).status == "CANCELLED"
    assert ran(redis_client, tag) == ["child_charge", "child_refund", "parent_saw"]
    saw = next(e for e in effects(redis_client, tag) if e["name"] == "parent_saw")
    assert saw["value"] == "CANCELLED"


@pytest.mark.parametrize(
    ("policy", "status"),
    [("terminate", "TERMINATED"), ("request_cancel", "CANCELLED"), ("abandon", "RUNNING")],
)
def test_each_parent_close_policy_on_a_parent_that_completes(harvest, workers, tag, policy, status):
    run_id = harvest.start_workflow(
        "ch_leaves_open", {"tag": tag, "policy": policy}, execution_id=f"pc-{tag}"
    )
    child = harvest.result(run_id, timeout=60)
    wait_for(lambda: harvest.describe(child).status == status, what=f"the child {status}")
    if policy == "abandon":
        harvest.signal(child, "go", "later")
        assert harvest.result(child, timeout=60) == "later"
        assert "ChildWorkflowClosed" not in types(harvest, run_id)  # a completed parent takes no more


def test_a_user_given_child_id_that_exists_is_refused_once(harvest, workers, tag):
    harvest.start_workflow("ch_waits", {"tag": tag}, execution_id=f"taken-{tag}")
    run_id = harvest.start_workflow("ch_takes_id", {"tag": tag, "child_id": f"taken-{tag}"})
    assert harvest.result(run_id, timeout=60) == "refused"  # the decision that replayed the start
    assert types(harvest, run_id).count("ChildWorkflowStartRefused") == 1
    assert len(scheduled(harvest, run_id)) == 1  # asked once
    (verdict,) = WorkflowReplayer(harvest).replay_database(ids=[run_id]).runs
    assert verdict.result == "ok", verdict.line()  # a replay reads the answer back, asks nothing
    assert harvest.describe(f"taken-{tag}").parent_id is None
    harvest.terminate(f"taken-{tag}")


def _deadlocks(harvest: Any) -> int:
    """Deadlocks Postgres counted in this run's database (each slot has its own)."""
    with harvest.store.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


def test_parents_cancelled_while_their_children_close_never_deadlock(harvest, workers, tag):
    logs = {w.log: w.log.stat().st_size for w in workers.values()}  # only this test's lines count
    before = _deadlocks(harvest)
    for round_ in range(3):
        parents = [
            harvest.start_workflow(
                "ch_leaves_open", {"tag": tag, "policy": "terminate"}, execution_id=f"race-{tag}-{round_}-{i}"
            )
            for i in range(6)
        ]
        children = [f"{p}-c1" for p in parents]
        for p, c in zip(parents, children, strict=True):
            try:
                harvest.signal(c, "go", "now")
            except Exception:  # noqa: BLE001 - the child may not exist yet, or be closed
                pass
            try:
                harvest.cancel_workflow_execution(p, reason="race")
            except Exception:  # noqa: BLE001 - the parent may have completed already
                pass
        for p in parents:
            wait_for(lambda p=p: harvest.describe(p).status != "RUNNING", what=f"{p} to close")
    with harvest.store.engine.connect() as conn:
        wait_for(
            lambda: conn.execute(sa.select(sa.func.count()).select_from(child_notices)).scalar() == 0,
            what="every notice applied",
        )
    for log, offset in logs.items():
        with open(log, "rb") as f:
            f.seek(offset)
            assert b"deadlock detected" not in f.read(), f"a deadlock in {log}"
    assert _deadlocks(harvest) == before  # none anywhere in the database either


def test_a_long_chain_keeps_histories_short_and_result_follows_it(harvest, workers, tag):
    first = f"chain-{tag}"
    data = {"n": 0, "to": 5000, "every": 100, "signal_at": 2500}
    harvest.start_workflow("ch_counter", data, execution_id=first)
    # mid-chain, before the run that waits for it exists: buffered, carried from link to link
    wait_for(lambda: _links(harvest, first) >= 5, timeout=600, what="the chain's fifth link")
    harvest.signal(first, "mid", "hello")  # to the first id: routed to the current run
    assert harvest.result(first, timeout=900) == {"n": 5000, "got": ["hello"]}
    ids = [first]
    while harvest.describe(ids[-1]).continued_to:
        ids.append(harvest.describe(ids[-1]).continued_to)
    assert len(ids) == 51  # 50 links of 100 iterations, then the one that returns at once
    assert max(harvest.describe(i).history_length for i in ids) < 500


def _links(harvest: Any, run_id: str) -> int:
    count = 1
    while (following := harvest.describe(run_id).continued_to) is not None:
        run_id, count = following, count + 1
    return count


def test_a_worker_killed_between_a_childs_close_and_its_notice_gives_one_close(harvest, workers, tag):
    parent = f"k9-{tag}"
    with worker_env(workers, HARVEST_TEST_DIE_BEFORE_NOTICE="1"):
        harvest.start_workflow(
            "ch_takes_id", {"tag": tag, "child_id": f"k9-child-{tag}"}, execution_id=parent
        )
        wait_for(lambda: "ChildWorkflowStarted" in types(harvest, parent), what="the child's start")
        harvest.signal(f"k9-child-{tag}", "go", "x")
        wait_for(lambda: any(w.proc.poll() is not None for w in workers.values()), what="a worker to die")
        assert harvest.describe(f"k9-child-{tag}").status == "COMPLETED"
        with harvest.store.engine.connect() as conn:
            pending = conn.execute(
                sa.select(sa.func.count())
                .select_from(child_notices)
                .where(child_notices.c.parent_id == parent)
            ).scalar()
        assert pending == 1 and "ChildWorkflowClosed" not in types(harvest, parent)
    # the workers are back without the seam: the sweeper applies the notice
    assert harvest.result(parent, timeout=60) == "started"
    assert types(harvest, parent).count("ChildWorkflowClosed") == 1


def test_a_sealed_parent_records_its_childs_close_and_refuses_a_start_after_the_seal(
    harvest, workers, redis_client, tag
):
    parent = f"sp-{tag}"
    harvest.start_workflow("ch_sealed_parent", {"tag": tag}, execution_id=parent)
    wait_for(lambda: "ChildWorkflowStarted" in types(harvest, parent), what="the child's start")
    harvest.cancel_workflow_execution(parent, reason="seal")
    wait_for(lambda: "after_seal" in ran(redis_client, tag), what="the cancel branch")
    saw = next(e for e in effects(redis_client, tag) if e["name"] == "after_seal")
    assert saw["value"] == "NonDeterministic"  # raised into the workflow
    assert harvest.describe(parent).nd_blocked_at is None  # never an nd-block
    assert len(scheduled(harvest, parent)) == 1  # nothing recorded after the seal
    harvest.signal(f"{parent}-c1", "go", "late")  # abandoned: it still runs, and closes
    assert harvest.result(f"{parent}-c1", timeout=60) == "late"
    wait_for(
        lambda: "ChildWorkflowClosed" in types(harvest, parent),
        what="the close recorded in the sealed parent",
    )


def test_a_compensating_child_is_not_asked_to_cancel_and_a_seal_then_ends_failed(harvest, workers, tag):
    parent = f"sc-{tag}"
    harvest.start_workflow("ch_compensating_parent", {"tag": tag}, execution_id=parent)
    wait_for(lambda: len(scheduled(harvest, parent)) == 1, what="the compensating child")
    assert scheduled(harvest, parent)[0].compensation
    wait_for(lambda: "ChildWorkflowStarted" in types(harvest, parent), what="its start")
    harvest.request_cancellation(parent, reason="asked")  # a compensating child is not asked
    assert harvest.describe(f"{parent}-c1").cancel_requested_at is None
    assert harvest.cancel_workflow_execution(parent, reason="mid-unwind") == "FAILED"
    # the seal applies the parent-close policy (terminate) to it
    wait_for(lambda: harvest.describe(f"{parent}-c1").status == "TERMINATED", what="the policy")


def _age(harvest: Any, ids: list[str]) -> None:
    """Closed 40 days ago: past a 30-day purge (the suite's other runs are not)."""
    with harvest.store.engine.begin() as conn:
        conn.execute(
            executions.update()
            .where(executions.c.id.in_(ids) & executions.c.closed_at.is_not(None))
            .values(closed_at=sa.func.now() - sa.text("interval '40 days'"))
        )


def _left(harvest: Any, ids: list[str]) -> list[str]:
    with harvest.store.engine.connect() as conn:
        found = conn.execute(sa.select(executions.c.id).where(executions.c.id.in_(ids))).scalars()
        return sorted(found)


def test_a_chain_is_erased_and_purged_only_as_a_whole(harvest, workers, tag):
    first = f"fam-{tag}"
    harvest.start_workflow("ch_counter", {"n": 0, "to": 2, "every": 1, "signal_at": 2}, execution_id=first)
    wait_for(lambda: _links(harvest, first) == 2, what="the second link, waiting for its signal")
    ids = _chain(harvest, first)
    _age(harvest, ids)
    harvest.purge(older_than_days=30)
    assert _left(harvest, ids) == sorted(ids)  # the first link is terminal, the chain is not
    harvest.signal(first, "mid", "pii")
    assert harvest.result(first, timeout=60) == {"n": 2, "got": ["pii"]}
    ids = _chain(harvest, first)
    assert len(ids) == 3
    with pytest.raises(ForksHoldCopies) as refused:
        harvest.erase_payloads(first)  # its links hold copies of its input
    assert refused.value.forks == sorted(ids[1:])
    assert harvest.describe(first).erased_at is None  # nothing written
    assert harvest.erase_payloads(ids[1], with_forks=True)["forks"] == sorted({*ids} - {ids[1]})
    assert all(harvest.describe(i).erased_at is not None for i in ids)
    _age(harvest, ids)
    assert harvest.purge(older_than_days=30)["runs"] >= 3
    assert _left(harvest, ids) == []


def test_a_parent_with_children_is_erased_and_purged_only_as_a_whole(harvest, workers, tag):
    parent = f"famp-{tag}"
    harvest.start_workflow("ch_leaves_open", {"tag": tag, "policy": "abandon"}, execution_id=parent)
    child = harvest.result(parent, timeout=60)  # the parent completed; its child waits on
    with pytest.raises(ForksHoldCopies) as refused:
        harvest.erase_payloads(parent)  # the child holds a copy of the parent's input
    assert refused.value.forks == [child]
    _age(harvest, [parent])
    harvest.purge(older_than_days=30)
    assert _left(harvest, [parent, child]) == sorted([parent, child])  # the child is open
    harvest.signal(child, "go", "done")
    assert harvest.result(child, timeout=60) == "done"
    assert harvest.erase_payloads(child, with_forks=True)["forks"] == [parent]
    assert harvest.describe(parent).erased_at is not None
    _age(harvest, [parent, child])
    harvest.purge(older_than_days=30)
    assert _left(harvest, [parent, child]) == []


def _chain(harvest: Any, first: str) -> list[str]:
    ids = [first]
    while (following := harvest.describe(ids[-1]).continued_to) is not None:
        ids.append(following)
    return ids


def _longest(prefix: str, tag: str) -> str:
    head = f"{prefix}-{tag}-"
    return head + "x" * (MAX_ID_LENGTH - len(head))


def _legal(derived: str, source: str) -> bool:
    return check_execution_id(derived) == derived and len(derived) <= MAX_ID_LENGTH and derived != source


def test_200_character_sources_derive_legal_ids_for_children_chains_resets_and_retries(harvest, workers, tag):
    parent = _longest("lp", tag)
    harvest.start_workflow("ch_checkout", {"tag": tag}, execution_id=parent)
    assert harvest.result(parent, timeout=60) == "shipped"
    (kid,) = harvest.describe(parent).children  # the child's default id, hashed to fit
    assert _legal(kid["id"], parent) and harvest.describe(kid["id"]).parent_id == parent
    first = _longest("lc", tag)
    harvest.start_workflow("ch_counter", {"n": 0, "to": 2, "every": 1}, execution_id=first)
    assert harvest.result(first, timeout=60) == {"n": 2, "got": []}
    links = _chain(harvest, first)
    assert len(links) == 3 and all(_legal(b, a) for a, b in zip(links, links[1:], strict=False))
    gated = _longest("lr", tag)
    harvest.start_workflow("ch_waits", {"tag": tag}, execution_id=gated)
    harvest.signal(gated, "go", "yes")
    assert harvest.result(gated, timeout=60) == "yes"
    fork = harvest.reset(gated, 1)
    assert _legal(fork, gated) and "-reset-" in fork and harvest.describe(fork).status == "RUNNING"
    harvest.terminate(fork)
    source = _longest("ld", tag)
    harvest.start_workflow("retryable", {"tag": tag}, execution_id=source)
    with pytest.raises(WorkflowFailed):
        harvest.result(source, timeout=60)
    retried = harvest.retry_dag_run("retryable", source)["run_id"]
    assert _legal(retried, source) and "-retry-" in retried
    assert set(harvest.result(retried, timeout=60)) == {"rt_a", "rt_b", "rt_c"}


def test_bad_child_starts_and_continue_as_new_raise_before_anything_is_recorded(
    harvest, workers, redis_client, tag
):
    run_id = harvest.start_workflow("ch_bad_starts", {"tag": tag}, execution_id=f"bad-{tag}")
    seen = harvest.result(run_id, timeout=60)  # what the second decision's replay saw
    assert [error for error, _ in seen] == [
        "UnknownWorkflow",
        "InvalidExecutionId",
        "ValueError",
        "PayloadNotSerializable",
        "PayloadNotSerializable",
    ]
    for (_, message), names in zip(
        seen,
        ["ch_no_such_workflow", "has:colon", "bogus", "child workflow 'ch_waits'", "continue_as_new"],
        strict=True,
    ):
        assert names in message  # a clear error: it names what was wrong
    first = next(e for e in effects(redis_client, tag) if e["name"] == "after_bad")
    assert first["value"] == seen  # the first decision saw the same
    assert ran(redis_client, tag) == ["after_bad"]
    assert types(harvest, run_id) == [  # nothing recorded but the activity and the close
        "WorkflowStarted",
        "ActivityScheduled",
        "ActivityStarted",
        "ActivityCompleted",
        "WorkflowCompleted",
    ]
    described = harvest.describe(run_id)
    assert described.status == "COMPLETED" and described.continued_to is None
    assert described.children == () and described.nd_blocked_at is None
    with harvest.store.engine.connect() as conn:
        started = conn.execute(
            sa.select(sa.func.count()).select_from(executions).where(executions.c.parent_id == run_id)
        ).scalar()
    assert started == 0  # no child row written
