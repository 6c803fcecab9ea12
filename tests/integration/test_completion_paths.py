"""The completion paths on real Postgres (``_runtime/completion.py``), in process: the engine's
in-process dispatcher drives claims, bodies and completions through the code a Celery worker
runs, so a test seam can land a change between an attempt's claim and its completion.

* One test per guard column, generated from ``predicates.fast_path``'s declaration: the change
  lands through ``Runtime.before_inline_decision``; the one-statement write is refused by its
  guard (``harvest_decision_fallbacks_total{reason="guard"}`` rose by one, no other reason was
  counted) and the stored rows equal the ordinary path's with the same change landed.
* With an offloading payload store that lists its keys, steps take ``one_statement``; a refused
  one-statement write whose blob could not be deleted leaves no blob behind once the run is
  erased or purged.
* With a driver whose trip's statements do not commit together (psycopg 3), the close of a
  limited workflow's run leaves the one-statement path (``admission``) and its ordinary
  transaction writes the warm replay's decision, unless the run moved on meanwhile (psycopg2
  closes it in one trip: test_admission_close.py).
* A contradictory ``fast_paths`` combination raises its ValueError and writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, PostgresPayloadStore, RetryPolicy, WorkflowContext, activity, workflow
from harvest_celery._runtime.completion import FALLBACK_REASONS
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._store import predicates, tasks
from harvest_celery._store.dialect import Dialect
from harvest_celery._store.records import utcnow
from harvest_celery._store.schema import blobs, executions

from .conftest import DATABASE_URL

pytestmark = pytest.mark.integration


@activity(name="cp_step", retry=RetryPolicy(max_attempts=3, initial_interval=0))
def cp_step(x: Any) -> Any:
    return x


@activity(name="cp_big", retry=RetryPolicy(max_attempts=1))
def cp_big(size: int) -> str:
    return "z" * size


@workflow(name="cp_one")
async def cp_one(ctx: WorkflowContext, x: Any) -> Any:
    return await ctx.execute_activity(cp_step, x)


@workflow(name="cp_limited", concurrency=1)
async def cp_limited(ctx: WorkflowContext, x: Any) -> Any:
    """Two steps under one global admission limit of 1: its close frees the slot."""
    return await ctx.execute_activity(cp_step, await ctx.execute_activity(cp_step, x))


@workflow(name="cp_limited_nudged", concurrency=1)
async def cp_limited_nudged(ctx: WorkflowContext, x: Any) -> Any:
    """``cp_limited``, saying whether a ``nudge`` signal had arrived when it closed."""
    nudge = ctx.wait_signal("nudge")
    done = await ctx.execute_activity(cp_step, await ctx.execute_activity(cp_step, x))
    return [done, nudge.done()]


@workflow(name="cp_big_steps")
async def cp_big_steps(ctx: WorkflowContext, data: dict[str, int]) -> int:
    total = 0
    for _ in range(data["n"]):
        total += len(await ctx.execute_activity(cp_big, data["size"]))
    return total


_MADE: list[Harvest] = []


@pytest.fixture(autouse=True)
def _dispose() -> Any:
    """Give back each test's connections (Postgres allows ~100 on a machine shared by runs)."""
    yield
    while _MADE:
        dispose(_MADE.pop())


def dispose(h: Harvest) -> None:
    h.store.dispose()
    inner = getattr(h.store.payloads.store, "inner", h.store.payloads.store)
    engine = getattr(inner, "_engine", None)
    if engine is not None:
        engine.dispose()


def make(**kwargs: Any) -> Harvest:
    h = Harvest(DATABASE_URL, **kwargs).register(
        cp_step, cp_big, cp_one, cp_big_steps, cp_limited, cp_limited_nudged
    )
    _MADE.append(h)
    return h


def run_id() -> str:
    return f"cp-{uuid.uuid4().hex[:10]}"


def fallbacks(before: dict[str, float] | None = None) -> dict[str, float]:
    """``harvest_decision_fallbacks_total`` by reason in this process, since ``before``."""
    now = {r: METRICS.value("decision_fallbacks", {"reason": r}) for r in FALLBACK_REASONS}
    return {r: v - (before or {}).get(r, 0.0) for r, v in now.items()}


