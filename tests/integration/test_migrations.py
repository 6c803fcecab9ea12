"""Alembic migrations from an empty database give exactly the models' schema."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from harvest_celery._store.migrate import downgrade, upgrade
from harvest_celery._store.schema import metadata
from tests import status_checks

from .conftest import ADMIN_URL, DB_NAME

DRIFT_DB = f"{DB_NAME}_drift"  # beside the suite's own database: two runs never share it

pytestmark = pytest.mark.integration


def _create(admin: sa.Engine) -> str:
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DRIFT_DB}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{DRIFT_DB}"'))
    return ADMIN_URL.rsplit("/", 1)[0] + f"/{DRIFT_DB}"


def _drop(admin: sa.Engine) -> None:
    with admin.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
            {"name": DRIFT_DB},
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DRIFT_DB}"'))
    admin.dispose()


def test_migration_0007_stops_on_an_unknown_status_and_changes_nothing_on_postgres():
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        status_checks.assert_stops_on_unknown_status(_create(admin))
    finally:
        _drop(admin)


def test_migrating_an_empty_postgres_database_gives_the_models_schema():
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    url = _create(admin)
    try:
        upgrade(url)
        status_checks.assert_checked(url)
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"version_table": "harvest_alembic_version"}), metadata
            )
            assert diff == []
            assert set(sa.inspect(conn).get_table_names()) >= {t.name for t in metadata.sorted_tables}
        downgrade(url)
        with engine.connect() as conn:
            assert not set(sa.inspect(conn).get_table_names()) & {t.name for t in metadata.sorted_tables}
        engine.dispose()
    finally:
        _drop(admin)
