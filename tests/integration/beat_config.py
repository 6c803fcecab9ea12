"""A Celery Beat configuration for the import-beat test (``harvest schedules import-beat
tests.integration.beat_config:app``): a crontab entry, a timedelta entry and one entry harvest
cannot honour (a solar schedule). The entries' kwargs carry ``HARVEST_TEST_BEAT_TAG``, so the
task body records its calls under the test's tag."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, solar

TAG = os.environ.get("HARVEST_TEST_BEAT_TAG", "")

app = Celery("harvest_beat_config", set_as_current=False)
app.conf.timezone = "Europe/Paris"
app.conf.beat_schedule = {
    "beat-nightly": {
        "task": "sched.beat_add",
        "schedule": crontab(minute=0, hour=2),
        "args": (1, 2),
        "kwargs": {"tag": TAG},
    },
    "beat-often": {
        "task": "sched.beat_add",
        "schedule": timedelta(seconds=2),
        "args": (3, 4),
        "kwargs": {"tag": TAG},
    },
    # a solar instance without the ephem library it needs to compute: import-beat refuses it
    # by its class alone
    "beat-sunrise": {"task": "sched.beat_add", "schedule": solar.__new__(solar)},
}
