"""Activity limits across worker processes (docs/flow-control.md), on real Postgres, Redis and
Celery: two worker processes of this module's own consume the ``limited`` queue. Overlaps are
computed from the bodies' own start and end stamps (time, pid); no assertion is timed (the waits
are generous bounds). After every test, each limit's ``in_use`` equals its scheduled and running
rows."""

from __future__ import annotations

import itertools
import json
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import WorkflowFailed
from harvest_celery._store.schema import activity_tasks, limits
from tests.integration.app import harvest as _app  # noqa: F401  (imports limited after app)
from tests.integration.conftest import _PORT, Worker, scrape_port, wait_for
from tests.integration.limited import QUEUE

LIM_PORTS = [(1, _PORT + 2), (2, _PORT + 3)]  # the shared workers serve _PORT and _PORT + 1


@pytest.fixture(scope="module")
def limited_workers(workers: Any) -> Iterator[list[Worker]]:
    started = [Worker(f"lim{i}", QUEUE, {"HARVEST_METRICS_PORT": str(port)}) for i, port in LIM_PORTS]
    try:
        for w in started:
            w.start()
        yield started
    finally:
        for w in started:
            w.stop()


@pytest.fixture(autouse=True)
def in_use_matches(harvest: Any) -> Iterator[None]:
    yield
    assert_in_use_matches(harvest)


def assert_in_use_matches(harvest: Any) -> None:
    """The invariant: each limit row's in_use is the scheduled and running rows of its limit,
    once the settles in flight have committed (a one-trip completion whose slot nobody takes
    settles it just after its own commit, ``Store._settle_after``)."""
    found: list[tuple[dict[Any, int], dict[Any, int]]] = []

    def matches() -> bool:
        found[:] = [_in_use_and_held(harvest)]
        return found[0][0] == found[0][1]

    if not matches():
        wait_for(matches, timeout=10, what="every limit's in_use to match its rows")
    assert found[0][0] == found[0][1]


def _in_use_and_held(harvest: Any) -> tuple[dict[Any, int], dict[Any, int]]:
    t = activity_tasks.c
    with harvest.store.engine.connect() as conn:
        held = conn.execute(
            sa.select(t.activity_name, t.limit_digest, sa.func.count())
            .where(t.status.in_(("scheduled", "running")) & t.limit_digest.is_not(None))
            .group_by(t.activity_name, t.limit_digest)
        ).all()
        rows = conn.execute(sa.select(limits.c.name, limits.c.key_digest, limits.c.in_use)).all()
    counts = {(name, digest): n for name, digest, n in held}
    used = {(name, digest): n for name, digest, n in rows if n or (name, digest) in counts}
    return used, counts


def stamps(redis_client: Any, tag: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in redis_client.lrange(f"stamps:{tag}", 0, -1)]


def max_overlap(marks: list[dict[str, Any]]) -> int:
    """The most bodies between their start and end stamps at once (an end before a start at
    the same instant: touching intervals do not overlap)."""
    events = sorted((m["at"], 0 if m["what"] == "end" else 1) for m in marks)
    current = peak = 0
    for _at, kind in events:
        current += 1 if kind else -1
        peak = max(peak, current)
    return peak


def start_calls(harvest: Any, tag: str, activity: str, n: int, **extra: Any) -> list[str]:
    return [
        harvest.start_workflow(
            "limited_call", {"tag": tag, "activity": activity, "label": f"{tag}-{i}", **extra}
        )
        for i in range(n)
    ]


def wait_finished(harvest: Any, runs: list[str], timeout: float = 180) -> None:
    for run_id in runs:
        harvest.result(run_id, timeout=timeout)


def statuses(harvest: Any, runs: list[str]) -> list[str]:
    return [
        harvest.store.activity_rows(r)[0]["status"] if harvest.store.activity_rows(r) else "none"
        for r in runs
    ]


