"""On Postgres, each run-state predicate's SQL text fragment and Core expression select exactly the
rows its Python form accepts, for any combination of the columns it reads (hypothesis), and for
``fast_path`` the attempt's task row too. Every row is written and rolled back in one transaction."""

from __future__ import annotations

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
RUN_VALUES: dict[str, Any] = {"status": st.sampled_from(RUN_STATUSES), "next_seq": st.sampled_from([1, 2]),
                              "sticky_queue": QUEUES}
PARAM_VALUES: dict[str, Any] = {"next_seq": st.sampled_from([1, 2]), "sticky_queue": QUEUES,
                                "attempt": st.sampled_from([1, 2]), "closes": st.booleans()}
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
    conn.execute(executions.insert().values(
        id="pred", workflow_type="W", created_at=NOW, updated_at=NOW, nd_block_count=0,
        **{"status": "RUNNING", "next_seq": 1, **run}))
    conn.execute(activity_tasks.insert().values(
        execution_id="pred", activity_id="a1", activity_name="act", queue="q", event_seq=1,
        **{"status": "running", "attempt": 1, **task}))


def _text_form(conn: Any, pred: p.Predicate, params: dict[str, Any]) -> bool:
    sql = (f"SELECT r.id FROM {executions.name} AS r JOIN {activity_tasks.name} AS t "
           f"ON t.execution_id = r.id WHERE r.id = 'pred' AND {pred.sql('r')} "
           f"AND {pred.sql('t', table=p.TASK)}")
    return conn.exec_driver_sql(sql, {k: params[k] for k in pred.params}).first() is not None


def _core_form(conn: Any, pred: p.Predicate, params: dict[str, Any]) -> bool:
    q = sa.select(executions.c.id).select_from(executions.join(
        activity_tasks, activity_tasks.c.execution_id == executions.c.id)).where(
        executions.c.id == "pred", pred.core(executions, **params),
        pred.core(activity_tasks, on=p.TASK, **params))
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
