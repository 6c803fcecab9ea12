"""The package's shape is a contract too. import-linter (``lint-imports``) holds the layers and
``scripts/shape.py`` (both run by ``scripts/lint``) the sizes, import cycles and lazy imports; these
tests hold where a newcomer finds each concern and that every package says what it owns."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "harvest_celery"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _defines(module: str, name: str) -> bool:
    path = _modules()[module]
    tree = ast.parse(path.read_text())
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
        for n in ast.walk(tree)
    )


def test_a_newcomer_finds_each_concern_by_its_folder_name():
    assert _defines("harvest_celery._store.runs", "cancel")  # cancel a workflow
    assert _defines("harvest_celery._runtime.claim", "claim")  # the Celery pre-run claim
    assert _defines("harvest_celery._runtime.celery", "_on_prerun")
    assert _defines("harvest_celery._dag.runner", "make_runner")  # DAG unwind order
    assert _defines("harvest_celery._payloads.erasure", "erase_event")  # payload erasure
    assert _defines("harvest_celery._store.runs", "erase")


def test_every_package_says_what_it_owns_and_may_not_import():
    for init in PACKAGE.glob("_*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May not import" in doc or "May import only" in doc, init
