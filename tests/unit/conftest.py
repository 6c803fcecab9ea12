"""Shared fixtures of the unit tests (no services)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from harvest_celery._cli import main


@pytest.fixture
def cli_db(tmp_path, monkeypatch) -> Callable[[str], str]:
    """``cli_db(app_module)``: a migrated SQLite database with no HARVEST_* environment leaking
    in, and the CLI test app module freshly imported against it. Returns the database url."""

    def make(app_module: str) -> str:
        for name in list(os.environ):
            if name.startswith("HARVEST_"):
                monkeypatch.delenv(name)
        path = tmp_path / "harvest.db"
        monkeypatch.setenv("HARVEST_CLI_TEST_DB", str(path))
        monkeypatch.delitem(sys.modules, app_module, raising=False)
        url = f"sqlite:///{path}"
        assert main(["--database-url", url, "db", "upgrade"]) == 0
        return url

    return make
