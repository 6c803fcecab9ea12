"""Canvases made durable (issue 28), without services: the compiler (signature -> canonical
graph: node ids, Celery's argument rules, refusals, one form for a frozen and a fresh canvas),
and the built-in ``harvest.canvas`` workflow in the pure engine (keyed by node id, results equal
to Celery's eager ``apply().get()``, the unwind order and the compensation conventions,
``link``/``link_error``, replay from the stored graph only)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.canvas import chunks as canvas_chunks

from harvest_celery import (
    CanvasNotSupported,
    InvalidTaskCall,
    PayloadNotSerializable,
    RetryPolicy,
    UnknownActivity,
)
from harvest_celery._core import events as ev
from harvest_celery._core.registry import ActivityDefinition, WorkflowDefinition
from harvest_celery._dag import canvas_compile
from harvest_celery._dag.canvas import CANVAS
from harvest_celery._dag.canvas_compile import compile_canvas
from harvest_celery._dag.canvas_run import canvas_workflow
from harvest_celery._dag.folds import fold_dispatches
from harvest_celery._runtime.adopt import _call
from harvest_celery.testing import Simulator, registry_of

# plain Celery only as the reference: ``Signature.apply()`` runs a canvas in this process (no
# broker, no worker); dispatch is covered on real workers by tests/integration/test_canvas.py
app = Celery("canvas_unit", set_as_current=False)


@app.task(name="t.add")
def add(x, y=0, *, z=0):
    return x + y + z


@app.task(name="t.tsum")
def tsum(xs, *, scale=1):
    return sum(xs) * scale


@app.task(name="t.pair")
def pair(x, y):
    return [x, y]


@app.task(name="t.boom")
def boom(*args):
    raise RuntimeError("boom")


@app.task(name="t.release")
def release(value):
    return None


@app.task(name="t.errback")
def errback(info):
    return None


BODIES = {t.name: t.run for t in (add, tsum, pair, boom, release, errback)}
ADOPTED = [SimpleNamespace(__harvest_activity__=ActivityDefinition(n, None, adopted=True)) for n in BODIES]
NATIVE = SimpleNamespace(__harvest_activity__=ActivityDefinition("native", lambda x: x))
CANVAS_WF = SimpleNamespace(__harvest_workflow__=WorkflowDefinition(CANVAS, canvas_workflow, kind="canvas"))
REGISTRY = registry_of(*ADOPTED, NATIVE)


def graph(sig: Any, **kw: Any) -> dict[str, Any]:
    return compile_canvas(sig, REGISTRY, **kw)


def ids(sig: Any) -> list[str]:
    return [n["id"] for n in graph(sig)["nodes"]]


def run_canvas(sig: Any, fail: set[str] = frozenset(), **kw: Any) -> Any:  # type: ignore[assignment]
    """Run the canvas in the simulator, each dispatch executed as the adoption guard would
    call its body (its recorded convention); nodes in ``fail`` fail."""
    run = Simulator(CANVAS_WF, *ADOPTED).start(CANVAS, graph(sig, **kw))
    for _ in range(200):
        run.decide()
        open_ = [a for a in run.open_activities() if not _started(run, a.activity_id)]
        if not open_:
            run.fire_timers()
            if not [a for a in run.open_activities() if not _started(run, a.activity_id)]:
                run.decide()
                if not [a for a in run.open_activities() if not _started(run, a.activity_id)]:
                    return run
            continue
        for a in open_:
            if a.node in fail and not a.compensation:
                run.fail(a.activity_id, "RuntimeError", f"node {a.node} failed")
            else:
                run.complete(a.activity_id, _call(BODIES[a.activity_name], a.call_convention, a.input))
    raise AssertionError("did not settle")


def _started(run: Any, activity_id: str) -> bool:
    return any(isinstance(e, ev.ActivityStarted) and e.activity_id == activity_id for e in run.events)


def result(run: Any) -> Any:
    assert run.status == "COMPLETED", run.events[-1]
    return run.events[-1].result


def scheduled(run: Any) -> list[ev.ActivityScheduled]:
    return [e for e in run.events if isinstance(e, ev.ActivityScheduled)]


def eager(sig: Any) -> Any:
    """What Celery returns, through JSON as its json serializer would."""
    import json

    if isinstance(sig, canvas_chunks):
        sig = sig.group()  # an eager chunks returns its group's result object
    return json.loads(json.dumps(sig.apply().get()))


# ── the compiler: node ids, argument rules ────────────────────────────────────────────────────
def test_node_ids_are_canvas_paths_in_path_order():
    sig = chain(add.s(1, 2), chord([add.s(3), chain(add.s(4), add.s(5))], tsum.s()), add.si(7, 8))
    assert ids(sig) == ["0", "1.header.0", "1.header.1.0", "1.header.1.1", "1.body", "2"]
    assert ids(add.s(1, 2)) == ["0"]
    assert ids(group(add.s(1), add.s(2))) == ["0", "1"]
    assert ids(chord([add.s(1, 1)], tsum.s())) == ["header.0", "body"]


def test_a_chain_prepends_the_previous_result_unless_immutable():
    g = graph(chain(add.s(1, 2), add.s(3), add.si(4, 5)))
    first, second, third = g["nodes"]
    assert first["prepend"] is None and first["upstreams"] == []
    assert second["prepend"] == "0" and second["upstreams"] == ["0"]
    assert second["call"] == {"args": [3], "kwargs": {}}
    assert third["prepend"] is None and third["upstreams"] == ["1"]  # waits, gets nothing
    assert g["result"] == "2"


def test_a_chord_body_gets_the_header_list():
    g = graph(chord([add.s(1, 1), chain(add.s(2, 2), add.s(1))], tsum.s()))
    body = g["nodes"][-1]
    assert body["prepend"] == ["header.0", "header.1.1"]
    assert body["upstreams"] == ["header.0", "header.1.1"]
    assert g["result"] == "body"


def test_a_group_result_is_the_list_of_its_members():
    assert graph(group(add.s(1, 1), chain(add.s(1, 1), add.s(2))))["result"] == ["0", "1.1"]


def test_signature_kwargs_are_kept_and_json_normalised():
    node = graph(add.s((1,), z=(2,)))["nodes"][0]
    assert node["call"] == {"args": [[1]], "kwargs": {"z": [2]}}


def test_chunks_and_starmap_are_one_node_per_chunk():
    g = graph(add.chunks([(1, 2), (3, 4), (5, 6)], 2))
    assert [(n["id"], n["kind"], n["call"]) for n in g["nodes"]] == [
        ("0", "per_item", {"items": [[1, 2], [3, 4]]}),
        ("1", "per_item", {"items": [[5, 6]]}),
    ]
    assert g["result"] == ["0", "1"]
    s = graph(add.starmap([(1, 2), (3, 4)]))
    assert s["result"] == "0" and s["nodes"][0]["call"] == {"items": [[1, 2], [3, 4]]}


def test_queue_countdown_eta_compensator_and_retry_are_per_node():
    sig = chain(add.s(1, 2).set(queue="fast", countdown=5), add.s(3))
    g = graph(sig, compensate={"t.add": "t.release"}, retry={"t.add": RetryPolicy(max_attempts=1)})
    first, second = g["nodes"]
    assert first["queue"] == "fast" and first["countdown"] == 5.0
    assert second["queue"] is None and second["countdown"] is None
    assert first["compensator"] == {"task": "t.release", "receives": "output"}
    assert first["retry"]["max_attempts"] == 1
    opted = graph(add.s(1, 2), compensate={"t.add": {"task": "t.release", "receives": "envelope"}})
    assert opted["nodes"][0]["compensator"]["receives"] == "envelope"


def test_a_composite_queue_applies_to_members_without_one():
    g = graph(group(add.s(1, 1), add.s(2, 2).set(queue="own")).set(queue="grp"))
    assert [n["queue"] for n in g["nodes"]] == ["grp", "own"]


def test_a_link_error_anywhere_is_the_canvas_s_once():
    errback_sig = errback.s()
    sig = chain(add.s(1, 1).on_error(errback_sig), add.s(2).on_error(errback.s()))
    assert [e["task"] for e in graph(sig)["link_error"]] == ["t.errback"]


def test_link_and_link_error_on_the_canvas_are_its_callbacks():
    sig = chain(add.s(1, 2), add.s(3))
    sig.link(tsum.s(scale=2))
    sig.link_error(errback.si({"x": 1}))
    g = graph(sig)
    assert g["link"] == [
        {"task": "t.tsum", "call": {"args": [], "kwargs": {"scale": 2}}, "immutable": False, "queue": None}
    ]
    assert g["link_error"][0]["immutable"] is True


# ── one canonical form ────────────────────────────────────────────────────────────────────────
def _nested() -> Any:
    return chain(add.s(1, 2), chord([add.s(3), chain(add.s(4), add.s(5))], tsum.s()), add.si(7, 8))


def test_a_frozen_canvas_compiles_to_the_same_graph_as_a_fresh_one():
    backend_app = Celery("canvas_freeze", set_as_current=False, backend="cache+memory://")
    fresh = _nested()
    frozen = _nested()
    frozen._app = backend_app  # freeze needs a result backend for the chord
    for sig in (frozen, *frozen.tasks):
        sig._app = backend_app
    frozen.freeze()
    assert graph(frozen) == graph(fresh)
    g = group(add.s(1), add.s(2))
    g2 = group(add.s(1), add.s(2))
    g2.freeze()
    assert graph(g2) == graph(g)


def test_a_nested_chain_is_spliced():
    assert graph(chain(add.s(1, 1), chain(add.s(2), add.s(3)))) == graph(
        chain(add.s(1, 1), add.s(2), add.s(3))
    )


# ── refusals ──────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize(
    ("sig", "error", "text"),
    [
        (lambda: chord([add.s(1, 1)], tsum.s(), propagate=False), CanvasNotSupported, "propagate=False"),
        (lambda: chain(add.s(1, 1), add.s(2).set(exchange="x")), InvalidTaskCall, "exchange"),
        (lambda: chain(add.s(1, 1), add.s(2).set(routing_key="x")), InvalidTaskCall, "routing_key"),
        (lambda: chain(add.s(1, 1).set(link=[errback.s()]), add.s(2)), CanvasNotSupported, "inside a canvas"),
        (lambda: add.s({1, 2}), PayloadNotSerializable, "argument 0 of task 't.add'"),
        (lambda: app.signature("t.unknown", (1,)), UnknownActivity, "t.unknown"),
        (lambda: app.signature("native", (1,)), UnknownActivity, "adopt_task"),
        (lambda: app.signature("celery.accumulate", (1,)), CanvasNotSupported, "celery.accumulate"),
        (lambda: chain(add.s(1, 1), add.s(2)).set(countdown=3), CanvasNotSupported, "countdown"),
        (lambda: add.chunks([(1, 2)], 0), CanvasNotSupported, "positive integer"),
    ],
)
def test_a_bad_canvas_is_refused(sig, error, text):
    with pytest.raises(error, match=text):
        graph(sig())


def test_canvas_not_supported_is_an_invalid_task_call():
    assert issubclass(CanvasNotSupported, InvalidTaskCall)


def test_an_unadopted_compensator_is_refused():
    with pytest.raises(UnknownActivity):
        graph(add.s(1, 2), compensate={"t.add": "t.nope"})
    with pytest.raises(InvalidTaskCall, match="receives"):
        graph(add.s(1, 2), compensate={"t.add": {"task": "t.release", "receives": "input"}})


# ── the run: results equal Celery's ───────────────────────────────────────────────────────────
@pytest.mark.parametrize(
    "make",
    [
        lambda: chain(add.s(1, 2), add.s(3), add.si(10, 20)),
        lambda: chain(add.s(1, 2), add.s(3), pair.s(9)),
        lambda: group(add.s(1, 1), add.s(2, 2), pair.s(1, 2)),
        lambda: chord([add.s(1, 1), add.s(2, 2)], tsum.s(scale=3)),
        lambda: chain(add.s(1, 2), chord([add.s(3), chain(add.s(4), add.s(5))], tsum.s()), add.s(1)),
        lambda: chain(add.s(1, z=5), add.s(2, z=1)),
        lambda: add.chunks([(1, 2), (3, 4), (5, 6)], 2),
        lambda: add.starmap([(1, 2), (3, 4)]),
        lambda: chain(group(add.s(1, 1), add.s(2, 2)), tsum.s()),
    ],
)
def test_a_canvas_run_returns_what_celery_returns(make):
    assert result(run_canvas(make())) == eager(make())


def test_each_dispatch_records_its_node_id_outside_the_invocation():
    run = run_canvas(group(add.s(1, 1), add.s(2, 2)))
    dispatched = scheduled(run)
    assert [(d.activity_name, d.node, d.call_convention) for d in dispatched] == [
        ("t.add", "0", "args_kwargs"),
        ("t.add", "1", "args_kwargs"),
    ]
    assert all(set(d.input) == {"args", "kwargs"} for d in dispatched)
    assert set(fold_dispatches(run.history).forward_by_name()) == {"0", "1"}


def test_a_countdown_is_a_durable_timer_before_the_dispatch():
    run = Simulator(CANVAS_WF, *ADOPTED).start(CANVAS, graph(add.s(1, 2).set(countdown=5)))
    run.decide()
    assert run.types()[-1] == "TimerStarted" and not scheduled(run)
    run.fire_timers()
    run.decide()
    assert scheduled(run)[0].node == "0"


def test_link_runs_once_with_the_result_prepended():
    sig = chain(add.s(1, 2), add.s(3))
    sig.link(pair.s(0))
    run = run_canvas(sig)
    assert result(run) == 6
    link = scheduled(run)[-1]
    assert (link.node, link.input) == ("link.0", {"args": [6, 0], "kwargs": {}})


# ── failures: the unwind, the conventions, link_error ─────────────────────────────────────────
def test_a_failed_chord_header_unwinds_completed_nodes_lifo_and_never_runs_the_body():
    sig = chain(add.s(1, 2), chord([add.s(3), add.s(4), add.s(5)], tsum.s()))
    run = run_canvas(sig, fail={"1.header.1"}, compensate={"t.add": "t.release"})
    assert run.status == "FAILED"
    failed = run.events[-1]
    assert "canvas task 't.add' (node 1.header.1) failed" in failed.message
    comps = [d for d in scheduled(run) if d.compensation]
    # forward level order: 0, then 1.header.0, 1.header.2; popped LIFO
    assert [c.node for c in comps] == ["1.header.2", "1.header.0", "0"]
    assert [c.input["dag_compensate"] for c in comps] == ["1.header.2", "1.header.0", "0"]
    assert all(c.call_convention == "envelope_output" for c in comps)
    assert comps[0].input["output"] == 8  # 3 + 5: the undo receives the result
    assert "1.body" not in {d.node for d in scheduled(run)}


def test_the_envelope_opt_in_is_recorded_as_its_convention():
    run = run_canvas(
        chain(add.s(1, 2), boom.s()),
        fail={"1"},
        compensate={"t.add": {"task": "t.release", "receives": "envelope"}},
    )
    (comp,) = [d for d in scheduled(run) if d.compensation]
    assert comp.call_convention == "envelope"
    assert _call(lambda e: e, comp.call_convention, comp.input) == {
        "dag_compensate": "0",
        "input": {"args": [1, 2], "kwargs": {}},
        "output": 3,
    }
    assert _call(lambda r: r, "envelope_output", comp.input) == 3


def test_link_error_runs_after_the_last_compensation_with_the_failure():
    sig = chain(add.s(1, 2), chain(add.s(3), boom.s()))
    sig.link_error(errback.s())
    run = run_canvas(sig, fail={"2"}, compensate={"t.add": "t.release"})
    dispatched = scheduled(run)
    assert [d.node for d in dispatched] == ["0", "1", "2", "1", "0", "link_error.0"]
    assert dispatched[-1].input["args"][0] == {
        "task": "t.boom",
        "node": "2",
        "error_type": "RuntimeError",
        "message": "node 2 failed",
    }
    assert run.status == "FAILED" and "node 2" in run.events[-1].message


def test_replay_reads_the_stored_graph_not_the_compiler(monkeypatch):
    run = run_canvas(group(add.s(1, 1), add.s(2, 2)))
    # a compiler that would now order the group differently changes nothing on replay
    monkeypatch.setattr(canvas_compile, "_members", lambda tasks: list(reversed(list(tasks))))
    decision = Simulator(CANVAS_WF, *ADOPTED).run_from_history(CANVAS, run.events).replay()
    assert decision.nd is None


def test_an_unreadable_graph_version_fails_the_run():
    run = Simulator(CANVAS_WF, *ADOPTED).start(CANVAS, {"canvas": 99, "nodes": []})
    run.decide()
    assert run.status == "FAILED" and "schema version 99" in run.events[-1].message


def test_the_async_client_starts_a_canvas_as_the_sync_one_does(tmp_path):
    import asyncio

    from harvest_celery import AsyncHarvest, ExecutionAlreadyExists, Harvest

    local = Celery("canvas_async", broker="memory://", set_as_current=False)
    a, s = local.task(name="t.add")(add.run), local.task(name="t.tsum")(tsum.run)
    h = Harvest(f"sqlite:///{tmp_path / 'canvas.db'}", local)
    h.migrate()
    for task in (a, s):
        h.adopt_task(task.name)
    sig = chord([a.s(1, 1), a.s(2, 2)], s.s())

    async def scenario() -> Any:
        async with AsyncHarvest(h) as client:
            rid = await client.start_canvas(sig, execution_id="cv-async")
            again = await client.start_canvas(sig, execution_id="cv-async")
            with pytest.raises(ExecutionAlreadyExists):
                await client.start_canvas(chord([a.s(9, 9)], s.s()), execution_id="cv-async")
            with pytest.raises(CanvasNotSupported):
                await client.start_canvas(chord([a.s(1, 1)], s.s(), propagate=False))
            return rid, again

    assert asyncio.run(scenario()) == ("cv-async", "cv-async")
    started = h.history("cv-async")[0].event
    assert started.workflow_type == CANVAS and started.input == graph(sig)


def test_a_run_lock_leaves_the_stored_graph_unread_unless_asked(tmp_path):
    """Every completion and decision locks the run row: it must not read (and decode) the
    canvas graph, which is as large as the canvas (B5 was O(nodes) per lock before)."""
    from harvest_celery import Harvest
    from harvest_celery._store.records import NOT_LOADED

    local = Celery("canvas_lock", broker="memory://", set_as_current=False)
    a, s = local.task(name="t.add")(add.run), local.task(name="t.tsum")(tsum.run)
    h = Harvest(f"sqlite:///{tmp_path / 'lock.db'}", local)
    h.migrate()
    for task in (a, s):
        h.adopt_task(task.name)
    sig = chord([a.s(i, i) for i in range(20)], s.s())
    rid = h.start_canvas(sig, execution_id="cv-lock")
    with h.store.begin() as tx:
        lean, full = tx.lock(rid), tx.lock(rid, payloads=True)
    assert lean is not None and full is not None
    assert lean.input is NOT_LOADED and lean.result is NOT_LOADED
    assert h.store.payloads.decode_value(full.input) == graph(sig)
    assert (lean.id, lean.status, lean.next_seq) == (full.id, full.status, full.next_seq)


def test_each_node_records_its_policy_and_run_time_refusals_are_never_retried():
    given = graph(add.s(1, 2), retry={"t.add": RetryPolicy(max_attempts=2)})["nodes"][0]["retry"]
    adopted = graph(add.s(1, 2))["nodes"][0]["retry"]  # no canvas policy: the task's adopted one
    assert (given["max_attempts"], adopted["max_attempts"]) == (2, 3)
    for policy in (given, adopted):
        assert set(policy["non_retryable_error_types"]) == {"CanvasNotSupported", "PayloadNotSerializable"}
    assert not RetryPolicy.from_data(given).should_retry(1, "CanvasNotSupported")


def test_task_replace_and_add_to_chord_are_refused_only_while_harvest_runs_the_body():
    from harvest_celery._runtime.adopt import RUNNING, _refuse_dynamic

    local = Celery("canvas_replace", set_as_current=False)

    @local.task(name="t.grow", bind=True)
    def grow(self):
        return self.replace(add.si(1, 1))

    _refuse_dynamic(grow)
    grow.push_request()
    try:
        setattr(grow.request, RUNNING, True)
        with pytest.raises(CanvasNotSupported, match=r"Task.replace\(\) in task 't.grow'"):
            grow.replace(add.si(1, 1))
        with pytest.raises(CanvasNotSupported, match="add_to_chord"):
            grow.add_to_chord(add.si(1, 1))
        setattr(grow.request, RUNNING, False)
        with pytest.raises(ValueError, match="not member of any chord"):  # Celery's own, as before
            grow.add_to_chord(add.si(1, 1))
    finally:
        grow.pop_request()


def test_a_sealed_run_never_unwinds_and_never_runs_link_error():
    sig = chain(add.s(1, 2), group(add.s(1), boom.s()))
    sig.link_error(errback.s())
    run = Simulator(CANVAS_WF, *ADOPTED).start(CANVAS, graph(sig, compensate={"t.add": "t.release"}))
    run.decide()
    (first,) = run.open_activities()
    run.complete(first.activity_id, 3)
    run.decide()
    ok, bad = sorted(run.open_activities(), key=lambda a: a.node)
    assert (ok.node, bad.node) == ("1.0", "1.1")
    run.complete(ok.activity_id, 4)
    run.fail(bad.activity_id, "RuntimeError", "boom")
    run.cancel("stop")  # the seal, then the post-cancel decision
    assert run.status == "CANCELLED"
    assert [d.node for d in scheduled(run)] == ["0", "1.0", "1.1"]  # no undo, no link_error
