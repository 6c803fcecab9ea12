"""The hot path's statements find their rows by key, whatever the planner knows (real Postgres).

A run's claim, its one-statement completions and a limited step's hand-off each find the run
row and the attempt's task row by primary key, and also compare a status. On a young database
(no statistics yet: every equality looks equally selective) the planner used to tie the
primary key with the status index, pick the status index, and keep that generic plan on the
prepared statement as the table grew: each step then walked the status's whole range (every
completed task row, every running run). These tests run steps on a database of their own,
fresh, so its tables are young, then ask for every prepared statement's generic plan on the
session that prepared them: no status index appears in any, and the hand-off takes the next
waiting row from the wait-order index without sorting the key's backlog (docs/performance.md,
"Activity limits: key lookups on a young database, and the wait order").
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, WorkflowContext, activity, workflow

from .conftest import ADMIN_URL, DB_NAME
from .paths import run_id

pytestmark = pytest.mark.integration

YOUNG = f"{DB_NAME}_young"
STATUS_INDEXES = {"ix_harvest_activity_tasks_status", "ix_harvest_executions_status"}


@activity(name="kl_step")
def kl_step(x: int) -> int:
    return x + 1


@activity(name="kl_limited", concurrency=1)
def kl_limited(x: int) -> int:
    return x + 1


@workflow(name="kl_steps")
async def kl_steps(ctx: WorkflowContext, n: int) -> int:
    """``n`` unlimited steps, then ``n`` under ``concurrency=1`` (the hand-off's statement)."""
    x = 0
    for _ in range(n):
        x = await ctx.execute_activity(kl_step, x)
    for _ in range(n):
        x = await ctx.execute_activity(kl_limited, x)
    return x


def _admin(sql: str) -> None:
    engine = sa.create_engine(ADMIN_URL, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


@pytest.fixture
def young() -> Iterator[Harvest]:
    """A freshly created and migrated database (tables without statistics), and a Harvest on
    it with one autocommit connection (``claim_pool_size=1``), so the test reads the session
    that prepared the statements."""
    _admin(f'DROP DATABASE IF EXISTS "{YOUNG}" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{YOUNG}"')
    url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{YOUNG}"
    h = Harvest(url, claim_pool_size=1).register(kl_step, kl_limited, kl_steps)
    try:
        h.migrate()
        yield h
    finally:
        h.store.dispose()
        _admin(f'DROP DATABASE IF EXISTS "{YOUNG}" WITH (FORCE)')


def generic_plans(h: Harvest) -> dict[str, str]:
    """Every statement harvest's autocommit connection prepared, with its generic plan."""
    plans = {}
    with h.store.autocommit_engine.connect() as conn:
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        try:
            for name, types in conn.exec_driver_sql(
                "SELECT name, cardinality(parameter_types) FROM pg_prepared_statements"
            ).all():
                args = f"({', '.join(['NULL'] * types)})" if types else ""
                rows = conn.exec_driver_sql(f"EXPLAIN EXECUTE {name}{args}").all()
                plans[name] = "\n".join(r[0] for r in rows)
        finally:
            conn.exec_driver_sql("RESET plan_cache_mode")
    return plans


def indexes(plan: str) -> set[str]:
    return set(re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan) (?:using|on) (\w+)", plan))


def test_no_hot_statement_plans_a_status_index_on_a_young_database(young: Harvest) -> None:
    rid = young.start_workflow("kl_steps", 4, execution_id=run_id("kl"))
    assert young.result(rid, timeout=20) == 8
    plans = generic_plans(young)
    used = {name: indexes(plan) for name, plan in plans.items()}
    # the statements that matter were prepared: the claim, the completions and the hand-off
    # all read a task row by its key
    assert sum("harvest_activity_tasks_pkey" in ix for ix in used.values()) >= 2, plans
    hand_offs = [plans[name] for name, ix in used.items() if "ix_harvest_activity_tasks_wait_order" in ix]
    assert hand_offs, "no hand-off prepared"
    # the next waiting row comes off the wait-order index: no sort of the key's whole backlog
    assert all("Sort Key" not in plan for plan in hand_offs), hand_offs
    wrong = {name: ix & STATUS_INDEXES for name, ix in used.items() if ix & STATUS_INDEXES}
    assert wrong == {}, "\n\n".join(plans[name] for name in wrong)
