"""Existing Celery canvases run durably with ``harvest.start_canvas`` (issue 28), on real
Postgres, Redis and Celery worker processes: each result is compared in the same test with the
same canvas under plain Celery (``apply_async().get()``, json serializer, the same worker); the
error shapes Celery mishandles (#9107, #6220, #8786, #3317) fail the run naming the task and node,
compensate the completed nodes in unwind order and run ``link_error`` once, after the unwind; a
bad canvas writes nothing; the same canvas twice is one run; a canvas run retries from a node;
a countdown is a durable timer; the run graph shows canvas-path node ids."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from celery import chain, chord, group

from harvest_celery import (
    CanvasNotSupported,
    ExecutionAlreadyExists,
    InvalidTaskCall,
    PayloadNotSerializable,
    RetryRefused,
    UnknownActivity,
    WorkflowFailed,
)
from harvest_celery._dag.canvas import CANVAS

from .conftest import Worker, wait_for

pytestmark = pytest.mark.integration

# this module's worker: a metrics port no other module's worker takes (+0 +1 +4 +5 +7 +8 +9)
PORT = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808")) + 3


@pytest.fixture(scope="module")
def cv(harvest: Any, redis_client: Any) -> Any:
    """The canvas app and one worker deciding on its own queue and running its tasks."""
    suffix = f"_s{os.environ.get('HARVEST_TEST_SLOT', '0')}_{uuid.uuid4().hex[:8]}"
    os.environ["HARVEST_TEST_CV_SUFFIX"] = suffix  # before the import; the worker inherits it
    from tests.integration import canvas_app

    assert canvas_app.QUEUE.endswith(suffix), "canvas_app was imported before the fixture"
    worker = Worker(
        "cv",
        f"{canvas_app.DECIDE},{canvas_app.QUEUE}",
        {"HARVEST_METRICS_PORT": str(PORT), "HARVEST_TEST_CV_SUFFIX": suffix},
        app="tests.integration.canvas_app",
    )
    worker.start()
    canvas_app.worker = worker
    try:
        yield canvas_app
    finally:
        worker.stop()


def tasks() -> Any:
    from tests.integration import canvas_tasks

    return canvas_tasks


def notes(redis_client: Any, tag: str) -> list[tuple[str, Any]]:
    return [(n["what"], n["value"]) for n in map(json.loads, redis_client.lrange(f"cv:{tag}", 0, -1))]


def events(cv: Any, rid: str) -> list[Any]:
    return [item.event for item in cv.harvest.history(rid)]


def scheduled(cv: Any, rid: str) -> list[Any]:
    return [e for e in events(cv, rid) if e.type == "ActivityScheduled"]


def rows(cv: Any, rid: str) -> dict[str, int]:
    counts = {}
    with cv.harvest.store.engine.connect() as conn:
        for table, column in (
            ("harvest_executions", "id"),
            ("harvest_events", "execution_id"),
            ("harvest_activity_tasks", "execution_id"),
        ):
            counts[table] = conn.execute(
                sa.text(f"SELECT count(*) FROM {table} WHERE {column} = :i"), {"i": rid}
            ).scalar()
    return counts


def both(cv: Any, make: Callable[[], Any]) -> tuple[Any, Any]:
    """The same canvas under harvest and under plain Celery, on the same worker."""
    rid = cv.harvest.start_canvas(make())
    durable = cv.harvest.result(rid, timeout=60)
    plain = make().apply_async().get(timeout=60)
    return durable, plain


# ── results equal plain Celery's ──────────────────────────────────────────────────────────────
SHAPES: dict[str, Callable[[], Any]] = {
    "chain of 3 mixing .s and .si": lambda: chain(
        tasks().add.s(1, 2), tasks().add.si(10, 20), tasks().add.s(5)
    ),
    "group, in order": lambda: group(tasks().add.s(i, i) for i in range(5)),
    "chord body": lambda: chord([tasks().add.s(1, 1), tasks().add.s(2, 2)], tasks().tsum.s(scale=3)),
    "chain containing a chord containing a chain": lambda: chain(
        tasks().add.s(1, 2),
        chord([tasks().add.s(3), chain(tasks().add.s(4), tasks().add.s(5))], tasks().tsum.s()),
        tasks().add.s(100),
    ),
    "kwargs merging with the prepended result": lambda: chain(
        tasks().add.s(1, z=5), tasks().add.s(2, z=1), tasks().pair.s(7)
    ),
    "ignore_result accepted": lambda: chain(tasks().add.s(1, 2).set(ignore_result=True), tasks().add.s(3)),
    "chain of groups": lambda: chain(
        group(tasks().add.si(1, 1), tasks().add.si(2, 2)), group(tasks().tsum.s(), tasks().tsum.s(scale=2))
    ),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_canvas_run_returns_what_plain_celery_returns(cv, shape):
    durable, plain = both(cv, SHAPES[shape])
    assert durable == plain


def test_chunks_and_starmap_return_what_plain_celery_returns(cv):
    t = tasks()
    items = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10)]
    durable, plain = both(cv, lambda: t.add.chunks(items, 2))
    assert durable == plain == [[3, 7], [11, 15], [19]]
    durable, plain = both(cv, lambda: t.add.starmap(items[:3]))
    assert durable == plain == [3, 7, 11]
    rid = cv.harvest.start_canvas(t.add.chunks(items, 2))
    cv.harvest.result(rid, timeout=60)
    assert [(e.node, e.call_convention) for e in scheduled(cv, rid)] == [
        ("0", "per_item"),
        ("1", "per_item"),
        ("2", "per_item"),
    ]


def test_link_runs_once_with_the_result_prepended(cv, redis_client):
    t = tasks()
    tags = {"durable": uuid.uuid4().hex[:10], "plain": uuid.uuid4().hex[:10]}

    def make(tag: str) -> Any:
        sig = chain(t.add.s(1, 2), t.add.s(3))
        sig.link(t.collect.s(tag))
        return sig

    rid = cv.harvest.start_canvas(make(tags["durable"]))
    assert cv.harvest.result(rid, timeout=60) == make(tags["plain"]).apply_async().get(timeout=60) == 6
    wait_for(lambda: notes(redis_client, tags["plain"]), timeout=30)
    assert notes(redis_client, tags["durable"]) == notes(redis_client, tags["plain"]) == [("link", 6)]
    assert scheduled(cv, rid)[-1].node == "link.0"


# ── error shapes: the run fails naming the task and node, compensated in unwind order ─────────
def failed(cv: Any, rid: str) -> WorkflowFailed:
    with pytest.raises(WorkflowFailed) as info:
        cv.harvest.result(rid, timeout=60)
    return info.value


def compensations(cv: Any, rid: str) -> list[str]:
    return [e.node for e in scheduled(cv, rid) if e.compensation]


COMPENSATE = {"cv.reserve": "cv.release"}


def test_a_chord_in_a_chord_header_failing_unwinds_and_runs_link_error_last(cv, redis_client):
    """#9107 and #3317: no body runs on a failed header, every completed reservation is released
    (LIFO over the forward levels), then link_error runs once with the failure."""
    t, tag = tasks(), uuid.uuid4().hex[:10]
    inner = chord([t.reserve.si(tag, "a"), t.decline.si(tag, "b")], t.reserve.s(tag, "inner"))
    sig = chord([inner, t.reserve.si(tag, "c")], t.reserve.s(tag, "body"))
    sig.link_error(t.errback.s(tag))
    rid = cv.harvest.start_canvas(sig, compensate=COMPENSATE)
    error = failed(cv, rid)
    assert "canvas task 'cv.decline' (node header.0.header.1) failed: ValueError: declined b" in str(error)
    dispatched = {e.node for e in scheduled(cv, rid)}
    assert "header.0.body" not in dispatched and "body" not in dispatched
    assert compensations(cv, rid) == ["header.1", "header.0.header.0"]
    seen = notes(redis_client, tag)
    assert sorted(seen[:3]) == [("decline", "b"), ("reserve", "a"), ("reserve", "c")]
    assert seen[3:5] == [("release", f"{tag}/c"), ("release", f"{tag}/a")]
    (what, info), *rest = seen[5:]
    assert (what, rest) == ("errback", [])
    assert info["task"] == "cv.decline" and info["node"] == "header.0.header.1"
    assert info["error_type"] == "ValueError" and "declined b" in info["message"]
    assert set(info) == {"task", "node", "error_type", "message"}
    # it ran after the last compensation finished: its dispatch follows that completion
    history = events(cv, rid)
    last_undo = max(
        i
        for i, e in enumerate(history)
        if e.type == "ActivityCompleted"
        and e.activity_id in {s.activity_id for s in scheduled(cv, rid) if s.compensation}
    )
    errback_at = next(
        i for i, e in enumerate(history) if e.type == "ActivityScheduled" and e.node == "link_error.0"
    )
    assert errback_at > last_undo
    assert not [e for e in scheduled(cv, rid) if e.activity_name.startswith("celery.")]  # no chord_unlock


def test_a_chain_in_a_chord_failing_before_its_last_task_fails_the_run(cv, redis_client):
    """#6220: the chain's remaining task and the body never run; the completed header nodes are
    undone."""
    t, tag = tasks(), uuid.uuid4().hex[:10]
    header = [
        chain(t.reserve.si(tag, "a"), t.decline.si(tag, "b"), t.reserve.si(tag, "never")),
        t.reserve.si(tag, "c"),
    ]
    rid = cv.harvest.start_canvas(chord(header, t.reserve.s(tag, "body")), compensate=COMPENSATE)
    assert "(node header.0.1)" in str(failed(cv, rid))
    assert {e.node for e in scheduled(cv, rid) if not e.compensation} == {
        "header.0.0",
        "header.0.1",
        "header.1",
    }
    assert compensations(cv, rid) == ["header.1", "header.0.0"]
    assert ("reserve", "never") not in notes(redis_client, tag)


def test_a_chain_of_groups_with_failing_members_settles_the_group_then_unwinds(cv, redis_client):
    """#8786: the failing group settles every member, the next group never runs."""
    t, tag = tasks(), uuid.uuid4().hex[:10]
    first = group(t.reserve.si(tag, "a"), t.decline.si(tag, "b"), t.reserve.si(tag, "c"))
    sig = chain(first, group(t.reserve.si(tag, "d"), t.reserve.si(tag, "e")))
    rid = cv.harvest.start_canvas(sig, compensate=COMPENSATE)
    assert "canvas task 'cv.decline' (node header.1)" in str(failed(cv, rid))
    assert compensations(cv, rid) == ["header.2", "header.0"]
    assert not {"body.0", "body.1"} & {e.node for e in scheduled(cv, rid)}