def counted(since: dict[str, float]) -> dict[str, float]:
    return {r: v for r, v in fallbacks(since).items() if v}


def decisions(path: str, workflow: str) -> float:
    return METRICS.value("decisions", {"workflow": workflow, "path": path})


# ── the changes that land between claim and completion, one per guard column ──────────────────
def _update(**values: Any) -> Callable[[Harvest, str], None]:
    """A named row update: no public action changes this column alone at that moment."""

    def change(h: Harvest, rid: str) -> None:
        with h.store.begin() as tx:
            tx.update_run(rid, **{k: v(rid) if callable(v) else v for k, v in values.items()})

    return change


def _reclaimed(h: Harvest, rid: str) -> None:
    """The attempt's lease expired and a later attempt claimed the task row."""
    with h.store.begin() as tx:
        tasks.expire_lease(tx, rid, "1", 1, utcnow() + timedelta(hours=1), "harvest")
    with h.store.begin() as tx:
        tasks.redispatch_next_attempt(tx, rid, "1", utcnow())
    assert h.runtime.claim(rid, "1", 2) is not None


UNREACHABLE = "unreachable"
# Every term of fast_path's declaration, by its table and columns: the change that makes it
# refuse, or why no completion can meet it.
CHANGES: dict[str, Any] = {
    "run:status": lambda h, rid: h.terminate(rid, "guard test"),
    "run:cancelled_at": lambda h, rid: h.cancel_workflow_execution(rid, "guard test"),
    "run:cancel_requested_at": lambda h, rid: h.request_cancellation(rid, "guard test"),
    "run:decision_requested_at": lambda h, rid: h.signal(rid, "nudge", {"n": 1}),
    "run:paused_at": lambda h, rid: h.pause(rid),
    # erasure is for terminal runs only (_store/runs.py): a completion never meets an erased
    # run; the guard's refusal of one is pinned by tests/unit/test_completion_paths.py
    "run:erased_at": UNREACHABLE,
    # admission sets admitted_at once and never clears it (_store/admission.py), and a waiting
    # run has no decision, so no activity to claim (save the reset bug docs/flow-control.md
    # names): a completion never meets one; the guard's
    # refusal of a waiting run is pinned by tests/unit/test_admission.py
    # (test_the_predicates_refuse_a_waiting_row)
    "run:admitted_at": UNREACHABLE,
    "run:nd_blocked_at": _update(nd_blocked_at=lambda _rid: utcnow()),
    "run:nd_retry_at": _update(nd_retry_at=lambda _rid: utcnow() + timedelta(hours=1)),
    "run:next_seq": _update(next_seq=executions.c.next_seq + 1),
    "run:sticky_queue": _update(sticky_queue="harvest@another-process"),
    "task:status,attempt": _reclaimed,
}


def _key(term: predicates.Term) -> str:
    return f"{term.table}:{','.join(term.columns)}"


GUARD_TERMS = [t for t in predicates.fast_path.terms if CHANGES.get(_key(t)) is not UNREACHABLE]


def test_every_guard_term_of_fast_path_has_a_test_or_a_reason():
    """A term added to ``fast_path`` fails here until it has a change above (or is declared
    unreachable, with the reason and a unit test)."""
    assert sorted(_key(t) for t in predicates.fast_path.terms) == sorted(CHANGES)


def _stored(h: Harvest, execution_id: str) -> dict[str, Any]:
    """The run's rows — events, task rows, run row, attempt errors — without ids and times
    (a time column as set or not)."""
    skip = {"id", "execution_id", "input_digest", "worker_id", "updated_at", "created_at"}
    out: dict[str, Any] = {}
    with h.store.engine.connect() as conn:
        for table in ("harvest_executions", "harvest_activity_tasks", "harvest_attempt_errors"):
            key = "id" if table == "harvest_executions" else "execution_id"
            rows = (
                conn.execute(sa.text(f"SELECT * FROM {table} WHERE {key} = :id"), {"id": execution_id})
                .mappings()
                .all()
            )
            out[table] = sorted(
                (
                    sorted(
                        (k, "set" if isinstance(v, datetime) else repr(v))
                        for k, v in r.items()
                        if k not in skip and k != "detail"
                    )
                    for r in rows
                ),
                key=repr,
            )
    history = []
    for item in h.history(execution_id):
        data = item.event.to_data()
        data.pop("worker_id", None)
        history.append((item.seq, data))
    out["history"] = history
    return out


