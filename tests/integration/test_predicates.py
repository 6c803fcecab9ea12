"""On Postgres, each run-state predicate's SQL text fragment and Core expression select exactly the
rows its Python form accepts, for any combination of the columns it reads (hypothesis, then
exhaustively over every combination of the values that make a difference), and for
``fast_path`` the attempt's task row too. Every row is written and rolled back in one transaction."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest_celery._core.lifecycle import RUN_STATUSES
from harvest_celery._core.names import TASK_STATUSES
from harvest_celery._store import predicates as p
from harvest_celery._store.records import RunRow, TaskRow
from harvest_celery._store.schema import activity_tasks, executions

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
QUEUES = st.sampled_from([None, "q1@host", "q2@host"])
# every value a read column can take that makes a difference to some predicate
RUN_VALUES: dict[str, Any] = {
    "status": st.sampled_from(RUN_STATUSES),
    "next_seq": st.sampled_from([1, 2]),
    "sticky_queue": QUEUES,
}
PARAM_VALUES: dict[str, Any] = {
    "next_seq": st.sampled_from([1, 2]),
    "sticky_queue": QUEUES,
    "attempt": st.sampled_from([1, 2]),
    "closes": st.booleans(),
}
TASK_VALUES: dict[str, Any] = {"status": st.sampled_from(TASK_STATUSES), "attempt": st.sampled_from([1, 2])}


def _column_values(columns: frozenset[str], values: dict[str, Any]) -> Any:
    return st.fixed_dictionaries({c: values.get(c, st.sampled_from([None, NOW])) for c in sorted(columns)})


@st.composite
def _cases(draw: Any, pred: p.Predicate) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Any combination of the columns ``pred`` reads and its parameters. Half the time, for a
    predicate that pins every column (``fast_path``: a random row would almost never pass it),
    the row it accepts with at most one column drawn at random instead."""
    params = draw(st.fixed_dictionaries({k: PARAM_VALUES[k] for k in pred.params}))
    run = draw(_column_values(pred.columns, RUN_VALUES))
    task = draw(_column_values(pred.task_columns, TASK_VALUES))
    try:
        passing = pred.assumed(**params)
    except ValueError:
        return run, task, params
    if draw(st.booleans()):
        keep = draw(st.sampled_from([None, *(("run", c) for c in run), *(("task", c) for c in task)]))
        run = {c: run[c] if keep == ("run", c) else passing[c] for c in run}
        task_passing = {"status": "running", "attempt": params.get("attempt")}
        task = {c: task[c] if keep == ("task", c) else task_passing[c] for c in task}
    return run, task, params


@pytest.fixture(scope="module")
def engine(harvest: Any) -> Any:
    engine = sa.create_engine(harvest.database_url)
    yield engine
    engine.dispose()


def _write(conn: Any, run: dict[str, Any], task: dict[str, Any]) -> None:
    conn.execute(
        executions.insert().values(
            id="pred",
            workflow_type="W",
            created_at=NOW,
            updated_at=NOW,
            nd_block_count=0,
            **{"status": "RUNNING", "next_seq": 1, **run},
        )
    )
    conn.execute(
        activity_tasks.insert().values(
            execution_id="pred",
            activity_id="a1",
            activity_name="act",
            queue="q",
            event_seq=1,
            **{"status": "running", "attempt": 1, **task},
        )
    )


def _text_form(conn: Any, pred: p.Predicate, params: dict[str, Any]) -> bool:
    sql = (
        f"SELECT r.id FROM {executions.name} AS r JOIN {activity_tasks.name} AS t "
        f"ON t.execution_id = r.id WHERE r.id = 'pred' AND {pred.sql('r')} "
        f"AND {pred.sql('t', table=p.TASK)}"
    )
    return conn.exec_driver_sql(sql, {k: params[k] for k in pred.params}).first() is not None


def _core_form(conn: Any, pred: p.Predicate, params: dict[str, Any]) -> bool:
    q = (
        sa.select(executions.c.id)
        .select_from(executions.join(activity_tasks, activity_tasks.c.execution_id == executions.c.id))
        .where(
            executions.c.id == "pred",
            pred.core(executions, **params),
            pred.core(activity_tasks, on=p.TASK, **params),
        )
    )
    return conn.execute(q).first() is not None


def _python_form(conn: Any, pred: p.Predicate, params: dict[str, Any]) -> bool:
    run = conn.execute(sa.select(executions).where(executions.c.id == "pred")).one()
    task = conn.execute(sa.select(activity_tasks).where(activity_tasks.c.execution_id == "pred")).one()
    return pred.holds(RunRow.from_mapping(run._mapping), TaskRow.from_mapping(task._mapping), **params)