def test_a_nested_chain_failing_undoes_with_the_whole_envelope_when_asked(cv, redis_client):
    t, tag = tasks(), uuid.uuid4().hex[:10]
    sig = chain(
        t.reserve.si(tag, "a"), chain(t.reserve.si(tag, "b"), t.decline.si(tag, "x")), t.reserve.si(tag, "z")
    )
    opt_in = {"cv.reserve": {"task": "cv.release_envelope", "receives": "envelope"}}
    rid = cv.harvest.start_canvas(sig, compensate=opt_in)
    assert "(node 2)" in str(failed(cv, rid))
    assert compensations(cv, rid) == ["1", "0"]
    undone = [v for what, v in notes(redis_client, tag) if what == "release_envelope"]
    assert undone == [
        {"dag_compensate": "1", "input": {"args": [tag, "b"], "kwargs": {}}, "output": f"{tag}/b"},
        {"dag_compensate": "0", "input": {"args": [tag, "a"], "kwargs": {}}, "output": f"{tag}/a"},
    ]
    assert [e.call_convention for e in scheduled(cv, rid) if e.compensation] == ["envelope", "envelope"]


# ── bad input writes nothing; the same canvas is one run ──────────────────────────────────────
@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda t: chain(t.add.s(1, 2), t.app.signature("cv.unadopted", (1,))), UnknownActivity),
        (lambda t: chain(t.add.s(1, 2), t.add.s(3).set(exchange="x")), InvalidTaskCall),
        (lambda t: chord([t.add.s(1, 1)], t.tsum.s(), propagate=False), CanvasNotSupported),
        (lambda t: group(t.add.s(1, 1), t.add.s({1}, 2)), PayloadNotSerializable),
    ],
)
def test_a_refused_canvas_writes_nothing(cv, make, error):
    rid = f"cv-bad-{uuid.uuid4().hex[:8]}"
    with pytest.raises(error):
        cv.harvest.start_canvas(make(tasks()), execution_id=rid)
    assert rows(cv, rid) == {"harvest_executions": 0, "harvest_events": 0, "harvest_activity_tasks": 0}


