"""Workflow admission across two worker processes (docs/flow-control.md, "Workflow admission"),
on real Postgres, Redis and Celery: ``admission_app``'s ``adm_customer`` admits at most one run
per customer. Two workers of this module's own consume its decision and activity queues. Run
lifetimes are read from the bodies' own start stamps and the runs' close times; no assertion is
timed (the waits are generous bounds)."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import WorkflowFailed
from harvest_celery._cli import main
from harvest_celery._payloads.digest import limit_digest
from harvest_celery._payloads.erasure import is_erased
from harvest_celery._store.schema import events as events_table
from harvest_celery._store.schema import executions
from harvest_celery._web.api import create_app

from .conftest import Worker, wait_for

pytestmark = pytest.mark.integration

# this module's first worker: a port no other module's worker takes (the session's +0/+1,
# test_observability's +4/+5, test_schedules' +7, test_deadlines' +8, +9); the second serves none
PORT = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808")) + 2


@pytest.fixture(scope="module")
def adm(harvest: Any, redis_client: Any) -> Iterator[Any]:
    """The admission app and its two workers, each deciding and running bodies."""
    suffix = f"_s{os.environ.get('HARVEST_TEST_SLOT', '0')}_{uuid.uuid4().hex[:8]}"
    os.environ["HARVEST_TEST_ADM_SUFFIX"] = suffix  # before the import; the workers inherit it
    from tests.integration import admission_app

    assert admission_app.DECIDE.endswith(suffix), "admission_app was imported before the fixture"
    queues = f"{admission_app.DECIDE},{admission_app.QUEUE}"
    env = {"HARVEST_TEST_ADM_SUFFIX": suffix}
    admission_app.workers = [
        Worker(
            "adm1", queues, {**env, "HARVEST_METRICS_PORT": str(PORT)}, app="tests.integration.admission_app"
        ),
        Worker("adm2", queues, {**env, "HARVEST_METRICS_PORT": ""}, app="tests.integration.admission_app"),
    ]
    try:
        for w in admission_app.workers:
            w.start()
        yield admission_app
    finally:
        for w in admission_app.workers:
            w.stop()


def marks(redis_client: Any, customer: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in redis_client.lrange(f"adm:{customer}", 0, -1)]


def started_labels(redis_client: Any, customer: str) -> list[str]:
    """Labels in the order their first body started (a retried body stamps again)."""
    seen: list[str] = []
    for m in marks(redis_client, customer):
        if m["what"] == "start" and m["label"] not in seen:
            seen.append(m["label"])
    return seen


def start(h: Any, customer: str, label: str, **data: Any) -> str:
    priority = data.pop("priority", 0)
    return h.start_workflow(
        "adm_customer", {"customer": customer, "label": label, **data}, label, priority=priority
    )


def run_rows(h: Any, ids: list[str]) -> dict[str, Any]:
    c = executions.c
    with h.store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(c.id, c.status, c.admitted_at, c.admission_seq, c.closed_at, c.limit_key).where(
                c.id.in_(ids)
            )
        ).all()
    return {r.id: r for r in rows}


def types(h: Any, run_id: str) -> list[str]:
    return [item.event.type for item in h.history(run_id)]


def hold(h: Any, redis_client: Any, customer: str, label: str) -> str:
    """A run that holds its customer's one slot until ``release(label)``."""
    run_id = start(h, customer, label, hold=True)
    wait_for(lambda: started_labels(redis_client, customer) == [label], what=f"{label}'s body to start")
    return run_id


def release(redis_client: Any, label: str) -> None:
    redis_client.set(f"release:{label}", 1)


def finish(h: Any, ids: list[str], timeout: float = 120) -> None:
    for run_id in ids:
        h.result(run_id, timeout=timeout)


def decided_in(adm: Any, marker: str = "harvest.decide") -> list[str]:
    """The workers whose log shows a decision task (a run's first decision goes to the queue)."""
    return [
        w.name
        for w in adm.workers
        if marker in w.log.read_text(errors="replace").rsplit("===== start", 1)[-1]
    ]


