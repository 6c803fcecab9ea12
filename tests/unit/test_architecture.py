"""The package's shape is a contract too (issue: architecture). import-linter (``lint-imports`` in
.ci/run) holds the layers; these tests hold what it does not: no import cycle between modules, no
package import hidden inside a function to dodge one, and the size limits that keep every
module and function readable."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "harvest_celery"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# A lazy import of a package module is allowed only where it stands for an optional dependency:
# `harvest api` needs FastAPI (the [api] extra), the rest of the CLI does not.
OPTIONAL_LAZY = {("harvest_celery._cli.worker", "harvest_celery._web.api")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported package module, inside a function?) for every import of the package."""
    tree = ast.parse(path.read_text())
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harvest_celery"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                targets.append(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("harvest_celery")]
        found += [(t, id(node) in nested) for t in targets if t in known and t != name]
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: {t for t, _ in _imports(name, path, known)} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_package_modules():
    # a package's __init__ importing its own submodules is how a package is read, not a cycle
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in _graph().items()}
    assert _cycles(graph) == []


def test_no_package_import_hides_inside_a_function():
    modules = _modules()
    lazy = {(name, target) for name, path in modules.items()
            for target, inside in _imports(name, path, set(modules)) if inside}
    assert lazy <= OPTIONAL_LAZY


def test_no_type_checking_imports_stand_in_for_a_real_dependency():
    offenders = [str(p) for p in _modules().values() if "if TYPE_CHECKING:" in p.read_text()]
    assert offenders == []


def test_no_module_over_600_lines_and_no_function_over_60():
    long_modules, long_functions = [], []
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text()
        if source.count("\n") > MAX_MODULE_LINES:
            long_modules.append(str(path))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.name}:{node.name} ({length})")
    assert long_modules == [] and long_functions == []


def _defines(module: str, name: str) -> bool:
    path = _modules()[module]
    tree = ast.parse(path.read_text())
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
               for n in ast.walk(tree))


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
