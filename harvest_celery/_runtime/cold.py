"""The cold one-statement completion: a completion whose run this process holds no warm replay
of (``not_warm``) — the split decision/activity topology's first completion of every run, a
limited slot handed to another run's waiting row — still takes the one-statement path when
the run's history is short (``Settings.inline_cold_max_events``). So does one whose replay
here was left behind by decisions another process took since (``not_positioned``): it reads
only the tail and catches the replay up (``Session.catch_up``), whatever the history's length.

One autocommit read (``tasks.read_cold``: the run row WITHOUT a lock, and its history before
this attempt's ``ActivityStarted``), a cold ``Session`` built from it, and then exactly the
warm path's advance and guarded write (``completion._one_statement``), assuming the run row as
it was read (its next seq and sticky queue). The read is a snapshot, not a lock: the guarded
statement re-checks every ``predicates.fast_path`` term under the run row's lock, so a read
gone stale is refused (``guard``) and the ordinary transaction records the completion.

``prepare`` returns the cold session and the sticky queue its write assumes, or the reason the
ordinary path takes the completion (``completion.FALLBACK_REASONS``); nothing is written here.
"""

from __future__ import annotations

import logging
from typing import Any

from harvest_celery._core.engine import Activation, Session
from harvest_celery._runtime import logs
from harvest_celery._store import tasks
from harvest_celery._store.predicates import RUN, fast_path
from harvest_celery._store.records import Claim, RunRow

log = logging.getLogger("harvest_celery")


def eligible(rt: Any, claim: Claim, behind: Session | None = None) -> bool:
    """Worth a cold read: the claim says where its ``ActivityStarted`` is, and what there is to
    replay before it (the whole history, or the tail past ``behind``, a replay kept here that
    another process's decisions left behind) is short enough (``inline_or_task``'s bound)."""
    if claim.started_seq is None or claim.started_at is None:
        return False
    since = len(behind.events) if behind is not None else 0
    return claim.started_seq - since + 1 <= rt.settings.inline_cold_max_events


def refusal(rt: Any, claim: Claim, row: RunRow | None) -> str:
    """Why the run as read takes no cold one-statement completion ("" if it may): the checks
    ``inline_or_task`` makes on the locked row, and the guard's run terms."""
    assert claim.started_seq is not None
    if row is None or not row.decidable:
        return "not_decidable"
    if row.decision_requested_at is not None:
        return "decision_pending"
    if not rt.registry.has_workflow(row.workflow_type):
        return "not_registered"
    if row.next_seq != claim.started_seq + 1:
        return "not_positioned"  # appended to since this attempt's ActivityStarted
    params = {"next_seq": claim.started_seq + 1, "sticky_queue": row.sticky_queue}
    if not all(t.holds(row, params) for t in fast_path.of(RUN)):
        return "guard"  # e.g. a cancel requested, an nd-block: the ordinary path's
    return ""


def prepare(rt: Any, claim: Claim, behind: Session | None = None) -> tuple[Session | None, str | None, str]:
    """The session positioned just before this attempt's ``ActivityStarted`` and the sticky
    queue the guarded write assumes, or (None, None, reason). ``behind``: a replay kept here
    that stops short of it (this process's; ``prepare`` owns it now): caught up over the
    history's tail (``Session.catch_up``) instead of a replay from the start; one that cannot
    be is closed and the run replayed cold."""
    assert claim.started_seq is not None
    since = len(behind.events) if behind is not None else 0
    try:
        (row, history), _ = rt.store.transaction(
            lambda tx: tasks.read_cold(tx, claim.execution_id, claim.started_seq, since), one_statement=True
        )
        reason = refusal(rt, claim, row)
        if reason:
            if behind is not None:
                behind.close()
            return None, None, reason
        assert row is not None
        if behind is not None:
            if behind.catch_up(history, rt.settings.engine) is None:
                behind.close()  # not a tail it can take (a cancel?): from the start, if short
                return prepare(rt, claim) if eligible(rt, claim) else (None, None, "not_positioned")
            session = behind
        else:
            activation = Activation(row.id, row.workflow_type, history, rt.settings.engine)
            session = Session(rt.registry.workflow(row.workflow_type), activation, rt.registry)
    except Exception as exc:  # noqa: BLE001 - not a way to choose: logged, counted, recorded
        if behind is not None:
            behind.close()
        log.warning(
            "the cold read of %s for a one-statement completion failed (%s); it is recorded the ordinary way",
            claim.execution_id,
            type(exc).__name__,
            extra=logs.of_claim(claim),
        )
        log.debug("the cold read failed", exc_info=True)
        return None, None, "error"
    open_count = sum(1 for f in session.replay.activity_futures.values() if not f.done())
    if len(session.events) != claim.started_seq:
        reason = "not_positioned"
    elif open_count != 1:
        reason = "parallel_open"  # other attempts may append meanwhile: their claims fail the guard
    else:
        return session, row.sticky_queue, ""
    session.close()
    return None, None, reason
