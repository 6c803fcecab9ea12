"""The run-state predicates, declared once as data: which states of a run (and, for the one-statement
guard, of the attempt's task row) an operation accepts.

Each predicate is a conjunction of ``Term``\\ s, and every form the code needs is generated from
those terms: the SQL text fragment (``Predicate.sql``, for the raw statements of ``_store.sql``),
the Core expression (``Predicate.core``) and the Python test on a ``RunRow`` (``Predicate.holds``).
``fast_path`` also gives the run row a one-statement completion assumes (``RunRow.assumed``).

None of them is merged into another, although ``decidable`` and ``eager_claim`` extend
``accepts_results``: they answer different questions, and a cancelled run still accepts results
where the one-statement path refuses it. A new state (a column, a status) is added here, to the
predicates that must see it; ``tests/unit/test_predicates.py`` lists, for every column of the
runs table, which predicate reads it or why it ignores it, and fails for a column nobody has
classified. Each term's ``columns`` name the columns it reads (``table``: ``"run"``, or
``"task"`` for the attempt's task row), so tests can be generated from a declaration.

Parameters (``Term.value`` of a ``param``/``same``/``fact`` term) are named without a prefix; a
rendering's ``param`` callable spells them for its statement (``%(g_next_seq)s``, ``:next_seq``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from harvest_celery._core.lifecycle import RUNNING
from harvest_celery._core.names import TaskStatus

# The value a NOT_NULL term assumes of its column (a set timestamp whose value it never reads)
ADMITTED = datetime(1970, 1, 1, tzinfo=timezone.utc)
RUN = "run"  # Term.table: the execution row
TASK = "task"  # Term.table: the attempt's activity task row

# Term.op
IS_NULL = "is_null"  # the column is NULL
NOT_NULL = "not_null"  # the column is set
EQUALS = "equals"  # the column equals a constant (a status)
PARAM = "param"  # the column equals a parameter
SAME = "same"  # the column IS NOT DISTINCT FROM a parameter (NULL equals NULL)
ANY = "any"  # one of the sub-terms holds
ALL = "all"  # every sub-term holds (one guard over several columns)
FACT = "fact"  # a parameter known to the caller (no column) is false


def pyformat(name: str) -> str:
    """DB-API ``pyformat`` parameter (``exec_driver_sql``, DB-API cursors)."""
    return f"%({name})s"


def colon(name: str) -> str:
    """``sa.text`` parameter."""
    return f":{name}"


def unindexed(col: str) -> str:
    """``col`` as an expression no index on it can serve. Every statement a predicate's SQL goes
    into finds its row by primary key (the run row, the attempt's task row), and a constant
    status compared to the bare column lets the planner take the status index instead: in a plan
    made while the table was young and had no statistics, every equality looks equally
    selective, the two tie, and a prepared statement keeps that plan (``_store.prepared``) as
    the table grows, so each step scanned the status's whole range (every completed task row;
    docs/performance.md, "Activity limits: key lookups on a young database")."""
    return f"({col} || '')"


def literal(value: Any) -> str:
    """A constant as SQL text: statuses are our own constants, never user input."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


