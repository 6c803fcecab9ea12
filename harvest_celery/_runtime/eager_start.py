"""Eager workflow start (Temporal's Eager Workflow Start is the precedent).

A start in a transaction of its own (``Harvest.start_workflow`` without ``connection=``) takes
the new run's first decision in that same transaction, in the starting process, when that
process has the workflow's code (it registered it) and ``eager_start`` is on: the run's
``WorkflowStarted`` and the events and task rows of its first decision commit together, and the
first activity's message is sent straight to its queue after the commit. Without it, the start
sends a ``harvest.decide`` message and the first activity waits for a decision worker to receive
it, replay, write and send: a broker hop and a transaction more per run.

The decision is the one a decision worker would take: the same replay of the same code, the
same write (``Runtime._decide``, path ``start``). Nothing else changes: the decision request is
written as before and cleared by the decision's write, so a process that dies between the
commit and the send leaves a scheduled task row the sweeper re-sends, as for any decision. A
decision that raises (a bug in harvest or in a workflow's code before its first command) is
logged and the start is made again without it, the ordinary way: a start never fails because
of it. Not taken for a run that waits for admission, for a start on the application's
connection (the application's transaction must not run workflow code), or in embedded mode.

The starting process keeps no replay for the run (it does not consume the decision queue, so
no later decision comes to it): the session is closed after the commit, unless this process is
a worker whose sticky queue the decision recorded.
"""

from __future__ import annotations

import logging

from harvest_celery._runtime import logs
from harvest_celery._runtime.completion import Decided
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._store.records import Dispatch
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")
PATH = "start"  # harvest_decisions_total{path}


class Fallback(Exception):
    """The eager decision failed: the start's transaction is rolled back and made again
    without it."""


def decide(rt: Runtime, tx: Tx, execution_id: str, workflow_type: str) -> Decided | None:
    """The new run's first decision in its start's transaction (None: not taken here)."""
    if not rt.settings.eager_start or workflow_type not in rt.registry.workflows:
        return None
    row = tx.lock(execution_id)
    if row is None or not row.decidable or row.decision_requested_at is None:
        return None  # waiting for admission (no request is written for it)
    try:
        decided = rt._decide(tx, row, PATH)
    except Exception as exc:
        log.warning(
            "the first decision of %s in its start failed (%s: %s); started the ordinary way",
            execution_id,
            type(exc).__name__,
            exc,
            extra=logs.run(execution_id),
        )
        raise Fallback from exc
    # the decision is taken: the request the start wrote needs no message
    tx.dispatches[:] = [
        d for d in tx.dispatches if not (d.kind == Dispatch.DECIDE and d.execution_id == execution_id)
    ]
    return decided


def after_commit(rt: Runtime, tx: Tx, decided: Decided) -> None:
    """What the committed start sends (its first activities), and its replay closed unless this
    process routes the run's next decisions to itself."""
    if decided.session is not None and rt.sticky_queue is None:
        decided.session.close()
        decided.session = None
    rt._after_decision(tx, decided)
