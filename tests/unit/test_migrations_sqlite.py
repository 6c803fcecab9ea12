"""The embedded default (SQLite) migrates from empty to exactly the models' schema."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from harvest_celery._store.migrate import upgrade
from harvest_celery._store.schema import metadata
from tests import status_checks


def test_migrating_an_empty_sqlite_database_gives_the_models_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert (
            compare_metadata(
                MigrationContext.configure(conn, opts={"version_table": "harvest_alembic_version"}), metadata
            )
            == []
        )
    engine.dispose()


def test_the_status_checks_are_in_the_migrated_sqlite_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    upgrade(url)
    status_checks.assert_checked(url)


def test_migration_0007_stops_on_an_unknown_status_and_changes_nothing_on_sqlite(tmp_path):
    status_checks.assert_stops_on_unknown_status(f"sqlite:///{tmp_path / 'h.db'}")
