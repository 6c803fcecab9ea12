"""Recorded DAG runs for the run-graph golden test (``test_rungraph_golden``): the DAGs, a
recorder that runs them on the embedded SQLite store with messages delivered by hand (no worker,
so every interleaving is fixed), and a loader that writes a recorded run back into a database.

Each case is one run, stored as ``golden/rungraph/histories/<case>.json``: the run's row and its
history exactly as the store holds them (``data`` as stored, ``recorded_at`` as ISO-8601). The
worker id of every ``ActivityStarted`` is normalised (it names the recording host). The timeout
case goes through the sweeper's own lease-expiry path (``tasks.expire_lease``), which is what a
worker that overran ``start_to_close`` or vanished leaves in history.

Re-record (only when a case is added; the golden responses must then be re-made from code that
is known good): ``python -m tests.unit.rungraph_cases``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from harvest_celery import CollectAll, DagBuilder, Harvest, RetryPolicy, activity, dag
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._runtime.messages import DECIDE_TASK
from harvest_celery._store import tasks
from harvest_celery._store.schema import events as events_table
from harvest_celery._store.schema import executions as executions_table
from harvest_celery._store.store import utcnow

HERE = Path(__file__).parent / "golden" / "rungraph"
HISTORIES = HERE / "histories"
ONCE = RetryPolicy(max_attempts=1)
FLAKY: dict[str, int] = {}  # node → failures still to raise
BROKEN = {"gr_charge": True}  # gr_charge fails until a test mends it (the retry case)


@activity(retry=ONCE)
def gr_reserve(value: Any) -> dict:
    return {"reserved": "r-1"}


@activity(retry=RetryPolicy(max_attempts=3, initial_interval=0.01))
def gr_pack(value: Any) -> str:
    if FLAKY.get("gr_pack", 0) > 0:
        FLAKY["gr_pack"] -= 1
        raise ConnectionError("warehouse unreachable")
    return "packed"


@activity(retry=ONCE)
def gr_label(value: Any) -> str:
    return "labelled"


@activity(retry=ONCE)
def gr_charge(value: Any) -> str:
    if BROKEN["gr_charge"]:
        raise RuntimeError("card declined\nTraceback (most recent call last): ...")
    return "charged"


@activity(retry=ONCE)
def gr_ship(value: Any) -> str:
    return "shipped"


@activity(retry=ONCE)
def gr_release(envelope: Any) -> str:
    return "released"


@activity(retry=ONCE, start_to_close=2)
def gr_slow(value: Any) -> str:
    return "never in time"


@dag
def gr_order(g: DagBuilder) -> None:
    """reserve → (pack, label) → charge → ship; reserve and pack compensate with release."""
    r = g.activity(gr_reserve).compensate(gr_release)
    p = g.activity(gr_pack).upstream(r).compensate(gr_release)
    lb = g.activity(gr_label).upstream(r)
    c = g.activity(gr_charge).upstream(p, lb)
    g.activity(gr_ship).upstream(c)


@dag
def gr_plain(g: DagBuilder) -> None:
    """The same shape without compensators: a failure does not unwind."""
    r = g.activity(gr_reserve)
    p = g.activity(gr_pack).upstream(r)
    lb = g.activity(gr_label).upstream(r)
    c = g.activity(gr_charge).upstream(p, lb)
    g.activity(gr_ship).upstream(c)


@dag
def gr_deadline(g: DagBuilder) -> None:
    """reserve → slow (start_to_close 2 s) → ship."""
    r = g.activity(gr_reserve)
    g.activity(gr_ship).upstream(g.activity(gr_slow).upstream(r))


@activity(retry=ONCE)
def gr_items(value: Any) -> list:
    return [1, 2, 3]


@activity(retry=ONCE)
def gr_cell(item: Any) -> int:
    if item == 2:
        raise ValueError("item 2 is out of stock")
    return int(item) * 10


@dag
def gr_mapped(g: DagBuilder) -> None:
    """items → cell over each item (CollectAll: one failing cell does not fail the node) → ship."""
    cells = g.map_activity(gr_cell, CollectAll).over(g.activity(gr_items))
    g.activity(gr_ship).upstream(cells)


@dag
def gr_deadline_twice(g: DagBuilder) -> None:
    """slow with two attempts (the console test: both time out)."""
    g.activity(gr_slow).retry(RetryPolicy(max_attempts=2, initial_interval=0.01))


OBJECTS = (
    gr_reserve,
    gr_pack,
    gr_label,
    gr_charge,
    gr_ship,
    gr_release,
    gr_slow,
    gr_items,
    gr_cell,
    gr_order,
    gr_plain,
    gr_deadline,
    gr_mapped,
    gr_deadline_twice,
)
CASES = (
    "success",
    "failure",
    "timeout",
    "cancel",
    "live",
    "compensation",
    "retry_source",
    "retry_fork",
    "mapped",
)


def harvest_at(url: str) -> Harvest:
    h = Harvest(url).register(*OBJECTS)
    h.migrate()
    return h


def by_hand(h: Harvest) -> Harvest:
    h._inline = None  # deliver messages by hand
    h.runtime.dispatcher = InlineDispatcher()
    return h


def pump(
    h: Harvest, hold: tuple[str, ...] = (), expire: tuple[str, ...] = (), claim_only: tuple[str, ...] = ()
) -> list[Any]:
    """Deliver queued messages until none is left: decisions run, activity bodies run through the
    claim path, a due retry is sent at once. Messages for ``hold`` stay undelivered (returned);
    an attempt of an ``expire`` activity is claimed and its lease then expires (the sweeper); one
    of a ``claim_only`` activity is claimed (``ActivityStarted``) and its body is still running."""
    queue, held = h.runtime.dispatcher.queue, []  # type: ignore[attr-defined]
    while queue:
        m = queue.popleft()
        if m.task_name == DECIDE_TASK:
            h.runtime.run_decision(m.args[0])
            continue
        if m.task_name in hold:
            held.append(m)
            continue
        claim = h.runtime.claim(*m.args)
        if claim is None:
            continue
        if m.task_name in claim_only:
            continue
        if m.task_name in expire:
            with h.store.begin() as tx:
                tasks.expire_lease(
                    tx,
                    claim.execution_id,
                    claim.activity_id,
                    claim.attempt,
                    utcnow() + timedelta(seconds=60),
                    h.runtime.settings.decision_queue,
                )
            h.runtime._after_commit(tx)  # as the sweeper does: its messages go after commit
        else:
            h.runtime.execute(claim, h.registry.activity(m.task_name).fn)
        for row in h.store.activity_rows(claim.execution_id):
            if row["status"] == "retry_wait":
                with h.store.begin() as tx:
                    tasks.redispatch_next_attempt(tx, claim.execution_id, row["activity_id"], utcnow())
                h.runtime._after_commit(tx)
    return held


def record_all(url: str) -> dict[str, tuple[str, str]]:
    """Run every case on a fresh database; ``{case: (dag name, run id)}``."""
    h = by_hand(harvest_at(url))
    runs: dict[str, tuple[str, str]] = {}

    def start(case: str, name: str, **pump_kw: Any) -> str:
        run_id = h.start_workflow(name, {"order": case}, execution_id=f"run-{case}")
        pump(h, **pump_kw)
        runs[case] = (name, run_id)
        return run_id

    FLAKY["gr_pack"] = 2  # pack fails twice, then succeeds on its third attempt
    BROKEN["gr_charge"] = False
    start("success", "gr_plain")
    BROKEN["gr_charge"] = True
    start("failure", "gr_plain")
    start("timeout", "gr_deadline", expire=("gr_slow",))
    # pack started and never finished, label never started: both open when the cancel seals the run
    cancelled = start("cancel", "gr_plain", hold=("gr_label",), claim_only=("gr_pack",))
    h.cancel_workflow_execution(cancelled, "customer asked")
    pump(h)
    start("live", "gr_plain", hold=("gr_label",), claim_only=("gr_pack",))  # the same, the run live
    start("compensation", "gr_order")
    source = start("retry_source", "gr_plain")
    BROKEN["gr_charge"] = False
    forked = h.retry_dag_run("gr_plain", source, new_execution_id="run-retry_fork")["run_id"]
    pump(h)
    runs["retry_fork"] = ("gr_plain", forked)
    start("mapped", "gr_mapped")
    return runs


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def dump(h: Harvest, run_id: str, dag_name: str) -> dict[str, Any]:
    """The run's row and its history, as stored."""
    with h.store.engine.connect() as conn:
        row = conn.execute(sa.select(executions_table).where(executions_table.c.id == run_id)).one()
        rows = conn.execute(
            sa.select(events_table).where(events_table.c.execution_id == run_id).order_by(events_table.c.seq)
        ).all()
    events = []
    for r in rows:
        data = dict(r.data)
        if data.get("type") == "ActivityStarted":
            data["worker_id"] = "worker-1"
        events.append({"seq": r.seq, "type": r.type, "data": data, "recorded_at": r.recorded_at.isoformat()})
    return {"dag": dag_name, "execution": {k: _iso(v) for k, v in row._mapping.items()}, "events": events}