def _landing(h: Harvest, rid: str, change: Callable[[Harvest, str], None], *, seam: bool) -> None:
    """Land ``change`` once, between the first claim and its completion: through the
    one-statement seam (``before_inline_decision``), or before the ordinary transaction."""
    landed: list[bool] = []

    def once(execution_id: str) -> None:
        if execution_id == rid and not landed:
            landed.append(True)
            change(h, rid)

    if seam:
        h.runtime.before_inline_decision = once
    else:
        real = h.runtime.complete

        def complete(claim: Any, output: Any) -> None:
            once(claim.execution_id)
            real(claim, output)

        h.runtime.complete = complete  # type: ignore[method-assign]
    h.start_workflow("cp_one", {"v": 1}, execution_id=rid)
    h.drain()
    assert landed == [True]


@pytest.mark.parametrize("term", GUARD_TERMS, ids=[_key(t) for t in GUARD_TERMS])
def test_a_change_between_claim_and_completion_is_refused_by_the_guard(harvest, term):
    change = CHANGES[_key(term)]
    fast, plain = make(), make(sticky_sessions=False)  # plain: the ordinary path only
    a, b = run_id(), run_id()
    before = fallbacks()
    tried = decisions("one_statement", "cp_one")
    _landing(fast, a, change, seam=True)
    # the one-statement write was attempted and refused by its guard, and only that was counted
    assert counted(before) == {"guard": 1}, (term.name, counted(before))
    assert decisions("one_statement", "cp_one") == tried
    _landing(plain, b, change, seam=False)
    assert _stored(fast, a) == _stored(plain, b), term.name


# ── an offloading payload store ───────────────────────────────────────────────────────────────
def _blob_keys(rid: str) -> list[str]:
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        keys = conn.execute(sa.select(blobs.c.key).where(blobs.c.key.startswith(f"{rid}/"))).scalars().all()
    engine.dispose()
    return sorted(keys)


def test_with_an_offloading_store_that_lists_steps_take_one_statement(harvest):
    h = make(payload_store=PostgresPayloadStore(), offload_threshold=1024)
    before, counts = fallbacks(), decisions("one_statement", "cp_big_steps")
    rid = h.start_workflow("cp_big_steps", {"n": 3, "size": 3000}, execution_id=run_id())
    assert h.result(rid, timeout=20) == 9000
    assert decisions("one_statement", "cp_big_steps") - counts == 3
    assert counted(before) == {}
    outputs = [e.event.output for e in h.history(rid) if e.event.type == "ActivityCompleted"]
    assert outputs == ["z" * 3000] * 3  # every reference written by the statement is readable
    keys = _blob_keys(rid)
    assert len(keys) == 3 and all(k.startswith(f"{rid}/") for k in keys), keys


class _Flaky:
    """A Postgres payload store whose next ``failing`` deletes fail."""

    def __init__(self) -> None:
        self.inner = PostgresPayloadStore()
        self.store_id = self.inner.store_id
        self.failing = 0
        self.refused: list[str] = []

    def bind(self, url: str) -> None:
        self.inner.bind(url)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def delete(self, key: str) -> None:
        if self.failing:
            self.failing -= 1
            self.refused.append(key)
            raise OSError("store unavailable")
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)


def _referenced(rid: str) -> set[str]:
    """The blob keys the run's stored rows reference."""
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        texts = (
            conn.execute(
                sa.text(
                    "SELECT data::text FROM harvest_events WHERE execution_id = :id "
                    "UNION ALL SELECT result::text FROM harvest_executions "
                    "WHERE id = :id"
                ),
                {"id": rid},
            )
            .scalars()
            .all()
        )
    engine.dispose()
    return {k for k in _blob_keys(rid) if any(k in (t or "") for t in texts)}


