"""The Django project of the Django integration tests: its database is the integration tests'
harvest database (``HARVEST['DATABASE_ALIAS']``), so a view's start joins its transaction."""

from __future__ import annotations

import os

from harvest_celery import PostgresPayloadStore
from harvest_celery._store.records import Timings

DB_NAME = os.environ.get("HARVEST_TEST_DB", "harvest_it")
SECRET_KEY = "harvest-celery-tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["harvest_celery.contrib.django", "tests.integration.django.shop"]
MIDDLEWARE = ["harvest_celery.contrib.django.http.HarvestErrorMiddleware"]
ROOT_URLCONF = "tests.integration.django.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DB_NAME,
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    },
}
CELERY_BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")
HARVEST = {
    "DATABASE_ALIAS": "default",
    "CELERY_APP": "tests.integration.django.djproject:app",
    "DECISION_QUEUE": "dj_decide",
    "OPTIONS": {
        # a minute: a run that completes in seconds was dispatched on commit, not swept
        "timings": Timings(redispatch_after=60.0, default_lease=30.0),
        "sweep_interval": 0.3,
        "payload_store": PostgresPayloadStore(),
        "offload_threshold": 200,
    },
}
