"""Erasing a run deletes its own unsent outbox rows and no other run's (issue 14: a task-id
``LIKE 'a:%'`` also matched the rows of a run named ``a:b``), and migration 0006 backfills the
``execution_id`` of the rows an older build left. Embedded SQLite, messages delivered by hand."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, InvalidExecutionId, RetryPolicy, activity, workflow
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store.migrate import upgrade
from harvest_celery._store.schema import outbox
from harvest_celery._store.store import utcnow


@activity(retry=RetryPolicy(max_attempts=1))
def card_check(x):
    raise RuntimeError("declined")


@workflow
async def pay(ctx, data):
    await ctx.execute_activity(card_check, data)


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}").register(pay, card_check)
    harvest.migrate()
    harvest._inline = None
    harvest.runtime.dispatcher = InlineDispatcher()
    return harvest


def finished_run(h, run_id):
    h.start_workflow("pay", {"card": "4111"}, execution_id=run_id)
    queue = h.runtime.dispatcher.queue
    while queue:
        m = queue.popleft()
        if m.task_name == "harvest.decide":
            h.runtime.run_decision(m.args[0])
        elif (claim := h.runtime.claim(*m.args)) is not None:
            h.runtime.execute(claim, card_check)
    assert h.describe(run_id).status == "FAILED"


def legacy_rows(run_id):
    """The unsent rows an older build wrote for ``run_id`` (no execution_id column then): an
    adopted task's (its input as the argument, the ids in a header), an engine-native
    activity's and a decision's."""
    return [
        {
            "task_name": "shop.charge",
            "queue": "payments",
            "args": [{"card": f"{run_id}-secret"}],
            "headers": {"harvest": {"execution_id": run_id, "activity_id": "1", "attempt": 1}},
            "task_id": f"{run_id}:1:1",
        },
        {
            "task_name": "card_check",
            "queue": "default",
            "args": [run_id, "2", 1],
            "headers": None,
            "task_id": f"{run_id}:2:1",
        },
        {
            "task_name": "harvest.decide",
            "queue": "harvest",
            "args": [run_id],
            "headers": None,
            "task_id": f"decide:{run_id}:1.5",
        },
    ]


def insert(h, rows, **extra):
    with h.store.begin() as tx:
        for row in rows:
            tx.conn.execute(outbox.insert().values(created_at=utcnow(), **row, **extra))


def outbox_task_ids(h):
    with h.store.begin() as tx:
        return sorted(r.task_id for r in tx.conn.execute(sa.select(outbox.c.task_id)))


def test_erasing_a_run_spares_the_legacy_outbox_rows_of_a_run_whose_id_extends_it(h):
    finished_run(h, "a")
    insert(h, legacy_rows("a"))
    insert(h, legacy_rows("a:b"))  # a run named before ids refused ':'
    h.erase_payloads("a")
    assert outbox_task_ids(h) == ["a:b:1:1", "a:b:2:1", "decide:a:b:1.5"]


def test_erasing_a_run_deletes_its_rows_by_their_execution_id(h):
    finished_run(h, "a")
    insert(h, legacy_rows("a")[:1], execution_id="a")
    insert(h, legacy_rows("a:b"), execution_id="a:b")
    insert(h, legacy_rows("a")[1:])  # written by an older worker after the migration
    h.erase_payloads("a")
    assert outbox_task_ids(h) == ["a:b:1:1", "a:b:2:1", "decide:a:b:1.5"]


def test_purge_deletes_the_purged_runs_outbox_rows_only(h):
    finished_run(h, "a")
    insert(h, legacy_rows("a"), execution_id="a")
    insert(h, legacy_rows("a:b"))
    assert h.purge(older_than_days=-1)["runs"] == 1
    assert outbox_task_ids(h) == ["a:b:1:1", "a:b:2:1", "decide:a:b:1.5"]


@pytest.mark.parametrize("bad", ["a:b", "a/b"])
def test_new_run_ids_refuse_colon_and_slash_and_write_nothing(h, bad):
    with pytest.raises(InvalidExecutionId, match="an id may not hold a '[:/]'"):
        h.start_workflow("pay", {}, execution_id=bad)
    assert h.list() == []


def test_migration_0006_backfills_the_execution_id_of_rows_left_by_an_older_build(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url, "0005d")
    engine = sa.create_engine(url)
    old_outbox = sa.table(
        "harvest_outbox",
        sa.column("task_name"),
        sa.column("queue"),
        sa.column("args", sa.JSON()),
        sa.column("headers", sa.JSON()),
        sa.column("task_id"),
        sa.column("created_at"),
    )
    with engine.begin() as conn:
        for run_id in ("a", "a:b"):
            conn.execute(old_outbox.insert(), [{**r, "created_at": utcnow()} for r in legacy_rows(run_id)])
        conn.execute(
            old_outbox.insert().values(
                task_name="odd", queue="q", args=[], headers=None, task_id="odd", created_at=utcnow()
            )
        )
    upgrade(url)
    with engine.connect() as conn:
        got = {
            r.task_id: r.execution_id
            for r in conn.execute(sa.select(outbox.c.task_id, outbox.c.execution_id))
        }
    engine.dispose()
    assert got == {
        "a:1:1": "a",
        "a:2:1": "a",
        "decide:a:1.5": "a",
        "a:b:1:1": "a:b",
        "a:b:2:1": "a:b",
        "decide:a:b:1.5": "a:b",
        "odd": None,
    }
