"""The per-step budget is stated once, in docs/performance.md (issue 19, item 5): README.md and
docs/operations.md link to its section, and no other page gives its figures (commits and
Postgres round trips per step), so the figures cannot drift apart between pages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = "performance.md"
ANCHOR = "## Per-step budget"
# a count of commits or round trips, as the budget gives them: "2 commits", "≤ 6 round trips",
# "**1 commit and 1 round trip**", "5 Postgres round trips"
FIGURE = re.compile(r"\b\d+\**\s+(?:Postgres\s+)?(?:commits?|round[\s-]trips?)\b", re.I)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_budget_has_its_section_in_performance_md():
    text = (ROOT / "docs" / HOME).read_text()
    assert ANCHOR in text.splitlines()
    assert FIGURE.search(text.split(ANCHOR, 1)[1])


def test_readme_and_operations_link_to_it():
    assert "(docs/performance.md#per-step-budget)" in (ROOT / "README.md").read_text()
    assert "(performance.md#per-step-budget)" in (ROOT / "docs" / "operations.md").read_text()


def test_no_other_page_states_its_figures():
    stated = {
        f"{page.relative_to(ROOT)}: {m.group(0)}"
        for page in _pages()
        if page.name != HOME
        for m in FIGURE.finditer(page.read_text())
    }
    assert stated == set()
