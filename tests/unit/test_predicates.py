"""The run-state predicates (``_store.predicates``): which predicate reads which column of the runs
table, and why the others ignore it. A column added to ``_store/schema.py`` fails this test until
it is classified here, for every predicate."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa

from harvest_celery._core.lifecycle import CANCELLED, RUN_STATUSES, RUNNING
from harvest_celery._core.names import TASK_STATUSES, TaskStatus
from harvest_celery._store import predicates as p
from harvest_celery._store.records import RunRow, TaskRow
from harvest_celery._store.schema import activity_tasks, executions

READS = "reads"
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
NAMES = ("accepts_results", "decidable", "fast_path", "eager_claim", "operator_live", "accepts_updates")


def _all(reason: str) -> dict[str, str]:
    return dict.fromkeys(NAMES, reason)


# Columns that are not state: what a run is, holds or says, never whether it may change.
NOT_STATE = {
    "id": "identity",
    "workflow_type": "what runs, not its state",
    "input": "a payload",
    "result": "a payload",
    "error": "the outcome's details (status says whether it failed)",
    "created_at": "a timestamp of record",
    "updated_at": "a timestamp of record",
    "cancel_reason": "the text of a cancel (cancelled_at / cancel_requested_at are the state)",
    "nd_block_reason": "the text of an nd-block (nd_blocked_at is the state)",
    "nd_details": "the details of an nd-block (nd_blocked_at is the state)",
    "input_digest": "the id-reuse rule's input fingerprint",
    "decision_queue": "routing only, written once at start: where the starting app decides",
    "traceparent": "tracing's stored context, written once at start (migration 0016)",
    "admission_seq": "the start order of a waiting run (admission orders by it; no predicate)",
    "priority": "the start priority: orders waiting runs, never whether a run may change",
    "limit_key": "a payload: the admission key (its digest names the limit row)",
    "limit_digest": "which limit row a run is admitted under (admission_seq's companion)",
}

# For every state column: each predicate reads it, or says why it does not.
STATE = {
    "status": _all(READS),
    "next_seq": {
        "accepts_results": "a result is appended at the locked run's next seq, whatever it is",
        "decidable": "a decision replays the history as stored",
        "fast_path": READS,
        "eager_claim": "its ActivityStarted follows the decision's own events in the same write",
        "operator_live": "an operator action appends at the locked run's next seq",
        "accepts_updates": "an acceptance appends at the locked run's next seq",
    },
    "closed_at": _all("set with a terminal status; status is what the predicates read"),
    "cancelled_at": {**_all(READS), "operator_live": "a seal sets a terminal status, which status refuses"},
    "cancel_requested_at": {
        "accepts_results": "a run asked to cancel is still RUNNING and records results",
        "decidable": "its decision is how the workflow sees the request",
        "fast_path": READS,
        "eager_claim": "a cancelling run may still schedule durable work",
        "operator_live": "operators act on a cancelling run as on a running one "
        "(request_cancellation checks it itself, for idempotence)",
        "accepts_updates": "a cancelling run still decides, so its handler still runs",
    },
    "decision_requested_at": {
        "accepts_results": "a pending decision reads the results recorded before it runs",
        "decidable": "a pending request is what a decision takes",
        "fast_path": READS,
        "eager_claim": "the decision carrying the claim clears it in the same write",
        "operator_live": "an operator action requests a decision only when none is pending",
        "accepts_updates": "the acceptance requests a decision only when none is pending",
    },
    "nd_blocked_at": {
        "accepts_results": "an nd-blocked run records results for its retried decision",
        "decidable": "an nd retry is a decision",
        "fast_path": READS,
        "eager_claim": "only a decision that is not nd-blocked schedules work (it clears the block)",
        "operator_live": "operators may cancel or terminate an nd-blocked run",
        "accepts_updates": READS,
    },
    "nd_block_count": _all("the nd backoff's counter; nd_blocked_at says whether it is blocked"),
    "nd_retry_at": {**_all("the sweeper's nd backoff clock, not a state that refuses"), "fast_path": READS},
    "erased_at": {**_all(READS), "operator_live": "erasure is for terminal runs only (status)"},
    "paused_at": {
        "accepts_results": "a paused run still records results; its decisions wait",
        "decidable": READS,
        "fast_path": READS,
        "eager_claim": "the decision carrying it was taken on a decidable run, under the same lock",
        "operator_live": "operators may signal, cancel or terminate a paused run",
        "accepts_updates": READS,
    },
    "forked_from": _all("lineage: a fork is a run of its own"),
    "forked_to": _all("lineage: a forked source is in the state its own columns say"),
    "parent_id": _all("lineage: a child is a run of its own, decided on its own row"),
    "continued_from": _all("lineage: a continued run is a run of its own"),
    "continued_to": _all("lineage: a continued run is terminal, which status says"),
    "sticky_queue": {**_all("routing only: which worker decides"), "fast_path": READS},
    "execution_deadline_at": _all("the sweeper's deadline clock (due_deadlines), not a state that refuses"),
    "run_deadline_at": _all("the sweeper's deadline clock (due_deadlines), not a state that refuses"),
    "timed_out_at": {
        **_all("a timeout request also opens cancel_requested_at, which the predicates read"),
        "operator_live": "operators act on a timed-out running run as on any running one",
    },
    "timeout_grace_at": _all("the sweeper's grace clock (due_deadlines), not a state that refuses"),
    "timeout_overrun_at": _all("a mark for operators (describe); the run stays running, which status says"),
    "admitted_at": {
        "accepts_results": "a waiting run has no activity, so no result can arrive for it",
        "decidable": READS,
        "fast_path": READS,
        "eager_claim": "the decision carrying it was taken on an admitted run, under the same lock",
        "operator_live": "operators may signal, cancel, terminate or pause a waiting run",
        "accepts_updates": "an accepted update waits, undecided, for the run's admission like a signal",
    },
}


def test_every_column_of_the_runs_table_is_classified():
    columns = set(executions.c.keys())
    assert set(NOT_STATE) | set(STATE) == columns, (
        f"unclassified: {sorted(columns - set(NOT_STATE) - set(STATE))}; "
        f"gone: {sorted(set(NOT_STATE) | set(STATE) - columns)}"
    )
    assert not set(NOT_STATE) & set(STATE)
    assert all(reason.strip() for reason in NOT_STATE.values())


def test_the_predicates_are_the_declared_ones():
    assert tuple(pred.name for pred in p.PREDICATES) == NAMES


@pytest.mark.parametrize("pred", p.PREDICATES, ids=lambda pred: pred.name)
def test_each_predicate_reads_exactly_the_columns_classified_as_read(pred):
    for column, verdicts in STATE.items():
        assert set(verdicts) == set(NAMES), column
        verdict = verdicts[pred.name]
        assert verdict.strip(), (column, pred.name)
        assert (verdict == READS) == (column in pred.columns), (
            f"{pred.name} {'reads' if column in pred.columns else 'ignores'} {column}, classified: {verdict}"
        )
    assert pred.columns <= set(STATE)
    assert pred.columns <= set(executions.c.keys())


def test_forked_to_is_read_by_none():
    assert all("forked_to" not in pred.columns for pred in p.PREDICATES)


def test_only_fast_path_reads_the_task_row():
    assert p.fast_path.task_columns == {"status", "attempt"}
    assert p.fast_path.task_columns <= set(activity_tasks.c.keys())
    assert all(not pred.task_columns for pred in p.PREDICATES if pred is not p.fast_path)


def test_no_predicate_is_merged_into_another():
    terms = {pred.name: pred.sql() for pred in p.PREDICATES}
    assert len(set(terms.values())) == len(terms)


def test_decidable_and_eager_claim_extend_accepts_results():
    n = len(p.accepts_results.terms)
    assert p.decidable.terms[:n] == p.accepts_results.terms
    assert p.eager_claim.terms[:n] == p.accepts_results.terms


# ── fast_path, term by term (the unit side of the guard-column tests; erased_at lives here only:
# erasure is for terminal runs, so no integration test can land it between claim and completion)
def _task(**changes):
    row = TaskRow("r", "a1", "act", "q", TaskStatus.RUNNING.value, 2, None, None, 3, False, NOW)
    return dataclasses.replace(row, **changes)


def _violating(term):
    if term.op == p.IS_NULL:
        return NOW
    if term.op == p.NOT_NULL:
        return None
    if term.op == p.EQUALS:
        return CANCELLED
    if term.op == p.PARAM:
        return 99
    if term.op == p.SAME:
        return "another-worker-queue"
    raise AssertionError(term)


def test_the_assumed_row_passes_fast_path():
    row = RunRow.assumed("r", "W", 7, "q@host")
    assert p.fast_path.holds(row, _task(), next_seq=7, sticky_queue="q@host", attempt=2)
    assert row.status == RUNNING and row.next_seq == 7 and row.sticky_queue == "q@host"


@pytest.mark.parametrize("term", p.fast_path.of(p.RUN), ids=lambda t: t.columns[0])
def test_fast_path_refuses_a_change_of_each_run_column_alone(term):
    row = dataclasses.replace(RunRow.assumed("r", "W", 7, None), **{term.column: _violating(term)})
    assert p.fast_path.refusing(row, _task(), next_seq=7, sticky_queue=None, attempt=2) == [term]


@pytest.mark.parametrize(
    "changes",
    [{"status": TaskStatus.SCHEDULED.value}, {"attempt": 3}, {"status": TaskStatus.COMPLETED.value}],
)
def test_fast_path_refuses_a_task_row_another_attempt_owns(changes):
    row = RunRow.assumed("r", "W", 7, None)
    refused = p.fast_path.refusing(row, _task(**changes), next_seq=7, sticky_queue=None, attempt=2)
    assert [t.table for t in refused] == [p.TASK]


def test_a_cancelled_run_accepts_results_but_not_the_fast_path():
    sealed = dataclasses.replace(RunRow.assumed("r", "W", 7, None), status=CANCELLED, cancelled_at=NOW)
    assert sealed.accepts_results and sealed.decidable
    assert p.eager_claim.holds(sealed, closes=False) and not p.eager_claim.holds(sealed, closes=True)
    assert not p.fast_path.holds(sealed, _task(), next_seq=7, sticky_queue=None, attempt=2)
    assert not p.operator_live.holds(sealed)


# ── the status constants: one set, in the schema's CHECK constraints too
def _check_text(table):
    (check,) = [c for c in table.constraints if isinstance(c, sa.CheckConstraint)]
    return str(check.sqltext.compile(compile_kwargs={"literal_binds": True}))


def test_the_schema_checks_the_status_constants():
    assert RUN_STATUSES == (
        "RUNNING",
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TERMINATED",
        "CONTINUED_AS_NEW",
        "TIMED_OUT",
    )
    assert TASK_STATUSES == tuple(s.value for s in TaskStatus)
    for table, statuses in ((executions, RUN_STATUSES), (activity_tasks, TASK_STATUSES)):
        text = _check_text(table)
        assert all(f"'{s}'" in text for s in statuses), text
        assert text.count("'") == 2 * len(statuses), text
