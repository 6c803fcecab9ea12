"""The invariants checked over every run after each fault, read straight from Postgres (the
history, the run rows and the effects the activity bodies recorded).

* every run terminal (or nd-blocked where the test expects it), with the outcome its input asks
  for (every second run fails at its last step);
* seq contiguous from 0 and matching the run's ``next_seq``; exactly one terminal event, last;
* no duplicate ``ActivityStarted`` / ``ActivityCompleted`` / ``ActivityFailed`` for an
  (activity, attempt), at most one completion per activity, no body run twice for one attempt;
* every effect a body recorded is in the history (its activity completed), every completion had
  its body run, and every forward effect is compensated when the saga unwinds (none otherwise);
* saga markers at most once per unwind.

Violations are counted in three columns — **lost** (a run not finished, an effect the history
does not know), **duplicated** (anything recorded or run twice, a forked history) and
**uncompensated** — and listed in ``problems``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

TERMINAL_EVENTS = ("WorkflowCompleted", "WorkflowFailed")
RESULT_EVENTS = ("ActivityCompleted", "ActivityFailed")


@dataclass(frozen=True)
class Expect:
    """What a run should end as: ``status``, whether its saga unwinds, the error type of its
    failure (None: any), or nd-blocked (still RUNNING, blocked on a divergence)."""

    status: str = "COMPLETED"
    unwinds: bool = False
    error_type: str | None = None
    nd_blocked: bool = False


@dataclass
class Verdict:
    runs: int = 0
    lost: int = 0
    duplicated: int = 0
    uncompensated: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, kind: str, run: str, text: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.problems.append(f"{run}: {kind}: {text}")

    def note(self, run: str, text: str) -> None:
        self.problems.append(f"{run}: {text}")

    @property
    def clean(self) -> bool:
        return not self.problems


def _data(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else json.loads(value)


def _load(conn: sa.Connection, run: str) -> tuple[Any, list[tuple[int, str, dict]], list[Any]]:
    row = conn.execute(
        sa.text("SELECT status, next_seq, error, nd_blocked_at FROM harvest_executions WHERE id = :id"),
        {"id": run},
    ).first()
    events = [
        (int(seq), str(typ), _data(data))
        for seq, typ, data in conn.execute(
            sa.text("SELECT seq, type, data FROM harvest_events WHERE execution_id = :id ORDER BY seq"),
            {"id": run},
        )
    ]
    effects = conn.execute(
        sa.text("SELECT step, kind, activity_id, attempt FROM fault_effects WHERE run = :id ORDER BY id"),
        {"id": run},
    ).fetchall()
    return row, events, effects


def check(engine: sa.Engine, expected: dict[str, Expect]) -> Verdict:
    verdict = Verdict(runs=len(expected))
    with engine.connect() as conn:
        for run, expect in expected.items():
            row, events, effects = _load(conn, run)
            if row is None:
                verdict.add("lost", run, "no such run")
                continue
            if not _check_status(verdict, run, row, expect):
                continue
            _check_history(verdict, run, row, events, expect)
            _check_effects(verdict, run, events, effects, expect)
    return verdict


def _check_status(verdict: Verdict, run: str, row: Any, expect: Expect) -> bool:
    status, _next_seq, error, nd_blocked_at = row
    if expect.nd_blocked:
        if status != "RUNNING" or nd_blocked_at is None:
            verdict.note(run, f"expected nd-blocked, got {status} (nd_blocked_at={nd_blocked_at})")
        return False
    if status == "RUNNING":
        verdict.add("lost", run, "still RUNNING after the recovery deadline")
        return False
    if status != expect.status:
        verdict.note(run, f"ended {status}, expected {expect.status} (error {error})")
    if expect.error_type and _data(error or {}).get("type") != expect.error_type:
        verdict.note(run, f"failed with {error}, expected {expect.error_type}")
    return True


def _check_history(
    verdict: Verdict, run: str, row: Any, events: list[tuple[int, str, dict]], expect: Expect
) -> None:
    seqs = [seq for seq, _t, _d in events]
    if seqs != list(range(len(seqs))) or len(seqs) != int(row[1]):
        verdict.add("duplicated", run, f"seq not contiguous from 0 to next_seq={row[1]}: {seqs}")
    terminal = [i for i, (_s, typ, _d) in enumerate(events) if typ in TERMINAL_EVENTS]
    if len(terminal) != 1 or terminal[0] != len(events) - 1:
        verdict.add("duplicated", run, f"{len(terminal)} terminal events (must be exactly one, last)")
    per_attempt = Counter(
        (typ, d.get("activity_id"), d.get("attempt"))
        for _s, typ, d in events
        if typ in (*RESULT_EVENTS, "ActivityStarted")
    )
    for (typ, aid, attempt), n in per_attempt.items():
        if n > 1:
            verdict.add("duplicated", run, f"{n}x {typ} for activity {aid} attempt {attempt}")
    completed = Counter(d.get("activity_id") for _s, typ, d in events if typ == "ActivityCompleted")
    for aid, n in completed.items():
        if n > 1:
            verdict.add("duplicated", run, f"activity {aid} completed {n} times")
    markers = Counter(d.get("name") for _s, typ, d in events if typ == "MarkerRecorded")
    for name, n in markers.items():
        if str(name).startswith("saga_") and n > 1:
            verdict.add("duplicated", run, f"marker {name} recorded {n} times")
    unwound = any(str(name).startswith("saga_compensated:") for name in markers)
    if unwound != expect.unwinds:
        verdict.note(run, f"saga unwound={unwound}, expected {expect.unwinds}")


def _check_effects(
    verdict: Verdict, run: str, events: list[tuple[int, str, dict]], effects: list[Any], expect: Expect
) -> None:
    completed = {
        (d.get("activity_id"), d.get("attempt")) for _s, typ, d in events if typ == "ActivityCompleted"
    }
    completed_ids = {aid for aid, _attempt in completed}
    ran = Counter((e.activity_id, e.attempt) for e in effects)
    for (aid, attempt), n in ran.items():
        if n > 1:
            verdict.add("duplicated", run, f"body of activity {aid} attempt {attempt} ran {n} times")
        if aid not in completed_ids:
            verdict.add(
                "lost",
                run,
                f"activity {aid} did its effect (attempt {attempt}) but the "
                "history records no completion for it",
            )
    for aid, attempt in completed:
        if (aid, attempt) not in ran:
            verdict.add("duplicated", run, f"activity {aid} attempt {attempt} completed without its body")
    done = {e.step for e in effects if e.kind == "do"}
    undone = {e.step for e in effects if e.kind == "undo"}
    unwound = any(
        typ == "MarkerRecorded" and str(d.get("name", "")).startswith("saga_compensated:")
        for _s, typ, d in events
    )
    if unwound:
        for step in sorted(done - undone):
            verdict.add("uncompensated", run, f"step {step}'s effect was never compensated")
    elif undone:
        verdict.note(run, f"steps {sorted(undone)} compensated although the saga never unwound")
