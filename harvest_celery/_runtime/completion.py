"""The completion paths: how an activity's outcome is recorded, and who takes the next decision.

A completion goes one of three ways (``harvest_decisions_total{path}``):

* ``one_statement`` — this process holds the run's warm replay, positioned just before this
  attempt's ``ActivityStarted``: the completion and the next decision are taken without reading
  anything and written in ONE guarded autocommit statement (``Tx.apply_guarded_decision``: it
  writes only while the run is as that replay assumes, ``predicates.fast_path``);
* ``inline`` — the ordinary transaction: the run row locked, the task row closed, the next
  decision taken and written in the same transaction;
* ``task`` — the outcome recorded alone with a decision request; the decision task decides.

``choose`` picks the path before anything is written, ``inline_or_task`` once the run row is
locked; each returns the path with the reason it left the faster one (a closed enum,
``FALLBACK_REASONS``, counted by ``harvest_decision_fallbacks_total{reason}``). A completion
counts at most one reason: the first point where it left the one-statement path. No exception
drives the choice: an unexpected error in the one-statement attempt is logged at WARNING with
its type (its traceback at DEBUG), counted as ``error``, and the ordinary path records the
completion. At-least-once holds on every path: ``record_outcome``'s fallback (the outcome
alone) and retry window; a shutdown signal in the middle of an attempt still records the
completion, then goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from harvest_celery._core import events as ev
from harvest_celery._core.commands import ContinuedAsNew, Decision, Failed, StartChildWorkflow
from harvest_celery._core.engine import Session
from harvest_celery._core.registry import Registry
from harvest_celery._payloads.stores import listable
from harvest_celery._runtime import cold, logs
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._runtime.sessions import SessionCache
from harvest_celery._store import handoff, tasks
from harvest_celery._store.predicates import RUN, fast_path
from harvest_celery._store.records import Claim, CompletionGuard, EagerClaim, RunRow, utcnow
from harvest_celery._store.store import Store, is_transient
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")
T = TypeVar("T")

ONE_STATEMENT, INLINE, TASK = "one_statement", "inline", "task"
PATHS = (ONE_STATEMENT, INLINE, TASK)
# Why a completion left the one-statement path (or an inline decision went to the decision
# task). Closed: a new way to fall back adds its value here, and to docs/operations.md.
FALLBACK_REASONS = (
    "not_warm",  # this process holds no warm replay of the run
    "not_positioned",  # the warm replay is not just before this attempt's ActivityStarted
    "parallel_open",  # other attempts of the run are open (their claims would fail the guard)
    "advance_refused",  # the warm replay could not take the completion (a full replay must)
    "nd",  # the decision diverged from history: the nd-block is the ordinary path's
    "interrupted",  # a shutdown interrupted the workflow code or the attempt
    "offload",  # the payload store offloads and cannot list its blobs (no ListablePayloadStore)
    "guard",  # the run or the task row moved on between the claim and the completion
    "error",  # an unexpected error (logged at WARNING); the ordinary path recorded it
    "cold_history",  # the run is cold here and its history long (or held by another process)
    "closing_with_work",  # the decision closes the run while scheduling work
    "unsupported_shape",  # the write has no plain-SQL guarded form
    "limited",  # a rate-limited step completes, or another limit's step is dispatched: the lock order
    "decision_pending",  # a decision is already requested: the decision task takes it
    "not_decidable",  # the run takes no decision now (paused, sealed, finished)
    "not_registered",  # the workflow is not registered in this process
    "child",  # it starts a child, continues as new, or closes a run that is a child or has open children
    "admission",  # it closes a limited workflow's run and the driver cannot send its settle in the same trip
)


@dataclass(frozen=True)
class Choice:
    """A path, and why the faster one was left (None: it was not, or was never allowed)."""

    path: str
    reason: str | None = None
    detail: str = ""  # free text, for the DEBUG log line only


class Advanced:
    """A warm replay advanced over a completion whose one-statement write was refused because
    the decision closes a limited workflow's run (``admission``): its decision, taken at
    ``now``, written by the ordinary transaction when the locked run is still as the replay
    assumed, so the close is never replayed a second time, cold."""

    def __init__(self, session: Session, decision: Decision, now: datetime) -> None:
        self.session: Session | None = session
        self.decision = decision
        self.now = now

    def fits(self, rt: Runtime, claim: Claim, row: RunRow) -> bool:
        """The locked run is as the one-statement guard would have required (its run terms):
        nothing appended since the attempt's ``ActivityStarted``, no pending decision, no
        cancel, pause, nd-block or erasure, the same sticky queue."""
        assert claim.started_seq is not None
        params = {"next_seq": claim.started_seq + 1, "sticky_queue": rt.sticky_queue}
        return self.session is not None and all(t.holds(row, params) for t in fast_path.of(RUN))

    def take(self) -> tuple[Session, Decision]:
        assert self.session is not None
        session, self.session = self.session, None
        return session, self.decision

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


class Decided:
    """What a decision taken inside a transaction leaves for after its commit."""

    def __init__(self, session: Session | None = None, written: list[ev.HistoryEvent] | None = None) -> None:
        self.session = session
        self.written = written or []
        self.reraise: BaseException | None = None


class Runtime(Protocol):
    """What the completion paths use of ``runtime.Runtime`` (which calls them)."""

    store: Store
    registry: Registry
    settings: Any  # runtime.Settings
    sessions: SessionCache
    sticky_queue: str | None
    before_inline_decision: Callable[[str], None] | None
    tracer: Any  # runtime.Tracer, or None (tracing off)

    def _decide(
        self,
        tx: Tx,
        row: RunRow,
        path: str,
        pending: Sequence[ev.HistoryEvent] = (),
        known: Sequence[ev.HistoryEvent] = (),
        advanced: tuple[Session, Decision] | None = None,
    ) -> Decided: ...

    def _after_decision(self, tx: Tx, decided: Decided) -> None: ...

    def _eager_claim(self) -> EagerClaim | None: ...

    def observe_decision(
        self, tx: Tx, execution_id: str, workflow: str, decision: Decision, path: str, started_ns: int
    ) -> None: ...


def _open_activities(session: Session) -> int:
    return sum(1 for future in session.replay.activity_futures.values() if not future.done())


def one_statement_allowed(rt: Runtime) -> bool:
    """Configuration and dialect allow the one-statement path (``fast_paths``, Postgres)."""
    s = rt.settings
    return s.inline_decisions and s.sticky_sessions and rt.store.dialect.completes_in_one_statement()


def choose(rt: Runtime, claim: Claim) -> tuple[Choice, Session | None]:
    """Before anything is written: the one-statement path (with the warm replay it advances,
    taken from this process's cache), or the ordinary one and why (the replay left cached)."""
    payloads = rt.store.payloads
    if not one_statement_allowed(rt):
        return Choice(INLINE if rt.settings.inline_decisions else TASK), None
    if payloads.offload_threshold is not None and not listable(payloads.store):
        return Choice(INLINE, "offload", "the payload store cannot list its blobs"), None
    if rt.registry.activity(claim.activity_name).limits.rate_limit is not None:
        return Choice(INLINE, "limited"), None  # its token is settled in the lock order (``_store.limits``)
    session = rt.sessions.take(claim.execution_id)
    if session is None:
        return Choice(INLINE, "not_warm"), None
    open_count = _open_activities(session)
    detail = f"replay at {len(session.events)}, ActivityStarted at {claim.started_seq}"
    if (
        claim.started_seq is not None
        and claim.started_at is not None
        and len(session.events) < claim.started_seq
    ):
        return Choice(INLINE, "not_positioned", detail), session  # behind: ``complete`` catches it up
    if claim.started_seq is None or claim.started_at is None or len(session.events) != claim.started_seq:
        choice = Choice(INLINE, "not_positioned", detail)
    elif open_count != 1:
        # other attempts may append meanwhile: their claims would fail the guard
        choice = Choice(INLINE, "parallel_open", f"{open_count} open")
    else:
        return Choice(ONE_STATEMENT), session
    rt.sessions.restore(claim.execution_id, session)  # kept warm for the ordinary path
    return choice, None


def _judged(decision: Decision | None, events: Sequence[ev.Event] = ()) -> Choice:
    """The warm replay's decision on the completion: the one-statement path's, or not."""
    if decision is None:
        return Choice(INLINE, "advance_refused")
    if decision.nd is not None:
        return Choice(INLINE, "nd")
    if crosses_runs(decision, events):
        return Choice(INLINE, "child")  # the guarded statement covers one run
    if isinstance(decision.outcome, Failed) and decision.outcome.interrupt:
        return Choice(INLINE, "interrupted")  # the ordinary path's to judge (a shutdown?)
    return Choice(ONE_STATEMENT)


def crosses_runs(decision: Decision, events: Sequence[ev.Event]) -> bool:
    """Does this decision write another run: start a child, continue as new, or close a run
    that is a child (its notice) or has open children (their policy)?"""
    if any(isinstance(c, StartChildWorkflow) for c in decision.commands):
        return True
    if decision.outcome is None:
        return False
    if isinstance(decision.outcome, ContinuedAsNew):
        return True
    first = events[0] if events else None
    return (isinstance(first, ev.WorkflowStarted) and first.parent_id is not None) or any(
        isinstance(e, ev.ChildWorkflowScheduled) for e in events
    )


def inline_or_task(rt: Runtime, row: RunRow) -> Choice:
    """Once the run row is locked: decide in this transaction, or hand the decision to the
    decision task. Inline when this process can (registered here, decidable, no decision
    pending) and it is cheap — its replay is warm here, or the history is short enough to
    replay cold. A replay this process kept is stale when the run names another process as the
    holder of its warm replay: then a long run's decision goes to that process."""
    s = rt.settings
    if not s.inline_decisions:
        return Choice(TASK)
    if not row.decidable:
        return Choice(TASK, "not_decidable")
    if row.decision_requested_at is not None:
        return Choice(TASK, "decision_pending")
    if not rt.registry.has_workflow(row.workflow_type):
        return Choice(TASK, "not_registered")
    held_elsewhere = row.sticky_queue is not None and row.sticky_queue != rt.sticky_queue
    if held_elsewhere:
        stale = rt.sessions.take(row.id)
        if stale is not None:
            stale.close()
    if (row.id in rt.sessions and not held_elsewhere) or row.next_seq <= s.inline_cold_max_events:
        return Choice(INLINE)
    return Choice(TASK, "cold_history", "held elsewhere" if held_elsewhere else f"{row.next_seq} events")


def _fell_back(tx: Tx, claim: Claim | None, choice: Choice) -> None:
    """Stage the count of a fallback (counted once ``tx`` commits) and say why at DEBUG."""
    if choice.reason is None:
        return
    assert choice.reason in FALLBACK_REASONS, choice.reason
    tx.metrics.append(("decision_fallbacks", {"reason": choice.reason}))
    if claim is not None:
        log.debug(
            "completion of %s/%s attempt %s: %s path (%s%s)",
            claim.execution_id,
            claim.activity_id,
            claim.attempt,
            choice.path,
            choice.reason,
            f": {choice.detail}" if choice.detail else "",
            extra=logs.of_claim(claim),
        )


# ── the paths ───────────────────────────────────────────────────────────────────────────────
def complete(rt: Runtime, claim: Claim, output: Any) -> None:
    """Record a completion: in one statement when ``choose`` says so, else the ordinary way
    (``record_completion``: inline, or with a decision request)."""
    choice, session = choose(rt, claim)
    assumed, advanced = rt.sticky_queue, None
    behind = session if choice.reason == "not_positioned" else None  # a replay here left behind
    if choice.reason == "not_warm" or behind is not None:
        session = None
        if cold.eligible(rt, claim, behind):
            try:
                # caught up over the tail, or cold from the start: still one statement to write
                session, assumed, reason = cold.prepare(rt, claim, behind)
            except BaseException:
                _interrupted(rt, claim, output)  # a shutdown signal during the read
                raise
            choice = Choice(INLINE, reason) if session is None else choice
        elif behind is not None:
            rt.sessions.restore(claim.execution_id, behind)  # the ordinary path catches it up
            behind = None
    if session is not None:
        warm = choice.reason is None or (behind is not None and session is behind)
        choice, advanced = _one_statement(rt, claim, output, session, assumed, warm)
        if choice.path == ONE_STATEMENT:
            return
    try:
        decided, tx = record_outcome(
            rt,
            claim,
            "completion",
            lambda tx, inline: record_completion(
                rt, tx, claim, output, inline=inline, fallback=choice, advanced=advanced
            ),
        )
    finally:
        if advanced is not None:
            advanced.close()  # not taken (the run moved on, or the first try failed)
    rt._after_decision(tx, decided)


def _one_statement(
    rt: Runtime, claim: Claim, output: Any, session: Session, assumed: str | None, warm: bool = True
) -> tuple[Choice, Advanced | None]:
    """The one-statement attempt (``choose`` allowed it, or ``cold.prepare`` built ``session``:
    ``warm`` False): ``Choice(ONE_STATEMENT)`` when it wrote, else the reason nothing was
    written: the session is closed then (the ordinary path replays cold), unless the reason is
    ``admission``: the decision is handed on (``Advanced``). ``assumed``: the run's sticky queue."""
    assert claim.started_seq is not None and claim.started_at is not None
    seq, now = claim.started_seq, utcnow()
    started_ns = time.time_ns() if rt.tracer is not None else 0
    started = ev.ActivityStarted(claim.activity_id, claim.attempt, claim.worker_id)
    completion = ev.ActivityCompleted(claim.activity_id, output, claim.attempt)
    try:
        if rt.before_inline_decision is not None:  # a test seam: a change lands now
            rt.before_inline_decision(claim.execution_id)
        decision = session.advance(
            [ev.HistoryEvent(seq, started, claim.started_at), ev.HistoryEvent(seq + 1, completion, now)],
            rt.settings.engine,
        )
        judged = _judged(decision, session.events)
        if decision is None or judged.path != ONE_STATEMENT:
            session.close()
            return judged, None
        if decision.outcome is not None and _limited(rt, session) and not _closes_in_one_trip(rt):
            # its close frees a slot in the lock order: the ordinary transaction writes this
            # decision (``Tx.apply_guarded_decision`` would refuse it, reason ``admission``)
            return Choice(INLINE, "admission"), Advanced(session, decision, now)
        (written, refusal), tx = rt.store.transaction(
            lambda tx: _write_one_statement(rt, tx, claim, session, decision, completion, now, assumed),
            one_statement=True,
        )
    except Exception as exc:  # noqa: BLE001 - not a way to choose: logged, counted, recorded
        session.close()
        log.warning(
            "the one-statement completion of %s/%s attempt %s failed (%s); it is recorded the ordinary way",
            claim.execution_id,
            claim.activity_id,
            claim.attempt,
            type(exc).__name__,
            extra=logs.of_claim(claim),
        )
        log.debug("the one-statement completion failed", exc_info=True)
        return Choice(INLINE, "error", f"{type(exc).__name__}: {exc}"), None
    except BaseException:
        session.close()
        _interrupted(rt, claim, output)
        raise
    if written is None:
        session.close()
        return Choice(INLINE, refusal), None
    _written(rt, tx, claim, session, decision, written, started_ns, "warm" if warm else "cold")
    return Choice(ONE_STATEMENT), None


def _interrupted(rt: Runtime, claim: Claim, output: Any) -> None:
    """A shutdown signal in the middle of an attempt: record the completion alone (the caller
    then re-raises it)."""
    decided, tx = record_outcome(
        rt,
        claim,
        "completion",
        lambda tx, _i: record_completion(
            rt, tx, claim, output, inline=False, fallback=Choice(TASK, "interrupted")
        ),
    )
    rt._after_decision(tx, decided)


def _written(
    rt: Runtime,
    tx: Tx,
    claim: Claim,
    session: Session,
    decision: Decision,
    written: list[ev.HistoryEvent],
    started_ns: int,
    replay: str,
) -> None:
    """A one-statement write committed: its counts, its span, its messages."""
    workflow = session.replay.activation.workflow_type
    tx.metrics.append(("decisions", {"workflow": workflow, "path": ONE_STATEMENT}))
    tx.metrics.append(("decision_replays", {"replay": replay}))  # warm, or cold (``cold.prepare``)
    tx.metrics.append(("activity_completed", {"workflow": workflow, "queue": claim.queue}))
    if not session.replay.sealed:  # its span, and its Sentry report if it fails the run
        rt.observe_decision(tx, claim.execution_id, workflow, decision, ONE_STATEMENT, started_ns)
    rt._after_decision(tx, Decided(session, written))


def _limited(rt: Runtime, session: Session) -> bool:
    """Is the run's workflow under workflow admission (its close frees a slot)?"""
    definition = rt.registry.workflows.get(session.replay.activation.workflow_type)
    return definition is not None and definition.admission.limited


def _closes_in_one_trip(rt: Runtime) -> bool:
    """Can a limited run's close and its admission's settle commit in one trip (psycopg2:
    ``admission.close_in_one_trip``)? Else its close is the ordinary transaction's."""
    return rt.store.dialect.trip_commits_together(rt.store.engine.dialect.driver)


def _write_one_statement(
    rt: Runtime,
    tx: Tx,
    claim: Claim,
    session: Session,
    decision: Decision,
    completion: ev.Event,
    now: datetime,
    assumed: str | None,
) -> tuple[list[ev.HistoryEvent] | None, str]:
    assert claim.started_seq is not None
    workflow_type = session.replay.activation.workflow_type
    row = RunRow.assumed(claim.execution_id, workflow_type, claim.started_seq + 1, assumed)
    return tx.apply_guarded_decision(
        row,
        session.events,
        decision,
        rt.registry,
        now,
        rt.settings.timings,
        workflow_type,
        CompletionGuard(
            claim.activity_id, claim.attempt, handoff.slot(rt.registry, claim.activity_name, claim.input)
        ),
        leading=[completion],
        eager=rt._eager_claim(),
        sticky=rt.sticky_queue if session.reusable else None,
    )


def record_outcome(rt: Runtime, claim: Claim, what: str, work: Callable[[Tx, bool], T]) -> tuple[T, Tx]:
    """Record a body's outcome — it ran, its side effect happened: this must not be lost.

    First with the next decision inline; if that transaction fails for any reason, the
    outcome alone (a decision bug never loses it). A database that does not answer is
    retried with backoff for ``Timings.outcome_retry_for`` seconds while the lease keeps
    being renewed (the caller holds it until this returns); only then the outcome is given
    up, loudly, with the ``outcome_lost`` counter — the lease then expires and the attempt is
    retried, at least once."""
    deadline = time.monotonic() + rt.settings.timings.outcome_retry_for
    delay = 0.1
    while True:
        try:
            try:
                return rt.store.transaction(lambda tx: work(tx, True))
            except Exception as exc:  # noqa: BLE001 - e.g. the decision's write failed
                if is_transient(exc):
                    raise
                log.warning(
                    "recording the %s of %s/%s with its decision failed; recording it alone",
                    what,
                    claim.execution_id,
                    claim.activity_id,
                    exc_info=True,
                    extra=logs.of_claim(claim),
                )
                return rt.store.transaction(lambda tx: work(tx, False))
        except Exception as exc:
            if not is_transient(exc):
                raise
            if time.monotonic() + delay > deadline:
                METRICS.inc("outcome_lost", {"queue": claim.queue})
                log.error(
                    "the %s of %s/%s attempt %s could not be recorded for %.0f s: "
                    "given up; the attempt will be retried when its lease expires",
                    what,
                    claim.execution_id,
                    claim.activity_id,
                    claim.attempt,
                    rt.settings.timings.outcome_retry_for,
                    exc_info=True,
                    extra=logs.of_claim(claim),
                )
                raise
            log.warning(
                "recording the %s of %s/%s failed (database unavailable?); retrying in %.1f s",
                what,
                claim.execution_id,
                claim.activity_id,
                delay,
                extra=logs.of_claim(claim),
            )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def record_completion(
    rt: Runtime,
    tx: Tx,
    claim: Claim,
    output: Any,
    *,
    inline: bool,
    fallback: Choice = Choice(INLINE),
    advanced: Advanced | None = None,
) -> Decided:
    """The ordinary path of a completion. ``fallback``: how it left the one-statement path;
    ``advanced``: the decision its warm replay took there, at its time (``Advanced``)."""
    now = advanced.now if advanced is not None and advanced.session is not None else utcnow()
    row = tasks.finish_completed(tx, claim.execution_id, claim.activity_id, claim.attempt, now)
    if row is None or not row.accepts_results:
        _fell_back(tx, claim, fallback)
        return Decided()  # a duplicate; or a finished run (the task row is closed, no event)
    completion = ev.ActivityCompleted(claim.activity_id, output, claim.attempt)
    tx.metrics.append(("activity_completed", {"workflow": row.workflow_type, "queue": claim.queue}))
    return record_result(
        rt, tx, claim, row, completion, now, inline=inline, fallback=fallback, advanced=advanced
    )


def record_result(
    rt: Runtime,
    tx: Tx,
    claim: Claim,
    row: RunRow,
    result: ev.Event,
    now: datetime,
    *,
    inline: bool,
    fallback: Choice = Choice(INLINE),
    advanced: Advanced | None = None,
) -> Decided:
    """Append an attempt's final result (the run row is locked): with the next decision in the
    same write when this process should decide (``inline_or_task``), else with a decision
    request. ``inline`` False: the first try with a decision failed; the result goes alone.
    ``advanced``: a decision already taken on this result by a warm replay, written as it is
    when the run is still as that replay assumed (``Advanced.fits``)."""
    decided = Decided()
    taken = advanced.take() if inline and advanced is not None and advanced.fits(rt, claim, row) else None
    choice = Choice(INLINE) if taken is not None else _ordinary(rt, row, inline)
    first = fallback if fallback.reason is not None else choice
    if choice.path == INLINE:
        pending = [ev.HistoryEvent(row.next_seq, result, now)]
        known = []
        if claim.started_seq is not None and claim.started_at is not None:
            known = [
                ev.HistoryEvent(
                    claim.started_seq,
                    ev.ActivityStarted(claim.activity_id, claim.attempt, claim.worker_id),
                    claim.started_at,
                )
            ]
        try:
            if rt.before_inline_decision is not None:
                rt.before_inline_decision(row.id)
            decided = rt._decide(tx, row, INLINE, pending, known, taken)
            _fell_back(tx, claim, first)
            return decided
        except BaseException as exc:  # noqa: BLE001 - a decision bug never loses a result
            # Nothing of the decision is handed to the transaction until its one statement has
            # written: what failed here left no row, message or count behind.
            log.warning(
                "inline decision of %s failed (%s: %s); the decision task takes over",
                row.id,
                type(exc).__name__,
                exc,
                extra=logs.run(row.id),
            )
            if first.reason is None:
                first = Choice(TASK, "error" if isinstance(exc, Exception) else "interrupted")
            if not isinstance(exc, Exception):
                decided.reraise = exc  # a shutdown signal: commit the result, then stop
    _fell_back(tx, claim, first)
    tx.append(row, [result], now, decide_on=rt.settings.decision_queue)
    return decided


def _ordinary(rt: Runtime, row: RunRow, inline: bool) -> Choice:
    """Inline or the decision task (``inline`` False: the try with a decision failed)."""
    if inline:
        return inline_or_task(rt, row)
    return Choice(TASK, "error" if rt.settings.inline_decisions else None)


def fail(rt: Runtime, claim: Claim, error_type: str, message: str, traceback: str = "") -> str:
    """Record a failed attempt: a retry per policy, or the final failure — decided on inline
    like a completion (falling back to the failure alone, with a decision request)."""

    def work(tx: Tx, inline: bool) -> tuple[str, Decided]:
        now = utcnow()
        verdict, row, failed = tasks.fail_attempt(
            tx, claim.execution_id, claim.activity_id, claim.attempt, error_type, message, now, traceback
        )
        if row is None or failed is None:
            return verdict, Decided()
        return verdict, record_result(rt, tx, claim, row, failed, now, inline=inline)

    (verdict, decided), tx = record_outcome(rt, claim, "failure", work)
    rt._after_decision(tx, decided)
    return verdict
