"""The runtime: decision cycles, activity claims and completions.

Glue between the pure engine, the store and a ``Dispatcher`` (Celery, or the in-process one of
embedded mode). Every operation is one transaction; messages and metrics go out only after it
commits. **The next decision rides on the completion**: a worker that records an activity's
completion and has the workflow registered decides in the same transaction. Nothing of the
decision is written until its one write statement, so a decision that raises before it leaves
the transaction as it was and the completion is recorded alone with a decision request; one that
fails in the database aborts the transaction, and ``_outcome_transaction`` records the completion
alone in a fresh one. A decision bug never loses a completion or runs a body again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from harvest_celery._core import events as ev
from harvest_celery._core import failures
from harvest_celery._core.commands import Decision, Failed
from harvest_celery._core.engine import Activation, Session
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.registry import Registry
from harvest_celery._runtime import activity_context
from harvest_celery._runtime.leases import LeaseKeeper
from harvest_celery._runtime.messages import Message, encode
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._runtime.sessions import SessionCache
from harvest_celery._runtime.settings import Settings
from harvest_celery._runtime.sweeper import Sweeper
from harvest_celery._store import tasks
from harvest_celery._store.records import (
    Claim,
    CompletionGuard,
    Dispatch,
    EagerClaim,
    RunRow,
    utcnow,
)
from harvest_celery._store.store import Store, is_transient
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")
T = TypeVar("T")


class Dispatcher(Protocol):
    def send(self, message: Message) -> None: ...


_HOST = socket.gethostname()  # read once: a system call per attempt showed in a profile


def _assumed_row(execution_id: str, workflow_type: str, next_seq: int, sticky: str | None) -> RunRow:
    """The run row a one-statement completion assumes: generated from ``predicates.fast_path``."""
    return RunRow.assumed(execution_id, workflow_type, next_seq, sticky)


def _open_activities(session: Session) -> int:
    return sum(1 for future in session.replay.activity_futures.values() if not future.done())


class _NotThisWay(Exception):
    """The one-statement completion does not apply here (``_complete_in_one_statement``)."""


def worker_id() -> str:
    return f"{_HOST}:{os.getpid()}:{threading.get_ident()}"


class _Decided:
    """What a decision taken inside a transaction leaves for after its commit."""

    def __init__(self, session: Session | None = None,
                 written: list[ev.HistoryEvent] | None = None) -> None:
        self.session = session
        self.written = written or []
        self.reraise: BaseException | None = None


class Runtime:
    def __init__(self, store: Store, registry: Registry, settings: Settings) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.dispatcher: Dispatcher | None = None
        self.sessions = SessionCache(settings.max_sessions)
        self.leases = LeaseKeeper(store, settings.timings.default_lease)
        self.sweeper = Sweeper(store, settings, self._after_commit, self.send_message,
                               lambda: sorted(self.registry.workflows))
        # a pool child forked while another thread held a lock must not inherit it held
        if hasattr(os, "register_at_fork"):
            me = weakref.ref(self)  # the hook must not keep every Runtime alive

            def after_fork() -> None:
                runtime = me()
                if runtime is not None:
                    runtime._reset_after_fork()

            os.register_at_fork(after_in_child=after_fork)
        # test seams: called inside the claim transaction before ActivityStarted is appended,
        # and inside an inline decision's savepoint before the decision runs
        self.before_claim_append: Callable[[str, str, int], None] | None = None
        self.before_inline_decision: Callable[[str], None] | None = None
        # set by the Celery worker at start: the queues it consumes (eager execution stays off
        # outside a worker) and whether it sends task events
        self.local_queues: frozenset[str] = frozenset()
        self.send_task_events = False
        self.event_source: Any = None  # the worker's consumer, once ready (its event dispatcher)
        self.shutting_down = threading.Event()  # set by the worker on a warm or cold shutdown
        self.sticky_queue: str | None = None  # this process's own decision queue, if routed to
        self._local = threading.local()  # .accept: take one eager dispatch; .held: the taken one

    def task_events_on(self) -> bool:
        """Does this worker send task events now? ``-E`` at start, or switched on later (Flower's
        ``enable_events``): read from the consumer's event dispatcher when this process has it."""
        dispatcher = getattr(self.event_source, "event_dispatcher", None)
        if dispatcher is None:
            return self.send_task_events
        groups = getattr(dispatcher, "groups", None)
        return bool(dispatcher.enabled) and (not groups or "task" in groups)

    def _reset_after_fork(self) -> None:
        self.sessions = SessionCache(self.settings.max_sessions)
        self.leases.reset_after_fork()

    # ── after commit ─────────────────────────────────────────────────────────────────────────
    def _after_commit(self, tx: Tx) -> None:
        for name, labels in tx.metrics:
            METRICS.inc(name, labels)
        self.send(tx.dispatches)

    def send(self, dispatches: Sequence[Dispatch]) -> None:
        """Send what a committed transaction asked for. A send that fails is logged: the task
        row (or the run's decision request) is the durable record, re-sent by the sweeper.
        Inside an eager scope, one activity this worker can run is held back for it instead:
        the one the write already claimed for this thread, or else the first it can run."""
        held = next((d for d in dispatches if d.claimed is not None), None)
        if held is None and self._accepting():
            held = next((d for d in dispatches if self._runs_here(d)), None)
        if held is not None:
            self._local.held = held
        if self.dispatcher is None:
            return
        for dispatch in dispatches:
            if dispatch is not held:
                self.send_message(encode(dispatch))

    def _accepting(self) -> bool:
        """Is this thread in an eager scope with room for one more activity?"""
        return bool(getattr(self._local, "accept", False)) and getattr(self._local, "held", None) is None

    def _eager_claim(self) -> EagerClaim | None:
        """The claim a decision written by this thread takes for it (``EagerClaim``), if the
        thread will run an activity next; never once the worker is shutting down."""
        if not self._accepting() or self.shutting_down.is_set():
            return None
        return EagerClaim(worker_id(), self.settings.timings.default_lease, self._claims_here)

    def _claims_here(self, dispatch: Dispatch) -> bool:
        if not self._runs_here(dispatch):
            return False
        if self.before_claim_append is not None:  # a test seam: the claim is being taken
            self.before_claim_append(dispatch.execution_id, dispatch.activity_id, dispatch.attempt)
        return True

    def _runs_here(self, dispatch: Dispatch) -> bool:
        """An activity this worker may run eagerly: engine-native, no deadline (a local chain
        would run under the first message's time limit), on a queue this worker consumes."""
        if dispatch.kind != Dispatch.ACTIVITY or dispatch.adopted or dispatch.deadline is not None:
            return False
        if dispatch.queue not in self.local_queues or dispatch.activity_name not in self.registry.activities:
            return False
        return self.registry.activity(dispatch.activity_name).fn is not None

    @contextmanager
    def eager_scope(self, enabled: bool) -> Iterator[Callable[[], Dispatch | None]]:
        """While a worker thread runs a claimed body: completions may hold back one next
        activity for this thread (``take`` it, run it, repeat) — at most ``eager_max_chain`` in
        a row, so one run cannot keep a slot for ever. Whatever is still held at the end is
        sent."""
        left = [self.settings.eager_max_chain if enabled and self.local_queues else 0]
        self._local.accept, self._local.held = left[0] > 0, None

        def take() -> Dispatch | None:
            held, self._local.held = self._local.held, None
            if held is not None:
                left[0] -= 1
                self._local.accept = left[0] > 0
            return held

        try:
            yield take
        finally:
            held, self._local.held, self._local.accept = self._local.held, None, False
            if held is not None and held.claimed is not None:
                # claimed for this thread, which stops before running it (a shutdown): its
                # lease expires and the attempt is retried, as if this process had died
                log.warning("eager attempt %s/%s was claimed but not run; retried when its "
                            "lease expires", held.execution_id, held.activity_id)
            elif held is not None:
                self.send([held])

    def send_message(self, message: Message) -> bool:
        if self.dispatcher is None:
            return False
        try:
            self.dispatcher.send(message)
        except Exception:  # noqa: BLE001 - the sweeper re-sends it
            log.exception("dispatch of %s failed; the sweeper will re-send it", message.task_id)
            return False
        return True

    # ── decisions ────────────────────────────────────────────────────────────────────────────
    def run_decision(self, execution_id: str) -> None:
        """One decision cycle from the decision task: lock, load, replay, append — one
        transaction."""

        def work(tx: Tx) -> _Decided:
            row = tx.take_decision_request(execution_id)
            if row is None:
                return _Decided()
            return self._decide(tx, row, "task")

        decided, tx = self.store.transaction(work)
        self._after_decision(tx, decided)

    def _decide(self, tx: Tx, row: RunRow, path: str, pending: Sequence[ev.HistoryEvent] = (),
                known: Sequence[ev.HistoryEvent] = ()) -> _Decided:
        """Replay and write one decision on a locked, decidable run. ``pending``: events not
        yet written that the decision sees and writes first, in the same statement (the
        completion a worker decides on). ``known``: the last events already written, when the
        caller knows them (the claim's ActivityStarted), so a warm replay need not read them."""
        session, decision = self._replay(tx, row, list(pending), list(known))
        if (isinstance(decision.outcome, Failed) and decision.outcome.interrupt
                and self.shutting_down.is_set()):
            # a shutdown signal interrupted the workflow code, not the workflow's own doing:
            # nothing is written; the decision is taken again after the restart
            session.close()
            raise SystemExit("worker shutting down in the middle of a decision")
        keeps = session.reusable and self.settings.sticky_sessions
        # the events are stored at the time the replay saw the pending ones at (ctx.now())
        now = pending[-1].recorded_at if pending else utcnow()
        written = tx.apply_decision(row, session.events, decision, self.registry, now,
                                    self.settings.timings, row.workflow_type,
                                    leading=[h.event for h in pending],
                                    sticky=self.sticky_queue if keeps else None,
                                    eager=self._eager_claim())

        tx.metrics.append(("decisions", {"workflow": row.workflow_type, "path": path}))
        if decision.nd is not None:
            log.warning("execution %s is nd-blocked: expected %s, got %s", row.id,
                        decision.nd["expected"], decision.nd["actual"])
        return _Decided(session, written)

    def _replay(self, tx: Tx, row: RunRow, pending: list[ev.HistoryEvent],
                known: list[ev.HistoryEvent] | None = None) -> tuple[Session, Decision]:
        """A warm execution (its last decision was taken by this process) is advanced from its
        cached ``Session`` with only the events appended since, so the cost stays flat in
        history length; anything unexpected falls back to a full replay."""
        definition = self.registry.workflow(row.workflow_type)
        session = self.sessions.take(row.id)
        if session is not None:
            since = len(session.events)
            if since == row.next_seq:
                new = pending
            elif known and known[0].seq == since and since + len(known) == row.next_seq:
                new = known + pending
            else:
                new = tx.history(row.id, since=since) + pending
            decision = session.advance(new, self.settings.engine)
            if decision is not None:
                return session, decision
            session.close()
        history = tx.history(row.id) + pending
        session = Session(definition, Activation(row.id, row.workflow_type, history,
                                                 self.settings.engine), self.registry)
        return session, session.decision

    def _after_decision(self, tx: Tx, decided: _Decided) -> None:
        self._after_commit(tx)
        session = decided.session
        if session is not None:
            if session.reusable and self.settings.sticky_sessions:
                session.committed(decided.written)  # what its decision wrote, now committed
                self.sessions.put(session.replay.activation.execution_id, session)
            else:
                session.close()
        if decided.reraise is not None:
            raise decided.reraise

    def _decides_inline(self, row: RunRow) -> bool:
        """Whether this process should decide the run in the completion's transaction: it can
        (registered here, decidable, no decision pending) and it is cheap — its replay is warm
        here, or the history is short enough to replay cold. A replay this process kept is
        stale when the run names another process as the holder of its warm replay: then a long
        run's decision goes to that process (``RunRow.decide_on``), not to a cold replay here."""
        s = self.settings
        if not (s.inline_decisions and row.decidable and row.decision_requested_at is None
                and self.registry.has_workflow(row.workflow_type)):
            return False
        held_elsewhere = row.sticky_queue is not None and row.sticky_queue != self.sticky_queue
        if held_elsewhere:
            stale = self.sessions.take(row.id)
            if stale is not None:
                stale.close()
        return (row.id in self.sessions and not held_elsewhere) or row.next_seq <= s.inline_cold_max_events

    # ── activities ───────────────────────────────────────────────────────────────────────────
    def claim(self, execution_id: str, activity_id: str, attempt: int) -> Claim | None:
        def work(tx: Tx) -> Claim | None:
            if self.before_claim_append is not None:
                self.before_claim_append(execution_id, activity_id, attempt)
            return tasks.claim(tx, execution_id, activity_id, attempt, worker_id(), utcnow(),
                               self.settings.timings)

        claim, _tx = self.store.transaction(work, one_statement=True)
        return claim

    def complete(self, claim: Claim, output: Any) -> None:
        """Record a completion, and take the next decision in the same transaction when this
        process should (``_decides_inline``). If that transaction fails, the completion is
        recorded alone with a decision request: a decision bug never loses a completion."""
        try:
            output = check_json(output, f"output of activity {claim.activity_name!r}")
        except Exception as exc:  # noqa: BLE001 - a non-JSON result is the activity's failure
            self.fail(claim, type(exc).__name__, str(exc))
            return
        if self._complete_in_one_statement(claim, output):
            return
        decided, tx = self._outcome_transaction(
            claim, "completion", lambda tx, inline: self._record_completion(tx, claim, output,
                                                                           inline=inline))
        self._after_decision(tx, decided)

    def _one_statement_may(self, claim: Claim) -> bool:
        """Not with a payload store that offloads: staging puts blobs at keys named by seq,
        which only the run lock (the ordinary way) makes free to write."""
        s = self.settings
        return (s.inline_decisions and s.sticky_sessions and self.store.dialect.completes_in_one_statement()
                and self.store.payloads.offload_threshold is None)

    def _complete_in_one_statement(self, claim: Claim, output: Any) -> bool:
        """The common step as ONE autocommit statement: when this process holds the run's warm
        replay, positioned just before this attempt's ``ActivityStarted``, the completion and
        the next decision are taken without reading anything and written in one guarded
        statement (``CompletionGuard``: it writes only if the run is exactly as that replay
        assumes). False: nothing was written — not that case, the guard failed, or any error —
        and the caller records the completion the ordinary way (a cold replay)."""
        s = self.settings
        session = self.sessions.take(claim.execution_id) if self._one_statement_may(claim) else None
        if session is None or claim.started_seq is None or claim.started_at is None:
            return False
        seq, now = claim.started_seq, utcnow()
        workflow_type = session.replay.activation.workflow_type
        started = ev.ActivityStarted(claim.activity_id, claim.attempt, claim.worker_id)
        completion = ev.ActivityCompleted(claim.activity_id, output, claim.attempt)
        if len(session.events) != seq or _open_activities(session) != 1:
            # not positioned at this attempt, or other attempts may append meanwhile (a
            # parallel branch's claims would fail the guard and cost a cold replay)
            self.sessions.restore(claim.execution_id, session)
            return False
        try:
            if self.before_inline_decision is not None:
                self.before_inline_decision(claim.execution_id)
            decision = session.advance([ev.HistoryEvent(seq, started, claim.started_at),
                                        ev.HistoryEvent(seq + 1, completion, now)], s.engine)
            outcome = decision.outcome if decision is not None else None
            if decision is None or decision.nd is not None or (
                    isinstance(outcome, Failed) and outcome.interrupt):
                raise _NotThisWay  # (an interrupted decision is the ordinary way's to judge)
            row = _assumed_row(claim.execution_id, workflow_type, seq + 1, self.sticky_queue)
            guard = CompletionGuard(claim.activity_id, claim.attempt)

            def work(tx: Tx) -> list[ev.HistoryEvent] | None:
                written = tx.apply_guarded_decision(
                    row, session.events, decision, self.registry, now, s.timings, workflow_type,
                    guard, leading=[completion], eager=self._eager_claim(),
                    sticky=self.sticky_queue if session.reusable else None)
                if written is not None:
                    tx.metrics.append(("decisions", {"workflow": workflow_type, "path": "inline"}))
                return written

            written, tx = self.store.transaction(work, one_statement=True)
        except Exception:  # noqa: BLE001 - _NotThisWay, or anything: the ordinary way decides
            session.close()
            return False
        except BaseException:
            session.close()  # a shutdown signal: record the completion alone, then stop
            decided, tx = self._outcome_transaction(
                claim, "completion", lambda tx, _i: self._record_completion(tx, claim, output,
                                                                           inline=False))
            self._after_decision(tx, decided)
            raise
        if written is None:
            session.close()
            return False
        self._after_decision(tx, _Decided(session, written))
        return True

    def _outcome_transaction(self, claim: Claim, what: str,
                             work: Callable[[Tx, bool], T]) -> tuple[T, Tx]:
        """Record a body's outcome — it ran, its side effect happened: this must not be lost.

        First with the next decision inline; if that transaction fails for any reason, the
        outcome alone (a decision bug never loses it). A database that does not answer is
        retried with backoff for ``Timings.outcome_retry_for`` seconds while the lease keeps
        being renewed (the caller holds it until this returns); only then the outcome is given
        up, loudly, with the ``outcome_lost`` counter — the lease then expires and the attempt is
        retried, at least once."""
        deadline = time.monotonic() + self.settings.timings.outcome_retry_for
        delay = 0.1
        while True:
            try:
                try:
                    return self.store.transaction(lambda tx: work(tx, True))
                except Exception as exc:  # noqa: BLE001 - e.g. the decision's write failed
                    if is_transient(exc):
                        raise
                    log.warning("recording the %s of %s/%s with its decision failed; recording "
                                "it alone", what, claim.execution_id, claim.activity_id,
                                exc_info=True)
                    return self.store.transaction(lambda tx: work(tx, False))
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    METRICS.inc("outcome_lost", {"queue": ""})
                    log.error("the %s of %s/%s attempt %s could not be recorded for %.0f s: "
                              "given up; the attempt will be retried when its lease expires",
                              what, claim.execution_id, claim.activity_id, claim.attempt,
                              self.settings.timings.outcome_retry_for, exc_info=True)
                    raise
                log.warning("recording the %s of %s/%s failed (database unavailable?); retrying "
                            "in %.1f s", what, claim.execution_id, claim.activity_id, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _record_completion(self, tx: Tx, claim: Claim, output: Any, *, inline: bool) -> _Decided:
        now = utcnow()
        row = tasks.finish_completed(tx, claim.execution_id, claim.activity_id, claim.attempt, now)
        if row is None or not row.accepts_results:
            return _Decided()  # a duplicate; or a finished run (the task row is closed, no event)
        completion = ev.ActivityCompleted(claim.activity_id, output, claim.attempt)
        return self._record_result(tx, claim, row, completion, now, inline=inline)

    def _record_result(self, tx: Tx, claim: Claim, row: RunRow, result: ev.Event, now: datetime,
                       *, inline: bool) -> _Decided:
        """Append an attempt's final result (the run row is locked): with the next decision in
        the same write when this process should decide, else with a decision request."""
        decided = _Decided()
        if inline and self._decides_inline(row):
            pending = [ev.HistoryEvent(row.next_seq, result, now)]
            known = []
            if claim.started_seq is not None and claim.started_at is not None:
                known = [ev.HistoryEvent(claim.started_seq, ev.ActivityStarted(
                    claim.activity_id, claim.attempt, claim.worker_id), claim.started_at)]
            marks = len(tx.dispatches), len(tx.metrics)
            try:
                if self.before_inline_decision is not None:
                    self.before_inline_decision(row.id)
                return self._decide(tx, row, "inline", pending, known)
            except BaseException as exc:  # noqa: BLE001 - a decision bug never loses a result
                # Nothing of the decision is written until its one statement: what failed here
                # left no row behind, and the messages and counts it staged are dropped, so
                # the result is recorded alone.
                del tx.dispatches[marks[0]:], tx.metrics[marks[1]:]
                log.warning("inline decision of %s failed (%s: %s); the decision task takes over",
                            row.id, type(exc).__name__, exc)
                if not isinstance(exc, Exception):
                    decided.reraise = exc  # a shutdown signal: commit the result, then stop
        tx.append(row, [result], now, decide_on=self.settings.decision_queue)
        return decided

    def _fail_with(self, claim: Claim, exc: BaseException) -> str:
        info = failures.describe(exc)
        return self.fail(claim, info.error_type, info.message, info.traceback)

    def fail(self, claim: Claim, error_type: str, message: str, traceback: str = "") -> str:
        """Record a failed attempt: a retry per policy, or the final failure — decided on inline
        like a completion (falling back to the failure alone, with a decision request)."""

        def work(tx: Tx, inline: bool) -> tuple[str, _Decided]:
            now = utcnow()
            verdict, row, failed = tasks.fail_attempt(tx, claim.execution_id, claim.activity_id,
                                                      claim.attempt, error_type, message, now,
                                                      traceback)
            if row is None or failed is None:
                return verdict, _Decided()
            return verdict, self._record_result(tx, claim, row, failed, now, inline=inline)

        (verdict, decided), tx = self._outcome_transaction(claim, "failure", work)
        self._after_decision(tx, decided)
        return verdict

    def execute(self, claim: Claim, fn: Callable[[Any], Any]) -> BaseException | None:
        """Run a claimed body and record what happened.

        With no ``start_to_close`` the claim's lease is renewed while the body runs and until
        its outcome commits (the process's one heartbeat thread): only a vanished worker lets it
        expire, so a long body is never run again beside itself. With one, the lease is the
        deadline. The body can reach its attempt through ``activity_context()``."""
        renewed = claim.start_to_close is None
        if renewed:
            self.leases.hold(claim)
        try:
            try:
                with activity_context.running(self.store, claim, self.settings.timings.default_lease):
                    output = fn(claim.input)
            except Exception as exc:  # noqa: BLE001 - recorded as the attempt's failure
                self._fail_with(claim, exc)
                return exc
            except BaseException as exc:
                # SystemExit, KeyboardInterrupt, a BaseException of the body's own: the attempt
                # failed (retried per policy, never left running under a renewed lease); the
                # exception then goes on to stop what it was meant to stop — so no eager claim
                self._local.accept = False
                self._fail_with(claim, exc)
                raise
            self.complete(claim, output)
            return None
        finally:
            if renewed:
                self.leases.release(claim)

    # ── the sweeper's pass ───────────────────────────────────────────────────────────────────
    def sweep_once(self) -> None:
        """Fire what is due: retries, expired leases, timers, lost messages, nd-block retries."""
        self.sweeper.sweep_once()
