"""The installed package (issue 19, item 3): the wheel's only top-level package is
``harvest_celery``; the repository keeps ``workflows/``, which installs as
``harvest_celery.examples``; ``harvest demo`` runs from the wheel installed outside the checkout
and from an editable install (the README's ``pip install -e . && harvest demo``), with no network.

The installs go into fresh virtualenvs made without pip (the running pip installs into them with
``--python``), whose dependencies come from this interpreter's site-packages through a ``.pth``."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import harvest_celery

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "harvest_celery"
EXAMPLES = ROOT / "workflows"
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARVEST_", "PYTHON", "PIP_"))}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, **kwargs)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the files a build reads, so building leaves nothing in the working tree."""
    where = tmp_path_factory.mktemp("checkout") / "harvest-celery"
    where.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, where / name)
    for name in ("harvest_celery", "workflows"):
        shutil.copytree(ROOT / name, where / name, ignore=SKIP)
    return where


@pytest.fixture(scope="module")
def wheel(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(checkout),
        ]
    )
    (built,) = out.glob("harvest_celery-*.whl")
    return built


def fresh_venv(where: Path) -> Path:
    """A virtualenv with no pip and no harvest; this interpreter's site-packages (the
    dependencies) appended to its path. Returns its python."""
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).stdout.strip()
    (Path(purelib) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def install(python: Path, *target: str) -> None:
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            *target,
        ]
    )


WHERE = """
import importlib.util, harvest_celery, harvest_celery.examples
print(harvest_celery.__file__)
print(harvest_celery.examples.__file__)
print(importlib.util.find_spec("workflows"))
"""


def test_the_wheels_only_top_level_package_is_harvest_celery(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"harvest_celery"}
    examples = {f"harvest_celery/examples/{p.name}" for p in EXAMPLES.glob("*.py")}
    assert "harvest_celery/examples/__init__.py" in examples and examples <= set(names)
    # pyproject lists the packages (find cannot add a mapped one): none of the tree's is missing
    tree = {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert tree - set(names) == set()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "harvest = harvest_celery._cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_repository_keeps_its_workflows_folder():
    assert (EXAMPLES / "__init__.py").is_file()
    assert {"checkout.py", "orders.py", "fulfillment.py", "dag_compensation_example.py"} <= {
        p.name for p in EXAMPLES.glob("*.py")
    }


def test_harvest_demo_runs_from_the_wheel_installed_outside_the_checkout(wheel, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    install(python, str(wheel))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    package, examples, workflows = run([str(python), "-c", WHERE], cwd=elsewhere).stdout.splitlines()
    site = str(tmp_path / "venv")
    assert package.startswith(site) and examples.startswith(site), (package, examples)
    assert workflows == "None"  # no top-level workflows module installed
    demo = run([str(tmp_path / "venv" / "bin" / "harvest"), "demo"], cwd=elsewhere)
    assert "(f) fulfillment     FAILED     (DagTaskFailed)" in demo.stdout
    assert list(elsewhere.iterdir()) == []


def test_readme_editable_install_maps_the_examples_and_runs_the_demo(checkout, tmp_path):
    """``pip install -e . && harvest demo``: the editable install honours the mapping too."""
    python = fresh_venv(tmp_path / "venv")
    install(python, "-e", str(checkout))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    package, examples, workflows = run([str(python), "-c", WHERE], cwd=elsewhere).stdout.splitlines()
    assert package == str(checkout / "harvest_celery" / "__init__.py")
    assert examples == str(checkout / "workflows" / "__init__.py")
    assert workflows == "None"
    demo = run([str(tmp_path / "venv" / "bin" / "harvest"), "demo"], cwd=elsewhere)
    assert "(c) checkout        FAILED     (ActivityError)" in demo.stdout


def _imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(relative level, module, names) of every import of a file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            yield node.level, node.module or "", [a.name for a in node.names]


def test_the_examples_import_only_what_harvest_celery_exports():
    """Users' code: ``from harvest_celery import <a name of __all__>``, and each other relatively
    (so they are the same modules under either name)."""
    for path in EXAMPLES.glob("*.py"):
        for level, module, names in _imports(path):
            if level:
                continue
            assert module.split(".")[0] != "workflows", path
            if module.split(".")[0] == "harvest_celery":
                assert module == "harvest_celery", (path, module)
                assert set(names) <= set(harvest_celery.__all__), (path, names)


def test_only_the_demo_imports_the_examples_and_nothing_imports_workflows():
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for _, module, names in _imports(path):
            if module.startswith("harvest_celery.examples") or (
                module == "harvest_celery" and "examples" in names
            ):
                importers.add(path.relative_to(ROOT).as_posix())
    assert importers == {"harvest_celery/_demo.py"}
    for folder in ("harvest_celery", "tests", "benchmarks", "workflows"):
        for path in (ROOT / folder).rglob("*.py"):
            assert all(m.split(".")[0] != "workflows" for level, m, _ in _imports(path) if not level), path
