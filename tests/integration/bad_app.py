"""A Celery app whose DAG names a compensator nobody registered: its worker must refuse to boot."""

from __future__ import annotations

import os

from celery import Celery

from harvest_celery import DagBuilder, Harvest, activity, configure_dedicated_celery_app, dag

app = Celery("harvest_bad", broker=os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5"))
configure_dedicated_celery_app(app)
harvest = Harvest(os.environ.get("HARVEST_TEST_DATABASE_URL"), app)


@activity
def ship(order: dict) -> str:
    return "shipped"


@dag
def shipping(g: DagBuilder) -> None:
    g.activity(ship).compensate_named("unship")  # never registered


harvest.register(ship, shipping)
