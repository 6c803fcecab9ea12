"""Celery settings for a harvest-celery deployment, for ``app.config_from_object``.

``harvest_celery.configure_dedicated_celery_app(app)`` applies the first block in code; this module is the same
thing as a config file, with the reasons, for teams that keep Celery settings in one place::

    app = Celery("myshop")
    app.config_from_object("config.celeryconfig")

If you merge these into an existing configuration, keep the first block as it is: the engine's
at-least-once guarantees depend on it (docs/operations.md, "At-least-once settings").
"""

import os

# ── what configure_dedicated_celery_app() sets ───────────────────────────────────────────────
# Ack after the body, not before, so a worker that dies mid-activity leaves the message to be
# redelivered. Duplicates are absorbed by the pre-run claim in Postgres.
task_acks_late = True
# A pool child killed by the OOM killer or SIGKILL requeues its message instead of acking it.
task_reject_on_worker_lost = True
# Each process holds at most one unacked message, so a slow activity does not strand others
# behind it in the prefetch buffer.
worker_prefetch_multiplier = 1
# The engine's fallback queue for activities that name none is the literal "default".
task_default_queue = "default"
# Results, errors and history live in Postgres: no result backend is needed.
task_ignore_result = True
# Workers wait for the broker at start-up instead of exiting.
broker_connection_retry_on_startup = True
# Celery 5.7, -P threads or solo: the prefetch restored after a reconnect is set from the pool
# thread that acks, racing the consumer on one AMQP connection, and the worker stops fetching
# (docs/operations.md, "Broker: Redis or RabbitMQ").
worker_enable_prefetch_count_reduction = False

# ── deployment settings (not set by configure_dedicated_celery_app) ─────────────────────────
broker_url = os.environ.get("HARVEST_BROKER_URL", "redis://localhost:6379/0")
# Redis redelivers an unacked message after the visibility timeout. Keep it longer than the
# longest activity start_to_close (and the default 300 s lease), or long attempts are delivered
# twice: the duplicate is refused by the claim, but it is wasted work.
broker_transport_options = {"visibility_timeout": 3600}
# Messages carry ids only; JSON is enough and is what Flower displays.
task_serializer = "json"
accept_content = ["json"]
# Flower needs task events.
worker_send_task_events = True
task_send_sent_event = True
