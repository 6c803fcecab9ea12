"""The runtime: decision cycles, activity claims and completions, the sweeper.

Glue between the pure engine, the store and a ``Dispatcher`` (Celery, or the in-process one of
embedded mode). Every operation is one transaction; messages and metrics go out only after it
commits.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, Protocol

from harvest_celery._core.engine import Activation, EngineConfig, Session
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.registry import Registry
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._store.store import Claim, OutboxMessage, Store, Timings, Tx, utcnow

log = logging.getLogger("harvest_celery")


class Dispatcher(Protocol):
    def send(self, message: OutboxMessage) -> None: ...


@dataclass
class Settings:
    decision_queue: str = "harvest"
    engine: EngineConfig = field(default_factory=EngineConfig)
    timings: Timings = field(default_factory=Timings)
    sweep_interval: float = 1.0
    relay_after: float = 10.0  # an outbox row older than this was not sent: send it again
    sticky_sessions: bool = True  # keep warm executions' replays between decisions
    max_sessions: int = 1000


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class SessionCache:
    """Warm replays by execution id (LRU). A session is taken out for a decision and put back
    only after that decision committed, so two threads never share one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, execution_id: str) -> Session | None:
        with self._lock:
            return self._items.pop(execution_id, None)

    def put(self, execution_id: str, session: Session) -> None:
        with self._lock:
            self._items[execution_id] = session
            evicted = []
            while len(self._items) > self.size:
                evicted.append(self._items.popitem(last=False)[1])
        for old in evicted:
            old.close()

    def __len__(self) -> int:
        return len(self._items)


