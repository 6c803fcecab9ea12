"""A ``BaseException`` from workflow or activity code is a failure like any other, never a
wedged decision worker or an attempt left running; only a real shutdown signal that interrupts
a decision leaves the run as it was, to be decided again after the restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, WorkflowFailed, activity, workflow


class Custom(BaseException):
    pass


RAISED: dict[str, BaseException] = {}


@workflow(name="be_raises")
async def be_raises(ctx: WorkflowContext, kind: str) -> Any:
    raise RAISED[kind]


@activity(name="be_body", retry=RetryPolicy(max_attempts=2, initial_interval=0))
def be_body(kind: str) -> Any:
    raise RAISED[kind]


@workflow(name="be_calls")
async def be_calls(ctx: WorkflowContext, kind: str) -> Any:
    return await ctx.execute_activity(be_body, kind)


KINDS = {
    "SystemExit": SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt(),
    "GeneratorExit": GeneratorExit(),
    "CancelledError": asyncio.CancelledError(),
    "Custom": Custom("mine"),
}


@pytest.fixture
def h(tmp_path) -> Harvest:
    harvest = Harvest(f"sqlite:///{tmp_path / 'b.db'}").register(be_raises, be_body, be_calls)
    harvest.migrate()
    RAISED.update(KINDS)
    return harvest


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_base_exception_from_workflow_code_fails_the_run(h, kind):
    rid = h.start_workflow("be_raises", kind)
    with pytest.raises(WorkflowFailed) as info:
        h.result(rid, timeout=10)
    assert info.value.error_type == kind
    assert h.describe(rid).status == "FAILED"


def test_a_shutdown_signal_in_the_middle_of_a_decision_does_not_seal_the_run(h):
    h.runtime.shutting_down.set()  # as the worker's worker_shutting_down signal does
    with pytest.raises(SystemExit):
        h.start_workflow("be_raises", "KeyboardInterrupt")
    [run] = h.list(workflow="be_raises")
    assert run.status == "RUNNING"  # nothing written: decided again after the restart
    assert [e.event.type for e in h.history(run.id)] == ["WorkflowStarted"]
    h.runtime.shutting_down.clear()
    h.runtime.run_decision(run.id)  # the restarted worker decides it: the workflow's own error
    assert h.describe(run.id).status == "FAILED"


@pytest.mark.parametrize("kind", ["SystemExit", "Custom"])
def test_a_base_exception_from_an_activity_fails_the_attempt_then_propagates(h, kind):
    with pytest.raises(type(KINDS[kind])):
        h.start_workflow("be_calls", kind, execution_id=f"be-{kind}")
    rows = h.store.activity_rows(f"be-{kind}")
    assert rows[0]["status"] == "retry_wait"  # failed and retried per policy, not left running
    assert [e.error_type for e in h.store.attempt_errors(f"be-{kind}")] == [kind]


@activity(name="be_ok")
def be_ok(x: Any) -> Any:
    return x


@workflow(name="be_two")
async def be_two(ctx: WorkflowContext, x: Any) -> Any:
    await ctx.execute_activity(be_ok, x)
    return await ctx.execute_activity(be_ok, x)


def test_a_decision_that_fails_after_staging_its_messages_sends_none_of_them(tmp_path, monkeypatch):
    """An inline decision that raises after it staged its messages and counts (before its one
    write) leaves none of them behind: the completion alone is recorded, and only its decision
    request goes out — no message for a task row that was never written."""
    from harvest_celery._store.tx import Tx

    h = Harvest(f"sqlite:///{tmp_path / 's.db'}").register(be_ok, be_two)
    h.migrate()
    real_write, broken = Tx.write, [True]

    def write(self: Tx, w: Any) -> None:
        if broken and w.events and w.tasks and w.events[0]["type"] == "ActivityCompleted":
            broken.pop()
            raise RuntimeError("a decision bug after the messages were staged")
        real_write(self, w)

    monkeypatch.setattr(Tx, "write", write)
    sent: list[str] = []
    real_send = h.runtime.dispatcher.send

    def send(message: Any) -> None:
        sent.append(message.task_name)
        real_send(message)

    monkeypatch.setattr(h.runtime.dispatcher, "send", send)
    rid = h.start_workflow("be_two", 1)
    assert h.result(rid, timeout=10) == 1 and broken == []
    # start's decision, activity 1, then (the inline decision failed) a decision request, then
    # activity 2 from the decision task: never a phantom activity message in between
    assert sent == ["harvest.decide", "be_ok", "harvest.decide", "be_ok"]
