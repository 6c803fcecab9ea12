"""Alembic environment for harvest-celery (run through harvest_celery._store.migrate)."""

from alembic import context
from sqlalchemy import create_engine, pool

from harvest_celery._store.schema import metadata

config = context.config
url = config.get_main_option("sqlalchemy.url") or ""


def run_migrations_offline() -> None:
    context.configure(
        url=url, target_metadata=metadata, literal_binds=True, version_table="harvest_alembic_version"
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table="harvest_alembic_version",
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
