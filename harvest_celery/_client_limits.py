"""Run-time activity limits: ``set_limit`` and ``limits`` (docs/flow-control.md). An override
is stored in Postgres and wins over the decorator until cleared; a deploy never touches it."""

from __future__ import annotations

from typing import Any

from harvest_celery._client_base import ClientBase
from harvest_celery._core.limits import check_concurrency, parse_rate_limit
from harvest_celery._core.registry import Registry
from harvest_celery._errors import UnknownActivity
from harvest_celery._store import admission as store_admission
from harvest_celery._store import limits as store_limits
from harvest_celery._store.records import utcnow
from harvest_celery._store.store import Store


class FlowControl(ClientBase):
    """``Harvest``'s limit overrides."""

    def set_limit(
        self,
        name: str,
        concurrency: int | None = None,
        *,
        rate_limit: str | None = None,
        clear: bool = False,
    ) -> None:
        """Override the concurrency (``0`` holds every new slot) and/or the rate limit
        (Celery's format, ``"20/s"``) of a limited activity at run time, or ``clear=True`` to
        return to the declared values. Raises ``UnknownActivity`` for a name with no limit,
        ``ValueError`` for a bad value; either writes nothing. A lowered limit stops no running
        body: only new slots and tokens follow it.

        On a limited workflow's name it overrides its admission limit the same way (a lowered
        one stops no admitted run); ``rate_limit`` is refused for a workflow, and a name that is
        both an activity and a workflow here is refused (``ValueError`` naming both)."""
        check_workflow_limit(self.registry, name, rate_limit)
        set_limit(self.store, name, concurrency, rate_limit=rate_limit, clear=clear)

    def limits(self) -> list[dict[str, Any]]:
        """Every limited activity: ``name``, ``declared_concurrency``, ``override_concurrency``,
        ``declared_rate_limit``, ``override_rate_limit``, ``override_set_at``, ``in_use``,
        ``waiting`` and ``keys`` (how many keys hold a row)."""
        return list_limits(self.store)


def set_limit(
    store: Store, name: str, concurrency: int | None, *, rate_limit: str | None = None, clear: bool = False
) -> None:
    """``Harvest.set_limit`` on a store (the CLI's ``harvest limits set|clear``): every value
    is checked before anything is written."""
    given = concurrency is not None or rate_limit is not None
    if clear == given:
        raise ValueError("give concurrency=N and/or rate_limit='20/s', or clear=True (not both)")
    value = None if concurrency is None else check_concurrency(concurrency, allow_zero=True)
    rate = None if rate_limit is None else parse_rate_limit(rate_limit).text
    with store.begin() as tx:
        if not store_limits.known(tx, name):
            raise UnknownActivity(name)
        store_limits.set_override(tx, name, utcnow(), concurrency=value, rate_limit=rate, clear=clear)
        runs = store_admission.limits_runs(tx, name)  # a workflow's admission limit
        for digest in store_limits.keys_of(tx, name):
            # settled before commit: a raised limit releases (or admits) now
            (tx.touch_admission if runs else tx.touch_limit)(name, digest)


def check_workflow_limit(registry: Registry, name: str, rate_limit: str | None) -> None:
    """``set_limit`` of a workflow's name: never a rate limit, and never a name that is an
    activity too (which limit it meant cannot be told)."""
    if name not in registry.workflows:
        return
    if name in registry.activities:
        raise ValueError(
            f"{name!r} is both an activity and a workflow: set_limit cannot tell which limit is meant "
            f"(activity {name!r}, workflow {name!r}); rename one of them"
        )
    if rate_limit is not None:
        raise ValueError(f"rate_limit is refused for workflow {name!r}: workflows take concurrency= only")


def list_limits(store: Store) -> list[dict[str, Any]]:
    with store.begin() as tx:
        return store_limits.usage(tx)
