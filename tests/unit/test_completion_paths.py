"""The completion paths' pieces without services: ``fast_paths``, the closed fallback enum, the
guard's refusal of an erased run (unreachable in an integration test), pure staging, and a
listable payload store's prefix listing and erasure by prefix (SQLite, embedded mode)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from harvest_celery import FileSystemPayloadStore, Harvest, InvalidState, WorkflowContext, activity, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.commands import Decision, ScheduleActivity
from harvest_celery._core.registry import Registry, register_into
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._payloads.stores import listable
from harvest_celery._runtime.completion import FALLBACK_REASONS, PATHS
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._runtime.settings import fast_path_settings
from harvest_celery._store import predicates
from harvest_celery._store.records import Dispatch, EagerClaim, RunRow, Timings
from harvest_celery._store.staging import stage_decision

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


@activity(name="cu_step")
def cu_step(x: Any) -> Any:
    return x


@activity(name="cu_big")
def cu_big(size: int) -> str:
    return "z" * size


@workflow(name="cu_flow")
async def cu_flow(ctx: WorkflowContext, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.execute_activity(cu_step, i)
    return total


@workflow(name="cu_big_flow")
async def cu_big_flow(ctx: WorkflowContext, size: int) -> int:
    return len(await ctx.execute_activity(cu_big, size))


def embedded(tmp_path: Any, **kwargs: Any) -> Harvest:
    h = Harvest(f"sqlite:///{tmp_path / 'h.db'}", **kwargs).register(cu_step, cu_big, cu_flow, cu_big_flow)
    h.migrate()
    return h


# ── fast_paths ────────────────────────────────────────────────────────────────────────────────
def test_fast_paths_false_stands_for_the_four_settings():
    off = {"inline_decisions": False, "sticky_sessions": False, "eager_max_chain": 0, "eager_start": False}
    assert fast_path_settings(False, None, None, None) == off
    assert fast_path_settings(False, False, False, 0, False) == off
    assert fast_path_settings(True, None, None, None) == {}
    assert fast_path_settings(True, None, False, 3) == {"sticky_sessions": False, "eager_max_chain": 3}
    assert fast_path_settings(True, None, None, None, False) == {"eager_start": False}


@pytest.mark.parametrize(
    ("name", "value"),
    [("inline_decisions", True), ("sticky_sessions", True), ("eager_max_chain", 1), ("eager_start", True)],
)
def test_fast_paths_false_with_a_setting_at_its_fast_value_names_both(name, value):
    with pytest.raises(ValueError, match=rf"fast_paths=False contradicts {name}={value!r}"):
        fast_path_settings(
            False,
            **{
                "inline_decisions": None,
                "sticky_sessions": None,
                "eager_max_chain": None,
                "eager_start": None,
                name: value,
            },
        )


def test_harvest_fast_paths_false_sends_every_step_through_the_decision_task(tmp_path):
    h = embedded(tmp_path, fast_paths=False)
    s = h.runtime.settings
    assert (s.inline_decisions, s.sticky_sessions, s.eager_max_chain, s.eager_start) == (
        False,
        False,
        0,
        False,
    )
    before = {p: METRICS.value("decisions", {"workflow": "cu_flow", "path": p}) for p in PATHS}
    rid = h.start_workflow("cu_flow", 3)
    assert h.result(rid, timeout=10) == 3
    after = {p: METRICS.value("decisions", {"workflow": "cu_flow", "path": p}) - before[p] for p in PATHS}
    assert after == {"one_statement": 0, "inline": 0, "task": 4}


def test_the_fallback_reasons_are_a_closed_enum():
    assert FALLBACK_REASONS == (
        "not_warm",
        "not_positioned",
        "parallel_open",
        "advance_refused",
        "nd",
        "interrupted",
        "offload",
        "guard",
        "error",
        "cold_history",
        "closing_with_work",
        "unsupported_shape",
        "limited",
        "decision_pending",
        "not_decidable",
        "not_registered",
        "child",
        "admission",
    )
    assert PATHS == ("one_statement", "inline", "task")


def test_a_decision_that_writes_another_run_leaves_the_one_statement_path():
    from harvest_celery._core import events as ev
    from harvest_celery._core.commands import Completed, ContinuedAsNew, Decision, StartChildWorkflow
    from harvest_celery._runtime.completion import _judged

    plain = [ev.WorkflowStarted("wf", 1)]
    child = [ev.WorkflowStarted("wf", 1, parent_id="p")]
    parent = [*plain, ev.ChildWorkflowScheduled("r-c1", "kid")]
    start = Decision(commands=[StartChildWorkflow("r-c1", "kid", 1, "", "terminate")])
    assert _judged(start, plain).reason == "child"
    assert _judged(Decision(outcome=ContinuedAsNew("r-n1", 1)), plain).reason == "child"
    assert _judged(Decision(outcome=Completed(1)), child).reason == "child"  # its notice
    assert _judged(Decision(outcome=Completed(1)), parent).reason == "child"  # its policies
    assert _judged(Decision(outcome=Completed(1)), plain).reason is None
    assert _judged(Decision(), child).reason is None  # a step of a child that does not close


# ── erased_at: the guard refuses it; no completion can meet it ────────────────────────────────
def test_the_guard_refuses_an_erased_run_and_erasure_never_meets_a_live_one(tmp_path):
    assumed = RunRow.assumed("r", "cu_flow", 3, None)
    params = {"next_seq": 3, "sticky_queue": None, "attempt": 1}
    assert predicates.fast_path.holds(assumed, _Task(), **params)
    erased = replace(assumed, erased_at=NOW)
    assert [t.name for t in predicates.fast_path.refusing(erased, _Task(), **params)] == ["not erased"]
    assert "erased_at IS NULL" in predicates.fast_path.sql()
    # erasure is for terminal runs only: a run a completion could meet is never erased
    h = embedded(tmp_path)
    h._inline = None  # keep the run live: no in-process drain
    rid = h.start_workflow("cu_flow", 2)
    with pytest.raises(InvalidState, match="RUNNING"):
        h.erase_payloads(rid)


class _Task:
    status = "running"
    attempt = 1


# ── pure staging ──────────────────────────────────────────────────────────────────────────────
def _row(**changes: Any) -> RunRow:
    return replace(RunRow.assumed("run-1", "cu_flow", 4, None), **changes)


def test_staging_a_decision_puts_sends_and_counts_nothing(tmp_path):
    store = FileSystemPayloadStore(tmp_path / "blobs")
    payloads = Payloads(None, store, 16)
    registry = Registry()
    register_into(registry, [cu_step])
    decision = Decision(commands=[ScheduleActivity("2", "cu_step", "x" * 100, "default")])
    wanted: list[str] = []
    eager = EagerClaim("w", 60.0, lambda d: wanted.append(d.activity_id) or True)
    staged = stage_decision(
        _row(),
        [],
        decision,
        registry,
        NOW,
        Timings(),
        "cu_flow",
        payloads,
        leading=[ev.ActivityCompleted("1", "y" * 100, 1)],
        eager=eager,
    )
    assert not (tmp_path / "blobs").exists()  # nothing put: the blobs are in the value
    keys = [key for key, _data in staged.blobs]
    assert len(keys) == 2 and all(k.startswith("run-1/") for k in keys), keys
    assert len({k.split("/")[1] for k in keys}) == 1  # one part unique to this staging
    assert [d.kind for d in staged.dispatches] == [Dispatch.ACTIVITY]
    assert staged.claimed is not None and staged.dispatches[0].claimed == staged.claimed
    assert wanted == ["2"]
    assert [e["type"] for e in staged.write.events] == [
        "ActivityCompleted",
        "ActivityScheduled",
        "ActivityStarted",
    ]
    again = stage_decision(
        _row(),
        [],
        decision,
        registry,
        NOW,
        Timings(),
        "cu_flow",
        payloads,
        leading=[ev.ActivityCompleted("1", "y" * 100, 1)],
    )
    assert {k.split("/")[1] for k, _ in again.blobs}.isdisjoint(k.split("/")[1] for k in keys)


# ── a listable store: list(prefix), erasure by prefix ─────────────────────────────────────────
def test_the_file_system_store_lists_keys_exactly_by_prefix(tmp_path):
    store = FileSystemPayloadStore(tmp_path)
    assert listable(store)
    for key in ("a/1/output", "a/x1/2/input", "a__b/1/output", "ab/1/output"):
        store.put(key, key.encode())
    (tmp_path / "a__legacy__output").write_bytes(b"old")  # an earlier version's file name
    assert store.list("a/") == ["a/1/output", "a/legacy/output", "a/x1/2/input"]
    assert store.get("a/legacy/output") == b"old"
    store.delete("a/legacy/output")
    assert store.list("a/") == ["a/1/output", "a/x1/2/input"]
    assert store.list("a__b/") == ["a__b/1/output"]


def test_erasure_deletes_every_blob_under_the_runs_prefix(tmp_path):
    store = FileSystemPayloadStore(tmp_path / "blobs")
    h = embedded(tmp_path, payload_store=store, offload_threshold=64)
    rid = h.start_workflow("cu_big_flow", 500)
    assert h.result(rid, timeout=10) == 500
    store.put(f"{rid}/0123456789ab/9/output", b"an orphan a crash left")  # referenced by no row
    other = h.start_workflow("cu_big_flow", 200)
    h.result(other, timeout=10)
    kept = store.list(f"{other}/")
    assert len(store.list(f"{rid}/")) >= 2 and kept
    counts = h.erase_payloads(rid)
    assert store.list(f"{rid}/") == [] and counts["blobs"] >= 2
    assert store.list(f"{other}/") == kept  # another run's blobs untouched


def test_a_statement_whose_commit_is_unknown_keeps_its_blobs():
    """A refused or failed guarded statement deletes its blobs; one whose connection went (or
    that a signal interrupted) may have committed, so they stay (an orphan at worst, deleted by
    prefix when the run is erased or purged)."""
    import sqlalchemy as sa

    from harvest_celery._store.tx import _outcome_unknown

    lost = sa.exc.OperationalError("UPDATE", {}, Exception("server closed the connection"))
    assert _outcome_unknown(lost) and _outcome_unknown(KeyboardInterrupt())
    assert not _outcome_unknown(sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not _outcome_unknown(RuntimeError("a bug"))
