"""The ``--app`` of tests/unit/test_queries_embedded.py's CLI test: an embedded ``Harvest`` on the
SQLite file named by ``HARVEST_QUERY_TEST_DB`` with the query test workflow."""

from __future__ import annotations

import os

from harvest_celery import Harvest
from tests.unit.test_queries_embedded import qe_parked, qe_step

harvest = Harvest("sqlite:///" + os.environ["HARVEST_QUERY_TEST_DB"])
harvest.register(qe_parked, qe_step)
