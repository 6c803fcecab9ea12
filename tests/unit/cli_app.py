"""The ``--app`` of tests/unit/test_cli.py: a ``Harvest`` on the SQLite file named by
``HARVEST_CLI_TEST_DB`` (embedded) and, when ``HARVEST_CLI_TEST_CELERY`` is set, one with a Celery
app for ``harvest worker`` (opt-in: every Celery app with harvest tasks lives for the process)."""

from __future__ import annotations

import os

from celery import Celery

from harvest_celery import Harvest
from harvest_celery.examples import orders

URL = "sqlite:///" + os.environ["HARVEST_CLI_TEST_DB"]

harvest = Harvest(URL)
harvest.register(orders)

if os.environ.get("HARVEST_CLI_TEST_CELERY"):
    app = Celery("harvest_cli_test", broker="memory://")
    celery_harvest = Harvest(URL, app)
    celery_harvest.register(orders)
