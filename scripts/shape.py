"""The package's shape, checked by ``scripts/lint``: what import-linter (the layers) does not hold.

- no module over ``MAX_MODULE_LINES`` lines and no function over ``MAX_FUNCTION_LINES``;
- no import cycle between package modules (``MAX_IMPORT_CYCLES``);
- no package import hidden inside a function to dodge one, except ``OPTIONAL_LAZY``;
- no ``if TYPE_CHECKING:`` import standing in for a real dependency.

Run as ``python scripts/shape.py [PACKAGE_DIR]`` (default: ``harvest_celery`` beside this folder).
It prints the largest module and the longest function with their sizes, then one line per
failure naming the file and the threshold it broke, and exits 1 if there was any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_IMPORT_CYCLES = 0
# A lazy import of a package module is allowed only where it stands for an optional dependency:
# `harvest api` needs FastAPI (the [api] extra), the rest of the CLI does not.
OPTIONAL_LAZY = {
    ("harvest_celery._cli.worker", "harvest_celery._web.api"),
    # the tracer module imports opentelemetry (the otel extra): only when tracing is on
    ("harvest_celery._client", "harvest_celery._runtime.tracing"),
}
# generated Alembic revisions are not read as modules of the package
SKIPPED_PARTS = {"migrations"}

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Size:
    where: str
    lines: int


@dataclass(frozen=True)
class Report:
    largest_module: Size | None
    longest_function: Size | None
    failures: list[str]


def modules(package: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        if SKIPPED_PARTS & set(path.relative_to(package).parts):
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported package module, inside a function?) for every import of the package."""
    root = name.split(".")[0]
    tree = ast.parse(path.read_text())
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, _FUNCTIONS) for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == root:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                targets.append(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == root]
        found += [(t, id(node) in nested) for t in targets if t in known and t != name]
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Who imports whom; a package's ``__init__`` importing its own submodules is how a package
    is read, not a cycle, so those edges are left out."""
    found = modules(package)
    known = set(found)
    return {
        name: {t for t, _ in imports(name, path, known) if not t.startswith(name + ".")}
        for name, path in found.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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


def _shown(package: Path, path: Path) -> str:
    """A file as the report names it: relative to the package's parent folder."""
    return str(path.relative_to(package.parent))


def _sizes(package: Path) -> Iterator[tuple[str, Size]]:
    """("module" | "function", size) for every module and function of the package."""
    for path in modules(package).values():
        source = path.read_text()
        where = _shown(package, path)
        yield "module", Size(where, source.count("\n"))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, _FUNCTIONS):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                yield "function", Size(f"{where}:{node.lineno} {node.name}", length)


def check(package: Path, optional_lazy: set[tuple[str, str]] | None = None) -> Report:
    """Every shape rule over one package directory."""
    allowed = OPTIONAL_LAZY if optional_lazy is None else optional_lazy
    failures: list[str] = []
    largest: Size | None = None
    longest: Size | None = None
    for kind, size in _sizes(package):
        if kind == "module":
            largest = size if largest is None or size.lines > largest.lines else largest
            if size.lines > MAX_MODULE_LINES:
                failures.append(f"{size.where}: {size.lines} lines, over MAX_MODULE_LINES={MAX_MODULE_LINES}")
        else:
            longest = size if longest is None or size.lines > longest.lines else longest
            if size.lines > MAX_FUNCTION_LINES:
                failures.append(
                    f"{size.where}: {size.lines} lines, over MAX_FUNCTION_LINES={MAX_FUNCTION_LINES}"
                )
    every = modules(package)
    found = cycles(import_graph(package))
    if len(found) > MAX_IMPORT_CYCLES:
        for cycle in found:
            files = ", ".join(_shown(package, every[m]) for m in cycle)
            failures.append(f"{files}: an import cycle, over MAX_IMPORT_CYCLES={MAX_IMPORT_CYCLES}")
    for name, path in every.items():
        shown = _shown(package, path)
        for target, inside in imports(name, path, set(every)):
            if inside and (name, target) not in allowed:
                failures.append(f"{shown}: imports {target} inside a function (not in OPTIONAL_LAZY)")
        if "if TYPE_CHECKING:" in path.read_text():
            failures.append(f"{shown}: an `if TYPE_CHECKING:` import stands in for a real dependency")
    return Report(largest, longest, failures)


def main(argv: list[str]) -> int:
    package = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "harvest_celery"
    report = check(package)
    if report.largest_module is not None:
        print(f"largest module: {report.largest_module.where} ({report.largest_module.lines} lines)")
    if report.longest_function is not None:
        print(f"longest function: {report.longest_function.where} ({report.longest_function.lines} lines)")
    for failure in report.failures:
        print(f"shape: {failure}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
