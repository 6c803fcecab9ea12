"""The hot path on real Postgres, in process (the engine's in-process dispatcher drives claims,
bodies and completions through the same code a Celery worker runs): the next decision is taken
inline in the completion's transaction, a decision that fails there never loses a completion or
runs a body twice, the budget of statements and commits per step, and the optimised path writes
the same histories as the plain one."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import (
    Harvest,
    PostgresPayloadStore,
    RetryPolicy,
    Saga,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._store import pgwrite
from harvest_celery._store.tx import RunWrite, Tx

from .conftest import DATABASE_URL, wait_for, workers_decide

BODIES: list[str] = []


@activity(name="hp_step", retry=RetryPolicy(max_attempts=1))
def hp_step(x: Any) -> Any:
    BODIES.append(f"step:{x}")
    return x


@activity(name="hp_fails", retry=RetryPolicy(max_attempts=1))
def hp_fails(x: Any) -> Any:
    BODIES.append(f"fails:{x}")
    raise RuntimeError("no")


@activity(name="hp_undo", retry=RetryPolicy(max_attempts=1))
def hp_undo(x: Any) -> Any:
    BODIES.append(f"undo:{x}")
    return None


@activity(name="hp_retried", retry=RetryPolicy(max_attempts=3, initial_interval=0))
def hp_retried(x: Any) -> Any:
    BODIES.append(f"retried:{x}")
    return x


@workflow(name="hp_one")
async def hp_one(ctx: WorkflowContext, x: Any) -> Any:
    return await ctx.execute_activity(hp_retried, x)


@workflow(name="hp_steps")
async def hp_steps(ctx: WorkflowContext, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.execute_activity(hp_step, i)
    return total


@workflow(name="hp_saga")
async def hp_saga(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    saga = Saga(ctx)
    for i in range(data["n"]):
        await saga.step(
            lambda i=i: ctx.execute_activity(hp_step, i), lambda v: ctx.execute_activity(hp_undo, v)
        )
    pair = await ctx.gather(ctx.execute_activity(hp_step, "a"), ctx.execute_activity(hp_step, "b"))
    if data.get("fail"):
        await saga.step(lambda: ctx.execute_activity(hp_fails, "x"))
    return pair


@workflow(name="hp_parallel")
async def hp_parallel(ctx: WorkflowContext, n: int) -> Any:
    fanned = await ctx.gather(*(ctx.execute_activity(hp_step, i) for i in range(n)))
    return [fanned, await ctx.execute_activity(hp_step, "after")]


@workflow(name="hp_clock")
async def hp_clock(ctx: WorkflowContext, _input: Any) -> Any:
    await ctx.execute_activity(hp_step, 1)
    return ctx.now().isoformat()  # the completion's time, as this replay saw it


@workflow(name="hp_signalled")
async def hp_signalled(ctx: WorkflowContext, _input: Any) -> Any:
    first = await ctx.execute_activity(hp_step, 1)
    got = await ctx.wait_signal("go")
    return [first, got, await ctx.execute_activity(hp_step, 2)]


def make(inline: bool = True, url: str = DATABASE_URL) -> Harvest:
    h = Harvest(url).register(
        hp_step, hp_fails, hp_undo, hp_steps, hp_saga, hp_retried, hp_one, hp_signalled, hp_parallel, hp_clock
    )
    h.runtime.settings.inline_decisions = inline
    return h


def run_id() -> str:
    return f"hp-{uuid.uuid4().hex[:10]}"


def shape(h: Harvest, execution_id: str) -> list[tuple[str, Any]]:
    """The history without times and worker ids: what must be identical path to path."""
    out = []
    for item in h.history(execution_id):
        data = item.event.to_data()
        data.pop("worker_id", None)
        out.append((item.seq, data))
    return out


def decisions(path: str, workflow: str) -> float:
    return METRICS.value("decisions", {"workflow": workflow, "path": path})


def test_the_next_decision_is_taken_inline_by_the_completing_worker(harvest):
    h = make()
    before = {path: decisions(path, "hp_steps") for path in ("one_statement", "inline", "task")}
    rid = h.start_workflow("hp_steps", 5, execution_id=run_id())
    assert h.result(rid, timeout=10) == 10
    # the start's decision goes through the decision task; each of the 5 completions decides
    # with it, in one statement (counted as its own path, not as inline)
    assert {path: decisions(path, "hp_steps") - n for path, n in before.items()} == {
        "one_statement": 5,
        "inline": 0,
        "task": 1,
    }


def _completions(h: Harvest, execution_id: str) -> list[str]:
    return [e.event.activity_id for e in h.history(execution_id) if e.event.type == "ActivityCompleted"]


@pytest.mark.parametrize(
    "raised", [RuntimeError("decision bug"), KeyboardInterrupt()], ids=["Exception", "BaseException"]
)
def test_an_inline_decision_that_fails_records_the_completion_once_and_runs_no_body_twice(harvest, raised):
    h = make()
    failures = [raised]

    def seam(_execution_id: str) -> None:
        if failures:
            raise failures.pop()

    h.runtime.before_inline_decision = seam
    BODIES.clear()
    rid = run_id()
    try:
        h.start_workflow("hp_steps", 3, execution_id=rid)
    except KeyboardInterrupt:
        h.drain()  # the shutdown signal stopped the drain after the completion committed
    assert h.result(rid, timeout=10) == 3
    assert _completions(h, rid) == ["1", "2", "3"]  # exactly one completion each
    assert BODIES == ["step:0", "step:1", "step:2"]  # no body ran twice
    assert failures == []


def test_a_decision_write_that_fails_in_the_database_falls_back_to_the_completion_alone(harvest, monkeypatch):
    h = make()
    h.runtime.settings.sticky_sessions = False  # no one-statement path: the ordinary write decides
    real = Tx.apply_decision
    broken = [True]

    def apply_then_fail(self: Tx, *args: Any, **kwargs: Any) -> Any:
        if broken and kwargs.get("leading"):
            broken.pop()
            self.conn.execute(sa.text("SELECT 1 / 0"))  # aborts the transaction, as a bad write would
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Tx, "apply_decision", apply_then_fail)
    BODIES.clear()
    rid = h.start_workflow("hp_steps", 2, execution_id=run_id())
    assert h.result(rid, timeout=10) == 1
    assert _completions(h, rid) == ["1", "2"] and BODIES == ["step:0", "step:1"]
    assert broken == []


def test_a_completion_whose_run_moved_on_is_refused_by_the_guard_and_recorded_the_usual_way(
    harvest, monkeypatch
):
    """The one-statement completion writes only if the run is as the warm replay assumes: a
    signal landing between the claim and the completion moves the run on, so the statement
    writes nothing and the completion is recorded by the ordinary transaction (a cold replay)."""
    h = make()
    signalled: list[str] = []

    def signal_once(execution_id: str) -> None:
        if not signalled:
            signalled.append(execution_id)
            h.signal(execution_id, "go", "sig")

    h.runtime.before_inline_decision = signal_once
    written: list[bool] = []
    real = Tx.apply_guarded_decision

    def spy(self: Tx, *args: Any, **kwargs: Any) -> Any:
        result = real(self, *args, **kwargs)
        written.append(result[0] is not None)
        return result

    monkeypatch.setattr(Tx, "apply_guarded_decision", spy)
    before = fallbacks()
    rid = h.start_workflow("hp_signalled", None, execution_id=run_id())
    assert h.result(rid, timeout=10) == [1, "sig", 2]
    assert written[0] is False  # the signal moved the run on: nothing written
    assert fallbacks(before)["guard"] == 1  # counted once, as the guard's refusal
    types = [e.event.type for e in h.history(rid)]
    assert types.count("ActivityCompleted") == 2 and types.count("SignalReceived") == 1, types
    assert [e.seq for e in h.history(rid)] == list(range(len(types)))


def test_parallel_completions_keep_the_warm_replay(harvest, monkeypatch):
    """A completion that cannot take the one-statement path (other attempts of the run are
    open) leaves the warm replay as it was: the run is replayed cold once, at its start."""
    from harvest_celery._runtime import runtime as runtime_module

    cold: list[str] = []
    real = runtime_module.Session

    def counted(definition: Any, activation: Any, registry: Any) -> Any:
        cold.append(activation.execution_id)
        return real(definition, activation, registry)

    monkeypatch.setattr(runtime_module, "Session", counted)
    h = make()
    rid = h.start_workflow("hp_parallel", 4, execution_id=run_id())
    assert h.result(rid, timeout=10) == [[0, 1, 2, 3], "after"]
    assert cold == [rid], cold


@pytest.mark.parametrize("sticky", [True, False], ids=["one-statement", "ordinary"])
def test_the_completion_is_stored_at_the_time_the_deciding_replay_saw(harvest, sticky):
    """ctx.now() reads event times: a decision taken on a completion must store that completion
    at the time its replay saw, or a later replay of the history sees another time."""
    h = make()
    h.runtime.settings.sticky_sessions = sticky  # off: every decision is the ordinary way's
    rid = h.start_workflow("hp_clock", None, execution_id=run_id())
    seen = h.result(rid, timeout=10)
    completed = next(e for e in h.history(rid) if e.event.type == "ActivityCompleted")
    assert seen == completed.recorded_at.isoformat()


class _UnlistedStore:
    """A payload store of the three-call Protocol only: it cannot list its blobs."""

    def __init__(self, store: Any) -> None:
        self.store, self.store_id = store, store.store_id

    def put(self, key: str, data: bytes) -> None:
        self.store.put(key, data)

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def delete(self, key: str) -> None:
        self.store.delete(key)


def test_an_offloading_store_that_cannot_list_keeps_the_ordinary_path(harvest, monkeypatch):
    """A store without ``list`` (not a ``ListablePayloadStore``) could not find an orphan a
    crash left between a blob and its statement: while it offloads, the guarded statement is
    never used, and each completion counts the ``offload`` fallback."""
    tried: list[str] = []
    monkeypatch.setattr(Tx, "apply_guarded_decision", lambda self, row, *a, **k: tried.append(row.id))
    h = Harvest(DATABASE_URL, payload_store=_UnlistedStore(PostgresPayloadStore()), offload_threshold=1024)
    h.register(hp_step, hp_steps)
    before = fallbacks()
    rid = h.start_workflow("hp_steps", 3, execution_id=run_id())
    assert h.result(rid, timeout=10) == 3
    assert tried == []
    assert {k: v for k, v in fallbacks(before).items() if v} == {"offload": 3}


def fallbacks(before: dict[str, float] | None = None) -> dict[str, float]:
    """``harvest_decision_fallbacks_total`` by reason (in this process), since ``before``."""
    from harvest_celery._runtime.completion import FALLBACK_REASONS

    now = {r: METRICS.value("decision_fallbacks", {"reason": r}) for r in FALLBACK_REASONS}
    return {r: v - (before or {}).get(r, 0.0) for r, v in now.items()}


def _count(h: Harvest, work: Any) -> dict[str, int]:
    """Statements, explicit transactions and commits that ``work`` sends, counted on the
    engine's events. Round trips: every statement, plus BEGIN and COMMIT of each explicit
    transaction (psycopg2 sends BEGIN with its first statement as a separate round trip); a
    one-statement autocommit operation (the claim) is its own commit."""
    counts = {"statements": 0, "transactions": 0, "autocommits": 0}
    engine, autocommit = h.store.engine, h.store.autocommit_engine

    def on_execute(*_a: Any) -> None:
        counts["statements"] += 1

    def on_autocommit(*_a: Any) -> None:
        counts["statements"] += 1
        counts["autocommits"] += 1

    def on_begin(_conn: Any) -> None:
        counts["transactions"] += 1

    listeners = [
        (engine, "before_cursor_execute", on_execute),
        (engine, "begin", on_begin),
        (autocommit, "before_cursor_execute", on_autocommit),
    ]
    for target, name, fn in listeners:
        sa.event.listen(target, name, fn)
    try:
        work()
    finally:
        for target, name, fn in listeners:
            sa.event.remove(target, name, fn)
    counts["commits"] = counts["transactions"] + counts["autocommits"]
    counts["round_trips"] = counts["statements"] + 2 * counts["transactions"]
    return counts


def test_a_step_costs_at_most_two_commits_and_six_round_trips(harvest):
    h = make()
    rid = h.start_workflow("hp_steps", 1, execution_id=run_id())  # warm the engine and the pool
    h.result(rid, timeout=10)

    def steps(n: int) -> dict[str, int]:
        def work() -> None:
            h.result(h.start_workflow("hp_steps", n, execution_id=run_id()), timeout=30)

        return _count(h, work)

    short, long = steps(5), steps(15)
    per_step = {k: (long[k] - short[k]) / 10 for k in short}
    assert per_step["commits"] <= 2, per_step
    assert per_step["round_trips"] <= 6, per_step
    # what this path really costs: the claim, then the completion with its decision in one
    # guarded statement (a path that always fell back to the transaction would cost 5)
    assert per_step == {
        "statements": 2,
        "transactions": 0,
        "autocommits": 2,
        "commits": 2,
        "round_trips": 2,
    }, per_step


@pytest.mark.parametrize("data", [{"n": 3}, {"n": 2, "fail": True}], ids=["completes", "unwinds"])
def test_the_inline_and_the_plain_paths_write_identical_histories(harvest, data):
    fast, plain = make(inline=True), make(inline=False)
    before = decisions("inline", "hp_saga"), decisions("one_statement", "hp_saga")
    a, b = run_id(), run_id()
    fast.start_workflow("hp_saga", data, execution_id=a)
    plain.start_workflow("hp_saga", data, execution_id=b)
    for h, rid in ((fast, a), (plain, b)):
        assert h.describe(rid).status in ("COMPLETED", "FAILED")
    assert shape(fast, a) == shape(plain, b)
    # the fast paths really ran: decisions taken inline, and in one statement
    assert decisions("inline", "hp_saga") > before[0] and decisions("one_statement", "hp_saga") > before[1]


@pytest.mark.parametrize("data", [{"n": 3}, {"n": 2, "fail": True}], ids=["completes", "unwinds"])
def test_sqlite_and_postgres_write_identical_histories(harvest, tmp_path, data):
    """Embedded mode (SQLite, statement by statement) and Postgres (one-statement claim and
    writes) are two implementations of one store: same schema (the migration drift tests),
    same histories."""
    lite = make(url=f"sqlite:///{tmp_path / 'lite.db'}")
    lite.migrate()
    pg = make()
    a, b = run_id(), run_id()
    lite.start_workflow("hp_saga", data, execution_id=a)
    pg.start_workflow("hp_saga", data, execution_id=b)
    assert lite.describe(a).status == pg.describe(b).status
    assert shape(lite, a) == shape(pg, b)


def _untraced(value: Any) -> Any:
    """A stored error detail without its traceback text, which depends on the Python stack the
    decision ran on (a warm or a cold replay), not on how it was written."""
    if isinstance(value, dict) and "traceback" in value:
        return {k: v for k, v in value.items() if k != "traceback"}
    return value


def _stored(h: Harvest, execution_id: str) -> dict[str, Any]:
    """The run's rows as stored, without ids, times and worker ids."""
    skip = {
        "id",
        "execution_id",
        "created_at",
        "updated_at",
        "closed_at",
        "started_at",
        "finished_at",
        "dispatched_at",
        "lease_expires_at",
        "worker_id",
        "input_digest",
        "recorded_at",
        "retry_at",
        "at",
        "admitted_at",  # workflow admission: the start's own time
    }
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
                (sorted((k, repr(_untraced(v))) for k, v in r.items() if k not in skip) for r in rows),
                key=repr,
            )
    out["history"] = shape(h, execution_id)
    return out


