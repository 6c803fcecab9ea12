"""The sweeper: time lives in Postgres, not in Celery ETAs. Every ``sweep_interval`` seconds it
fires what is due — retry backoffs, expired leases (a vanished worker, an overrun
start_to_close), durable timers, deadlines and the end of a timeout's grace period, lost messages (a task row still scheduled, a decision request
never taken), nd-block retries, limits with waiting rows (the release backstop) — and relays
outbox rows an older build left unsent. It runs on the decision worker (a daemon thread), or
in-process in embedded mode. Beside it runs its waker (``_runtime.waker``), which releases
rate-limited rows at their token's due time, never at the sweep tick.

Between passes it listens for starts written inside applications' transactions (Postgres: the
process's listener, ``harvest_runs_started``) and claims each one addressed to its decision queue
at once, so such a run's first decision does not wait for the lost-message pass
(``_store.starts``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from harvest_celery._runtime import logs
from harvest_celery._runtime.messages import Message, relayed
from harvest_celery._runtime.waker import Waker
from harvest_celery._store import admission, links, starts, sweeps, tasks
from harvest_celery._store.records import Timings, utcnow
from harvest_celery._store.store import Store
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")


class SweepSettings(Protocol):
    decision_queue: str
    timings: Timings
    sweep_interval: float
    relay_after: float


class Sweeper:
    def __init__(
        self,
        store: Store,
        settings: SweepSettings,
        after_commit: Callable[[Tx], None],
        send_message: Callable[[Message], bool],
        kinds: Callable[[], list[str]] | None = None,
    ) -> None:
        self.store = store
        # the workflow types this sweeper answers for (its app's registry): another app sharing
        # the database sweeps its own runs through its own queues
        self._kinds = kinds
        self.settings = settings
        self._after_commit = after_commit
        self._send_message = send_message
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by a start announcement, or by stop()
        self._thread: threading.Thread | None = None
        # fires this process's due schedules on every pass (``_runtime.scheduler``), set by the
        # runtime: every worker fires them too, beside any ``harvest scheduler`` process
        self.fire_schedules: Callable[[], Any] | None = None
        # releases rate-limited rows at their token's due time, between passes (_runtime.waker)
        self.waker = Waker(store, after_commit)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="harvest-sweeper", daemon=True)
            self._thread.start()
            self.waker.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.waker.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        listener = self.store.listener
        feed = listener.starts() if listener is not None else None
        if feed is not None:
            self._wake = feed.ready
        next_sweep = time.monotonic() + self.settings.sweep_interval
        try:
            while not self._stop.is_set():
                self._wake.wait(max(0.0, next_sweep - time.monotonic()))
                if self._stop.is_set():
                    break
                if feed is not None and feed.ready.is_set():
                    feed.ready.clear()
                    self.take_started(feed.drain())
                if time.monotonic() >= next_sweep:
                    try:
                        self.sweep_once()
                    except Exception:  # noqa: BLE001 - keep sweeping; the next pass retries
                        log.exception("sweep failed")
                    next_sweep = time.monotonic() + self.settings.sweep_interval
        finally:
            if listener is not None and feed is not None:
                listener.unsubscribe(feed)

    def take_started(self, notices: list[str]) -> None:
        """Claim the announced starts addressed to this decision queue, and send their first
        decision (one claimant wins each: ``starts.take_started``)."""
        mine = [
            (n[0], n[1])
            for n in map(starts.parse_notice, notices)
            if n is not None and n[2] == self.settings.decision_queue
        ]
        if not mine:
            return
        try:
            with self.store.begin() as tx:
                starts.take_started(tx, mine, utcnow(), self.settings.decision_queue)
        except Exception:  # noqa: BLE001 - the lost-message pass requests them later
            log.exception("sweeper: claiming %d announced start(s) failed", len(mine))
            return
        self._after_commit(tx)

    def sweep_once(self) -> None:
        """One pass. Each row is its own transaction, and one row that fails is logged and
        skipped: it must never stop the sweep for every other run."""
        s = self.settings
        now = utcnow()
        kinds = self._kinds() if self._kinds is not None else None
        with self.store.begin() as tx:
            due = sweeps.due_retries(tx, now, kinds=kinds)
            expired = sweeps.expired_leases(tx, now, kinds=kinds)
            timers = sweeps.due_timers(tx, now, kinds=kinds)
            deadlines = sweeps.due_deadlines(tx, now, kinds=kinds)
        for execution_id, activity_id in due:
            self._row(
                "retry",
                execution_id,
                partial(tasks.redispatch_next_attempt, execution_id=execution_id, activity_id=activity_id),
            )
        for execution_id, activity_id, attempt in expired:
            # The worker vanished or overran start_to_close: a failed attempt, retried per policy.
            self._row(
                "lease",
                execution_id,
                partial(
                    tasks.expire_lease,
                    execution_id=execution_id,
                    activity_id=activity_id,
                    attempt=attempt,
                    decision_queue=s.decision_queue,
                ),
            )
        for execution_id, timer_id in timers:
            self._row(
                "timer",
                execution_id,
                partial(
                    sweeps.fire_timer,
                    execution_id=execution_id,
                    timer_id=timer_id,
                    decision_queue=s.decision_queue,
                ),
            )
        self._deadlines(deadlines)
        self._row("lost messages", "*", partial(sweeps.stale_scheduled, timings=s.timings, kinds=kinds))
        self._child_notices(now)
        self._row("waiting rows", "*", sweeps.settle_waiting)  # the release backstop
        self.waker.poke()  # a due time this process could not hear of is read now
        self._row("waiting runs", "*", admission.settle_waiting)  # the admission backstop
        self._row(
            "lost decisions",
            "*",
            partial(sweeps.stale_decisions, timings=s.timings, decision_queue=s.decision_queue, kinds=kinds),
        )
        self._relay_outbox()
        if self.fire_schedules is not None:
            try:
                self.fire_schedules()
            except Exception:  # noqa: BLE001 - logged; the next pass fires what is still due
                log.exception("sweeper: firing schedules failed")

    def _deadlines(self, due: list[tuple[str, str]]) -> None:
        """Expired deadlines (a timeout request) and ended grace periods (a seal, or overrun)."""
        s = self.settings
        for execution_id, kind in due:
            if kind == sweeps.DEADLINE:
                work = partial(
                    sweeps.expire_deadline,
                    execution_id=execution_id,
                    grace=s.timings.timeout_grace,
                    decision_queue=s.decision_queue,
                )
            else:
                work = partial(sweeps.end_grace, execution_id=execution_id, decision_queue=s.decision_queue)
            self._row(kind, execution_id, work)

    def _row(self, what: str, execution_id: str, work: Callable[..., Any]) -> None:
        """``work(tx, now=...)`` in its own transaction."""
        try:
            with self.store.begin() as tx:
                work(tx, now=utcnow())
        except Exception:  # noqa: BLE001 - logged; the next pass retries this row
            log.exception("sweeper: %s of %s failed", what, execution_id, extra=logs.run(execution_id))
            return
        self._after_commit(tx)

    def _child_notices(self, now: Any) -> None:
        """Notices of children whose closing process died before applying them."""
        with self.store.begin() as tx:
            stale = links.stale_notices(tx, now, self.settings.timings.redispatch_after)
        for parent_id, child_id in stale:
            self._row(
                "child notice",
                parent_id,
                partial(
                    links.apply_notice,
                    parent_id=parent_id,
                    child_id=child_id,
                    queue=self.settings.decision_queue,
                ),
            )

    def _relay_outbox(self) -> None:
        with self.store.begin() as tx:
            stale = sweeps.stale_outbox(tx, utcnow(), self.settings.relay_after)
        sent = [m.id for m in stale if self._send_message(relayed(m))]
        if sent:
            with self.store.begin() as tx:
                sweeps.delete_outbox(tx, sent)
