"""The project's Celery module, as Celery's Django guide writes it (``proj/celery.py``). The
worker runs ``celery -A tests.integration.django.djproject``; Celery's Django fix-up sets Django up
and the harvest app builds the ``Harvest`` as the worker starts."""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

from harvest_celery import configure_dedicated_celery_app

if not settings.configured:  # the test process configures Django itself (conftest.py)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integration.django.settings")

app = Celery("djshop")
app.config_from_object("django.conf:settings", namespace="CELERY")
configure_dedicated_celery_app(app)