@pytest.mark.parametrize("data", [{"n": 3}, {"n": 2, "fail": True}], ids=["completes", "unwinds"])
def test_the_plain_sql_run_write_stores_what_the_core_statement_stores(harvest, monkeypatch, data):
    """Postgres run writes go as plain SQL cached by shape (``_store.pgwrite``); SQLAlchemy
    Core builds the same statement when that declines. Both store the same rows, JSON nulls
    included."""
    real = pgwrite.statement
    used = []

    def counted(*args: Any) -> Any:
        found = real(*args)
        used.append(found is not None)
        return found

    monkeypatch.setattr(pgwrite, "statement", counted)
    h = make()
    fast = h.start_workflow("hp_saga", data, execution_id=run_id())
    assert h.describe(fast).status in ("COMPLETED", "FAILED")
    assert used and all(used)  # every write of that run took the plain-SQL path
    monkeypatch.setattr(pgwrite, "statement", lambda *_a: None)
    core = h.start_workflow("hp_saga", data, execution_id=run_id())
    # a JSON column set to None: Core stores JSON null, not SQL NULL; so must the plain SQL
    for rid, statement in ((fast, real), (core, lambda *_a: None)):
        monkeypatch.setattr(pgwrite, "statement", statement)
        h.store.transaction(lambda tx, rid=rid: tx.write(RunWrite(rid, values={"nd_details": None})))
    assert _stored(h, fast) == _stored(h, core)
    with h.store.engine.connect() as conn:
        sql_null = conn.execute(
            sa.text("SELECT id, nd_details IS NULL FROM harvest_executions WHERE id IN (:a, :b)"),
            {"a": fast, "b": core},
        ).all()
    assert sorted(null for _id, null in sql_null) == [False, False]


