"""An eager chain acks the message that started it once that message's own work has committed
(``celery._release_message``): only the worker's own ``Request`` of this very task, only once,
and a failed ack leaves the message to Celery's ack after the task."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state

from harvest_celery._runtime.celery import _release_message


class FakeRequest:
    def __init__(self, task: Any, fails: bool = False) -> None:
        self.task, self.acknowledged, self.acks, self.fails = task, False, 0, fails

    def acknowledge(self) -> None:
        if self.fails:
            raise OSError("connection lost")
        self.acks += 1
        self.acknowledged = True


def _task(task_id: str) -> Any:
    return SimpleNamespace(request=SimpleNamespace(id=task_id))


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    monkeypatch.setattr(state, "requests", requests)
    return requests


def test_the_workers_request_of_this_task_is_acked_once(held):
    task = _task("t1")
    held["t1"] = request = FakeRequest(task)
    _release_message(task)
    _release_message(task)  # Celery's acknowledge() after the task would find it acked too
    assert request.acks == 1 and request.acknowledged


def test_no_request_in_this_process_acks_nothing(held):
    _release_message(_task("t1"))  # a prefork child: the parent holds the message
    assert held == {}


def test_a_request_of_another_task_under_the_same_id_is_left_alone(held):
    held["t1"] = other = FakeRequest(_task("t1"))
    _release_message(_task("t1"))
    assert other.acks == 0 and not other.acknowledged


def test_a_failed_ack_leaves_the_message_unacked_for_celery(held, caplog):
    task = _task("t1")
    held["t1"] = request = FakeRequest(task, fails=True)
    _release_message(task)
    assert not request.acknowledged
    assert "acked after it" in caplog.text
