"""The pages teach the one configuration surface (issue 19, item 6 and its design constraints):
settings are ``Harvest(...)`` keywords, so no page mentions the runtime's internal settings
object (it keeps working for code written against older pages: tests/unit/test_configuration.py),
flower.md sets ``celery_error_detail`` as a keyword, and no page calls the deprecated
``configure_celery``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pages() -> dict[str, str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in pages}


def test_no_page_mentions_the_runtimes_settings_object():
    assert [name for name, text in _pages().items() if re.search(r"runtime\.settings\b", text)] == []


def test_flower_sets_the_error_detail_as_a_harvest_keyword():
    text = (ROOT / "docs" / "flower.md").read_text()
    assert re.search(r"Harvest\([^)]*\bcelery_error_detail=\"type\"", text)
    assert "configuration.md#celery_error_detail" in text


def test_no_page_calls_the_deprecated_name():
    calls = {name for name, text in _pages().items() if re.search(r"\bconfigure_celery\(", text)}
    assert calls == set()
