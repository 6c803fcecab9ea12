"""The store's raw SQL lives in ``_store/sql.py``, and SQLite and Postgres differ only through the
``Dialect`` subclasses (``_store/dialect.py``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harvest_celery._core.lifecycle import RUN_STATUSES
from harvest_celery._core.names import TASK_STATUSES
from harvest_celery._store import predicates, sql

PACKAGE = Path(__file__).resolve().parents[2] / "harvest_celery"
STORE = PACKAGE / "_store"
STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|LISTEN|NOTIFY)\b", re.I)


def _strings(path: Path) -> list[str]:
    """The string literals of a module (f-string parts included), docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_raw_statement_outside_the_sql_module():
    offenders = [
        f"{path.name}: {text.strip()[:40]!r}"
        for path in sorted(STORE.glob("*.py"))
        if path.name != "sql.py"
        for text in _strings(path)
        if STATEMENT.match(text)
    ]
    assert offenders == []


def test_no_dialect_test_outside_the_dialect_module():
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "dialect.py" and "dml_ctes" in path.read_text()
    ]
    assert offenders == []


def test_no_status_is_spelled_out_in_the_store():
    """Statuses come from the constants (``lifecycle.RUN_STATUSES``, ``names.TASK_STATUSES``): no
    run status as a bare string, no status compared with a literal, none quoted in SQL text."""
    offenders = [
        f"{path.name}: {text!r}"
        for path in sorted(STORE.glob("*.py"))
        for text in _strings(path)
        if text in RUN_STATUSES
    ]
    quoted = re.compile("'(" + "|".join(RUN_STATUSES + TASK_STATUSES) + ")'")
    for path in sorted(STORE.glob("*.py")):
        offenders += [f"{path.name}: {m.group(0)}" for text in _strings(path) for m in quoted.finditer(text)]
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Compare)
                and any(
                    isinstance(side, ast.Attribute) and side.attr == "status"
                    for side in (node.left, *node.comparators)
                )
                and any(
                    isinstance(side, ast.Constant) and isinstance(side.value, str)
                    for side in (node.left, *node.comparators)
                )
            ):
                offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_the_guard_is_fast_path_generated():
    run_sql = predicates.fast_path.sql(None, lambda n: f"%(g_{n})s")
    task_sql = predicates.fast_path.sql("t", lambda n: f"%(g_{n})s", table=predicates.TASK)
    assert run_sql in sql.GUARD and task_sql in sql.GUARD
    for term in predicates.fast_path.terms:
        assert all(column in sql.GUARD for column in term.columns), term.name
    assert predicates.accepts_results.sql(None, predicates.colon) in sql.CLAIM.text
