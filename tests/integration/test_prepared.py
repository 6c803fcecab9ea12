"""The hot path's prepared statements on real Postgres (``_store.prepared``), in process (the
engine's in-process dispatcher, as ``test_cold_completion``), on one autocommit connection
(``claim_pool_size=1``) so the test reads the session that prepared:

* a run's claims and one-statement completions run from statements prepared once on harvest's
  own connection, on generic plans after Postgres's first few;
* behind a transaction pooler (``pooled=True``) nothing is prepared;
* statements dropped behind harvest's back (as a pooler's ``DISCARD ALL`` would) cost nothing
  but a re-prepare: no completion leaves its path, nothing is lost or doubled.
"""

from __future__ import annotations

from typing import Any

import pytest

from harvest_celery import Harvest, WorkflowContext, activity, workflow

from .conftest import DATABASE_URL
from .paths import counted, decisions, fallbacks, run_id

pytestmark = pytest.mark.integration


@activity(name="pr_step")
def pr_step(x: int) -> int:
    return x + 1


@workflow(name="pr_steps")
async def pr_steps(ctx: WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.execute_activity(pr_step, x)
    return x


_MADE: list[Harvest] = []


@pytest.fixture(autouse=True)
def _dispose() -> Any:
    yield
    while _MADE:
        _MADE.pop().store.dispose()


def make(**kwargs: Any) -> Harvest:
    h = Harvest(DATABASE_URL, claim_pool_size=1, **kwargs).register(pr_step, pr_steps)
    _MADE.append(h)
    return h


def statements(h: Harvest) -> list[Any]:
    """What the one autocommit connection has prepared (its own session's view)."""
    with h.store.autocommit_engine.connect() as conn:
        return list(
            conn.exec_driver_sql("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements").all()
        )


def steps(h: Harvest, n: int) -> str:
    rid = h.start_workflow("pr_steps", n, execution_id=run_id("pr"))
    assert h.result(rid, timeout=20) == n
    return rid


def test_the_hot_statements_are_prepared_once_and_run_on_generic_plans(harvest):
    h = make()
    before, written = fallbacks(), decisions("one_statement", "pr_steps")
    steps(h, 10)
    prepared = statements(h)
    assert prepared, "nothing prepared on harvest's own autocommit connection"
    assert all(name.startswith("harvest_") for name, _, _ in prepared)
    assert sum(generic for _, generic, _ in prepared) > 0  # planned a few times, then kept
    assert counted(before) == {}
    assert decisions("one_statement", "pr_steps") - written == 10


def test_nothing_is_prepared_behind_a_transaction_pooler(harvest):
    h = make(pooled=True)
    steps(h, 6)
    assert statements(h) == []


def test_statements_dropped_behind_harvests_back_are_prepared_again_and_nothing_is_lost(harvest):
    h = make()
    steps(h, 6)
    assert statements(h)
    with h.store.autocommit_engine.connect() as conn:
        conn.exec_driver_sql("DEALLOCATE ALL")  # as a pooler's DISCARD ALL would
    before, written = fallbacks(), decisions("one_statement", "pr_steps")
    rid = steps(h, 6)
    assert counted(before) == {}  # refused whole, sent again as text: no completion left its path
    assert decisions("one_statement", "pr_steps") - written == 6
    kinds = [e.event.type for e in h.history(rid)]
    assert kinds.count("ActivityStarted") == kinds.count("ActivityCompleted") == 6
    assert statements(h)  # prepared again