@dataclass(frozen=True)
class Term:
    """One condition. ``name`` says it in words (messages, generated test ids)."""

    name: str
    op: str
    column: str = ""  # the column read (none for ANY and FACT)
    value: Any = None  # EQUALS: the constant; PARAM, SAME, FACT: the parameter's name
    terms: tuple[Term, ...] = ()  # ANY: the alternatives; ALL: the parts
    table: str = RUN

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of ``table`` this term reads."""
        if self.op in (ANY, ALL):
            return tuple(dict.fromkeys(c for t in self.terms for c in t.columns))
        return (self.column,) if self.column else ()

    @property
    def params(self) -> tuple[str, ...]:
        if self.op in (ANY, ALL):
            return tuple(dict.fromkeys(p for t in self.terms for p in t.params))
        return (self.value,) if self.op in (PARAM, SAME, FACT) else ()

    def sql(self, alias: str | None, param: Callable[[str], str]) -> str:
        col = f"{alias}.{self.column}" if alias else self.column
        if self.op == IS_NULL:
            return f"{col} IS NULL"
        if self.op == NOT_NULL:
            return f"{col} IS NOT NULL"
        if self.op == EQUALS:
            return f"{unindexed(col)} = {literal(self.value)}"
        if self.op == PARAM:
            return f"{col} = {param(self.value)}"
        if self.op == SAME:
            return f"{col} IS NOT DISTINCT FROM {param(self.value)}"
        if self.op == FACT:
            return f"{param(self.value)} IS FALSE"
        if self.op in (ANY, ALL):
            joined = (" OR " if self.op == ANY else " AND ").join(t.sql(alias, param) for t in self.terms)
            return f"({joined})"
        raise ValueError(f"unknown term op {self.op!r}")

    def core(self, table: Any, params: Mapping[str, Any]) -> Any:
        if self.op in (ANY, ALL):
            return (sa.or_ if self.op == ANY else sa.and_)(*(t.core(table, params) for t in self.terms))
        if self.op == FACT:
            return sa.literal(bool(params[self.value])).is_(False)
        col = table.c[self.column]
        if self.op == IS_NULL:
            return col.is_(None)
        if self.op == NOT_NULL:
            return col.is_not(None)
        if self.op == EQUALS:
            return col == self.value
        if self.op == PARAM:
            return col == sa.bindparam(None, params[self.value], type_=col.type)
        if self.op == SAME:
            return col.is_not_distinct_from(sa.bindparam(None, params[self.value], type_=col.type))
        raise ValueError(f"unknown term op {self.op!r}")

    def holds(self, row: Any, params: Mapping[str, Any]) -> bool:
        if self.op in (ANY, ALL):
            return (any if self.op == ANY else all)(t.holds(row, params) for t in self.terms)
        if self.op == FACT:
            return not params[self.value]
        value = getattr(row, self.column)
        if self.op == IS_NULL:
            return value is None
        if self.op == NOT_NULL:
            return value is not None
        if self.op == EQUALS:
            return bool(value == self.value)
        if self.op in (PARAM, SAME):
            return bool(value == params[self.value])
        raise ValueError(f"unknown term op {self.op!r}")

    def assumed(self, params: Mapping[str, Any]) -> Any:
        """The one value of its column this term accepts (a run row assumed to pass it)."""
        if self.op == IS_NULL:
            return None
        if self.op == NOT_NULL:
            return ADMITTED
        if self.op == EQUALS:
            return self.value
        if self.op in (PARAM, SAME):
            return params[self.value]
        raise ValueError(f"{self.name!r} accepts more than one value: no row can be assumed from it")


@dataclass(frozen=True)
class Predicate:
    """A named conjunction of terms (module docstring)."""

    name: str
    terms: tuple[Term, ...]
    doc: str = ""

    def extended(self, name: str, *terms: Term, doc: str = "") -> Predicate:
        """This predicate's terms and more, under its own name."""
        return Predicate(name, self.terms + terms, doc)

    def of(self, table: str) -> tuple[Term, ...]:
        return tuple(t for t in self.terms if t.table == table)

    @property
    def columns(self) -> frozenset[str]:
        """The run columns it reads."""
        return frozenset(c for t in self.of(RUN) for c in t.columns)

    @property
    def task_columns(self) -> frozenset[str]:
        return frozenset(c for t in self.of(TASK) for c in t.columns)

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for t in self.terms for p in t.params))

    def sql(
        self, alias: str | None = None, param: Callable[[str], str] = pyformat, *, table: str = RUN
    ) -> str:
        """The SQL text of its terms on ``table`` (its rows named ``alias``), ANDed."""
        return " AND ".join(t.sql(alias, param) for t in self.of(table)) or "true"

    def core(self, table: Any, *, on: str = RUN, **params: Any) -> Any:
        """A Core expression of its terms on ``on`` over ``table`` (a Table or an alias)."""
        return sa.and_(sa.true(), *(t.core(table, params) for t in self.of(on)))

    def holds(self, row: Any, task: Any = None, **params: Any) -> bool:
        """The Python form: on a ``records.RunRow`` (and, for task terms, a ``TaskRow``)."""
        return not self.refusing(row, task, **params)

    def refusing(self, row: Any, task: Any = None, **params: Any) -> list[Term]:
        """The terms that do not hold (for messages and tests)."""
        return [t for t in self.terms if not t.holds(task if t.table == TASK else row, params)]

    def assumed(self, **params: Any) -> dict[str, Any]:
        """The run-row columns it pins, at the values it accepts."""
        return {t.column: t.assumed(params) for t in self.of(RUN)}