def test_the_same_canvas_twice_one_frozen_is_one_run_and_a_changed_one_conflicts(cv):
    t = tasks()

    def make(x: int = 1) -> Any:
        return chain(t.add.s(x, 2), chord([t.add.s(3), t.add.s(4)], t.tsum.s()), t.add.s(1))

    rid = f"cv-same-{uuid.uuid4().hex[:8]}"
    frozen = make()
    frozen.freeze()  # task ids, group and chord ids, and the chord body folded in: all canonical
    assert cv.harvest.start_canvas(make(), execution_id=rid) == rid
    assert cv.harvest.start_canvas(frozen, execution_id=rid) == rid
    assert rows(cv, rid)["harvest_executions"] == 1
    assert cv.harvest.result(rid, timeout=60) == make().apply_async().get(timeout=60)
    with pytest.raises(ExecutionAlreadyExists) as info:
        cv.harvest.start_canvas(make(5), execution_id=rid)
    assert info.value.conflict == "input"


# ── retry from a node, the run graph, a countdown ─────────────────────────────────────────────
def test_retry_dag_run_on_canvas_runs(cv, redis_client):
    t, tag = tasks(), uuid.uuid4().hex[:10]
    unwound = cv.harvest.start_canvas(
        chain(t.reserve.si(tag, "a"), t.decline.si(tag, "b")), compensate=COMPENSATE
    )
    failed(cv, unwound)
    with pytest.raises(RetryRefused) as info:
        cv.harvest.retry_dag_run(CANVAS, unwound)
    assert info.value.reason == "compensated"
    # failed, not unwound: the succeeded nodes are carried, the run re-runs from a node id
    source = cv.harvest.start_canvas(chain(t.reserve.si(tag, "x"), t.decline.si(tag, "y"), t.add.s(1)))
    failed(cv, source)
    plan = cv.harvest.retry_dag_run(CANVAS, source, dry_run=True)
    assert (plan["retry_from"], plan["carried"], plan["rerun"]) == ("1", ["0"], ["1", "2"])
    fork = cv.harvest.retry_dag_run(CANVAS, source, "1")["run_id"]
    failed(cv, fork)  # decline declines again, but the carried reservation is not redone
    assert [n for n in notes(redis_client, tag) if n == ("reserve", "x")] == [("reserve", "x")]
    assert events(cv, fork)[0].input == events(cv, source)[0].input  # the graph copied unchanged
    assert [e.node for e in scheduled(cv, fork)] == ["1"]


