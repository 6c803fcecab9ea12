"""Reads of runs: describe, stuck, history, attempt errors, list, queries, and waiting for a
result."""

from __future__ import annotations

import dataclasses
import time
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from harvest_celery._client_base import ClientBase
from harvest_celery._core import events as ev
from harvest_celery._core.admission import admission_hint
from harvest_celery._core.engine import Activation
from harvest_celery._core.lifecycle import (
    CANCELLED,
    COMPLETED,
    CONTINUED_AS_NEW,
    RUNNING,
    TERMINAL_STATUSES,
    TIMED_OUT,
)
from harvest_celery._core.names import CANCELLED_ERROR, TaskStatus
from harvest_celery._core.queries import answer, query_arg
from harvest_celery._errors import InvalidState, WorkflowCancelledError, WorkflowFailed, WorkflowTimedOut
from harvest_celery._runtime.consumers import waiting_hints
from harvest_celery._store.records import AttemptError, CancelBranch, Execution, RunOutcome, utcnow

_OPEN = (TaskStatus.SCHEDULED.value, TaskStatus.WAITING.value)


class Reads(ClientBase):
    """``Harvest``'s reads: none of them writes."""

    def describe(self, execution_id: str) -> Execution:
        """The run: its status, payloads, timings and links (``parent_id``, ``children``,
        ``continued_from``, ``continued_to``); a run waiting for admission (display status
        WAITING) carries its place in ``admission`` ("3rd of 7 waiting; 1/1 in use")."""
        found = self.store.get(execution_id)
        place = self.store.admission(execution_id)[0] if found.waiting else None
        return dataclasses.replace(found, children=self.store.children(execution_id), admission=place)

    def stuck(self, execution_id: str) -> list[dict[str, Any]] | None:
        """What a RUNNING run waits on that no live worker will take: each activity a limit
        holds back (``{"kind": "slot", "activity", "queue", "waiting_seconds", "in_use",
        "concurrency"}``, from Postgres alone), or, for a run waiting for admission, one hint
        ``{"kind": "admission", "workflow", "position", "waiting_runs", "in_use",
        "concurrency", "holders": [{"execution_id", "state"}], "text"}`` (from Postgres alone:
        each slot holder and why it is not moving, e.g. paused), each open activity on a queue no live worker
        consumes (``{"kind": "activity", "activity", "queue", "waiting_seconds"}``), and a
        pending decision request when none consumes the decision queue (``{"kind": "decision",
        "queue", "waiting_seconds"}``). ``[]``: nothing is (or the run is not running); None:
        cannot tell (embedded mode, or the workers could not be asked) and no slot is awaited.

        Asks the workers (a broadcast that waits ~1 s) at most every ~15 s per ``Harvest``, and
        only when the run has open work; never raises for that. Not part of ``describe``."""
        consumers = self._consumers
        status, requested_at, updated_at = self.store.decision_request(execution_id)
        if status != RUNNING:
            return [] if consumers is not None else None
        place, holders = self.store.admission(execution_id)
        if place is not None:  # waiting for admission: Postgres alone says why (no worker asked)
            since = self.store.get(execution_id).created_at
            return [admission_hint(place, holders, max(0.0, (utcnow() - since).total_seconds()))]
        rows = [r for r in self.store.activity_rows(execution_id) if r["status"] in _OPEN]
        held = [r for r in rows if r["status"] == TaskStatus.WAITING.value]
        slots = self.store.limit_usage({(r["activity_name"], r["limit_digest"] or "") for r in held})
        if consumers is not None and len(held) == len(rows) and requested_at is None:
            return waiting_hints(held, (), utcnow(), slots=slots)  # no worker needs asking
        consumed = consumers.queues() if consumers is not None else None
        if consumed is None:
            # the workers cannot be asked: what Postgres alone tells (a slot), or "cannot tell"
            return waiting_hints(held, (), utcnow(), slots=slots) or None
        first_attempts = [r["event_seq"] for r in rows if r["queue"] not in consumed and r["attempt"] <= 1]
        scheduled_at = {}
        if first_attempts:  # when each was scheduled: its ActivityScheduled's time
            with self.store.begin() as tx:
                scheduled_at = {seq: at for seq, _, at in tx.raw_history(execution_id, min(first_attempts))}
        decision = (
            None
            if requested_at is None
            else (self.runtime.settings.decision_queue, min(requested_at, updated_at))
        )
        return waiting_hints(
            rows, consumed, utcnow(), scheduled_at=scheduled_at, decision=decision, slots=slots
        )

    def history(self, execution_id: str, *, strict: bool = True) -> list[ev.HistoryEvent]:
        """The run's events, decoded. ``strict=False`` (read-only views) leaves a payload that
        cannot be decoded raw instead of raising."""
        self.store.get(execution_id)
        return self.store.history(execution_id, strict=strict)

    def attempt_errors(self, execution_id: str) -> list[AttemptError]:
        """Every failed attempt's error with its traceback, oldest first (activity "" and
        attempt 0: the workflow's own failure). Raises ``ExecutionNotFound``."""
        self.store.status(execution_id)
        return self.store.attempt_errors(execution_id)

    def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        nd_blocked: bool | None = None,
        limit: int = 100,
        offset: int = 0,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> list[Execution]:
        """Runs, newest first, without their payloads (``input`` and ``result`` are None);
        ``created_after``/``created_before`` bound the creation time (inclusive/exclusive)."""
        return self.store.list(
            status=status,
            workflow_type=workflow,
            nd_blocked=nd_blocked,
            limit=limit,
            offset=offset,
            created_after=created_after,
            created_before=created_before,
        )

    def query(self, execution_id: str, name: str, arg: Any = None) -> Any:
        """Ask the run: return ``handler(arg)`` of the query handler it registered as ``name``
        (``ctx.set_query_handler``). Answered here, by this process (which must register the
        run's workflow), from the stored history read in a read-only transaction and replayed
        for this call only: nothing is written and no warm replay is touched. Live, paused and
        closed runs answer; an id of a continue-as-new chain is answered by its current run, as
        a signal is routed (docs/concepts.md, "Queries").

        Raises ``PayloadNotSerializable`` (``arg`` is not JSON, before anything is read),
        ``ExecutionNotFound``, ``InvalidState`` (the run's payloads were erased),
        ``UnknownWorkflow`` (not registered here), ``UnknownQuery`` (listing the names the run
        registered) and ``QueryFailed`` (the handler raised or issued a ``ctx`` command, or the
        replay diverged)."""
        payload = query_arg(name, arg)
        run = self.store.snapshot(execution_id)
        if run.erased_at is not None:
            raise InvalidState(execution_id, "erased", "query")
        definition = self.registry.workflow(run.workflow_type)
        config = self.runtime.settings.engine
        activation = Activation(run.id, run.workflow_type, run.history, config, probe=True)
        return answer(definition, activation, self.registry, name, payload)

    def result(self, execution_id: str, timeout: float | None = 30.0, poll: float = 1.0) -> Any:
        """Wait for the run to finish; return its result or raise ``WorkflowFailed`` /
        ``WorkflowCancelledError`` / ``WorkflowTimedOut`` (a deadline expired and the run did
        not complete anyway) (``TimeoutError`` after ``timeout`` seconds).

        A cancelled (sealed) run is waited on until its cancel branch has settled — no decision
        pending and no body running — and ``WorkflowCancelledError`` carries what the branch did
        (``outcome``: returned, cancelled, failed or stopped); on timeout the same error with
        ``outcome="pending"``, never a bare ``TimeoutError``, because the run *is* cancelled.

        Waits on Postgres ``LISTEN``/``NOTIFY`` (one listening connection per process, shared
        by every waiter), re-reading the run's status every ``poll`` seconds as a fallback. In
        embedded mode (SQLite) it drains the in-process queue and polls."""
        deadline = None if timeout is None else time.monotonic() + timeout
        current: str | None = execution_id
        while current is not None:  # along a continue-as-new chain, link by link
            current, answer = self._wait_one(current, deadline, timeout, poll)
        return answer

    def _wait_one(
        self, execution_id: str, deadline: float | None, timeout: float | None, poll: float
    ) -> tuple[str | None, Any]:
        """Wait for one run: (None, its outcome), or (the next link, None) for a run that
        continued as new."""
        listener = self.store.listener if self._inline is None else None
        with listener.watch(execution_id) if listener else nullcontext() as woken:
            while True:
                if self._inline is not None:
                    self.drain()
                seen = self.store.outcome(execution_id)  # one read: status, seal, outcome
                status, branch = seen.status, None
                following = self.store.continued_to(execution_id) if status == CONTINUED_AS_NEW else None
                if following is not None:  # a chain: its result is its last run's
                    return following, None
                if status in TERMINAL_STATUSES:
                    if seen.cancelled_at is None:  # closed, never sealed: answered from that read
                        return None, self._outcome(seen)
                    branch = self.store.cancel_branch(execution_id)
                    if branch is None:  # unreachable (a seal is never undone); read as closed
                        return None, self._outcome(seen)
                    if branch.settled:
                        raise self._cancelled_error(execution_id, branch, status)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if branch is not None:
                        raise self._cancelled_error(execution_id, branch, status)  # outcome "pending"
                    raise TimeoutError(f"execution {execution_id} still {status} after {timeout}s")
                wait = poll if left is None else min(poll, left)
                if woken is not None:
                    woken.wait(wait)
                    woken.clear()
                else:
                    time.sleep(min(wait, 0.05))
                    self.runtime.sweep_once()

    def _cancelled_error(
        self, execution_id: str, branch: CancelBranch, status: str
    ) -> WorkflowCancelledError | WorkflowTimedOut:
        """A sealed run's error once its branch settled (or "pending"): a timeout's seal gives
        ``WorkflowTimedOut``."""
        value = self.store.get(execution_id).result if branch.outcome == "returned" else None
        if status == TIMED_OUT:
            return self._timed_out(execution_id, branch.outcome, branch.error, value)
        return WorkflowCancelledError(execution_id, branch.reason, branch.error, branch.outcome, value)

    def _timed_out(self, execution_id: str, outcome: str, error: str | None, value: Any) -> WorkflowTimedOut:
        request = self.store.timeout_request(execution_id)
        timeout, reason = (request.timeout, request.reason) if request is not None else ("execution", "")
        return WorkflowTimedOut(execution_id, timeout, reason, outcome, error, value)

    def _outcome(self, row: RunOutcome) -> Any:
        if row.status == TIMED_OUT:  # its branch raised after the timeout request
            error = row.error or {}
            failed = error.get("type") != CANCELLED_ERROR
            text = f"{error.get('type', 'Error')}: {error.get('message', '')}" if failed else None
            raise self._timed_out(row.id, "failed" if failed else "cancelled", text, None)
        return _outcome(row)


def _outcome(row: RunOutcome) -> Any:
    if row.status == COMPLETED:
        return row.result
    error = row.error or {}
    recorded = f"{error['type']}: {error.get('message', '')}" if error else None
    if row.status == CANCELLED:
        # a cooperative cancel the workflow honoured by raising Cancelled (a sealed run is read
        # through its cancel branch: Store.cancel_branch)
        raise WorkflowCancelledError(row.id, row.cancel_reason or "", recorded, "cancelled")
    raise WorkflowFailed(row.id, error.get("type", "Error"), error.get("message", ""))