def _null(column: str, name: str) -> Term:
    return Term(name, IS_NULL, column)


_RUNNING = Term("running", EQUALS, "status", RUNNING)
# workflow admission: a run waiting for a slot never has a decision requested or taken
_ADMITTED = Term("admitted", NOT_NULL, "admitted_at")

accepts_results = Predicate(
    "accepts_results",
    (
        _null("erased_at", "not erased"),
        Term("running or cancelled", ANY, terms=(_RUNNING, Term("cancelled", NOT_NULL, "cancelled_at"))),
    ),
    doc="A live run records results; so does a cancelled one (a body that was running when the "
    "cancel landed did its side effect, and the history must say so). An erased run never. "
    "The claim and the finish.",
)

decidable = accepts_results.extended(
    "decidable",
    _null("paused_at", "not paused"),
    _ADMITTED,
    doc="A decision may run: live (or sealed with a cancel to follow up), admitted (a run waiting "
    "for admission never decides), not paused or erased.",
)

eager_claim = accepts_results.extended(
    "eager_claim",
    Term("the decision does not close the run", FACT, value="closes"),
    doc="A decision claims one of its new activities for its own thread in its write: the "
    "claim's own rule, and the decision leaves the run open (a closing write abandons the "
    "rows it could claim).",
)

fast_path = Predicate(
    "fast_path",
    (
        _RUNNING,
        _null("cancelled_at", "no cancel seal"),
        _null("cancel_requested_at", "no cancellation request"),
        _null("decision_requested_at", "no pending decision"),
        _null("paused_at", "not paused"),
        _null("erased_at", "not erased"),
        _null("nd_blocked_at", "not nd-blocked"),
        _null("nd_retry_at", "no nd retry due"),
        _ADMITTED,
        Term("the next seq the warm replay assumes", PARAM, "next_seq", "next_seq"),
        Term("the sticky queue the warm replay assumes", SAME, "sticky_queue", "sticky_queue"),
        Term(
            "the task row running at this attempt",
            ALL,
            table=TASK,
            terms=(
                Term("the task row running", EQUALS, "status", TaskStatus.RUNNING.value, table=TASK),
                Term("the task row at this attempt", PARAM, "attempt", "attempt", table=TASK),
            ),
        ),
    ),
    doc="The one-statement guard: a completion and the decision taken on it are written in one "
    "statement only while the run is exactly as the deciding warm replay assumes.",
)

operator_live = Predicate(
    "operator_live",
    (_RUNNING,),
    doc="Running: operator actions (signal, cancel, terminate, pause), the "
    "sweeper's timers and nd retries, retries of a failed attempt, "
    "claims of an announced start.",
)

accepts_updates = operator_live.extended(
    "accepts_updates",
    _null("cancelled_at", "no cancel seal"),
    _null("paused_at", "not paused"),
    _null("erased_at", "not erased"),
    _null("nd_blocked_at", "not nd-blocked"),
    doc="An update may be accepted (``_store.updates``): running, not sealed, paused, erased or "
    "nd-blocked, since its handler must run on the next decision.",
)

PREDICATES = (accepts_results, decidable, fast_path, eager_claim, operator_live, accepts_updates)