def test_the_run_graph_shows_canvas_path_node_ids(cv):
    from fastapi.testclient import TestClient

    from harvest_celery._web.api import create_app

    t = tasks()
    rid = cv.harvest.start_canvas(chord([t.add.s(1, 1), chain(t.add.s(2, 2), t.add.s(1))], t.tsum.s()))
    cv.harvest.result(rid, timeout=60)
    response = TestClient(create_app(cv.harvest)).get(f"/dags/{CANVAS}/runs/{rid}")
    assert response.status_code == 200, response.text
    nodes = response.json()["nodes"]
    assert [(n["node_name"], n["task"], n["status"]) for n in nodes] == [
        ("header.0", "cv.add", "succeeded"),
        ("header.1.0", "cv.add", "succeeded"),
        ("header.1.1", "cv.add", "succeeded"),
        ("body", "cv.tsum", "succeeded"),
    ]
    assert nodes[-1]["depends_on"] == ["header.0", "header.1.1"]


def test_a_countdown_is_a_durable_timer_across_a_worker_restart(cv, redis_client):
    t = tasks()
    rid = cv.harvest.start_canvas(chain(t.add.s(1, 2), t.add.s(3).set(countdown=5)))
    wait_for(lambda: any(e.type == "TimerStarted" for e in events(cv, rid)), timeout=30)
    cv.worker.stop()
    broker = redis.Redis.from_url(cv.BROKER_URL)
    assert broker.llen(cv.QUEUE) == 0  # nothing parked in the broker meanwhile
    assert [e.node for e in scheduled(cv, rid)] == ["0"]
    cv.worker.start()
    assert cv.harvest.result(rid, timeout=60) == 6


