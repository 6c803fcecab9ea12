"""Issue 14, defect 6, end to end on Postgres: an exception whose text Postgres cannot store (a
NUL, a lone surrogate) or whose ``__str__`` raises must fail its run or its attempt like any
other error — never leave the run RUNNING, re-decided for ever — and an activity's real error
type must still reach ``non_retryable_error_types``. (The unit tests in
``tests/unit/test_failures.py`` test the text sanitiser itself; these test whole runs.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, WorkflowFailed, activity, workflow

from .conftest import DATABASE_URL


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


def _odd(kind: str) -> Exception:
    if kind == "nul":
        return ValueError("card \x00 and a lone \ud800 surrogate")
    return Unprintable()


@activity(
    name="pt_odd",
    retry=RetryPolicy(
        max_attempts=3, initial_interval=0, non_retryable_error_types=["Unprintable", "ValueError"]
    ),
)
def pt_odd(kind: str) -> Any:
    raise _odd(kind)


@workflow(name="pt_workflow_raises")
async def pt_workflow_raises(ctx: WorkflowContext, kind: str) -> Any:
    raise _odd(kind)


@workflow(name="pt_activity_raises")
async def pt_activity_raises(ctx: WorkflowContext, kind: str) -> Any:
    return await ctx.execute_activity(pt_odd, kind)


@pytest.fixture
def h(harvest: Any) -> Any:
    client = Harvest(DATABASE_URL).register(pt_odd, pt_workflow_raises, pt_activity_raises)
    yield client
    client.store.engine.dispose()


@pytest.mark.parametrize("kind", ["nul", "unprintable"])
def test_workflow_code_raising_odd_text_fails_the_run(h, kind):
    rid = h.start_workflow("pt_workflow_raises", kind, execution_id=f"pt-{uuid.uuid4().hex[:10]}")
    run = h.describe(rid)
    assert run.status == "FAILED", run
    with pytest.raises(WorkflowFailed) as failed:
        h.result(rid, timeout=5)
    assert "\x00" not in str(failed.value) and "\ud800" not in str(failed.value)


@pytest.mark.parametrize(("kind", "error_type"), [("nul", "ValueError"), ("unprintable", "Unprintable")])
def test_an_activity_raising_odd_text_fails_once_with_its_real_type(h, kind, error_type):
    rid = h.start_workflow("pt_activity_raises", kind, execution_id=f"pt-{uuid.uuid4().hex[:10]}")
    assert h.describe(rid).status == "FAILED"
    started = [e.event.attempt for e in h.history(rid) if e.event.type == "ActivityStarted"]
    assert started == [1]  # non-retryable by its real type: no second attempt
    errors = [e for e in h.attempt_errors(rid) if e.activity_id]
    assert [e.error_type for e in errors] == [error_type]