@pytest.mark.parametrize("how", ["erase", "purge"])
def test_a_refused_write_leaves_no_blob_once_its_run_is_erased_or_purged(harvest, how, caplog):
    store = _Flaky()
    h = make(payload_store=store, offload_threshold=1024)
    rid = run_id()
    landed: list[bool] = []

    def refuse_once(execution_id: str) -> None:
        # the run moves on (a signal): the statement is refused after its blob was put, and
        # that blob's delete fails — an orphan, referenced by no row
        if not landed:
            landed.append(True)
            h.signal(execution_id, "nudge", None)
            store.failing = 1

    h.runtime.before_inline_decision = refuse_once
    before = fallbacks()
    h.start_workflow("cp_big_steps", {"n": 2, "size": 3000}, execution_id=rid)
    with caplog.at_level("WARNING", logger="harvest_celery"):
        assert h.result(rid, timeout=20) == 6000
    assert counted(before) == {"guard": 1}
    assert len(store.refused) == 1 and store.refused[0].startswith(f"{rid}/")
    assert "could not be deleted" in caplog.text
    orphan = store.refused[0]
    assert orphan in _blob_keys(rid) and orphan not in _referenced(rid)
    left = _blob_keys(rid)
    assert len(left) >= 3  # the orphan, and the two outputs the history references
    if how == "erase":
        assert h.erase_payloads(rid)["blobs"] == len(left)
    else:
        engine = sa.create_engine(DATABASE_URL)
        with engine.begin() as conn:
            conn.execute(
                executions.update()
                .where(executions.c.id == rid)
                .values(closed_at=sa.func.now() - sa.text("interval '40 days'"))
            )
        engine.dispose()
        assert h.purge(older_than_days=30)["blobs"] >= len(left)
    assert _blob_keys(rid) == []


# ── fast_paths ────────────────────────────────────────────────────────────────────────────────
def _row_counts() -> dict[str, int]:
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        out = {
            t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("harvest_executions", "harvest_events", "harvest_activity_tasks", "harvest_blobs")
        }
    engine.dispose()
    return out


@pytest.mark.parametrize(
    "given", [{"inline_decisions": True}, {"sticky_sessions": True}, {"eager_max_chain": 4}]
)
def test_a_contradictory_fast_paths_combination_raises_and_writes_nothing(harvest, given):
    before = _row_counts()
    name, value = next(iter(given.items()))
    with pytest.raises(ValueError, match=rf"fast_paths=False contradicts {name}={value!r}"):
        Harvest(DATABASE_URL, fast_paths=False, **given)
    assert _row_counts() == before


def test_fast_paths_off_sends_every_step_through_the_decision_task(harvest):
    h = make(fast_paths=False)
    paths = ("one_statement", "inline", "task")
    before, seen = {p: decisions(p, "cp_big_steps") for p in paths}, fallbacks()
    rid = h.start_workflow("cp_big_steps", {"n": 3, "size": 10}, execution_id=run_id())
    assert h.result(rid, timeout=20) == 30
    assert {p: decisions(p, "cp_big_steps") - n for p, n in before.items()} == {
        "one_statement": 0,
        "inline": 0,
        "task": 4,
    }
    assert counted(seen) == {}  # nothing was allowed on a faster path: no fallback counted


# ── the close of a run under workflow admission ───────────────────────────────────────────────
def replays(kind: str) -> float:
    return METRICS.value("decision_replays", {"replay": kind})


def one_by_one(monkeypatch: Any) -> None:
    """A driver whose trip's statements do not commit together (psycopg 3): a limited run's
    close is the ordinary transaction's (psycopg2's one trip: test_admission_close.py)."""
    monkeypatch.setattr(Dialect, "trip_commits_together", lambda self, driver: False)