def test_a_worker_whose_compiler_changed_mid_run_finishes_by_the_stored_graph(cv, redis_client):
    """Compile once: the worker restarts mid-run (the first node waits on its countdown) with a
    compiler that orders every group and chain reversed; the run still follows its stored
    graph. A decision that recompiled would dispatch the group's members in the other order and
    return its list reversed."""
    t = tasks()
    make = lambda: chain(t.add.si(1, 2).set(countdown=3), group(t.add.s(10), t.add.s(20), t.add.s(30)))  # noqa: E731
    rid = cv.harvest.start_canvas(make())
    wait_for(lambda: any(e.type == "TimerStarted" for e in events(cv, rid)), timeout=30)
    cv.worker.stop()
    flag = f"cv:compiler{os.environ['HARVEST_TEST_CV_SUFFIX']}"
    redis_client.delete(flag)
    cv.worker.extra_env["HARVEST_TEST_CV_REVERSED"] = "1"
    try:
        cv.worker.start()
        marks = [m if isinstance(m, str) else m.decode() for m in redis_client.lrange(flag, 0, -1)]
        assert marks == ["reversed"]  # the worker runs the patched compiler
        durable = cv.harvest.result(rid, timeout=60)
    finally:
        cv.worker.stop()
        del cv.worker.extra_env["HARVEST_TEST_CV_REVERSED"]
        cv.worker.start()
    assert durable == make().apply_async().get(timeout=60) == [13, 23, 33]
    group_nodes = [e for e in scheduled(cv, rid) if e.node != "0"]
    assert [e.input["args"] for e in group_nodes] == [[3, 10], [3, 20], [3, 30]]


# ── limits: a large header settles, the body's cap, kill -9 mid header ────────────────────────
def test_a_1000_task_header_with_one_early_failure_runs_all_1000_then_unwinds(cv, redis_client):
    """A level settles only when every member has a result: the early failure does not stop
    the other 999 (unlike Celery); the 999 reservations are then undone, LIFO; no body runs."""
    t, tag = tasks(), uuid.uuid4().hex[:10]
    header = [t.decline.si(tag, 0), *(t.reserve.si(tag, i) for i in range(1, 1000))]
    rid = cv.harvest.start_canvas(chord(header, t.tsum.s()), compensate=COMPENSATE)
    with pytest.raises(WorkflowFailed, match=r"canvas task 'cv.decline' \(node header.0\) failed"):
        cv.harvest.result(rid, timeout=600)
    history = events(cv, rid)
    forward = [i for i, e in enumerate(history) if e.type == "ActivityScheduled" and not e.compensation]
    undos = [i for i, e in enumerate(history) if e.type == "ActivityScheduled" and e.compensation]
    assert len(forward) == 1000 and "body" not in {history[i].node for i in forward}
    settled = [i for i, e in enumerate(history) if e.type in ("ActivityCompleted", "ActivityFailed")]
    assert len(settled) >= 1000 and settled[999] < undos[0]  # all 1,000 settled before the unwind
    assert [history[i].node for i in undos] == [f"header.{i}" for i in range(999, 0, -1)]
    seen = notes(redis_client, tag)
    assert sorted(v for what, v in seen if what == "reserve") == list(range(1, 1000))
    assert len([v for what, v in seen if what == "release"]) == 999
    assert max(i for i, (what, _) in enumerate(seen) if what == "reserve") < min(
        i for i, (what, _) in enumerate(seen) if what == "release"
    )


