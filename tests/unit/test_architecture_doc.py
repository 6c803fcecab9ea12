"""docs/architecture.md is the contributors' map: every path it names exists, and its layout
lists every module of the package, so the page cannot drift from the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
# generated Alembic revisions are files of the migrations folder, not modules the layout names
UNLISTED_PARTS = {"migrations"}
# a backticked token that names a repository path: a folder ending in '/' or a file with a suffix
_PATH = re.compile(r"`((?:harvest_celery|tests|docs|scripts|benchmarks|workflows|config|\.ci)[\w./-]*)`")


def _layout() -> list[str]:
    """The paths of the layout block (the fenced block under '## Layout'), rebuilt from its
    indentation: a line's first word is a folder (ending in '/') or a file inside the folder
    above it."""
    text = DOC.read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    paths: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        word = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + word
        paths.append(path)
        if word.endswith("/"):
            stack.append((indent, path))
    return paths


def _package_modules() -> set[str]:
    package = ROOT / "harvest_celery"
    return {
        str(p.relative_to(ROOT))
        for p in package.rglob("*.py")
        if not UNLISTED_PARTS & set(p.relative_to(package).parts)
        and (p.name != "__init__.py" or p.parent == package)
    }


def test_the_layout_block_is_read_as_a_tree():
    paths = _layout()
    assert "harvest_celery/" in paths and "harvest_celery/_core/engine.py" in paths


def test_every_path_the_layout_names_exists():
    missing = [p for p in _layout() if not (ROOT / p).exists()]
    assert missing == []


def test_every_package_module_is_in_the_layout():
    assert sorted(_package_modules() - set(_layout())) == []


def test_every_path_the_page_names_exists():
    named = {p for p in _PATH.findall(DOC.read_text()) if "/" in p}  # not dotted module names
    missing = sorted(p for p in named if not (ROOT / p.split("::")[0].rstrip(".")).exists())
    assert named and missing == []
