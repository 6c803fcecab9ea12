"""Issue 14, defect 10: no SQL parameter reaches harvest's logs — including the values Postgres
itself quotes in an error (psycopg2 sends parameters inside the statement text, and the
server's LINE / DETAIL / CONTEXT parts echo them)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery._store.redaction import RedactedDatabaseError
from harvest_celery._store.store import Store

from .conftest import DATABASE_URL

SECRET = "pan-4111-1111-1111-1111"


def _database_error_quoting(secret: str) -> BaseException:
    store = Store(DATABASE_URL)
    try:
        with store.engine.connect() as conn:
            conn.execute(sa.text("SELECT CAST(:v AS JSONB)"), {"v": f'{{"card": "{secret}", '})
    except sa.exc.DBAPIError as exc:
        return exc
    finally:
        store.engine.dispose()
    raise AssertionError("the statement should have failed")


def test_a_database_error_is_logged_without_the_values_postgres_quotes(caplog: Any):
    exc = _database_error_quoting(SECRET)
    assert SECRET in str(exc)  # what would have been logged: Postgres echoes the value
    caplog.set_level(logging.WARNING)
    for name in ("harvest_celery", "harvest_celery.api"):
        try:
            raise RuntimeError("recording the completion failed") from exc
        except RuntimeError:
            logging.getLogger(name).exception("while doing harvest work")
    text = caplog.text
    assert SECRET not in text
    assert text.count("invalid input syntax for type json") == 2  # the cause is still named
    assert all(r.exc_info and r.exc_info[0] is RedactedDatabaseError for r in caplog.records)


def test_other_errors_are_logged_untouched(caplog: Any):
    caplog.set_level(logging.WARNING)
    with pytest.raises(ValueError):
        try:
            raise ValueError("a plain bug, not the database's")
        except ValueError:
            logging.getLogger("harvest_celery").exception("boom")
            raise
    assert "a plain bug, not the database's" in caplog.text