def test_a_chord_body_over_the_cap_fails_before_dispatch_and_a_payload_store_lets_it_run(
    cv, redis_client, tmp_path
):
    """Three 0.9 MiB header results make a 2.7 MiB body input: over the 2 MiB activity-input
    cap, refused before dispatch (PayloadTooLarge) and the header undone; with a payload store
    on the worker, the same canvas completes."""
    from harvest_celery import FileSystemPayloadStore, Harvest

    t, tag = tasks(), uuid.uuid4().hex[:10]
    size = 900 * 1024

    def make() -> Any:
        return chord([t.big.si(tag, size) for _ in range(3)], t.lengths.s())

    compensate = {"cv.big": "cv.unbig"}
    rid = cv.harvest.start_canvas(make(), compensate=compensate)
    error = failed(cv, rid)
    assert "canvas task 'cv.lengths' (node body) failed: payload too large: input of activity" in str(error)
    assert "body" not in {e.node for e in scheduled(cv, rid)}
    assert compensations(cv, rid) == ["header.2", "header.1", "header.0"]
    assert [what for what, _ in notes(redis_client, tag)].count("unbig") == 3
    # the same canvas, the worker (and this client) with a payload store: it completes
    store = str(tmp_path / "store")
    client = Harvest(
        cv.DATABASE_URL, cv.app, decision_queue=cv.DECIDE, payload_store=FileSystemPayloadStore(store)
    )
    for name in ("cv.big", "cv.unbig", "cv.lengths"):
        client.adopt_task(name, queue=cv.QUEUE)
    cv.worker.restart({"HARVEST_TEST_CV_STORE": store})
    try:
        rid = client.start_canvas(make(), compensate=compensate)
        assert client.result(rid, timeout=120) == [len(tag) + 1 + size] * 3
        assert [what for what, _ in notes(redis_client, tag)].count("unbig") == 3  # none more
    finally:
        cv.worker.extra_env.pop("HARVEST_TEST_CV_STORE")
        cv.worker.restart()
        client.store.engine.dispose()


def test_kill_9_of_the_worker_mid_chord_header_completes_at_least_once(cv, redis_client):
    """The worker is killed while header bodies sleep: the run completes with plain Celery's
    result, every body execution had its own ActivityStarted, and no node ran more often than
    it was started (at-least-once, never beyond)."""
    from harvest_celery import RetryPolicy

    t, tag = tasks(), uuid.uuid4().hex[:10]

    def make(tag: str) -> Any:
        return chord([t.slow.si(tag, i, 2.0) for i in range(6)], t.tsum.s())

    retry = {"cv.slow": RetryPolicy(max_attempts=5, initial_interval=0.2)}
    rid = cv.harvest.start_canvas(make(tag), retry=retry)
    wait_for(lambda: len(notes(redis_client, tag)) >= 2, timeout=30, what="header bodies running")
    cv.worker.kill9()
    cv.worker.start()
    assert cv.harvest.result(rid, timeout=120) == make(f"{tag}-plain").apply_async().get(timeout=60) == 15
    history = events(cv, rid)
    node_of = {e.activity_id: e.node for e in history if e.type == "ActivityScheduled"}
    started: dict[str, int] = {}
    completed: dict[str, int] = {}
    for e in history:
        if e.type == "ActivityStarted":
            started[node_of[e.activity_id]] = started.get(node_of[e.activity_id], 0) + 1
        if e.type == "ActivityCompleted":
            completed[node_of[e.activity_id]] = completed.get(node_of[e.activity_id], 0) + 1
    ran: dict[str, int] = {}
    for what, item in notes(redis_client, tag):
        assert what == "slow"
        ran[f"header.{item}"] = ran.get(f"header.{item}", 0) + 1
    assert set(ran) == {f"header.{i}" for i in range(6)}
    assert all(1 <= ran[node] <= started[node] for node in ran), (ran, started)
    assert any(n > 1 for n in ran.values())  # the killed executions ran again
    assert completed == {**{f"header.{i}": 1 for i in range(6)}, "body": 1}


