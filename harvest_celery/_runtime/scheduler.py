"""Firing schedules: one pass (``fire_pass``), run by every worker's sweeper and by the
``harvest scheduler`` process, whose loop sleeps until the earliest ``next_fire_at``. Any number
may run at once: the row lock gives each tick one run (``_store.schedules``).

A process fires only the schedules of its decision queue whose workflow its registry has, or
whose task (an imported Beat entry) its ``Harvest`` adopted."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from prometheus_client import Gauge

from harvest_celery._core.lifecycle import FAILED
from harvest_celery._errors import InvalidLimitKey
from harvest_celery._store import admission
from harvest_celery._store import schedules as rows
from harvest_celery._store.appconn import payloads_on

log = logging.getLogger("harvest_celery")

LAG = Gauge(
    "harvest_schedule_lag_seconds",
    "How late the latest fired tick of the workflow's schedules started (run creation minus nominal tick), worst over its schedules.",
    ("workflow",),
    multiprocess_mode="max",
)
FAILING = Gauge(
    "harvest_schedule_failing",
    "Schedules of the workflow whose last tick's run failed (harvest schedules list --failing names them).",
    ("workflow",),
    multiprocess_mode="max",
)
MAX_SLEEP = 5.0  # a schedule created or edited elsewhere is seen within this
FIRED_HERE: Counter[str] = Counter()  # ticks this process fired, per schedule (tests, the CLI)


PASS_LIMIT = 1000  # schedules fired in one pass; the rest on the next


def adopted(runtime: Any) -> list[str]:
    """The adopted tasks of this process: the task schedules it may fire."""
    return sorted(n for n, d in runtime.registry.activities.items() if d.adopted)


def fire_pass(runtime: Any, since: datetime | None = None) -> list[rows.Fired]:
    """Fire what is due: each schedule in its own transaction (a schedule that fails, e.g. an
    input its codec key no longer reads, is logged and left for the next pass without holding
    up the others); decisions and counters after each commit. Lateness is judged from
    ``since`` (default: when this pass began), so a burst that takes the pass longer than the
    on-time margin to fire misses none of its ticks (``_core.schedule.plan``)."""
    if since is None:
        with runtime.store.begin() as tx:
            since = rows.db_now(tx)
    fired: list[rows.Fired] = []
    failed: list[str] = []
    while len(fired) + len(failed) < PASS_LIMIT:
        try:
            done = _fire_one(runtime, failed, since)
        except rows.FiringFailed as exc:
            failed.append(exc.name)
            if isinstance(exc.__cause__, InvalidLimitKey):
                _pause_unfireable(runtime, exc.name, exc.__cause__)
            else:
                log.exception("scheduler: firing schedule %s failed", exc.name)
            continue
        if done is None:
            break
        fired.append(done)
    worst: dict[str, float] = {}
    for f in fired:
        FIRED_HERE[f.name] += len(f.fired)
        if f.lateness:
            worst[f.workflow] = max(worst.get(f.workflow, 0.0), max(f.lateness))
    for workflow, lag in worst.items():
        LAG.labels(workflow=workflow).set(lag)
    return fired


def _fire_one(runtime: Any, failed: list[str], since: datetime) -> rows.Fired | None:
    store = runtime.store
    with store.begin() as tx:
        tx.payloads = payloads_on(store, tx.conn)
        if runtime.tracer is not None:  # each tick starts a trace of its own
            tx.trace_start = partial(runtime.tracer.tick_start, tx)
        found = rows.fire_due(
            tx,
            runtime.settings.decision_queue,
            sorted(runtime.registry.workflows),
            1,
            failed,
            adopted(runtime),
            seen=since,
            admit=partial(admission.prepare, runtime.registry, priority=0),  # ticks pass admission
        )
        for f in found:
            for outcome, count in (("fired", len(f.fired)), ("skipped", f.skipped), ("missed", f.missed)):
                tx.metrics.extend([("schedule_ticks", {"workflow": f.workflow, "outcome": outcome})] * count)
    runtime._after_commit(tx)
    return found[0] if found else None


def _pause_unfireable(runtime: Any, name: str, why: InvalidLimitKey) -> None:
    """A tick whose workflow's ``limit_key`` refuses the stored input will refuse it on every
    pass: the schedule is paused once, with the reason as its note, instead of failing (and
    logging) forever. ``harvest schedules resume`` after fixing the input or the key fires it
    again; the ticks missed meanwhile follow the schedule's catch-up policy."""
    log.error("scheduler: schedule %s paused: %s", name, why)
    with runtime.store.begin() as tx:
        rows.pause(tx, name, f"paused by the scheduler: {why}")


def observe_failing(runtime: Any) -> None:
    with runtime.store.begin() as tx:
        found = rows.listed(tx)
        statuses = rows.run_statuses(tx, [r.last_run_id for r in found if r.last_run_id])
    failing: Counter[str] = Counter()
    for r in found:
        failing[r.workflow] += statuses.get(r.last_run_id) == FAILED
    for workflow, count in failing.items():
        FAILING.labels(workflow=workflow).set(count)


def sleep_for(runtime: Any) -> float:
    with runtime.store.begin() as tx:
        delay = rows.seconds_to_next(
            tx, runtime.settings.decision_queue, sorted(runtime.registry.workflows), adopted(runtime)
        )
    return MAX_SLEEP if delay is None else min(delay, MAX_SLEEP)


def run_forever(runtime: Any, stop: threading.Event, on_fired: Callable[[str], None] | None = None) -> None:
    """The ``harvest scheduler`` loop: fire, then sleep until the earliest ``next_fire_at``
    (at most ``MAX_SLEEP``, to see schedules made elsewhere; a buffered tick is looked at on
    every pass)."""
    since: datetime | None = None  # kept while passes are cut at PASS_LIMIT: one burst
    while not stop.is_set():
        delay = MAX_SLEEP
        try:
            if since is None:
                with runtime.store.begin() as tx:
                    since = rows.db_now(tx)
            found = fire_pass(runtime, since)
            since = since if len(found) >= PASS_LIMIT else None
            for done in found:
                for run_id in done.fired:
                    if on_fired is not None:
                        on_fired(run_id)
            observe_failing(runtime)
            delay = sleep_for(runtime)
        except Exception:  # noqa: BLE001 - keep firing; the next pass retries
            log.exception("scheduler: a firing pass failed")
        stop.wait(max(delay, 0.05))