def in_use(harvest: Any, name: str) -> int:
    with harvest.store.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(limits.c.in_use), 0)).where(limits.c.name == name)
            ).scalar_one()
        )


def assert_settles_to_zero(harvest: Any, name: str) -> None:
    """``name``'s slots all free once the settles in flight have committed: the last
    completion's slot, which nobody takes, is settled just after its own commit
    (``Store._settle_after``), so it may still be held when ``result()`` returns."""
    wait_for(lambda: in_use(harvest, name) == 0, timeout=10, what=f"{name}'s in_use back to 0")


def test_200_runs_of_a_concurrency_3_activity_overlap_exactly_3_across_two_processes(
    harvest, limited_workers, redis_client, tag
):
    runs = start_calls(harvest, tag, "limited_three", 200)
    wait_finished(harvest, runs)
    marks = stamps(redis_client, tag)
    assert len([m for m in marks if m["what"] == "start"]) == 200
    assert max_overlap(marks) == 3
    assert len({m["pid"] for m in marks}) >= 2  # bodies ran in both processes
    settled(harvest, "limited_three")


def settled(harvest: Any, name: str) -> None:
    """Every slot of ``name`` back: a one-trip completion whose slot nobody takes settles it in
    a transaction of its own, just after the run's close is visible (``Store._settle_after``)."""
    wait_for(lambda: in_use(harvest, name) == 0, timeout=10, what=f"{name}'s slots settled")


def most_starts_in_a_second(marks: list[dict[str, Any]]) -> int:
    """The most body starts that any 1 s window [t, t + 1) holds (windows begin at a start)."""
    starts = sorted(m["at"] for m in marks if m["what"] == "start")
    return max((bisect_left(starts, at + 1.0) - i for i, at in enumerate(starts)), default=0)


def test_a_20_per_second_rate_limit_holds_across_two_processes(harvest, limited_workers, redis_client, tag):
    runs = start_calls(harvest, tag, "limited_rate", 300, sleep=0.0)
    deadline = time.monotonic() + 60  # one generous bound on waiting for all: 300 at 20/s is 15 s
    for run_id in runs:
        harvest.result(run_id, timeout=max(0.1, deadline - time.monotonic()))
    marks = stamps(redis_client, tag)
    assert len([m for m in marks if m["what"] == "start"]) == 300
    assert most_starts_in_a_second(marks) <= 21  # burst one: starts spaced 1/20 s apart
    assert len({m["pid"] for m in marks}) >= 2  # bodies ran in both processes
    settled(harvest, "limited_rate")


def test_a_keyed_limit_gives_each_key_its_own_slots(harvest, limited_workers, redis_client, tag):
    runs = []
    for i in range(15):
        runs += start_calls(harvest, f"{tag}", "limited_per_key", 1, key=f"k{i % 3}", sleep=0.1)
    wait_finished(harvest, runs)
    marks = stamps(redis_client, tag)
    for key in ("k0", "k1", "k2"):
        assert max_overlap([m for m in marks if m["key"] == key]) == 2
    assert max_overlap(marks) > 2  # different keys overlapped
    settled(harvest, "limited_per_key")


def _hold_the_slot(harvest: Any, redis_client: Any, tag: str) -> str:
    (holder,) = start_calls(harvest, f"{tag}-hold", "limited_one", 1, hold=True)
    redis_client.delete(f"release:{tag}-hold")
    wait_for(lambda: stamps(redis_client, f"{tag}-hold"), what="the holder's body to start")
    assert in_use(harvest, "limited_one") == 1  # the slot is busy while the queue forms
    return holder


