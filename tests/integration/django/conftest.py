"""The Django integration tests: their own settings module (``settings.py``), configured here for
this folder only, so ``pytest tests/integration`` runs them beside everything else and nothing
else sees Django (pytest-django stays idle until settings are configured; no
``DJANGO_SETTINGS_MODULE`` is set in this process, so no other worker inherits it).

``HARVEST_DJANGO_DRIVER=psycopg2`` hides psycopg 3 from this process before Django loads its
Postgres backend, which then uses psycopg2: ``test_django.py`` reruns itself that way in a child
pytest (``HARVEST_DJANGO_CHILD=1``) that reuses the parent's database and worker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import Worker

CHILD = os.environ.get("HARVEST_DJANGO_CHILD") == "1"
DRIVER = os.environ.get("HARVEST_DJANGO_DRIVER", "psycopg")


def pytest_configure(config: Any) -> None:
    if DRIVER == "psycopg2" and "psycopg" not in sys.modules:
        sys.modules["psycopg"] = None  # type: ignore[assignment]  # Django falls back to psycopg2
    import django
    from django.conf import settings

    from tests.integration.django import settings as project

    if not settings.configured:
        settings.configure(**{k: getattr(project, k) for k in dir(project) if k.isupper()})
        django.setup()


@pytest.fixture(scope="session")
def harvest_database(request: Any) -> None:
    """The session's fresh, migrated harvest database (the child reuses its parent's)."""
    if not CHILD:
        request.getfixturevalue("harvest")


@pytest.fixture(scope="session")
def django_db_setup(harvest_database: None, django_db_blocker: Any) -> None:
    """The project's database *is* the harvest database: no test database is made; the shop's
    tables are created in it (flushed after each transactional test, harvest's are not Django's)."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        call_command("migrate", run_syncdb=True, verbosity=0)


@pytest.fixture(scope="module")
def django_worker(harvest_database: None) -> Iterator[Worker | None]:
    """``celery -A tests.integration.django.djproject worker``, as the project runs it (per module:
    its connections are given back when the module is done)."""
    if CHILD:
        yield None  # the parent's worker is running
        return
    worker = Worker(
        "django",
        "dj_decide,dj_q",
        app="tests.integration.django.djproject",
        extra_env={"DJANGO_SETTINGS_MODULE": "tests.integration.django.settings"},
    )
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