class Runtime:
    def __init__(self, store: Store, registry: Registry, settings: Settings) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.dispatcher: Dispatcher | None = None
        self.sessions = SessionCache(settings.max_sessions)
        self._sent: list[int] = []
        self._sent_lock = threading.Lock()
        # delete sent outbox rows in batches on a background thread (False: at once)
        self.batch_outbox_deletes = True
        self._flusher_pid = -1
        # a pool child forked while another thread held the lock must not inherit it held
        if hasattr(os, "register_at_fork"):
            me = weakref.ref(self)  # the hook must not keep every Runtime alive

            def after_fork() -> None:
                runtime = me()
                if runtime is not None:
                    runtime._reset_after_fork()

            os.register_at_fork(after_in_child=after_fork)
        # test seam: called inside the claim transaction before ActivityStarted is appended
        self.before_claim_append: Callable[[str, str, int], None] | None = None

    # ── after commit ─────────────────────────────────────────────────────────────────────────
    def _after_commit(self, tx: Tx) -> None:
        for name, labels in tx.metrics:
            METRICS.inc(name, labels)
        self.flush(tx.outbox)

    def flush(self, messages: Sequence[OutboxMessage]) -> None:
        if not messages or self.dispatcher is None:
            return
        sent = []
        for message in messages:
            try:
                self.dispatcher.send(message)
            except Exception:  # noqa: BLE001 - the relay re-sends what stays in the outbox
                log.exception("dispatch of %s failed; the relay will re-send it", message.task_id)
                continue
            sent.append(message.id)
        self._forget_sent(sent)

    def _forget_sent(self, ids: list[int]) -> None:
        """Sent outbox rows are deleted in batches, off the hot path: a crash before the batch
        commits only means the relay re-sends them, and a duplicate message is harmless (the
        claim lets one body through)."""
        if not ids:
            return
        with self._sent_lock:
            self._sent.extend(ids)
            due = len(self._sent) >= 200 or not self.batch_outbox_deletes
            if not due and self._flusher_pid != os.getpid():  # one flusher per process (forks too)
                self._flusher_pid = os.getpid()
                threading.Thread(target=self._flush_loop, name="harvest-outbox", daemon=True).start()
        if due:
            self.flush_sent()

    def _reset_after_fork(self) -> None:
        self._sent_lock = threading.Lock()
        self._sent = []  # the parent deletes its own batch
        self._flusher_pid = -1
        self.sessions = SessionCache(self.settings.max_sessions)

    def flush_sent(self) -> None:
        with self._sent_lock:
            ids, self._sent = self._sent, []
        self.store.delete_outbox(ids)

    def _flush_loop(self) -> None:
        while True:
            time.sleep(0.5)
            try:
                self.flush_sent()
            except Exception:  # noqa: BLE001 - the rows stay; the relay may re-send them
                log.exception("deleting sent outbox rows failed")

    # ── decisions ────────────────────────────────────────────────────────────────────────────
    def run_decision(self, execution_id: str) -> None:
        """One decision cycle: lock, load, replay, append — one transaction.

        A warm execution (its last decision was taken by this process) is advanced from the cached
        ``Session`` with only the events appended since, so the cost stays flat in history length;
        anything unexpected falls back to a full replay."""
        with self.store.begin() as tx:
            row = tx.take_decision_request(execution_id)
            if row is None:
                return
            workflow_type = row._mapping["workflow_type"]
            definition = self.registry.workflow(workflow_type)
            session = self.sessions.take(execution_id)
            decision = None
            if session is not None:
                decision = session.advance(tx.history(execution_id, since=len(session.events)),
                                           self.settings.engine)
                if decision is None:
                    session.close()
            if session is None or decision is None:
                history = tx.history(execution_id)
                session = Session(definition, Activation(execution_id, workflow_type, history,
                                                         self.settings.engine), self.registry)
                decision = session.decision
            tx.apply_decision(row, session.events, decision, self.registry, utcnow(),
                              self.settings.timings, workflow_type)
            if decision.nd is not None:
                METRICS.inc("nd_blocked", {"workflow": workflow_type})
                log.warning("execution %s is nd-blocked: expected %s, got %s", execution_id,
                            decision.nd["expected"], decision.nd["actual"])
        self._after_commit(tx)
        if session.reusable and self.settings.sticky_sessions:
            self.sessions.put(execution_id, session)  # only once its decision committed
        else:
            session.close()

    # ── activities ───────────────────────────────────────────────────────────────────────────
    def claim(self, execution_id: str, activity_id: str, attempt: int) -> Claim | None:
        with self.store.begin() as tx:
            if self.before_claim_append is not None:
                self.before_claim_append(execution_id, activity_id, attempt)
            claim = tx.claim(execution_id, activity_id, attempt, worker_id(), utcnow(),
                             self.settings.timings)
        return claim

    def complete(self, claim: Claim, output: Any) -> None:
        try:
            output = check_json(output, f"output of activity {claim.activity_name!r}")
        except Exception as exc:  # noqa: BLE001 - a non-JSON result is the activity's failure
            self.fail(claim, type(exc).__name__, str(exc))
            return
        with self.store.begin() as tx:
            tx.complete_activity(claim.execution_id, claim.activity_id, claim.attempt, output,
                                 utcnow(), self.settings.decision_queue)
        self._after_commit(tx)

    def fail(self, claim: Claim, error_type: str, message: str) -> str:
        with self.store.begin() as tx:
            verdict = tx.fail_activity(claim.execution_id, claim.activity_id, claim.attempt,
                                       error_type, message, utcnow(), self.settings.decision_queue)
        self._after_commit(tx)
        return verdict

    def execute(self, claim: Claim, fn: Callable[[Any], Any]) -> None:
        """Run a claimed body and record what happened.

        With no ``start_to_close`` the claim's lease is renewed while the body runs (a
        heartbeat): only a vanished worker lets it expire, so a long body is never run again
        beside itself. With one, the lease is the deadline."""
        stop = threading.Event()
        if claim.start_to_close is None:
            threading.Thread(target=self._renew_lease, args=(claim, stop), daemon=True,
                             name=f"harvest-lease-{claim.activity_id}").start()
        try:
            output = fn(claim.input)
        except Exception as exc:  # noqa: BLE001 - recorded as the attempt's failure
            stop.set()
            self.fail(claim, type(exc).__name__, str(exc))
            return
        stop.set()
        self.complete(claim, output)

    def _renew_lease(self, claim: Claim, stop: threading.Event) -> None:
        lease = self.settings.timings.default_lease
        while not stop.wait(lease / 3):
            try:
                with self.store.begin() as tx:
                    tx.renew_lease(claim.execution_id, claim.activity_id, claim.attempt,
                                   utcnow() + timedelta(seconds=lease + 5))
            except Exception:  # noqa: BLE001 - the next beat retries; the lease has slack
                log.exception("renewing the lease of %s/%s failed", claim.execution_id, claim.activity_id)

    # ── sweeper ──────────────────────────────────────────────────────────────────────────────
    def sweep_once(self) -> None:
        """Fire what is due: retries, expired leases, timers, lost messages, nd-block retries.

        Each row is its own transaction, and one row that fails is logged and skipped: it must
        never stop the sweep for every other run."""
        s = self.settings
        now = utcnow()
        with self.store.begin() as tx:
            due = tx.due_retries(now)
            expired = tx.expired_leases(now)
            timers = tx.due_timers(now)
        for execution_id, activity_id in due:
            self._sweep_row("retry", execution_id, partial(
                Tx.redispatch_next_attempt, execution_id=execution_id, activity_id=activity_id))
        for execution_id, activity_id, attempt in expired:
            # The worker vanished or overran start_to_close: a failed attempt, retried per policy.
            self._sweep_row("lease", execution_id, partial(
                Tx.expire_lease, execution_id=execution_id, activity_id=activity_id, attempt=attempt,
                decision_queue=s.decision_queue))
        for execution_id, timer_id in timers:
            self._sweep_row("timer", execution_id, partial(
                Tx.fire_timer, execution_id=execution_id, timer_id=timer_id,
                decision_queue=s.decision_queue))
        self._sweep_row("lost messages", "*", partial(Tx.stale_scheduled, timings=s.timings))
        self._sweep_row("lost decisions", "*", partial(
            Tx.stale_decisions, timings=s.timings, decision_queue=s.decision_queue))
        with self.store.begin() as tx:
            stale = tx.stale_outbox(utcnow(), s.relay_after)
        self.flush(stale)

    def _sweep_row(self, what: str, execution_id: str, work: Callable[..., Any]) -> None:
        """``work(tx, now=...)`` in its own transaction."""
        try:
            with self.store.begin() as tx:
                work(tx, now=utcnow())
        except Exception:  # noqa: BLE001 - logged; the next pass retries this row
            log.exception("sweeper: %s of %s failed", what, execution_id)
            return
        self._after_commit(tx)


class Sweeper:
    """Runs ``Runtime.sweep_once`` every ``sweep_interval`` seconds on a daemon thread."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="harvest-sweeper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.runtime.settings.sweep_interval):
            try:
                self.runtime.sweep_once()
            except Exception:  # noqa: BLE001 - keep sweeping; the next pass retries
                log.exception("sweep failed")


class InlineDispatcher:
    """Embedded mode: messages go to an in-process queue that ``drain`` executes."""

    def __init__(self) -> None:
        self.queue: deque[OutboxMessage] = deque()

    def send(self, message: OutboxMessage) -> None:
        self.queue.append(message)