def test_priority_9_bodies_all_start_before_any_priority_0_body(harvest, limited_workers, redis_client, tag):
    holder = _hold_the_slot(harvest, redis_client, tag)
    low = start_calls(harvest, tag, "limited_one", 50, priority=0, sleep=0.0)
    high = [
        harvest.start_workflow(
            "limited_call",
            {"tag": tag, "activity": "limited_one", "label": f"{tag}-hi-{i}", "priority": 9, "sleep": 0.0},
        )
        for i in range(10)
    ]
    wait_for(lambda: statuses(harvest, low + high).count("waiting") == 60, what="60 waiting rows")
    assert in_use(harvest, "limited_one") == 1
    redis_client.set(f"release:{tag}-hold", 1)
    wait_finished(harvest, [holder, *low, *high])
    starts = [m["label"] for m in stamps(redis_client, tag) if m["what"] == "start"]
    assert len(starts) == 60
    assert all("-hi-" in label for label in starts[:10]), starts[:12]
    assert_settles_to_zero(harvest, "limited_one")


def test_cancel_and_terminate_cancel_waiting_rows_that_are_never_released(
    harvest, limited_workers, redis_client, tag
):
    holder = _hold_the_slot(harvest, redis_client, tag)
    cancelled, terminated, kept = start_calls(harvest, tag, "limited_one", 3, sleep=0.0)
    wait_for(
        lambda: statuses(harvest, [cancelled, terminated, kept]) == ["waiting"] * 3, what="3 waiting rows"
    )
    harvest.cancel_workflow_execution(cancelled, "stop")
    harvest.terminate(terminated, "stop")
    wait_for(
        lambda: statuses(harvest, [cancelled, terminated]) == ["cancelled"] * 2, what="both rows cancelled"
    )
    redis_client.set(f"release:{tag}-hold", 1)
    wait_finished(harvest, [holder, kept])
    started = [m["label"] for m in stamps(redis_client, tag) if m["what"] == "start"]
    assert started == [f"{tag}-2"]  # only the run left alone ran its body
    assert statuses(harvest, [cancelled, terminated]) == ["cancelled"] * 2


def test_a_saga_unwind_goes_ahead_of_forward_work_queued_earlier(harvest, limited_workers, redis_client, tag):
    saga = harvest.start_workflow("limited_saga", {"tag": tag, "activity": "limited_one", "sleep": 0.0})
    wait_for(lambda: stamps(redis_client, f"{tag}-fail"), what="the failing step to start")
    holder = _hold_the_slot(harvest, redis_client, tag)
    forward = start_calls(harvest, tag, "limited_one", 5, sleep=0.0)
    wait_for(lambda: statuses(harvest, forward).count("waiting") == 5, what="5 waiting forward rows")
    redis_client.set(f"release:{tag}-fail", 1)  # the step fails: the unwind's compensation waits
    wait_for(
        lambda: [r["status"] for r in harvest.store.activity_rows(saga)][2:] == ["waiting"],
        what="the compensation waiting for the slot",
    )
    (compensation,) = harvest.store.activity_rows(saga)[2:]
    assert compensation["compensation"], compensation
    redis_client.set(f"release:{tag}-hold", 1)
    wait_finished(harvest, [holder, *forward])
    with pytest.raises(WorkflowFailed):
        harvest.result(saga, timeout=60)  # the saga failed, compensated
    starts = [m["label"] for m in stamps(redis_client, tag) if m["what"] == "start"]
    assert starts[0] == "saga-forward" and starts[1] == "compensation", starts
    assert len(starts) == 7
    assert max_overlap([m for m in stamps(redis_client, tag)]) == 1


