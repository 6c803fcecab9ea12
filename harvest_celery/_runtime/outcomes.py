"""What Celery is told of an attempt's outcome: failures look like failures, a refused claim
is IGNORED. Shared by engine-native tasks, adopted tasks and eager runs."""

from __future__ import annotations

from celery.exceptions import Ignore

from harvest_celery._errors import RedactedActivityError
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
    shown = for_celery(runtime, error, task_id)
    if shown is not error:
        del error  # a redacted failure's frames must not hold the original (error trackers
        raise shown from None  # record frame locals)
    raise error


def for_celery(runtime: Runtime, error: BaseException, task_id: str | None) -> BaseException:
    """The exception Celery is shown for a failed attempt (see ``settle``): the error itself, or
    with ``celery_error_detail == "type"`` a ``RedactedActivityError`` raised from a frame that
    holds nothing of the attempt, so it has a traceback of its own and none of the body's."""
    if runtime.settings.celery_error_detail != "type":
        return error
    return _raised(RedactedActivityError(type(error).__name__, task_id or ""))


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - only to give it a traceback
        return caught