# ── result() waits on LISTEN/NOTIFY, one listening connection per process ─────────────────────
def _listening_connections() -> int:
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        count = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN harvest_runs' "
                "AND datname = current_database()"
            )
        ).scalar_one()
    engine.dispose()
    return int(count)


def test_result_is_woken_by_the_notification_not_by_polling(harvest, workers, tag):
    rid = harvest.start_workflow("three_steps", {"tag": tag})
    reads: list[str] = []

    def on_execute(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        reads.append(statement)

    sa.event.listen(harvest.store.engine, "before_cursor_execute", on_execute)
    try:
        # a fallback poll of 60 s: only a notification can end this wait early
        harvest.result(rid, timeout=60, poll=60)
    finally:
        sa.event.remove(harvest.store.engine, "before_cursor_execute", on_execute)
    assert len(reads) <= 4  # status before the wait, status after the wake, the row: no polling


def test_many_waiters_share_one_listening_connection(harvest, workers, tag):
    import threading

    runs = [harvest.start_workflow("three_steps", {"tag": f"{tag}{i}"}) for i in range(16)]
    results: dict[str, object] = {}

    def wait(run: str) -> None:
        results[run] = harvest.result(run, timeout=60, poll=60)

    threads = [threading.Thread(target=wait, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert len(results) == 16
    assert harvest.store.listener is not None and harvest.store.listener.connected.is_set()
    assert _listening_connections() == 1


# ── eager activity execution on real workers ──────────────────────────────────────────────────
def _types(harvest: Any, rid: str) -> list[str]:
    return [h.event.type for h in harvest.history(rid)]


def test_eager_runs_the_next_activity_here_through_the_claim_and_bounds_the_chain(
    harvest, workers, redis_client, tag
):
    from .conftest import effects

    rid = harvest.start_workflow("alpha_chain", {"tag": tag, "n": 20})
    assert harvest.result(rid, timeout=60) == 20
    ran = effects(redis_client, tag)
    assert [e["value"] for e in ran] == list(range(20))  # each body once, in order
    assert all(e["queue"] == "alpha" for e in ran)  # run as its own task, on its own queue
    eager = [e["eager"] for e in ran]
    assert any(eager)  # the eager path really ran
    assert not eager[0]  # the first step was sent by the start, which took the first decision
    with workers_decide(harvest):  # taken by a decision worker instead: it runs the first step
        first = harvest.start_workflow("alpha_chain", {"tag": f"{tag}-w", "n": 1})
        assert harvest.result(first, timeout=60) == 1
    assert [e["eager"] for e in effects(redis_client, f"{tag}-w")] == [True]  # in that decide task
    longest = max(len(run) for run in "".join("e" if x else "." for x in eager).split("."))
    # nothing else waits for this -P threads -c 4 worker: the chain goes past eager_max_chain
    # (8), never past EAGER_IDLE_FACTOR times it (tests/unit/test_eager_chain_length.py pins
    # the cap under load)
    assert 8 < longest <= 32, eager
    # every body had its ActivityStarted, appended by the claim, before it ran
    types = _types(harvest, rid)
    assert types.count("ActivityStarted") == 20 == types.count("ActivityCompleted")
    # each attempt exactly one ActivityStarted: the eager path never runs a second claim
    starts = Counter(
        (h.event.activity_id, h.event.attempt)
        for h in harvest.history(rid)
        if h.event.type == "ActivityStarted"
    )
    assert set(starts.values()) == {1} and len(starts) == 20, starts
    history = harvest.history(rid)
    assert [h.seq for h in history] == list(range(len(types)))
    # an eager body was claimed in the very write of the decision that scheduled it (no claim
    # statement, no commit of its own): its ActivityStarted follows its ActivityScheduled,
    # stamped with the same time; a delivered body's claim comes later, on its own
    folded = [
        b.event.activity_id
        for a, b in itertools.pairwise(history)
        if a.event.type == "ActivityScheduled"
        and b.event.type == "ActivityStarted"
        and a.event.activity_id == b.event.activity_id
        and a.recorded_at == b.recorded_at
    ]
    assert len(folded) == sum(eager), (folded, eager)


def test_the_start_takes_the_first_decision_and_the_worker_runs_the_first_step(
    harvest, workers, redis_client, tag
):
    """Eager start (docs/operations.md, "The completion paths"): the history holds the first
    decision as soon as start_workflow returns, taken in this process (its counter), so no
    harvest.decide message was needed; the worker runs the step it sent."""
    from .conftest import effects

    before = METRICS.value("decisions", {"workflow": "alpha_chain", "path": "start"})
    rid = harvest.start_workflow("alpha_chain", {"tag": tag, "n": 3})
    history = harvest.history(rid)  # the worker may already have claimed the step: [:2]
    assert [h.event.type for h in history][:2] == ["WorkflowStarted", "ActivityScheduled"]
    assert METRICS.value("decisions", {"workflow": "alpha_chain", "path": "start"}) == before + 1
    assert harvest.result(rid, timeout=60) == 3
    assert [e["value"] for e in effects(redis_client, tag)] == [0, 1, 2]  # each body once


def test_no_eager_run_under_a_deadline(harvest, workers, redis_client, tag):
    from .conftest import effects

    rid = harvest.start_workflow("alpha_chain", {"tag": tag, "n": 4, "deadline": True})
    assert harvest.result(rid, timeout=60) == 4
    assert [e["eager"] for e in effects(redis_client, tag)] == [False] * 4


# ── a body's outcome survives a database blip ─────────────────────────────────────────────────
def _flaky_transactions(h: Harvest, monkeypatch: Any, failures: int) -> list[int]:
    """The next ``failures`` transactions fail as a database that went away does."""
    real = type(h.store).transaction
    left = [failures]

    def transaction(self: Any, work: Any, **kwargs: Any) -> Any:
        if left[0] > 0:  # one-statement ones too: the completion may be one
            left[0] -= 1
            raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return real(self, work, **kwargs)

    monkeypatch.setattr(type(h.store), "transaction", transaction)
    return left


def _manual(h: Harvest, rid: str) -> None:
    """Start ``hp_one`` and take its first decision by hand (no in-process drain)."""
    h._inline = None
    h.start_workflow("hp_one", 0, execution_id=rid)
    h.runtime.run_decision(rid)


def test_a_completion_lost_to_a_database_blip_is_retried_until_it_commits(harvest, monkeypatch):
    h = make()
    BODIES.clear()
    rid = run_id()
    _manual(h, rid)
    h.runtime.settings.timings = type(h.runtime.settings.timings)(outcome_retry_for=30)
    claim = h.runtime.claim(rid, "1", 1)
    assert claim is not None
    left = _flaky_transactions(h, monkeypatch, 3)  # the completion's first three commits fail
    h.runtime.execute(claim, lambda x: BODIES.append(f"body:{x}") or x)
    assert left[0] == 0 and _completions(h, rid) == ["1"] and BODIES == ["body:0"]
    assert h.describe(rid).status == "COMPLETED"


def _expire_and_redispatch(h: Harvest, rid: str) -> None:
    from datetime import timedelta

    from harvest_celery._store import tasks
    from harvest_celery._store.records import utcnow

    with h.store.begin() as tx:  # the lease expired during the outage: a retry is scheduled
        tasks.expire_lease(tx, rid, "1", 1, utcnow() + timedelta(hours=1), "harvest")
    with h.store.begin() as tx:
        tasks.redispatch_next_attempt(tx, rid, "1", utcnow())  # attempt 2 sent, not yet claimed


def test_a_late_completion_is_accepted_until_a_later_attempt_claims_the_row(harvest):
    h = make()
    rid = run_id()
    _manual(h, rid)
    first = h.runtime.claim(rid, "1", 1)
    assert first is not None
    _expire_and_redispatch(h, rid)
    h.runtime.complete(first, 0)  # the late completion of attempt 1 lands
    assert _completions(h, rid) == ["1"]
    assert h.runtime.claim(rid, "1", 2) is None  # and attempt 2 is refused by its claim
    # once a later attempt has claimed the row, an earlier attempt's completion is ignored
    rid2 = run_id()
    _manual(h, rid2)
    old = h.runtime.claim(rid2, "1", 1)
    assert old is not None
    _expire_and_redispatch(h, rid2)
    assert h.runtime.claim(rid2, "1", 2) is not None
    h.runtime.complete(old, 0)
    assert _completions(h, rid2) == []


# ── sticky routing: a run's decisions go to the process holding its warm replay ────────────────
def _sticky(harvest: Any, rid: str) -> str | None:
    with harvest.store.begin() as tx:
        row = tx.lock(rid)
    assert row is not None
    return row.sticky_queue


def test_decisions_are_routed_to_the_process_holding_the_warm_replay(harvest, workers, tag):
    with workers_decide(harvest):  # the first decision a worker's, so it holds the replay
        rid = harvest.start_workflow("approval", {"tag": tag})
    holder = wait_for(lambda: _sticky(harvest, rid), what="a warm replay held by a worker")
    assert holder.startswith("harvest@w1-")  # the decision worker's own queue
    harvest.signal(rid, "decision", "yes")  # its decision request goes to that queue
    assert harvest.result(rid, timeout=30) == f"{tag}:yes"
    assert _sticky(harvest, rid) is None  # a finished run holds no replay anywhere


def test_a_decision_routed_to_a_vanished_process_is_taken_by_any_decision_worker(harvest, workers, tag):
    with workers_decide(harvest):
        rid = harvest.start_workflow("approval", {"tag": tag})
    wait_for(lambda: _sticky(harvest, rid), what="a warm replay held by a worker")
    with harvest.store.begin() as tx:  # as if its holder died
        tx.update_run(rid, sticky_queue="harvest@gone@nowhere")
    harvest.signal(rid, "decision", "late")  # sent to a queue nobody consumes...
    # ...re-requested by the sweeper on the decision queue after redispatch_after (3 s here)
    assert harvest.result(rid, timeout=30) == f"{tag}:late"