def test_an_override_lowers_new_slots_survives_a_worker_restart_and_clears(
    harvest, limited_workers, redis_client, tag
):
    holders = start_calls(harvest, f"{tag}-hold", "limited_three", 3, hold=True)
    wait_for(lambda: len(stamps(redis_client, f"{tag}-hold")) == 3, what="3 holders running")
    later = start_calls(harvest, tag, "limited_three", 4, sleep=0.1)
    wait_for(lambda: statuses(harvest, later).count("waiting") == 4, what="4 waiting rows")
    harvest.set_limit("limited_three", 1)  # while work waits
    redis_client.set(f"release:{tag}-hold", 1)
    wait_finished(harvest, [*holders, *later])
    assert max_overlap(stamps(redis_client, tag)) == 1  # new slots followed 1
    limited_workers[0].restart()  # a worker start syncs the decorator's 3: the override stays
    (entry,) = [e for e in harvest.limits() if e["name"] == "limited_three"]
    assert (entry["declared_concurrency"], entry["override_concurrency"]) == (3, 1)
    harvest.set_limit("limited_three", clear=True)
    (entry,) = [e for e in harvest.limits() if e["name"] == "limited_three"]
    assert (entry["declared_concurrency"], entry["override_concurrency"]) == (3, None)
    again = start_calls(harvest, f"{tag}-again", "limited_three", 30, sleep=0.1)
    wait_finished(harvest, again)
    assert max_overlap(stamps(redis_client, f"{tag}-again")) == 3  # the declared 3 again


def test_an_adopted_task_is_limited_when_harvest_dispatches_it_and_delay_is_not(
    harvest, limited_workers, redis_client, tag
):
    from tests.integration.app import limited_send

    (holder,) = start_calls(harvest, f"{tag}-hold", "legacy.limited_send", 1, hold=True)
    redis_client.delete(f"release:{tag}-hold")
    wait_for(lambda: stamps(redis_client, f"{tag}-hold"), what="the adopted holder to start")
    queued = start_calls(harvest, tag, "legacy.limited_send", 3, sleep=0.0)
    wait_for(lambda: statuses(harvest, queued).count("waiting") == 3, what="3 waiting dispatches")
    plain = [limited_send.delay({"tag": f"{tag}-plain", "label": f"plain-{i}"}) for i in range(2)]
    wait_for(  # a plain .delay() runs beside the held slot: harvest never sees it
        lambda: len([m for m in stamps(redis_client, f"{tag}-plain") if m["what"] == "end"]) == 2,
        what="the plain calls to run",
    )
    assert statuses(harvest, queued).count("waiting") == 3 and len(plain) == 2
    redis_client.set(f"release:{tag}-hold", 1)
    wait_finished(harvest, [holder, *queued])
    assert max_overlap(stamps(redis_client, tag)) == 1


def test_kill_9_of_a_worker_holding_a_slot_frees_it_only_at_lease_expiry(
    harvest, limited_workers, redis_client, tag
):
    holder = _hold_the_slot(harvest, redis_client, tag)
    (held,) = stamps(redis_client, f"{tag}-hold")
    (victim,) = [w for w in limited_workers if w.proc is not None and w.proc.pid == held["pid"]]
    queued = start_calls(harvest, tag, "limited_one", 3, sleep=0.0)
    wait_for(lambda: statuses(harvest, queued).count("waiting") == 3, what="3 waiting rows")
    victim.kill9()
    try:
        # the dead body's row still holds the slot: nothing is released until its lease expires
        assert in_use(harvest, "limited_one") == 1 and statuses(harvest, queued).count("waiting") == 3
        redis_client.set(f"release:{tag}-hold", 1)  # its retry (after the expiry) finishes at once
        wait_finished(harvest, [holder, *queued], timeout=120)
    finally:
        victim.start()
    assert max_overlap(stamps(redis_client, tag)) == 1
    assert_settles_to_zero(harvest, "limited_one")


def eager_runs() -> float:
    """harvest_activity_eager_total of the limited queue, over both processes consuming it."""
    return sum(scrape_port(port, "harvest_activity_eager_total", queue=QUEUE) for _, port in LIM_PORTS)


def claimed_in_its_write(harvest: Any, run_id: str) -> list[str]:
    """The activities whose ActivityStarted directly follows their ActivityScheduled, stamped
    with the same time: claimed in the write that scheduled them (the eager take)."""
    history = harvest.history(run_id)
    return [
        b.event.activity_id
        for a, b in itertools.pairwise(history)
        if a.event.type == "ActivityScheduled"
        and b.event.type == "ActivityStarted"
        and a.event.activity_id == b.event.activity_id
        and a.recorded_at == b.recorded_at
    ]


