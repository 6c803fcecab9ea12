"""Eager execution never runs a chain under a Celery time limit: the chained bodies would run
under the first task's limit. Any limit counts — the message's, the task's own, or the app's
(``task_time_limit``, e.g. from ``celery worker --time-limit``)."""

from __future__ import annotations

from celery import Celery

from harvest_celery._runtime.celery import _time_limited


def _task(**conf: float) -> object:
    app = Celery("limits", set_as_current=False)
    app.conf.update(**conf)

    @app.task(name="limits.t", shared=False)
    def t() -> None:
        return None

    return t


def test_no_time_limit_anywhere_allows_a_chain():
    assert _time_limited(_task()) is False


def test_an_app_wide_time_limit_forbids_a_chain():
    assert _time_limited(_task(task_time_limit=300))
    assert _time_limited(_task(task_soft_time_limit=60))


def test_a_task_or_message_time_limit_forbids_a_chain():
    task = _task()
    task.soft_time_limit = 5  # type: ignore[attr-defined]
    assert _time_limited(task)
    task = _task()
    task.push_request(timelimit=(10, None))  # type: ignore[attr-defined]
    try:
        assert _time_limited(task)
    finally:
        task.pop_request()  # type: ignore[attr-defined]