# ── refused at run time: Task.replace, a non-JSON result; neither retried ─────────────────────
@pytest.mark.parametrize(
    ("task", "error"),
    [("grow", "CanvasNotSupported: Task.replace() in task 'cv.grow'"), ("as_set", "PayloadNotSerializable")],
)
def test_a_body_that_replaces_itself_or_returns_no_json_fails_once_and_unwinds(cv, redis_client, task, error):
    """Only a running body reveals ``Task.replace()``; a non-JSON result is the other run-time
    refusal. The task is adopted with 3 attempts, yet the attempt is not retried, and the
    completed node is undone."""
    t, tag = tasks(), uuid.uuid4().hex[:10]
    sig = chain(t.reserve.si(tag, "a"), getattr(t, task).si(tag))
    rid = cv.harvest.start_canvas(sig, compensate=COMPENSATE)
    message = str(failed(cv, rid))
    assert f"canvas task 'cv.{task}' (node 1) failed: {error}" in message
    assert [e.type for e in events(cv, rid)].count("ActivityStarted") == 3  # 0, 1 once, the undo
    assert notes(redis_client, tag) == [("reserve", "a"), (task, 1), ("release", f"{tag}/a")]
    assert compensations(cv, rid) == ["0"]


def test_an_erased_canvas_run_shows_its_state_and_an_unreadable_version_is_409(cv):
    """After erasure the run graph reports the run's state and says its graph was erased; a
    stored graph of a schema version this release cannot read fails the run, and its retry is
    refused with 409 canvas_version."""
    from fastapi.testclient import TestClient

    from harvest_celery._web.api import create_app

    t = tasks()
    client = TestClient(create_app(cv.harvest))
    rid = cv.harvest.start_canvas(chain(t.add.s(1, 2), t.add.s(3)))
    cv.harvest.result(rid, timeout=60)
    cv.harvest.erase_payloads(rid)
    body = client.get(f"/dags/{CANVAS}/runs/{rid}").json()
    assert (body["state"], body["nodes"]) == ("COMPLETED", []), body
    assert "erased" in body["note"]
    newer = cv.harvest.start_workflow(CANVAS, {"canvas": 99, "nodes": []})
    with pytest.raises(WorkflowFailed, match="schema version 99"):
        cv.harvest.result(newer, timeout=60)
    with pytest.raises(RetryRefused) as info:
        cv.harvest.retry_dag_run(CANVAS, newer)
    assert info.value.reason == "canvas_version"
    response = client.post(f"/dags/{CANVAS}/runs/{newer}/retry")
    assert response.status_code == 409 and response.json()["reason"] == "canvas_version", response.text


def test_no_chord_unlock_was_ever_sent(cv):
    """#9674: ``chord_unlock`` retries forever in Celery; harvest's join is a DAG level, so the
    worker that ran every canvas of this module (durable and plain) never received one."""
    log = cv.worker.log.read_text(errors="replace")
    assert "Task cv." in log and "chord_unlock" not in log
