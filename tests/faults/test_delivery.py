"""Messages delivered more than once, and BaseExceptions from workflow and activity code."""

from __future__ import annotations

import time

import pytest

from .harness import FULL
from .invariants import Expect

pytestmark = pytest.mark.faults

BASE_EXCEPTIONS = ["SystemExit", "KeyboardInterrupt", "GeneratorExit", "CancelledError", "CustomStop"]


def test_forced_redelivery(faults):
    """Every message is sent three times while the runs move; afterwards every activity message
    of every attempt, and a decision request, is sent once more. No body runs twice for an
    attempt and nothing is appended twice."""
    faults.redis.set("faults:dup", 3)
    t0 = time.monotonic()
    runs = faults.start()
    recovery = faults.wait_finished(since=t0)
    faults.redis.delete("faults:dup")
    lengths = {run: len(faults.history(run)) for run in runs}
    app = faults.harvest.celery_app
    for run in runs:
        for row in faults.harvest.store.activity_rows(run):
            for attempt in range(1, row["attempt"] + 1):
                app.send_task(
                    row["activity_name"], args=[run, row["activity_id"], attempt], queue=row["queue"]
                )
        app.send_task("harvest.decide", args=[run], queue="harvest")
    time.sleep(3)  # time enough for the workers to (wrongly) run anything again
    assert {run: len(faults.history(run)) for run in runs} == lengths
    faults.assert_clean("forced redelivery (3 copies of every message, then all again)", recovery)


def test_base_exceptions_in_workflow_code(faults):
    """Each BaseException raised by workflow code (between steps 2 and 3) fails its run with
    that error; the decision worker is not wedged: runs started afterwards finish."""
    t0 = time.monotonic()
    for kind in BASE_EXCEPTIONS:
        (run,) = faults.start(n=1, wf_boom=kind)
        faults.expect(run, Expect("FAILED", unwinds=False, error_type=kind))
    faults.start()
    faults.assert_clean("BaseException in workflow code", faults.wait_finished(since=t0))


def test_base_exceptions_in_activity_code(faults):
    """Each BaseException raised by step 2's body on its first attempt fails that attempt (with
    the exception's type) and the step is retried; every run ends as planned and the activity
    worker keeps consuming — with more such exceptions than it has threads (once, each one that
    escaped a task held a thread-pool slot for good and wedged the worker)."""
    t0 = time.monotonic()
    runs = []
    for kind in BASE_EXCEPTIONS:
        runs += faults.start(n=2, boom=kind, boom_step=2)
    recovery = faults.wait_finished(since=t0, timeout=120 if FULL else 30)
    verdict = faults.verdict("BaseException in activity code", recovery)  # before any cleanup
    if recovery is None:
        # wedged: seal what is left (a fresh worker would wedge on it too) and start the worker
        # afresh, so the rest of the suite runs
        for run in runs:
            if faults.harvest.store.status(run) == "RUNNING":
                faults.harvest.terminate(run, "fault suite: leftover of a wedged worker")
        faults.workers["acts"].kill9()
        faults.workers["acts"].start()
    assert recovery is not None and verdict.clean, verdict.problems
    for run, kind in zip(runs, [k for k in BASE_EXCEPTIONS for _ in range(2)], strict=True):
        assert faults.attempt_errors(run, "2") == [(1, kind)], run
