"""The worker app of tests/integration/test_canvas.py: the user's existing Celery app
(``canvas_tasks``) joined by harvest, which adopts every task a canvas names. The task code is
unchanged. Queue names end in ``HARVEST_TEST_CV_SUFFIX`` (the module's fixture sets it before
the import, and the worker inherits it), so no other run's worker takes this run's messages."""

from __future__ import annotations

import os

from harvest_celery import FileSystemPayloadStore, Harvest, RetryPolicy
from harvest_celery._store.records import Timings
from tests.integration.canvas_tasks import BROKER_URL, QUEUE, app

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_it"
)
DECIDE = f"cv_decide{os.environ.get('HARVEST_TEST_CV_SUFFIX', '')}"
# a payload store, when the test restarts the worker with one (the chord body's cap test)
STORE = os.environ.get("HARVEST_TEST_CV_STORE")

harvest = Harvest(
    DATABASE_URL,
    app,
    decision_queue=DECIDE,
    # a killed worker's attempt waits out a short lease before the engine re-sends it
    timings=Timings(default_lease=3.0, redispatch_after=3.0),
    sweep_interval=0.3,
    payload_store=FileSystemPayloadStore(STORE) if STORE else None,
)
ONCE = RetryPolicy(max_attempts=1)
ADOPTED = ("cv.add", "cv.tsum", "cv.pair", "cv.reserve", "cv.release", "cv.release_envelope", "cv.big")
for name in (*ADOPTED, "cv.unbig", "cv.lengths", "cv.grow", "cv.as_set"):  # default retry: 3
    harvest.adopt_task(name, queue=QUEUE)
for name in ("cv.decline", "cv.errback", "cv.collect", "cv.slow"):
    harvest.adopt_task(name, queue=QUEUE, retry=ONCE)
# the compile-once test restarts the worker with a compiler that orders every group (and chain)
# reversed: a decision that recompiled the canvas would dispatch and return in another order
if os.environ.get("HARVEST_TEST_CV_REVERSED") == "1":
    import redis

    from harvest_celery._dag import canvas_compile

    canvas_compile._members = lambda tasks: list(reversed(list(tasks)))
    redis.Redis.from_url(os.environ["HARVEST_TEST_REDIS_URL"]).rpush(
        f"cv:compiler{os.environ.get('HARVEST_TEST_CV_SUFFIX', '')}", "reversed"
    )
__all__ = ["BROKER_URL", "DATABASE_URL", "DECIDE", "QUEUE", "app", "harvest"]