@pytest.mark.parametrize("pred", p.PREDICATES, ids=lambda pred: pred.name)
def test_sql_core_and_python_forms_agree(engine: Any, pred: p.Predicate) -> None:
    seen: set[bool] = set()

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=_cases(pred))
    def agree(case: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
        run, task, params = case
        with engine.connect() as conn:
            trans = conn.begin()
            try:
                _write(conn, run, task)
                expected = _python_form(conn, pred, params)
                assert _text_form(conn, pred, params) == expected, (run, task, params)
                assert _core_form(conn, pred, params) == expected, (run, task, params)
                seen.add(expected)
            finally:
                trans.rollback()

    agree()
    assert seen == {True, False}  # both answers were reached: the comparison can fail


# ── exhaustively: every combination of the values above, many rows at once ────────────────────
DOMAINS: dict[str, tuple[Any, ...]] = {
    "status": RUN_STATUSES,
    "next_seq": (1, 2),
    "sticky_queue": (None, "q1@host", "q2@host"),
}
PARAM_DOMAINS: dict[str, tuple[Any, ...]] = {
    "next_seq": (1, 2),
    "sticky_queue": (None, "q1@host", "q2@host"),
    "attempt": (1, 2),
    "closes": (False, True),
}
TASK_DOMAINS: dict[str, tuple[Any, ...]] = {"status": TASK_STATUSES, "attempt": (1, 2)}


def _product(columns: Any, domains: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    names = sorted(columns)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(domains.get(c, (None, NOW)) for c in names))
    ]


def _matching(conn: Any, pred: p.Predicate, params: dict[str, Any], table: str) -> tuple[set[str], set[str]]:
    """The ids the text fragment and the Core expression select among the combination rows."""
    if table == p.RUN:
        text = f"SELECT r.id FROM {executions.name} AS r WHERE r.id LIKE 'combo-%%' AND {pred.sql('r')}"
        core = sa.select(executions.c.id).where(
            executions.c.id.like("combo-%"), pred.core(executions, **params)
        )
    else:
        text = (
            f"SELECT t.execution_id FROM {activity_tasks.name} AS t WHERE t.execution_id LIKE "
            f"'combo-%%' AND {pred.sql('t', table=p.TASK)}"
        )
        core = sa.select(activity_tasks.c.execution_id).where(
            activity_tasks.c.execution_id.like("combo-%"), pred.core(activity_tasks, on=p.TASK, **params)
        )
    by_text = {r[0] for r in conn.exec_driver_sql(text, {k: params[k] for k in pred.params})}
    return by_text, {r[0] for r in conn.execute(core)}


@pytest.mark.parametrize("pred", p.PREDICATES, ids=lambda pred: pred.name)
def test_the_forms_agree_on_every_combination(engine: Any, pred: p.Predicate) -> None:
    runs = _product(pred.columns, DOMAINS)
    tasks = _product(pred.task_columns, TASK_DOMAINS) if pred.task_columns else []
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.execute(
                executions.insert(),
                [
                    {
                        "id": f"combo-{i}",
                        "workflow_type": "W",
                        "created_at": NOW,
                        "updated_at": NOW,
                        "nd_block_count": 0,
                        "status": "RUNNING",
                        "next_seq": 1,
                        **run,
                    }
                    for i, run in enumerate(runs)
                ],
            )
            if tasks:
                conn.execute(
                    activity_tasks.insert(),
                    [
                        {
                            "execution_id": f"combo-{i}",
                            "activity_id": "a1",
                            "activity_name": "act",
                            "queue": "q",
                            "event_seq": 1,
                            **task,
                        }
                        for i, task in enumerate(tasks)
                    ],
                )
            stored = {
                r.id: RunRow.from_mapping(r._mapping)
                for r in conn.execute(sa.select(executions).where(executions.c.id.like("combo-%")))
            }
            stored_tasks = {
                r.execution_id: TaskRow.from_mapping(r._mapping)
                for r in conn.execute(
                    sa.select(activity_tasks).where(activity_tasks.c.execution_id.like("combo-%"))
                )
            }
            sizes: set[int] = set()
            for params in _product(pred.params, PARAM_DOMAINS) if pred.params else [{}]:
                accepted = {
                    i for i, row in stored.items() if all(t.holds(row, params) for t in pred.of(p.RUN))
                }
                sizes.add(len(accepted))
                assert _matching(conn, pred, params, p.RUN) == (accepted, accepted), params
                if tasks:
                    accepted = {
                        i
                        for i, task in stored_tasks.items()
                        if all(t.holds(task, params) for t in pred.of(p.TASK))
                    }
                    assert _matching(conn, pred, params, p.TASK) == (accepted, accepted), params
            assert max(sizes) > 0 and min(sizes) < len(stored)  # rows on both sides: it can fail
        finally:
            trans.rollback()
