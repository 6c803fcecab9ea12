"""The ``--app`` of tests/unit/test_updates_embedded.py's CLI test: an embedded ``Harvest`` on the
SQLite file named by ``HARVEST_UPDATE_TEST_DB`` with the update test workflow."""

from __future__ import annotations

import os

from harvest_celery import Harvest
from tests.unit.test_updates_embedded import ue_counter, ue_double

harvest = Harvest("sqlite:///" + os.environ["HARVEST_UPDATE_TEST_DB"])
harvest.register(ue_counter, ue_double)