def test_a_limited_runs_close_is_written_from_its_warm_replay_in_the_ordinary_transaction(
    harvest, monkeypatch
):
    one_by_one(monkeypatch)
    h = make()
    before, cold, steps = fallbacks(), replays("cold"), decisions("one_statement", "cp_limited")
    first = h.start_workflow("cp_limited", 1, execution_id=run_id())
    second = h.start_workflow("cp_limited", 2, execution_id=run_id())  # waits for the slot
    assert h.result(first, timeout=20) == 1 and h.result(second, timeout=20) == 2
    assert counted(before) == {"admission": 2}  # each close left the one-statement path
    assert decisions("one_statement", "cp_limited") - steps == 2  # each run's first step took it
    # one cold replay per run, its first decision: the close was not replayed again (it was,
    # cold, before the warm replay's decision was handed to the ordinary transaction)
    assert replays("cold") - cold == 2
    rows = {r.id: r for r in _runs(h, [first, second])}
    assert rows[second].admitted_at >= rows[first].closed_at  # admitted by the first's close


def test_a_limited_run_that_moved_on_is_closed_from_a_fresh_replay(harvest, caplog, monkeypatch):
    one_by_one(monkeypatch)
    h = make()
    rid = run_id()
    signalled: list[str] = []

    def signal_before_the_close(execution_id: str) -> None:
        if (
            execution_id == rid
            and len([e for e in h.history(rid) if e.event.type == "ActivityCompleted"]) == 1
        ):
            if not signalled:
                signalled.append(execution_id)
                h.signal(rid, "nudge", {"n": 1})  # appended after the replay's ActivityStarted

    h.runtime.before_inline_decision = signal_before_the_close
    before, cold = fallbacks(), replays("cold")
    with caplog.at_level("WARNING", logger="harvest_celery"):
        h.start_workflow("cp_limited_nudged", 3, execution_id=rid)
        # the close saw the signal appended after the warm replay's ActivityStarted: its
        # decision was taken again, not the warm replay's (which had not seen it)
        assert h.result(rid, timeout=20) == [3, True]
    assert not [r for r in caplog.records if "failed" in r.getMessage()]  # no decision failed
    assert signalled == [rid]
    history = h.history(rid)
    assert [e.seq for e in history] == list(range(len(history)))
    types = [e.event.type for e in history]
    assert types.index("SignalReceived") < len(types) - 2 and types[-1] == "WorkflowCompleted"
    assert counted(before) == {"admission": 1}
    assert replays("cold") - cold == 2  # the first decision, and the close's own (the run moved on)


def _runs(h: Harvest, ids: list[str]) -> list[Any]:
    c = executions.c
    with h.store.engine.connect() as conn:
        return list(conn.execute(sa.select(c.id, c.admitted_at, c.closed_at).where(c.id.in_(ids))).all())


# ── an unexpected error in the one-statement attempt ──────────────────────────────────────────
def test_an_error_in_the_one_statement_attempt_is_logged_counted_and_recorded_the_ordinary_way(
    harvest, monkeypatch, caplog
):
    from harvest_celery._store import pgwrite

    real = pgwrite.guarded
    broken = [True]

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if broken:
            broken.pop()
            raise RuntimeError("a bug in the guarded statement's builder")
        return real(*args, **kwargs)

    monkeypatch.setattr(pgwrite, "guarded", guarded)
    h = make()
    before = fallbacks()
    with caplog.at_level("DEBUG", logger="harvest_celery"):
        rid = h.start_workflow("cp_big_steps", {"n": 2, "size": 10}, execution_id=run_id())
        assert h.result(rid, timeout=20) == 20
    assert counted(before) == {"error": 1}
    warning = [r for r in caplog.records if r.levelname == "WARNING" and "one-statement" in r.getMessage()]
    assert len(warning) == 1 and "RuntimeError" in warning[0].getMessage()
    assert warning[0].exc_info is None  # the traceback goes to DEBUG only
    assert any(r.levelname == "DEBUG" and r.exc_info for r in caplog.records)
    types = [e.event.type for e in h.history(rid)]
    assert types.count("ActivityCompleted") == 2 and types[-1] == "WorkflowCompleted"
