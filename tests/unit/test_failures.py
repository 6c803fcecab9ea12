"""How failures are written down: safe text, bounded tracebacks, every attempt's error kept (with
its traceback) beside the run and covered by erasure — in embedded mode, no services."""

from __future__ import annotations

from typing import Any

import pytest

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, WorkflowFailed, activity, workflow
from harvest_celery._core.failures import MAX_TRACEBACK_CHARS, describe, safe_text


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def test_a_message_postgres_cannot_store_is_made_safe():
    info = describe(_raise(ValueError("nul \x00 and lone \ud800 surrogate")))
    assert "\x00" not in info.message and "\ud800" not in info.message
    info.message.encode("utf-8")  # encodable
    assert info.error_type == "ValueError" and "test_failures.py" in info.traceback


def test_an_exception_whose_str_raises_is_still_described():
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    info = describe(_raise(Nasty()))
    assert info.error_type == "Nasty" and "str()" in info.message


def test_a_traceback_is_bounded_keeping_its_innermost_end():
    text = "outer\n" + "x" * (MAX_TRACEBACK_CHARS * 2) + "\ninnermost frame"
    cut = safe_text(text, MAX_TRACEBACK_CHARS)
    assert cut.endswith("innermost frame") and cut.startswith("[") and len(cut) < MAX_TRACEBACK_CHARS + 40


@activity(name="tf_flaky", retry=RetryPolicy(max_attempts=2, initial_interval=0))
def tf_flaky(x: Any) -> Any:
    raise ConnectionError(f"down for {x}")


@workflow(name="tf_bug")
async def tf_bug(ctx: WorkflowContext, x: Any) -> Any:
    return undefined_name  # type: ignore[name-defined]  # noqa: F821 - the bug under test


@workflow(name="tf_retries")
async def tf_retries(ctx: WorkflowContext, x: Any) -> Any:
    return await ctx.execute_activity(tf_flaky, x)


@pytest.fixture
def h(tmp_path) -> Harvest:
    harvest = Harvest(f"sqlite:///{tmp_path / 'f.db'}", timings=None).register(tf_flaky, tf_bug, tf_retries)
    harvest.migrate()
    return harvest


def test_a_bug_in_workflow_code_keeps_its_file_and_line(h):
    rid = h.start_workflow("tf_bug", 1)
    with pytest.raises(WorkflowFailed, match="undefined_name"):
        h.result(rid, timeout=10)
    [error] = h.store.attempt_errors(rid)
    assert (error.activity_id, error.attempt, error.error_type) == ("", 0, "NameError")
    assert "test_failures.py" in error.traceback and ", line " in error.traceback
    assert "return undefined_name" in error.traceback


def test_every_attempts_error_is_kept_not_only_the_last(h):
    rid = h.start_workflow("tf_retries", "db")
    with pytest.raises(WorkflowFailed):
        h.result(rid, timeout=10)
    errors = [e for e in h.store.attempt_errors(rid) if e.activity_id == "1"]
    assert [(e.attempt, e.error_type, e.message) for e in errors] == [
        (1, "ConnectionError", "down for db"),
        (2, "ConnectionError", "down for db"),
    ]
    assert all("in tf_flaky" in e.traceback for e in errors)


def test_erasure_tombstones_every_attempts_message_and_traceback(h):
    rid = h.start_workflow("tf_retries", "secret-card-4242")
    with pytest.raises(WorkflowFailed):
        h.result(rid, timeout=10)
    h.erase_payloads(rid)
    errors = h.store.attempt_errors(rid)
    assert errors and all(e.message == "" and e.traceback == "" for e in errors)
    assert all(e.error_type for e in errors)  # the types stay