# ── order and overlap ────────────────────────────────────────────────────────────────────────
def test_per_customer_lifetimes_never_overlap_follow_admission_seq_and_customers_overlap(
    adm, redis_client, tag
):
    h = adm.harvest
    customers = {f"A-{tag}": [], f"B-{tag}": []}

    def starter(customer: str) -> None:
        for i in range(20):
            customers[customer].append(start(h, customer, f"{customer}-{i:02d}"))

    threads = [threading.Thread(target=starter, args=(c,)) for c in customers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [run_id for runs in customers.values() for run_id in runs]
    finish(h, ids)
    rows = run_rows(h, ids)
    lifetimes = {}
    for customer, runs in customers.items():
        first_start = {}
        for m in marks(redis_client, customer):
            first_start.setdefault(m["label"], m["at"])
        spans = sorted((first_start[r], rows[r].closed_at.timestamp(), r) for r in runs)
        for (_s1, end1, _r1), (s2, _e2, _r2) in zip(spans, spans[1:], strict=False):
            assert s2 >= end1  # per customer: the next run starts only after the previous closed
        by_seq = sorted(runs, key=lambda r: rows[r].admission_seq)
        assert [r for _s, _e, r in spans] == by_seq  # admitted in start order
        lifetimes[customer] = (spans[0][0], spans[-1][1])
    (a0, a1), (b0, b1) = lifetimes.values()
    assert a0 < b1 and b0 < a1  # A's and B's runs did overlap
    pids = {m["pid"] for c in customers for m in marks(redis_client, c)}
    assert len(pids) == 2  # bodies ran in both processes
    assert sorted(decided_in(adm)) == ["adm1", "adm2"]  # and decisions did


# ── signals, cancels and terminates of a waiting run ─────────────────────────────────────────
def test_a_signal_to_a_waiting_run_waits_in_its_history_until_admission(adm, redis_client, tag):
    h, customer = adm.harvest, f"S-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    waiting = start(h, customer, f"{customer}-w", wait_signal=True)
    h.signal(waiting, "go", "early")
    assert types(h, waiting) == ["WorkflowStarted", "SignalReceived"]
    assert h.describe(waiting).display_status == "WAITING"
    assert started_labels(redis_client, customer) == [f"{customer}-hold"]  # its probe has not run
    release(redis_client, f"{customer}-hold")
    finish(h, [holder])
    assert h.result(waiting, timeout=60)["signal"] == "early"  # after admission the code saw it


def test_cancel_cooperative_cancel_and_terminate_of_waiting_runs(adm, redis_client, tag):
    h, customer = adm.harvest, f"C-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    ids = [start(h, customer, f"{customer}-{i}") for i in range(5)]
    h.cancel_workflow_execution(ids[0], "not needed")
    h.request_cancellation(ids[1], "not needed")
    h.terminate(ids[2], "not needed")
    assert [h.describe(r).status for r in ids[:3]] == ["CANCELLED", "CANCELLED", "TERMINATED"]
    for run_id in ids[:3]:
        assert h.describe(run_id).closed_at is not None
        assert "ActivityScheduled" not in types(h, run_id)  # no decision was taken
    assert types(h, ids[0])[-1] == "WorkflowCancelled" and types(h, ids[1])[-1] == "WorkflowCancelled"
    release(redis_client, f"{customer}-hold")
    finish(h, [holder, ids[3], ids[4]])
    assert started_labels(redis_client, customer) == [f"{customer}-hold", ids[3], ids[4]]
    assert all("ActivityScheduled" not in types(h, r) for r in ids[:3])  # the code never ran


# ── transactional starts ─────────────────────────────────────────────────────────────────────
def test_a_rolled_back_start_is_never_admitted_and_never_blocks(adm, redis_client, tag):
    h, customer = adm.harvest, f"R-{tag}"
    with h.store.engine.connect() as conn:
        with conn.begin() as trans:
            h.start_workflow(
                "adm_customer", {"customer": customer, "label": "rb"}, f"{customer}-rb", connection=conn
            )
            trans.rollback()
    after = start(h, customer, f"{customer}-after")
    finish(h, [after])
    assert started_labels(redis_client, customer) == [f"{customer}-after"]
    assert run_rows(h, [f"{customer}-rb"]) == {}


def test_a_start_that_commits_late_is_admitted_among_the_committed_starts_in_number_order(
    adm, redis_client, tag
):
    h, customer = adm.harvest, f"L-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    late = f"{customer}-late"
    with h.store.engine.connect() as conn:
        trans = conn.begin()
        h.start_workflow("adm_customer", {"customer": customer, "label": late}, late, connection=conn)
        n1 = start(h, customer, f"{customer}-n1", hold=True)  # a higher number, committed first
        n2 = start(h, customer, f"{customer}-n2")
        release(redis_client, f"{customer}-hold")  # the late start is not committed: n1 is next
        wait_for(lambda: n1 in started_labels(redis_client, customer), what="n1 to be admitted")
        trans.commit()
    release(redis_client, n1)
    finish(h, [holder, n1, late, n2])
    assert started_labels(redis_client, customer) == [f"{customer}-hold", n1, late, n2]
    seqs = {r: row.admission_seq for r, row in run_rows(h, [n1, late, n2]).items()}
    assert seqs[late] < seqs[n1] < seqs[n2]


# ── paused holders, priority ─────────────────────────────────────────────────────────────────
def test_stuck_of_a_waiting_run_names_a_paused_holder(adm, redis_client, tag):
    h, customer = adm.harvest, f"P-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    h.pause(holder)
    waiting = start(h, customer, f"{customer}-w")
    (hint,) = h.stuck(waiting)
    assert hint["kind"] == "admission"
    assert hint["holders"] == [{"execution_id": holder, "state": "paused"}]
    assert f"slot held by run {holder}: paused" in hint["text"]
    assert h.describe(waiting).admission["position"] == 1
    h.resume(holder)
    release(redis_client, f"{customer}-hold")
    finish(h, [holder, waiting])


def test_stuck_of_a_waiting_run_names_an_nd_blocked_holder(adm, redis_client, tag):
    h, customer = adm.harvest, f"D-{tag}"
    holder = start(h, customer, f"{customer}-hold", nd=True, wait_signal=True)
    waiting = start(h, customer, f"{customer}-w")

    def waits_for_its_signal() -> bool:  # its body recorded, the decision on it taken
        with h.store.engine.connect() as conn:
            requested = conn.execute(
                sa.select(executions.c.decision_requested_at).where(executions.c.id == holder)
            ).scalar_one()
        return requested is None and any(t.startswith("ActivityCompleted") for t in types(h, holder))

    wait_for(waits_for_its_signal, what="the holder to wait for its signal")
    # a replay diverges only when it runs the code again from the start: no worker keeps the
    # holder warm once both restart (a warm replay, or the close of a limited run that takes
    # the warm replay's decision, never re-runs code it has passed)
    for w in adm.workers:
        w.restart()
    redis_client.set(f"nd:{holder}", 1)  # its next replay diverges from its history
    h.signal(holder, "go")
    wait_for(lambda: h.describe(holder).nd_blocked_at is not None, what="the holder to be nd-blocked")
    (hint,) = h.stuck(waiting)
    assert hint["kind"] == "admission" and h.describe(waiting).display_status == "WAITING"
    (held,) = hint["holders"]
    assert held["execution_id"] == holder and held["state"].startswith("nd-blocked: ")
    assert f"slot held by run {holder}: nd-blocked" in hint["text"]
    assert started_labels(redis_client, customer) == [holder]  # the blocked holder keeps its slot
    h.terminate(holder, "nd-blocked")
    finish(h, [waiting])
    assert started_labels(redis_client, customer) == [holder, waiting]


def test_a_continue_as_new_chain_keeps_its_slot_down_its_links(adm, redis_client, tag):
    h, customer = adm.harvest, f"N-{tag}"
    chain = start(h, customer, f"{customer}-c", links=2)
    others = [start(h, customer, f"{customer}-{i}") for i in range(2)]
    finish(h, others)
    links = [chain]
    while h.describe(links[-1]).continued_to:
        links.append(h.describe(links[-1]).continued_to)
    assert len(links) == 3 and h.describe(links[-1]).status == "COMPLETED"
    labels = started_labels(redis_client, customer)
    assert labels == [chain, f"{chain}-l1", f"{chain}-l2", *others]  # no other run cut in
    first_start = {}
    for m in marks(redis_client, customer):
        first_start.setdefault(m["label"], m["at"])
    assert first_start[others[0]] >= h.describe(links[-1]).closed_at.timestamp()  # never overlapped


def test_a_priority_9_start_is_admitted_before_ten_earlier_priority_0_starts(adm, redis_client, tag):
    h, customer = adm.harvest, f"Q-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    low = [start(h, customer, f"{customer}-p0-{i}") for i in range(10)]
    place = h.describe(low[-1]).admission
    assert (place["in_use"], place["concurrency"], place["waiting"]) == (1, 1, 10)  # the slot is busy
    high = start(h, customer, f"{customer}-p9", priority=9)
    release(redis_client, f"{customer}-hold")
    finish(h, [holder, high, *low])
    assert started_labels(redis_client, customer)[:3] == [f"{customer}-hold", high, low[0]]
    assert h.result(high, timeout=5)["priority"] == 9


# ── metrics ──────────────────────────────────────────────────────────────────────────────────
def sample(name: str, labels: str) -> float:
    """One sample of the first worker's exposition (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(rf"^{re.escape(name)}{{{re.escape(labels)}}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_the_admission_gauges_and_the_one_trip_closes_as_a_worker_serves_them(adm, redis_client, tag):
    h, customer = adm.harvest, f"G-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    waiting = [start(h, customer, f"{customer}-{i}") for i in range(2)]
    label = 'workflow="adm_customer"'
    assert sample("harvest_admission_waiting", label) >= 2  # read from Postgres at scrape time
    assert sample("harvest_admission_in_use", label) >= 1
    release(redis_client, holder)
    finish(h, [holder, *waiting])
    closes = [holder, *waiting]
    one_trip = 'path="one_statement",workflow="adm_customer"'
    for i in range(10):  # the counter is the first worker's: closes there take one trip (psycopg2)
        if sample("harvest_decisions_total", one_trip) > 0:
            break
        closes.append(start(h, customer, f"{customer}-more-{i}"))
        finish(h, closes[-1:])
    assert sample("harvest_decisions_total", one_trip) > 0
    assert sample("harvest_decision_fallbacks_total", 'reason="admission"') == 0


# ── the workflow's own limit row held by another transaction ─────────────────────────────────
def held_row(conn: Any, name: str) -> None:
    """Update the workflow's own limit row in ``conn``'s open transaction, as a settle of a
    global limit, ``set_limit`` or a worker's ``sync_declared`` does."""
    conn.execute(
        sa.text("UPDATE harvest_limits SET updated_at = now() WHERE name = :name AND key_digest = ''"),
        {"name": name},
    )


def test_a_keyed_start_is_admitted_and_closes_while_the_workflows_own_limit_row_is_held(
    adm, redis_client, tag
):
    # the start declares that row only when its snapshot has none: an INSERT … ON CONFLICT
    # on the existing row waited for the holder's commit (this test hung on it)
    h, customer = adm.harvest, f"K-{tag}"
    with h.store.engine.connect() as holder:
        trans = holder.begin()
        done: list[str] = []
        starter = threading.Thread(target=lambda: done.append(start(h, customer, f"{customer}-1")))
        try:
            held_row(holder, "adm_customer")
            starter.start()
            wait_for(lambda: done, what="the start to return while the row is held")
            assert h.result(done[0], timeout=60)["label"] == f"{customer}-1"
        finally:
            trans.rollback()
            if starter.ident is not None:  # started
                starter.join()


def test_a_global_limit_start_waits_for_the_rows_holder_in_the_rows_lock_queue(adm, redis_client, tag):
    # a global limit's start settles that very row in its own transaction, so it waits for its
    # holder: in the lock's queue (the settle's FOR UPDATE), not in an INSERT … ON CONFLICT
    # that waited for the holder's commit outside it
    h, customer = adm.harvest, f"GL-{tag}"
    with h.store.engine.connect() as holder:
        trans = holder.begin()
        pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        done: list[str] = []
        starter = threading.Thread(
            target=lambda: done.append(
                h.start_workflow("adm_global", {"customer": customer, "label": f"{customer}-1"})
            )
        )
        try:
            held_row(holder, "adm_global")
            starter.start()

            def blocked() -> str | None:
                with h.store.engine.connect() as conn:
                    return conn.execute(
                        sa.text("SELECT query FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"),
                        {"pid": pid},
                    ).scalar()

            query = wait_for(blocked, what="the start to wait for the row's holder")
            assert "FOR UPDATE" in query and not done
        finally:
            trans.rollback()
            if starter.ident is not None:  # started
                starter.join()
    assert h.result(done[0], timeout=60)["label"] == f"{customer}-1"


# ── erasure ──────────────────────────────────────────────────────────────────────────────────
def test_erasure_of_a_closed_run_tombstones_its_stored_key(adm, redis_client, tag):
    h, customer = adm.harvest, f"E-{tag}"
    run_id = start(h, customer, f"{customer}-1")
    finish(h, [run_id])
    assert not is_erased(run_rows(h, [run_id])[run_id].limit_key)
    h.erase_payloads(run_id)
    stored = run_rows(h, [run_id])[run_id].limit_key
    assert is_erased(stored) and customer not in json.dumps(stored)


def test_no_event_was_appended_to_a_run_refused_at_start(adm):
    with adm.harvest.store.engine.connect() as conn:
        before = conn.execute(sa.select(sa.func.count()).select_from(events_table)).scalar_one()
    with pytest.raises(ValueError):
        adm.harvest.start_workflow(
            "adm_customer", {"customer": "x", "label": "x"}, "bad-priority", priority=10
        )
    with adm.harvest.store.engine.connect() as conn:
        after = conn.execute(sa.select(sa.func.count()).select_from(events_table)).scalar_one()
    assert after == before and run_rows(adm.harvest, ["bad-priority"]) == {}


# ── every way a run is created passes admission: children, schedule ticks, reset, DAG retry ──
def sequence(redis_client: Any, customer: str) -> list[tuple[str, str]]:
    """The customer's body stamps in the order Redis got them: (what, label)."""
    return [(m["what"], m["label"]) for m in marks(redis_client, customer)]


def retarget(h: Any, run_id: str, workflow: str, key: str) -> None:
    """Store another key for a closed run (as if its ``limit_key`` had given ``key``): a run made
    from it that recomputed its key from its input would not find this one."""
    with h.store.engine.begin() as conn:
        conn.execute(
            executions.update()
            .where(executions.c.id == run_id)
            .values(
                limit_key=h.store.payloads.encode_value(key, f"{run_id}/limit_key"),
                limit_digest=limit_digest(workflow, key),
            )
        )


def stored_key(h: Any, run_id: str) -> tuple[Any, str | None]:
    row = run_rows(h, [run_id])[run_id]
    with h.store.engine.connect() as conn:
        digest = conn.execute(sa.select(executions.c.limit_digest).where(executions.c.id == run_id)).scalar()
    return h.store.payloads.decode_value(row.limit_key), digest


def test_children_of_a_limited_workflow_wait_for_admission_in_start_order(adm, redis_client, tag):
    h, customer = adm.harvest, f"CH-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    kids = [f"{customer}-k{i}" for i in range(3)]
    parent = h.start_workflow(
        "adm_parent", {"customer": customer, "labels": kids}, f"{customer}-p", priority=4
    )
    wait_for(lambda: len(run_rows(h, kids)) == 3, what="the children's rows")
    assert all(row.admitted_at is None for row in run_rows(h, kids).values())  # written waiting
    assert [h.describe(k).admission["position"] for k in kids] == [1, 2, 3]
    assert {h.describe(k).parent_id for k in kids} == {parent}
    assert h.describe(kids[0]).display_status == "WAITING"
    assert started_labels(redis_client, customer) == [holder]  # no child's code ran
    release(redis_client, holder)
    out = h.result(parent, timeout=120)
    assert out["kids"] == kids  # the parent awaited its waiting children as usual
    ((error, message),) = out["errors"]  # the bad key raised into the parent's code
    assert error == "InvalidLimitKey" and "adm_bad_key" in message
    assert sequence(redis_client, customer) == [  # one at a time, in start order
        (what, label) for label in [holder, *kids] for what in ("start", "end")
    ]
    assert [h.result(k, timeout=5)["priority"] for k in kids] == [4, 4, 4]  # the parent's priority
    with h.store.engine.connect() as conn:
        bad = conn.execute(
            sa.select(sa.func.count()).where(
                (executions.c.parent_id == parent) & (executions.c.workflow_type == "adm_bad_key")
            )
        ).scalar_one()
    assert bad == 0 and "ChildWorkflowScheduled(adm_bad_key)" not in [
        f"{e.event.type}({getattr(e.event, 'workflow_type', '')})" for e in h.history(parent)
    ]


def test_a_schedules_tick_of_a_limited_workflow_waits_for_admission_and_counts_open(adm, redis_client, tag):
    h, customer = adm.harvest, f"SC-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    name = f"adm-sched-{tag}"
    h.create_schedule(
        name,
        workflow="adm_customer",
        every=timedelta(seconds=1),
        input={"customer": customer, "label": f"{customer}-tick"},
        overlap="skip",
    )
    try:  # fired by the workers' sweepers
        wait_for(lambda: h.describe_schedule(name)["last_run_id"] is not None, what="a tick")
        tick = h.describe_schedule(name)["last_run_id"]
        assert h.describe(tick).display_status == "WAITING"
        wait_for(lambda: h.describe_schedule(name)["skipped"] >= 1, what="a tick skipped as overlapping")
        assert h.describe_schedule(name)["last_run_id"] == tick  # the waiting tick counted open
        assert h.describe(tick).display_status == "WAITING"
        assert started_labels(redis_client, customer) == [holder]
    finally:
        h.delete_schedule(name)
    release(redis_client, holder)
    finish(h, [holder, tick])
    assert sequence(redis_client, customer) == [
        ("start", holder),
        ("end", holder),
        ("start", f"{customer}-tick"),
        ("end", f"{customer}-tick"),
    ]


def test_a_reset_that_waits_runs_nothing_before_admission_and_copies_the_stored_key(adm, redis_client, tag):
    h, customer = adm.harvest, f"RS-{tag}"
    source = hold(h, redis_client, customer, f"{customer}-src")  # admitted; its activity open
    waiting = start(h, customer, f"{customer}-w", hold=True)
    kinds = types(h, source)
    # reset to just after ActivityScheduled: its activity is open at the reset point
    new = h.reset(source, kinds.index("ActivityScheduled") + 1)  # `source` terminated: `waiting` next
    assert h.describe(source).status == "TERMINATED"
    wait_for(lambda: waiting in started_labels(redis_client, customer), what="the next run's body")
    assert h.describe(new).display_status == "WAITING"
    assert stored_key(h, new) == stored_key(h, source)  # the source's key, copied
    release(redis_client, source)  # the terminated source's body ends; the reset's would not hold
    wait_for(lambda: ("end", source) in sequence(redis_client, customer), what="the old body's end")
    starts_of_source = [m for m in sequence(redis_client, customer) if m == ("start", source)]
    assert len(starts_of_source) == 1  # the reset's re-dispatched activity has not run
    assert h.describe(new).display_status == "WAITING"
    release(redis_client, waiting)
    out = h.result(new, timeout=120)  # admitted when `waiting` closed; its activity ran then
    assert out["label"] == source
    seq = sequence(redis_client, customer)
    second_start = [i for i, m in enumerate(seq) if m == ("start", source)][1]
    assert seq.index(("end", waiting)) < second_start  # never beside the admitted run
    assert [e.event.type for e in h.history(new)].count("ActivityStarted") == 1


def test_a_reset_of_a_closed_run_copies_its_stored_key_never_recomputed(adm, redis_client, tag):
    h, customer, other = adm.harvest, f"RC-{tag}", f"RC2-{tag}"
    source = start(h, customer, f"{customer}-src")
    finish(h, [source])
    holder = hold(h, redis_client, other, f"{other}-hold")
    retarget(h, source, "adm_customer", other)  # its stored key now names the held customer
    new = h.reset(source, 1)
    assert stored_key(h, new) == (other, limit_digest("adm_customer", other))
    assert h.describe(new).display_status == "WAITING"  # behind `other`'s holder, not `customer`'s free slot
    release(redis_client, holder)
    finish(h, [holder, new])
    assert [e.event.type for e in h.history(new)].count("ActivityStarted") == 1


def test_a_dag_retry_copies_its_sources_stored_key_and_waits_for_admission(adm, redis_client, tag):
    h, customer, other = adm.harvest, f"DG-{tag}", f"DG2-{tag}"
    label = f"{customer}-dag"
    redis_client.set(f"fail:{label}", 1)
    source = h.start_workflow("adm_dag", {"customer": customer, "label": label}, label)
    with pytest.raises(WorkflowFailed):
        h.result(source, timeout=60)
    redis_client.delete(f"fail:{label}")
    holder_label = f"{other}-hold"
    holder = h.start_workflow(
        "adm_dag", {"customer": other, "label": holder_label, "hold": True}, holder_label
    )
    wait_for(lambda: started_labels(redis_client, other) == [holder_label], what="the holder's body")
    retarget(h, source, "adm_dag", other)  # recomputed from its input, the key would be `customer`
    new = h.retry_dag_run("adm_dag", source)["run_id"]
    assert stored_key(h, new) == (other, limit_digest("adm_dag", other))
    assert h.describe(new).display_status == "WAITING"  # behind the holder of the copied key
    assert [m for m in sequence(redis_client, customer) if m[0] == "start"] == [("start", label)]
    release(redis_client, holder_label)
    finish(h, [holder, new])
    assert [m for m in sequence(redis_client, customer) if m[0] == "start"] == [("start", label)] * 2
    assert h.describe(new).status == "COMPLETED"


# ── kill -9 (last: it restarts a worker) ─────────────────────────────────────────────────────
def test_a_waiting_run_shows_its_place_everywhere(adm, redis_client, tag, capsys, monkeypatch):
    """A waiting run as operators see it (issue 24, "Visibility"; docs/flow-control.md, "Seeing
    it"): ``describe()``, ``harvest show``, the HTTP API (status, place, a list filtered on
    WAITING) and the console's run page all give WAITING with its place. The embedded twins of
    these checks (and the activity slot line) are tests/unit/test_waiting_views.py."""
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    h = adm.harvest
    customer = f"c-{tag}"
    holder = h.start_workflow(
        "adm_customer", {"customer": customer, "label": f"{tag}-0", "hold": True}, f"{tag}-0"
    )
    wait_for(
        lambda: started_labels(redis_client, customer) == [f"{tag}-0"], what="the holder's body to start"
    )
    waiting = [
        h.start_workflow("adm_customer", {"customer": customer, "label": f"{tag}-{i}"}, f"{tag}-{i}")
        for i in (1, 2, 3)
    ]
    place = "waiting for admission to adm_customer: 3rd of 3 waiting; 1/1 in use"
    try:
        x = h.describe(waiting[2])
        assert x.display_status == "WAITING" and (x.admission["position"], x.admission["waiting"]) == (3, 3)
        assert h.describe(holder).display_status == "RUNNING" and h.describe(holder).admission is None

        assert main(["--database-url", h.database_url, "show", waiting[2]]) == 0
        out = capsys.readouterr().out
        assert "WAITING" in out.splitlines()[0] and f"  {place}\n" in out

        client = TestClient(create_app(h))
        body = client.get(f"/workflows/{waiting[2]}").json()
        assert body["display_status"] == "WAITING"
        assert {k: body["admission"][k] for k in ("position", "waiting", "in_use", "concurrency")} == {
            "position": 3,
            "waiting": 3,
            "in_use": 1,
            "concurrency": 1,
        }
        listed = client.get(
            "/workflows", params={"status": "WAITING", "workflow": "adm_customer", "limit": 1000}
        )
        ids = {r["execution_id"] for r in listed.json()["workflows"]}
        assert set(waiting) <= ids and holder not in ids

        page = client.get(f"/console/runs/{waiting[2]}").text
        found = re.search(r'<span class="flag" id="run-admission">(.*?)</span>', page, re.S)
        assert found and found.group(1).strip() == place
    finally:
        redis_client.set(f"release:{tag}-0", 1)
        for run_id in (holder, *waiting):
            h.result(run_id, timeout=120)
    assert h.describe(waiting[2]).display_status == "COMPLETED"


def test_kill_9_of_the_worker_running_an_admitted_run_gives_no_second_slot(adm, redis_client, tag):
    h, customer = adm.harvest, f"K-{tag}"
    holder = hold(h, redis_client, customer, f"{customer}-hold")
    (pid,) = {m["pid"] for m in marks(redis_client, customer)}
    # the threads pool runs the body in the worker process itself
    victim = next(w for w in adm.workers if w.proc is not None and w.proc.pid == pid)
    waiting = [start(h, customer, f"{customer}-{i}") for i in range(3)]
    victim.kill9()
    # the lease expires, attempt 2 runs in the other worker (it sees the release flag)
    release(redis_client, f"{customer}-hold")
    finish(h, [holder, *waiting], timeout=180)
    labels = started_labels(redis_client, customer)
    assert labels == [f"{customer}-hold", *waiting]  # the order held
    starts = [m for m in marks(redis_client, customer) if m["what"] == "start"]
    assert len({m["pid"] for m in starts if m["label"] == f"{customer}-hold"}) == 2  # it finished elsewhere
    rows = run_rows(h, waiting)
    first_start = {}
    for m in starts:
        first_start.setdefault(m["label"], m["at"])
    closes = [h.describe(holder).closed_at.timestamp(), *(rows[r].closed_at.timestamp() for r in waiting)]
    assert all(first_start[r] >= closes[i] for i, r in enumerate(waiting))  # never two at once
    victim.start()
