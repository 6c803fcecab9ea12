"""scripts/shape.py, the shape check ``scripts/lint`` runs, on trees made to break each rule."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "shape.py"
_spec = importlib.util.spec_from_file_location("shape", SCRIPT)
assert _spec is not None and _spec.loader is not None
shape = importlib.util.module_from_spec(_spec)
sys.modules["shape"] = shape  # dataclasses resolve their module by name
_spec.loader.exec_module(shape)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package."""\n')
    for name, text in files.items():
        (package / name).write_text(text)
    return package


def _function(lines: int) -> str:
    """A function whose def..last line spans exactly ``lines`` lines."""
    return "def long():\n" + "    x = 1\n" * (lines - 1)


def test_a_tree_breaking_each_threshold_gets_one_failure_each_naming_file_and_threshold(tmp_path):
    package = _package(
        tmp_path,
        {
            "big.py": "x = 1\n" * (shape.MAX_MODULE_LINES + 1),
            "fn.py": _function(shape.MAX_FUNCTION_LINES + 1),
            "a.py": "from pkg import b\n",
            "b.py": "from pkg import a\n",
        },
    )
    failures = shape.check(package).failures
    assert len(failures) == 3, failures
    big, fn, cycle = sorted(failures, key=lambda f: ("big" not in f, "fn.py" not in f))
    assert big.startswith("pkg/big.py:") and "601 lines" in big and "MAX_MODULE_LINES=600" in big
    assert fn.startswith("pkg/fn.py:1 long:") and "61 lines" in fn and "MAX_FUNCTION_LINES=60" in fn
    assert "pkg/a.py" in cycle and "pkg/b.py" in cycle and "MAX_IMPORT_CYCLES=0" in cycle


def test_a_tree_at_the_thresholds_passes_and_the_report_names_its_largest_parts(tmp_path):
    package = _package(
        tmp_path,
        {
            "big.py": "x = 1\n" * shape.MAX_MODULE_LINES,
            "fn.py": _function(shape.MAX_FUNCTION_LINES),
            "a.py": "from pkg import b\n",
            "b.py": "y = 2\n",
        },
    )
    report = shape.check(package)
    assert report.failures == []
    assert report.largest_module == shape.Size("pkg/big.py", shape.MAX_MODULE_LINES)
    assert report.longest_function == shape.Size("pkg/fn.py:1 long", shape.MAX_FUNCTION_LINES)


def test_a_package_import_inside_a_function_fails_unless_declared_optional(tmp_path):
    package = _package(tmp_path, {"a.py": "def f():\n    from pkg import b\n", "b.py": "y = 2\n"})
    assert shape.check(package, optional_lazy=set()).failures == [
        "pkg/a.py: imports pkg.b inside a function (not in OPTIONAL_LAZY)"
    ]
    assert shape.check(package, optional_lazy={("pkg.a", "pkg.b")}).failures == []


def test_the_script_prints_its_largest_module_and_longest_function_and_exits_1_on_failure(tmp_path):
    package = _package(tmp_path, {"fn.py": _function(shape.MAX_FUNCTION_LINES + 1)})
    done = subprocess.run([sys.executable, str(SCRIPT), str(package)], capture_output=True, text=True)
    assert done.returncode == 1
    assert "largest module: pkg/fn.py (61 lines)" in done.stdout
    assert "longest function: pkg/fn.py:1 long (61 lines)" in done.stdout
    assert "shape: pkg/fn.py:1 long: 61 lines, over MAX_FUNCTION_LINES=60" in done.stdout


def test_the_cycle_finder_finds_a_cycle():
    assert shape.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
