"""The example Celery app that docker-compose.yml runs: the checkout saga and the order pipeline
on a Celery app configured for harvest-celery.

``celery -A harvest_celery.examples.celery_app worker`` / ``harvest worker -A
harvest_celery.examples.celery_app`` import this module, which creates the ``Harvest`` object
(registering the decision task) and registers the example workflows and activities (one Celery
task per activity). ``HARVEST_DATABASE_URL`` and
``HARVEST_BROKER_URL`` come from the environment (config/settings.example.env).
"""

from __future__ import annotations

import os

from celery import Celery

from harvest_celery import Harvest, configure_dedicated_celery_app

from . import checkout, fulfillment, orders

app = Celery("harvest_example", broker=os.environ.get("HARVEST_BROKER_URL", "redis://localhost:6379/0"))
configure_dedicated_celery_app(app)  # an app made only for harvest
# Longer than any activity's start_to_close and the default lease: see docs/operations.md.
app.conf.broker_transport_options = {"visibility_timeout": 3600}
app.conf.worker_send_task_events = True  # for Flower
app.conf.task_send_sent_event = True

harvest = Harvest.from_env(celery_app=app)
harvest.register(checkout, orders, fulfillment)
