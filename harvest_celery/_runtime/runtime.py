"""The runtime: decision cycles, activity claims and completions.

Glue between the pure engine, the store and a ``Dispatcher`` (Celery, or the in-process one of
embedded mode). Every operation is one transaction; messages and metrics go out only after it
commits. **The next decision rides on the completion**: a worker that records an activity's
completion and has the workflow registered decides with it — in one statement, inline, or
through the decision task, as ``completion`` (the completion paths) chooses. Nothing of a
decision is written, sent or counted until its one write statement (``staging``), so a decision
that raises before it leaves the transaction as it was and the completion is recorded alone
with a decision request; one that fails in the database aborts the transaction, and
``completion.record_outcome`` records the completion alone in a fresh one. A decision bug never
loses a completion or runs a body again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from functools import partial
from typing import Any, Protocol, TypeVar

from harvest_celery._core import events as ev
from harvest_celery._core import failures
from harvest_celery._core.commands import Decision, Failed, StartChildWorkflow
from harvest_celery._core.engine import Activation, Session
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.registry import Registry
from harvest_celery._runtime import activity_context, completion, logs, scheduler, sentry
from harvest_celery._runtime.completion import Decided
from harvest_celery._runtime.leases import LeaseKeeper
from harvest_celery._runtime.messages import Message, encode
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._runtime.sessions import SessionCache
from harvest_celery._runtime.settings import Settings
from harvest_celery._runtime.sweeper import Sweeper
from harvest_celery._store import admission, limits, links, runs, tasks
from harvest_celery._store.records import (
    Claim,
    Dispatch,
    EagerClaim,
    RunRow,
    utcnow,
)
from harvest_celery._store.store import Store
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")
T = TypeVar("T")
# an eager chain goes past ``eager_max_chain`` only while its worker's pool is idle, and never
# past this many times it: the chain's first message stays unacknowledged (acks_late) until
# the chain ends, under the broker's consumer_timeout or visibility_timeout
EAGER_IDLE_FACTOR = 4


class Dispatcher(Protocol):
    def send(self, message: Message) -> None: ...


class Tracer(Protocol):
    """What the runtime asks of tracing (``_runtime.tracing``, imported only when it is on):
    records taken inside a transaction are plain data; spans leave only after its commit."""

    def decision(
        self, execution_id: str, workflow: str, path: str, started_ns: int, row: RunRow | None = None
    ) -> Any: ...

    def after_commit(self, tx: Tx) -> None: ...

    def run_context(self, execution_id: str) -> AbstractContextManager[Any]: ...

    def attempt(self, claim: Claim, started_ns: int, outcome: str, error: BaseException | None) -> None: ...


_HOST = socket.gethostname()  # read once: a system call per attempt showed in a profile


def worker_id() -> str:
    return f"{_HOST}:{os.getpid()}:{threading.get_ident()}"


def _may_have_children(history: Sequence[ev.Event], decision: Decision) -> bool:
    """Can a closing run have open children: one was scheduled in its history or by this
    decision? Else its close reads no history back for their parent-close policies."""
    return any(isinstance(c, StartChildWorkflow) for c in decision.commands) or any(
        isinstance(e, ev.ChildWorkflowScheduled) for e in history
    )


class Runtime:
    def __init__(self, store: Store, registry: Registry, settings: Settings) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.dispatcher: Dispatcher | None = None
        self.sessions = SessionCache(settings.max_sessions)
        self.leases = LeaseKeeper(store, settings.timings.default_lease)
        self.sweeper = Sweeper(
            store, settings, self._after_commit, self.send_message, lambda: sorted(self.registry.workflows)
        )
        self.sweeper.fire_schedules = partial(scheduler.fire_pass, self)
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
        # a test seam: called with the children whose close just committed, before their
        # notices are applied (the kill -9 test dies here; the sweeper must apply them)
        self.before_child_notices: Callable[[Sequence[str]], None] | None = None
        # set by the Celery worker at start: the queues it consumes (eager execution stays off
        # outside a worker) and whether it sends task events
        self.local_queues: frozenset[str] = frozenset()
        self.send_task_events = False
        self.event_source: Any = None  # the worker's consumer, once ready (its event dispatcher)
        self.shutting_down = threading.Event()  # set by the worker on a warm or cold shutdown
        self.sticky_queue: str | None = None  # this process's own decision queue, if routed to
        # set by a ``-P threads`` worker at init: True while a thread of its pool is free and no
        # delivered message waits for one (an eager chain may then go past eager_max_chain)
        self.pool_idle: Callable[[], bool] | None = None
        # .left: eager runs this scope may still take; .more: past that, while the pool is idle;
        # .held: the one taken
        self._local = threading.local()
        # tracing on (Harvest sets it): tracing off costs one ``is None`` check per site
        self.tracer: Tracer | None = None

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
        for name, labels, amount in tx.amounts:
            METRICS.inc(name, labels, amount)
        if self.tracer is not None:
            self.tracer.after_commit(tx)
        if tx.reports:
            sentry.report(tx.reports, self.settings.celery_error_detail)
        self.send(tx.dispatches)
        if tx.closed_children:
            if self.before_child_notices is not None:
                self.before_child_notices(tx.closed_children)
            self.apply_child_notices(tx.closed_children)

    def apply_child_notices(self, child_ids: Sequence[str]) -> None:
        """Right after a child's close commits: its notice, applied in its parent's own
        transaction (a failure is logged: the sweeper applies it later)."""
        with self.store.begin() as tx:
            pending = links.notices_of(tx, child_ids)
        for parent_id, child_id in pending:
            try:
                with self.store.begin() as tx:
                    links.apply_notice(tx, parent_id, child_id, utcnow(), self.settings.decision_queue)
            except Exception:  # noqa: BLE001 - the notice is durable: the sweeper applies it
                log.exception(
                    "the notice of child %s to %s failed; the sweeper retries it",
                    child_id,
                    parent_id,
                    extra=logs.run(parent_id),
                )
                continue
            self._after_commit(tx)

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
                with self.trace_context(dispatch.execution_id):
                    self.send_message(encode(dispatch))

    def trace_context(self, execution_id: str) -> AbstractContextManager[Any]:
        """The run span's context made current (tracing on): a message sent under it carries it,
        so Celery's instrumentation hangs its spans off the run span."""
        if self.tracer is None:
            return nullcontext()
        return self.tracer.run_context(execution_id)

    def observe_decision(
        self,
        tx: Tx,
        execution_id: str,
        workflow: str,
        decision: Decision,
        path: str,
        started_ns: int,
        row: RunRow | None = None,
    ) -> None:
        """A live decision's span and, if it fails the run, its error report: both acted on once
        ``tx`` commits, on every completion path (a replay alone, a probe or a query never gets
        here). ``row``: the run's row, when the decision locked it (its stored trace context)."""
        if self.tracer is not None:
            tx.spans.append(self.tracer.decision(execution_id, workflow, path, started_ns, row))
        failed = decision.outcome
        if isinstance(failed, Failed) and not failed.interrupt and sentry.sdk() is not None:
            report = sentry.WorkflowFailure(
                execution_id, workflow, failed.error_type, failed.message, failed.traceback
            )
            tx.reports.append(report)

    def _accepting(self) -> bool:
        """Is this thread in an eager scope with room for one more activity? Past
        ``eager_max_chain``, only while the worker's pool is idle (``pool_idle``), up to
        ``EAGER_IDLE_FACTOR`` times that."""
        local = self._local
        if getattr(local, "held", None) is not None:
            return False
        if getattr(local, "left", 0) > 0:
            return True
        return getattr(local, "more", 0) > 0 and self.pool_idle is not None and self.pool_idle()

    def _stop_chain(self) -> None:
        self._local.left = self._local.more = 0

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
        a row, so one run cannot keep a slot for ever while other work waits; while the pool is
        idle, up to ``EAGER_IDLE_FACTOR`` times that. Whatever is still held at the end is
        sent."""
        cap = self.settings.eager_max_chain if enabled and self.local_queues else 0
        local = self._local
        local.left, local.more, local.held = cap, cap * (EAGER_IDLE_FACTOR - 1), None

        def take() -> Dispatch | None:
            held, local.held = local.held, None
            if held is not None and local.left > 0:
                local.left -= 1
            elif held is not None:
                local.more -= 1
            return held

        try:
            yield take
        finally:
            held, self._local.held = self._local.held, None
            self._stop_chain()
            if held is not None and held.claimed is not None:
                # claimed for this thread, which stops before running it (a shutdown): its
                # lease expires and the attempt is retried, as if this process had died
                log.warning(
                    "eager attempt %s/%s was claimed but not run; retried when its lease expires",
                    held.execution_id,
                    held.activity_id,
                    extra=logs.run(held.execution_id, held.activity_name, held.activity_id, held.attempt),
                )
            elif held is not None:
                self.send([held])

    def send_message(self, message: Message) -> bool:
        if self.dispatcher is None:
            return False
        try:
            self.dispatcher.send(message)
        except Exception:  # noqa: BLE001 - the sweeper re-sends it
            log.exception(
                "dispatch of %s failed; the sweeper will re-send it",
                message.task_id,
                extra=logs.of_message(message),
            )
            return False
        return True

    # ── decisions ────────────────────────────────────────────────────────────────────────────
    def run_decision(self, execution_id: str) -> None:
        """One decision cycle from the decision task: lock, load, replay, append — one
        transaction."""

        def work(tx: Tx) -> Decided:
            row = tx.take_decision_request(execution_id)
            if row is None:
                return Decided()
            return self._decide(tx, row, "task")

        decided, tx = self.store.transaction(work)
        self._after_decision(tx, decided)

    def _decide(
        self,
        tx: Tx,
        row: RunRow,
        path: str,
        pending: Sequence[ev.HistoryEvent] = (),
        known: Sequence[ev.HistoryEvent] = (),
        advanced: tuple[Session, Decision] | None = None,
    ) -> Decided:
        """Replay and write one decision on a locked, decidable run. ``pending``: events not
        yet written that the decision sees and writes first, in the same statement (the
        completion a worker decides on). ``known``: the last events already written, when the
        caller knows them (the claim's ActivityStarted), so a warm replay need not read them.
        ``advanced``: a warm replay already advanced over ``pending`` and its decision (a
        limited run's close refused by the one-statement path, ``completion.Advanced``)."""
        started_ns = time.time_ns() if self.tracer is not None else 0
        session, decision = self._replay(tx, row, list(pending), list(known), advanced)
        if (
            isinstance(decision.outcome, Failed)
            and decision.outcome.interrupt
            and self.shutting_down.is_set()
        ):
            # a shutdown signal interrupted the workflow code, not the workflow's own doing:
            # nothing is written; the decision is taken again after the restart
            session.close()
            raise SystemExit("worker shutting down in the middle of a decision")
        keeps = session.reusable and self.settings.sticky_sessions
        # the events are stored at the time the replay saw the pending ones at (ctx.now())
        now = pending[-1].recorded_at if pending else utcnow()
        written = tx.apply_decision(
            row,
            session.events,
            decision,
            self.registry,
            now,
            self.settings.timings,
            row.workflow_type,
            leading=[h.event for h in pending],
            sticky=self.sticky_queue if keeps else None,
            eager=self._eager_claim(),
        )
        self._cross_runs(tx, row, decision, session.events, now)
        tx.metrics.append(("decisions", {"workflow": row.workflow_type, "path": path}))
        if not session.replay.sealed:  # a post-cancel decision replays a sealed run: no span
            self.observe_decision(tx, row.id, row.workflow_type, decision, path, started_ns, row)
        if decision.nd is not None:
            log.warning(
                "execution %s is nd-blocked: expected %s, got %s",
                row.id,
                decision.nd["expected"],
                decision.nd["actual"],
                extra=logs.run(row.id),
            )
        return Decided(session, written)

    def _cross_runs(
        self, tx: Tx, row: RunRow, decision: Decision, history: Sequence[ev.Event], now: datetime
    ) -> None:
        """After a decision's write: its children and next link (``links.after_decision``);
        if it closed the run, each open child's parent-close policy."""
        closed = links.after_decision(tx, row, decision, history, now, self.settings.decision_queue)
        if closed is not None and _may_have_children(history, decision):
            runs.close_children(
                tx,
                [h.event for h in tx.history(row.id)],  # with the answers just appended
                f"parent {row.id} closed {closed.status}",
                now,
                self.settings.decision_queue,
            )

    def _replay(
        self,
        tx: Tx,
        row: RunRow,
        pending: list[ev.HistoryEvent],
        known: list[ev.HistoryEvent] | None = None,
        advanced: tuple[Session, Decision] | None = None,
    ) -> tuple[Session, Decision]:
        """A warm execution (this process decided it before) is advanced from its cached
        ``Session`` with only the events appended since (``Session.catch_up``: decisions another
        process took meanwhile included), so the cost stays flat in history length; anything
        unexpected falls back to a full replay. ``advanced``: the
        replay is already advanced over ``pending`` and decided (``_decide``)."""
        if advanced is not None:
            tx.metrics.append(("decision_replays", {"replay": "warm"}))
            return advanced
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
            decision = session.catch_up(new, self.settings.engine)  # decisions taken elsewhere too
            if decision is not None:
                tx.metrics.append(("decision_replays", {"replay": "warm"}))
                return session, decision
            session.close()
        tx.metrics.append(("decision_replays", {"replay": "cold"}))
        history = tx.history(row.id) + pending
        session = Session(
            definition, Activation(row.id, row.workflow_type, history, self.settings.engine), self.registry
        )
        return session, session.decision

    def _after_decision(self, tx: Tx, decided: Decided) -> None:
        self._after_commit(tx)
        if tx.unsettled:
            self._settle_deferred(tx.unsettled)
        session = decided.session
        if session is not None:
            if session.reusable and self.settings.sticky_sessions:
                session.committed(decided.written)  # what its decision wrote, now committed
                self.sessions.put(session.replay.activation.execution_id, session)
            else:
                session.close()
        if decided.reraise is not None:
            raise decided.reraise

    def _settle_deferred(self, keys: set[tuple[str, str]]) -> None:
        """Admissions a one-trip close deferred (a run it would admit has held rows,
        ``admission.close_in_one_trip``): each settled by a transaction of its own, its
        messages sent; one that fails is the sweeper's (its backstop settles every waiting key)."""
        for name, digest in sorted(keys):

            def settle(tx: Tx, n: str = name, d: str = digest) -> None:
                tx.touch_admission(n, d)  # settled before its commit (``Tx.settle_limits``)

            try:
                _, later = self.store.transaction(settle)
            except Exception as exc:  # noqa: BLE001 - the close is committed; the sweeper settles
                log.warning("the admission of %s after a close could not be settled (%s)", name, exc)
                continue
            self._after_commit(later)

    # ── activities ───────────────────────────────────────────────────────────────────────────
    def sync_limits(self) -> None:
        """The decorators' limits into their declared columns (worker start; an override stays).
        A database that cannot be reached now is logged: the first dispatch declares them."""
        try:
            with self.store.begin() as tx:
                limits.sync_declared(tx, self.registry, utcnow())
                admission.sync_declared(tx, self.registry, utcnow())  # workflows' admission limits
        except Exception as exc:  # noqa: BLE001 - the worker starts; the next start syncs again
            log.warning("cannot sync the declared activity limits: %s", exc)

    def claim(self, execution_id: str, activity_id: str, attempt: int) -> Claim | None:
        def work(tx: Tx) -> Claim | None:
            if self.before_claim_append is not None:
                self.before_claim_append(execution_id, activity_id, attempt)
            return tasks.claim(
                tx, execution_id, activity_id, attempt, worker_id(), utcnow(), self.settings.timings
            )

        claim, _tx = self.store.transaction(work, one_statement=True)
        return claim

    def complete(self, claim: Claim, output: Any) -> None:
        """Record a completion, and take the next decision with it when this process should:
        in one statement, inline, or through the decision task (``completion``). If the
        decision fails, the completion is recorded alone with a decision request: a decision
        bug never loses a completion."""
        try:
            output = check_json(output, f"output of activity {claim.activity_name!r}")
        except Exception as exc:  # noqa: BLE001 - a non-JSON result is the activity's failure
            self.fail(claim, type(exc).__name__, str(exc))
            return
        completion.complete(self, claim, output)

    def _fail_with(self, claim: Claim, exc: BaseException) -> str:
        info = failures.describe(exc)
        return self.fail(claim, info.error_type, info.message, info.traceback)

    def fail(self, claim: Claim, error_type: str, message: str, traceback: str = "") -> str:
        """Record a failed attempt: a retry per policy, or the final failure — decided on inline
        like a completion (falling back to the failure alone, with a decision request)."""
        return completion.fail(self, claim, error_type, message, traceback)

    def execute(self, claim: Claim, fn: Callable[[Any], Any]) -> BaseException | None:
        """Run a claimed body and record what happened.

        With no ``start_to_close`` the claim's lease is renewed while the body runs and until
        its outcome commits (the process's one heartbeat thread): only a vanished worker lets it
        expire, so a long body is never run again beside itself. With one, the lease is the
        deadline. The body can reach its attempt through ``activity_context()``."""
        renewed = claim.start_to_close is None
        if renewed:
            self.leases.hold(claim)
        started_ns = time.time_ns() if self.tracer is not None else 0
        try:
            try:
                with activity_context.running(self.store, claim, self.settings.timings.default_lease):
                    output = fn(claim.input)
            except Exception as exc:  # noqa: BLE001 - recorded as the attempt's failure
                self._traced(claim, started_ns, self._fail_with(claim, exc), exc)
                return exc
            except BaseException as exc:
                # SystemExit, KeyboardInterrupt, a BaseException of the body's own: the attempt
                # failed (retried per policy, never left running under a renewed lease); the
                # exception then goes on to stop what it was meant to stop — so no eager claim
                self._stop_chain()
                self._traced(claim, started_ns, self._fail_with(claim, exc), exc)
                raise
            self.complete(claim, output)
            self._traced(claim, started_ns, "completed", None)
            return None
        finally:
            if renewed:
                self.leases.release(claim)

    def _traced(self, claim: Claim, started_ns: int, outcome: str, error: BaseException | None) -> None:
        """The attempt's span, once its outcome has committed (the call before it returned)."""
        if self.tracer is not None:
            self.tracer.attempt(claim, started_ns, outcome, error)

    # ── the sweeper's pass ───────────────────────────────────────────────────────────────────
    def sweep_once(self) -> None:
        """Fire what is due: retries, expired leases, timers, lost messages, nd-block retries."""
        self.sweeper.sweep_once()
