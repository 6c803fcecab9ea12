"""What Celery is told of an attempt's outcome: failures look like failures, a refused claim
is IGNORED. Shared by engine-native tasks, adopted tasks and eager runs."""

from __future__ import annotations

from celery.exceptions import Ignore, WorkerShutdown, WorkerTerminate

from harvest_celery._errors import BodyInterrupted, RedactedActivityError
from harvest_celery._runtime.runtime import Runtime


def settle(runtime: Runtime, ran: bool, error: BaseException | None, task_id: str | None) -> None:
    """End the Celery task as Celery users expect. A refused claim is IGNORED, never SUCCESS
    (the claim logged why). A failed attempt ends in FAILURE with the real exception and its
    traceback, so Flower shows it red and ``task_failure`` fires — its failure is already
    committed, and the engine retries it by its own policy. With
    ``Settings.celery_error_detail == "type"`` Celery gets only the exception type (exception text
    and tracebacks can quote the payload); the full text stays in Postgres."""
    if not ran:
        raise Ignore()
    if error is None:
        return
    if stops_the_worker(runtime, error):
        raise error
    shown = for_celery(runtime, error, task_id)
    if shown is not error:
        del error  # a redacted failure's frames must not hold the original (error trackers
        raise shown from None  # record frame locals)
    raise error


def stops_the_worker(runtime: Runtime, error: BaseException) -> bool:
    """A BaseException that must go on into Celery: the worker is shutting down (Celery's own
    ``WorkerShutdown``/``WorkerTerminate``, or a signal while ``shutting_down`` is set)."""
    if isinstance(error, (WorkerShutdown, WorkerTerminate)):
        return True
    return not isinstance(error, Exception) and runtime.shutting_down.is_set()


def for_celery(runtime: Runtime, error: BaseException, task_id: str | None) -> BaseException:
    """The exception Celery is shown for a failed attempt (see ``settle``): the error itself;
    a ``BodyInterrupted`` for a ``BaseException`` that is not an ``Exception`` (escaping a task,
    it would wedge Celery's thread pool); or with ``celery_error_detail == "type"`` a
    ``RedactedActivityError`` raised from a frame that holds nothing of the attempt, so it has a
    traceback of its own and none of the body's."""
    if runtime.settings.celery_error_detail == "type":
        return _raised(RedactedActivityError(type(error).__name__, task_id or ""))
    if not isinstance(error, Exception):
        return _raised(BodyInterrupted(type(error).__name__, str(error)))
    return error


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - only to give it a traceback
        return caught