def test_a_limited_activity_runs_eagerly_only_when_its_slot_is_free(
    harvest, limited_workers, redis_client, tag
):
    # its slot free: the worker that completed the first step takes it in that write and runs it
    before = eager_runs()
    (free,) = start_calls_of(harvest, "limited_pair", tag, "free")
    assert harvest.result(free, timeout=60) == "free-second"
    assert eager_runs() - before == 1  # the second step, run where the first completed
    second = harvest.store.activity_rows(free)[1]["activity_id"]
    assert claimed_in_its_write(harvest, free) == [second]  # no claim statement, no message
    # its slot busy: it waits, nothing is run eagerly, then it is released like any other
    holder = _hold_the_slot(harvest, redis_client, tag)
    before = eager_runs()
    (busy,) = start_calls_of(harvest, "limited_pair", tag, "busy")
    wait_for(lambda: statuses_all(harvest, busy) == ["completed", "waiting"], what="the second step waiting")
    assert eager_runs() - before == 0 and in_use(harvest, "limited_one") == 1
    redis_client.set(f"release:{tag}-hold", 1)
    assert harvest.result(busy, timeout=60) == "busy-second"
    harvest.result(holder, timeout=60)
    assert claimed_in_its_write(harvest, busy) == []  # claimed later, on its own
    assert_settles_to_zero(harvest, "limited_one")
    # under a rate limit, with its token free: taken in the write as well
    before = eager_runs()
    (rated,) = start_calls_of(harvest, "limited_pair", tag, "rated", second="limited_rate")
    assert harvest.result(rated, timeout=60) == "rated-second"
    assert eager_runs() - before == 1
    assert claimed_in_its_write(harvest, rated) == [harvest.store.activity_rows(rated)[1]["activity_id"]]


def start_calls_of(harvest: Any, workflow: str, tag: str, label: str, **extra: Any) -> list[str]:
    return [harvest.start_workflow(workflow, {"tag": tag, "label": label, "sleep": 0.0, **extra})]


def statuses_all(harvest: Any, run_id: str) -> list[str]:
    return [r["status"] for r in harvest.store.activity_rows(run_id)]


def test_a_completion_hands_its_slot_to_the_next_waiting_row_without_the_limit_rows_lock(
    harvest, limited_workers, redis_client, tag
):
    # the holder's completion frees limited_one's only slot while a row waits for it: the slot
    # passes to that row in the completion's own transaction, the limit row never locked (the
    # count of rows holding a slot is the same before and after), so commits on a hot limit do
    # not queue behind one another (docs/flow-control.md, "What a limit costs")
    holder = _hold_the_slot(harvest, redis_client, tag)
    (waiting,) = start_calls(harvest, f"{tag}-next", "limited_one", 1, sleep=0.0)
    wait_for(lambda: statuses(harvest, [waiting]) == ["waiting"], what="the second call waiting")
    with harvest.store.engine.connect() as locker:
        locker.execute(
            sa.select(limits.c.in_use)
            .where((limits.c.name == "limited_one") & (limits.c.key_digest == ""))
            .with_for_update()
        ).all()
        redis_client.set(f"release:{tag}-hold", 1)
        # released while the limit row stays locked by this connection: its body runs
        wait_for(lambda: stamps(redis_client, f"{tag}-next"), what="the waiting row's body to start")
        assert statuses(harvest, [holder]) == ["completed"]
        locker.rollback()
    # nothing waits behind it: its own completion frees the slot under the lock (a recount)
    assert harvest.result(waiting, timeout=60) == f"{tag}-next-0"
    assert harvest.result(holder, timeout=60) == f"{tag}-hold-0"
    assert_settles_to_zero(harvest, "limited_one")
