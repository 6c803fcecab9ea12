"""``DjangoHarvest``: the ``Harvest`` a Django project gets, starting runs inside Django's
transaction when ``HARVEST['DATABASE_ALIAS']`` names the harvest database."""

from __future__ import annotations

from typing import Any

from harvest_celery._client import Harvest


class DjangoHarvest(Harvest):
    """A ``Harvest`` whose ``start_workflow`` joins the transaction of Django's connection
    ``database_alias`` (when set): inside ``transaction.atomic()`` the run exists only if that
    block commits, and its first decision is sent from ``on_commit``; outside one, the start is
    its own atomic block on that connection. Without an alias it is a plain ``Harvest`` (use
    ``start_workflow_on_commit`` to start after your own commit)."""

    def __init__(self, *args: Any, database_alias: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.database_alias = database_alias

    def start_workflow(
        self,
        name: str,
        input: Any = None,
        execution_id: str | None = None,
        *,
        connection: Any = None,
        id_reuse: str = "idempotent",
        scheduled_for: Any = None,
        execution_timeout: Any = None,
        run_timeout: Any = None,
        priority: int = 0,
    ) -> str:
        """A start with deadlines is its own transaction on the harvest database (a start on a
        connection takes none yet)."""
        alias = self.database_alias
        timed = execution_timeout is not None or run_timeout is not None
        if connection is not None or alias is None or scheduled_for is not None or timed:
            return super().start_workflow(
                name,
                input,
                execution_id,
                connection=connection,
                id_reuse=id_reuse,
                scheduled_for=scheduled_for,
                execution_timeout=execution_timeout,
                run_timeout=run_timeout,
                priority=priority,
            )
        from django.db import connections, transaction

        django_connection = connections[alias]
        if django_connection.in_atomic_block:
            return super().start_workflow(
                name, input, execution_id, connection=django_connection, id_reuse=id_reuse, priority=priority
            )
        with transaction.atomic(using=alias):
            return super().start_workflow(
                name, input, execution_id, connection=django_connection, id_reuse=id_reuse, priority=priority
            )

    def start_workflow_on_commit(
        self,
        name: str,
        input: Any = None,
        execution_id: str | None = None,
        *,
        session: Any = None,
        using: str | None = None,
        id_reuse: str = "idempotent",
        execution_timeout: Any = None,
        run_timeout: Any = None,
        priority: int = 0,
    ) -> str:
        """``Harvest.start_workflow_on_commit`` on Django's ``transaction.on_commit`` (database
        ``using``, default ``"default"``). With ``DATABASE_ALIAS`` set, prefer ``start_workflow``
        inside your atomic block: the start then commits or rolls back with your rows."""
        return super().start_workflow_on_commit(
            name,
            input,
            execution_id,
            session=session,
            using=using,
            id_reuse=id_reuse,
            execution_timeout=execution_timeout,
            run_timeout=run_timeout,
            priority=priority,
        )
