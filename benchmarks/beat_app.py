"""The Celery Beat side of the schedule-lateness benchmark (``benchmarks/scenarios/schedules.py``):
``celery -A benchmarks.beat_app beat -S benchmarks.beat_app:TimedScheduler``.

``beat_schedule`` holds ``HARVEST_BENCH_BEAT_ENTRIES`` timedelta entries of one interval
(``HARVEST_BENCH_BEAT_EVERY`` seconds), each sending ``raw_step`` to the queue ``beat_bench``,
which no worker consumes: what is measured is the firing, not the task. ``TimedScheduler``
appends one line per sent entry to ``HARVEST_BENCH_BEAT_OUT``: the entry's name, its due time
(``last_run_at + run_every``, what Beat itself judges due) and the time its message was sent."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.beat import Scheduler

BROKER_URL = os.environ.get("HARVEST_BENCH_BROKER_URL", "redis://127.0.0.1:6379/7")
ENTRIES = int(os.environ.get("HARVEST_BENCH_BEAT_ENTRIES", "1000"))
EVERY = float(os.environ.get("HARVEST_BENCH_BEAT_EVERY", "10"))
OUT = os.environ.get("HARVEST_BENCH_BEAT_OUT", "/tmp/harvest-bench-beat.txt")

app = Celery("harvest_bench_beat", broker=BROKER_URL)
app.conf.timezone = "UTC"
app.conf.beat_schedule = {
    f"lat-{i:04d}": {
        "task": "raw_step",
        "schedule": timedelta(seconds=EVERY),
        "args": (0,),
        "options": {"queue": "beat_bench"},
    }
    for i in range(ENTRIES)
}


class TimedScheduler(Scheduler):
    """Beat's in-memory scheduler, recording how late each entry is sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out = open(OUT, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        due = entry.last_run_at.timestamp() + entry.schedule.run_every.total_seconds()
        super().apply_entry(entry, producer=producer)
        self._out.write(f"{entry.name} {due:.6f} {time.time():.6f}\n")