def load(h: Harvest, recorded: dict[str, Any]) -> str:
    """Write a recorded run into ``h``'s database; returns its id."""
    ts = {c.name for c in executions_table.columns if isinstance(c.type, sa.DateTime)}
    row = {
        k: (datetime.fromisoformat(v) if k in ts and v is not None else v)
        for k, v in recorded["execution"].items()
    }
    with h.store.engine.begin() as conn:
        conn.execute(executions_table.insert().values(**row))
        for e in recorded["events"]:
            conn.execute(
                events_table.insert().values(
                    execution_id=row["id"],
                    seq=e["seq"],
                    type=e["type"],
                    data=e["data"],
                    recorded_at=datetime.fromisoformat(e["recorded_at"]),
                )
            )
    return str(row["id"])


def recorded(case: str) -> dict[str, Any]:
    return json.loads((HISTORIES / f"{case}.json").read_text())  # type: ignore[no-any-return]


def main() -> None:  # pragma: no cover - the recorder, run by hand
    import tempfile

    HISTORIES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/record.db"
        runs = record_all(url)
        h = harvest_at(url)
        for case, (name, run_id) in runs.items():
            text = json.dumps(dump(h, run_id, name), indent=1, sort_keys=True) + "\n"
            (HISTORIES / f"{case}.json").write_text(text)
            print(case, h.describe(run_id).status, len(json.loads(text)["events"]), "events")


if __name__ == "__main__":
    main()
