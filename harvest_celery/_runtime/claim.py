"""The pre-run claim, in one place. Every way a body can run — an engine-native Celery task (the
``task_prerun`` hook, or ``__call__`` when called without it), an adopted existing task, an eager
local run, embedded mode's drain — goes through ``claim`` with one failure policy: an error while
claiming is logged and means the body does not run (the task row stays scheduled and the sweeper
re-dispatches it); a refusal (re-sent, redelivered, stale or cancelled) is logged at INFO. The
one shortcut: an eager run whose decision this very thread wrote was claimed inside that write,
under the same guard (``claim_dispatch``; ``records.EagerClaim``). Then ``run_claimed`` runs the
body under the claim and records its outcome."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from harvest_celery._runtime import logs
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._store.records import Claim, Dispatch

log = logging.getLogger("harvest_celery")


def claim(runtime: Runtime, execution_id: str, activity_id: str, attempt: int) -> Claim | None:
    """Claim the attempt (append ``ActivityStarted``) or refuse; never raises."""
    try:
        claimed = runtime.claim(execution_id, activity_id, attempt)
    except Exception:  # noqa: BLE001 - the sweeper re-dispatches the still-scheduled row
        log.exception(
            "claim of %s/%s attempt %s failed: the body will not run; the sweeper re-dispatches it",
            execution_id,
            activity_id,
            attempt,
            extra=logs.run(execution_id, activity_id=activity_id, attempt=attempt),
        )
        return None
    if claimed is not None:
        _started(claimed)
    else:
        log.info(
            "claim of %s/%s attempt %s refused (duplicate, stale or cancelled)",
            execution_id,
            activity_id,
            attempt,
            extra=logs.run(execution_id, activity_id=activity_id, attempt=attempt),
        )
    return claimed


def claim_dispatch(runtime: Runtime, dispatch: Dispatch) -> Claim | None:
    """An eager attempt's claim: the one its decision's write took for this thread
    (``EagerClaim``), else taken now by ``claim``."""
    if dispatch.claimed is not None:
        _started(dispatch.claimed)
        return dispatch.claimed
    return claim(runtime, dispatch.execution_id, dispatch.activity_id, dispatch.attempt)


def _started(claimed: Claim) -> None:
    """A first attempt's schedule-to-start lag, once its claim has committed (recorded times;
    a later attempt's start waits on its backoff, which is not lag)."""
    if claimed.attempt == 1 and claimed.scheduled_at is not None and claimed.started_at is not None:
        lag = (claimed.started_at - claimed.scheduled_at).total_seconds()
        METRICS.observe("activity_schedule_to_start", {"queue": claimed.queue}, max(lag, 0.0))


def run_claimed(
    runtime: Runtime, claimed: Claim | None, body: Callable[[Any], Any]
) -> tuple[bool, BaseException | None]:
    """Run ``body(input)`` under a claim and record its outcome. Returns whether it ran, and
    the error it raised (already recorded as the attempt's failure), if any."""
    if claimed is None:
        return False, None
    try:
        return True, runtime.execute(claimed, body)
    except BaseException as exc:  # noqa: BLE001 - not an Exception: its failure is recorded
        return True, exc  # the caller decides what goes on (a shutdown, or a wrapped failure)


def claim_and_run(
    runtime: Runtime, execution_id: str, activity_id: str, attempt: int, body: Callable[[Any], Any]
) -> tuple[bool, BaseException | None]:
    return run_claimed(runtime, claim(runtime, execution_id, activity_id, attempt), body)
